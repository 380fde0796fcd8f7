// The fast CPU speech decoder (engine/cpu_fast/fast_speech_decoder.h) against the official
// reference's fp32 audio (../shared/reference/golden, tiny-customvoice decoder_long: 200 frames),
// in both weight formats, one pass and streamed in 4-frame chunks. The reference models' speech
// tokenizer weights are bf16-representable (golden README), so here bf16 packing is exact too and
// both formats must meet the reference decoder's own bound (1e-4 max abs, test_decoder_golden);
// the SNR is printed. On fp32 weights bf16 is lossy: test_cpu_fast_decoder* measure that.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "engine/cpu_fast/fast_speech_decoder.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "test_support.h"

namespace cf = qtts::cpu_fast;

TEST_CASE("fast decoder: decoder_long matches the reference audio in both formats", "[cpu_fast][decoder][golden]") {
    const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-customvoice", "decoder_long"));
    const qtts::TensorView& codes_t = golden->get("codes");
    REQUIRE(codes_t.shape.size() == 2);
    const int n = int(codes_t.shape[0]);
    const auto codes64 = qtts::tensor_to_i64(codes_t);
    const std::vector<int32_t> codes(codes64.begin(), codes64.end());
    const auto audio_full = qtts::tensor_to_f32(golden->get("audio_full"));
    const auto ckpt = qtts::checkpoint_load(qtts_test::reference_model_dir("tiny-customvoice"));

    for (const auto format : {cf::ConvFormat::CONV_FORMAT_FP32, cf::ConvFormat::CONV_FORMAT_BF16}) {
        const cf::FastSpeechDecoder dec(ckpt->speech_config.decoder, ckpt->decoder, format,
                                        std::make_shared<cf::ThreadPool>(2));
        REQUIRE(size_t(n) * size_t(dec.samples_per_frame()) == audio_full.size());
        const auto full = dec.decode_full(codes.data(), n);
        cf::FastDecoderState state = dec.state_new();
        std::vector<float> streamed;
        for (int done = 0; done < n; done += 4) dec.decode(state, codes.data() + size_t(done) * 16, std::min(4, n - done), &streamed);
        REQUIRE(full.size() == audio_full.size());
        REQUIRE(streamed.size() == audio_full.size());
        const double err = qtts_test::max_abs_error(full.data(), audio_full.data(), full.size());
        const double err_streamed = qtts_test::max_abs_error(streamed.data(), audio_full.data(), streamed.size());
        const double rel = qtts_test::rel_error(full.data(), audio_full.data(), full.size());
        std::printf("fast decoder %s vs decoder_long audio_full: max abs %.3g (4-frame chunks %.3g), SNR %.1f dB\n",
                    cf::conv_format_name(format), err, err_streamed, rel > 0 ? -20.0 * std::log10(rel) : 999.0);
        CAPTURE(cf::conv_format_name(format));
        CHECK(err <= 1e-4);
        CHECK(err_streamed <= 1e-4);
    }
}
