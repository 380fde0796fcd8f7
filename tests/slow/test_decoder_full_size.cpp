// The CPU speech decoder at the real release size (decoder_dim 1536, latent 1024, hidden 512,
// 8 layers; random weights from model_write_random): exact streaming and the CPU time per
// frame (printed, never asserted).
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "engine/cpu/speech_decoder.h"
#include "engine/model/weights.h"
#include "test_support.h"

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

TEST_CASE("full-size decoder: exact streaming and CPU time per frame", "[decoder][slow]") {
    // Tiny talker (irrelevant here), release-size speech decoder.
    auto t0 = std::chrono::steady_clock::now();
    const auto ckpt = qtts_test::tiny_checkpoint_with_decoder("full-decoder", qtts_test::decoder_release_size, 21);
    const qtts::cpu::CpuSpeechDecoder dec(*ckpt);
    std::printf("full-size decoder: written, loaded and converted in %.1f s\n", seconds_since(t0));
    REQUIRE(dec.config().decoder_dim == 1536);
    REQUIRE(dec.config().latent_dim == 1024);
    REQUIRE(dec.config().hidden_size == 512);
    REQUIRE(dec.config().num_layers == 8);
    REQUIRE(dec.samples_per_frame() == 1920);

    const int n = 12;
    const int nq = dec.num_quantizers();
    const auto u = qtts_test::random_floats(size_t(n) * nq, 77, 0.0f, 1.0f);
    std::vector<int32_t> codes(u.size());
    for (size_t i = 0; i < u.size(); ++i) codes[i] = std::min(2047, int(u[i] * 2048.0f));

    const auto full = dec.decode_full(codes.data(), n);  // also warms the scratch buffers up
    REQUIRE(full.size() == size_t(n) * 1920);
    double ss = 0.0, peak = 0.0;
    for (float v : full) {
        ss += double(v) * v;
        peak = std::max(peak, double(std::fabs(v)));
    }
    const double rms = std::sqrt(ss / double(full.size()));
    std::printf("full-size decoder: %d frames, rms %.3f, peak %.3f\n", n, rms, peak);
    REQUIRE(rms > 1e-3);
    REQUIRE(peak < 1.0);

    // Timings: wall clock, and process CPU time (all BLAS threads summed). Informational only.
    for (int chunk : {1, 4, n}) {
        qtts::cpu::DecoderState state = dec.state_new();
        std::vector<float> pcm;
        const std::clock_t c0 = std::clock();
        t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < n; s += chunk) dec.decode(state, codes.data() + size_t(s) * nq, std::min(chunk, n - s), &pcm);
        const double wall = seconds_since(t0);
        const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
        REQUIRE(pcm.size() == full.size());
        const double err = qtts_test::max_abs_error(pcm.data(), full.data(), full.size());
        std::printf("full-size decoder: chunk %2d: %.1f ms/frame wall, %.1f ms/frame CPU; max abs diff vs decode_full "
                    "%.3g; carried state %.2f MB\n",
                    chunk, wall * 1e3 / n, cpu * 1e3 / n, err, double(state.carried_bytes()) / 1e6);
        CAPTURE(chunk);
        CHECK(err <= 1e-5);
    }
}
