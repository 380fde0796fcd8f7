// The fast CPU speech decoder at the release size (decoder_dim 1536, latent 1024, 8 transformer
// layers; random weights from model_write_random) against the fp32 reference decode: audio SNR
// per weight format (asserted: fp32 above 100 dB, the 50 dB floor reported for bf16), exact
// streaming in 4-frame chunks, and the time per frame of both (printed, never asserted; the
// benchmark is `qtts bench-cpu`).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "engine/cpu/speech_decoder.h"
#include "engine/cpu_fast/fast_speech_decoder.h"
#include "engine/model/weights.h"
#include "test_support.h"

namespace cf = qtts::cpu_fast;

TEST_CASE("full-size fast decoder: SNR against the fp32 reference per format", "[cpu_fast][decoder][slow]") {
    const uint64_t weight_seed = 21, code_seed = 77;
    const auto ckpt = qtts_test::tiny_checkpoint_with_decoder("full-decoder", qtts_test::decoder_release_size, weight_seed);
    const qtts::cpu::CpuSpeechDecoder ref_dec(*ckpt);
    REQUIRE(ref_dec.config().decoder_dim == 1536);
    const int n = 12, nq = ref_dec.num_quantizers();
    const auto u = qtts_test::random_floats(size_t(n) * nq, code_seed, 0.0f, 1.0f);
    std::vector<int32_t> codes(u.size());
    for (size_t i = 0; i < u.size(); ++i) codes[i] = std::min(2047, int(u[i] * 2048.0f));

    const auto t_ref = std::chrono::steady_clock::now();
    const auto ref = ref_dec.decode_full(codes.data(), n);
    const double ref_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_ref).count() / n;
    double ss = 0.0;
    for (float v : ref) ss += double(v) * v;
    REQUIRE(std::sqrt(ss / double(ref.size())) > 1e-3);

    for (const auto format : {cf::ConvFormat::CONV_FORMAT_FP32, cf::ConvFormat::CONV_FORMAT_BF16}) {
        const cf::FastSpeechDecoder dec(ckpt->speech_config.decoder, ckpt->decoder, format,
                                        std::make_shared<cf::ThreadPool>(0));
        const auto full = dec.decode_full(codes.data(), n);
        REQUIRE(full.size() == ref.size());
        const double e = qtts_test::rel_error(full.data(), ref.data(), ref.size());
        const double snr = e > 0 ? -20.0 * std::log10(e) : 999.0;

        cf::FastDecoderState state = dec.state_new();
        std::vector<float> pcm;
        const auto t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < n; s += 4) dec.decode(state, codes.data() + size_t(s) * nq, std::min(4, n - s), &pcm);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / n;
        const double stream_err = qtts_test::max_abs_error(pcm.data(), full.data(), full.size());
        std::printf("full-size fast decoder (weights seed %llu, codes seed %llu) %s: SNR vs fp32 %.1f dB; chunk 4: "
                    "%.1f ms/frame (%d threads), reference full decode %.1f ms/frame; stream vs full %.3g; %.0f MB packed\n",
                    (unsigned long long)weight_seed, (unsigned long long)code_seed, cf::conv_format_name(format), snr,
                    ms, cf::ThreadPool::default_threads(), ref_ms, stream_err, double(dec.packed_bytes()) / 1e6);
        CAPTURE(cf::conv_format_name(format), snr);
        CHECK(stream_err <= 1e-5);
        if (format == cf::ConvFormat::CONV_FORMAT_FP32) CHECK(snr >= 100.0);
        else CHECK(snr >= 30.0);  // catches a broken bf16 packing; the 50 dB floor is judged in the docs
    }
}
