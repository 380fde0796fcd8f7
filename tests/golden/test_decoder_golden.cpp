// The CPU speech decoder against the reference implementation's fp32 outputs
// (../shared/reference/golden): RVQ dequantization, one full decode, exact streaming at several
// chunk sizes, and the audio of every generation scenario.
//
// RoPE: the decoder computes its rotary table from the config (1 / theta^(2i / head_dim)), as
// the reference does since the goldens were regenerated (2026-12-01). The last test checks that
// the goldens are sensitive to that table, so a wrong one cannot pass unnoticed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/speech_decoder.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "test_support.h"

namespace {

using qtts::cpu::CpuSpeechDecoder;

struct Golden {
    std::shared_ptr<qtts::SafetensorsFile> file;

    explicit Golden(const std::string& model, const std::string& scenario)
        : file(qtts::SafetensorsFile::open(qtts_test::golden_path(model, scenario))) {}

    bool has(const std::string& name) const { return file->find(name) != nullptr; }
    std::vector<float> f32(const std::string& name) const { return qtts::tensor_to_f32(file->get(name)); }
    // [frames, 16] int64 -> int32, row-major frames
    std::vector<int32_t> codes(const std::string& name, int* frames) const {
        const qtts::TensorView& t = file->get(name);
        REQUIRE(t.shape.size() == 2);
        *frames = int(t.shape[0]);
        const auto v = qtts::tensor_to_i64(t);
        return std::vector<int32_t>(v.begin(), v.end());
    }
};

qtts::cpu::CpuSpeechDecoderOptions golden_options(int max_chunk_frames = 25) {
    qtts::cpu::CpuSpeechDecoderOptions options;
    options.max_chunk_frames = max_chunk_frames;
    return options;
}

const CpuSpeechDecoder& decoder_get(const std::string& model) {
    static std::map<std::string, std::unique_ptr<CpuSpeechDecoder>> cache;
    auto& slot = cache[model];
    if (!slot) {
        const auto ckpt = qtts::checkpoint_load(qtts_test::reference_model_dir(model));
        slot = std::make_unique<CpuSpeechDecoder>(*ckpt, golden_options());
    }
    return *slot;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double rms(const std::vector<float>& v) {
    double s = 0.0;
    for (float x : v) s += double(x) * x;
    return std::sqrt(s / double(std::max<size_t>(v.size(), 1)));
}

}  // namespace

TEST_CASE("decoder_long: RVQ dequantization matches the reference", "[decoder][golden]") {
    const Golden g("tiny-customvoice", "decoder_long");
    int n = 0;
    const auto codes = g.codes("codes", &n);
    const auto expect = g.f32("dequantized");
    const CpuSpeechDecoder& dec = decoder_get("tiny-customvoice");
    REQUIRE(n == 200);
    REQUIRE(expect.size() == size_t(n) * dec.config().codebook_dim);
    const auto got = dec.dequantize(codes.data(), n);
    REQUIRE(got.size() == expect.size());
    const double rel = qtts_test::rel_error(got.data(), expect.data(), expect.size());
    std::printf("decoder_long dequantized: rel error %.3g (max abs %.3g)\n", rel,
                qtts_test::max_abs_error(got.data(), expect.data(), expect.size()));
    CHECK(rel <= 1e-5);
}

TEST_CASE("decoder_long: full decode and exact streaming match audio_full", "[decoder][golden]") {
    const Golden g("tiny-customvoice", "decoder_long");
    int n = 0;
    const auto codes = g.codes("codes", &n);
    const auto audio_full = g.f32("audio_full");
    const auto audio_chunked = g.f32("audio_chunked_60_25");
    const CpuSpeechDecoder& dec = decoder_get("tiny-customvoice");
    const int spf = dec.samples_per_frame();
    REQUIRE(spf == 1920);
    REQUIRE(audio_full.size() == size_t(n) * spf);
    REQUIRE(rms(audio_full) > 0.01);

    auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    const auto full = dec.decode_full(codes.data(), n);
    const double full_s = seconds_since(t0);
    const double full_cpu = double(std::clock() - c0) / CLOCKS_PER_SEC;
    REQUIRE(full.size() == audio_full.size());
    const double full_err = qtts_test::max_abs_error(full.data(), audio_full.data(), full.size());
    std::printf("decoder_long decode_full: max abs error %.3g vs audio_full (rms %.3f); %.3f ms/frame wall, %.3f ms/frame "
                "CPU\n",
                full_err, rms(audio_full), full_s * 1e3 / n, full_cpu * 1e3 / n);
    CHECK(full_err <= 1e-4);

    // One pass over all 200 frames (no internal chunking) must agree too.
    {
        const auto ckpt = qtts::checkpoint_load(qtts_test::reference_model_dir("tiny-customvoice"));
        const CpuSpeechDecoder dec1(*ckpt, golden_options(n));
        const auto single = dec1.decode_full(codes.data(), n);
        const double err = qtts_test::max_abs_error(single.data(), audio_full.data(), single.size());
        std::printf("decoder_long single 200-frame pass: max abs error %.3g vs audio_full, %.3g vs decode_full\n", err,
                    qtts_test::max_abs_error(single.data(), full.data(), full.size()));
        CHECK(err <= 1e-4);
        CHECK(qtts_test::max_abs_error(single.data(), full.data(), full.size()) <= 1e-5);
    }

    // The reference's own 60/25 chunked decode is NOT exact; a correct decoder differs from it.
    const double chunked_diff = qtts_test::max_abs_error(full.data(), audio_chunked.data(), full.size());
    std::printf("decoder_long: audio_chunked_60_25 differs from our decode by %.3g (expected: inexact reference)\n",
                chunked_diff);
    CHECK(chunked_diff > 1e-3);

    for (int chunk : {1, 2, 3, 7, 25, 200}) {
        qtts::cpu::DecoderState state = dec.state_new();
        std::vector<float> pcm;
        t0 = std::chrono::steady_clock::now();
        for (int s = 0; s < n; s += chunk) {
            const int m = std::min(chunk, n - s);
            const size_t before = pcm.size();
            dec.decode(state, codes.data() + size_t(s) * dec.num_quantizers(), m, &pcm);
            REQUIRE(pcm.size() == before + size_t(m) * spf);
        }
        const double stream_s = seconds_since(t0);
        REQUIRE(pcm.size() == audio_full.size());
        REQUIRE(state.frames_done == n);
        const double err_golden = qtts_test::max_abs_error(pcm.data(), audio_full.data(), pcm.size());
        const double err_full = qtts_test::max_abs_error(pcm.data(), full.data(), pcm.size());
        std::printf("decoder_long streaming chunk %3d: max abs %.3g vs audio_full, %.3g vs decode_full; %.3f ms/frame\n",
                    chunk, err_golden, err_full, stream_s * 1e3 / n);
        CAPTURE(chunk);
        CHECK(err_golden <= 1e-4);
        CHECK(err_full <= 1e-5);
    }
}

TEST_CASE("scenario codes decode to the reference audio", "[decoder][golden]") {
    struct Scenario {
        const char* model;
        const char* name;
    };
    const Scenario scenarios[] = {
        {"tiny-customvoice", "cv-en-nonstream"}, {"tiny-customvoice", "cv-en-stream"},
        {"tiny-customvoice", "cv-auto-dialect"}, {"tiny-customvoice", "cv-zh-instruct"},
        {"tiny-voicedesign", "vd-en-instruct"},  {"tiny-voicedesign", "vd-auto-stream"},
        {"tiny-base", "base-xvec-stream"},       {"tiny-base", "base-icl-stream"},
        {"tiny-base", "base-icl-nonstream"},
    };
    for (const Scenario& sc : scenarios) {
        CAPTURE(sc.model, sc.name);
        const Golden g(sc.model, sc.name);
        const CpuSpeechDecoder& dec = decoder_get(sc.model);
        const int spf = dec.samples_per_frame();
        int n = 0;
        const auto codes = g.codes("codes", &n);
        const auto audio = g.f32("audio");
        if (g.has("audio_full_with_ref")) {
            // ICL: the reference decodes ref_codes ++ codes and keeps the tail after the reference.
            int n_ref = 0;
            auto all = g.codes("ref_codes", &n_ref);
            all.insert(all.end(), codes.begin(), codes.end());
            const auto expect_all = g.f32("audio_full_with_ref");
            const auto got_all = dec.decode_full(all.data(), n_ref + n);
            REQUIRE(got_all.size() == expect_all.size());
            const double err_all = qtts_test::max_abs_error(got_all.data(), expect_all.data(), got_all.size());
            REQUIRE(audio.size() == size_t(n) * spf);
            const double err_tail =
                qtts_test::max_abs_error(got_all.data() + size_t(n_ref) * spf, audio.data(), audio.size());
            std::printf("%s/%s: %d+%d frames, max abs %.3g (with ref), %.3g (tail = audio)\n", sc.model, sc.name, n_ref,
                        n, err_all, err_tail);
            CHECK(err_all <= 1e-4);
            CHECK(err_tail <= 1e-4);
        } else {
            const auto got = dec.decode_full(codes.data(), n);
            REQUIRE(audio.size() == size_t(n) * spf);
            REQUIRE(got.size() == audio.size());
            REQUIRE(rms(audio) > 1e-3);
            const double err = qtts_test::max_abs_error(got.data(), audio.data(), got.size());
            // The same frames streamed one at a time.
            qtts::cpu::DecoderState state = dec.state_new();
            std::vector<float> pcm;
            for (int t = 0; t < n; ++t) dec.decode(state, codes.data() + size_t(t) * dec.num_quantizers(), 1, &pcm);
            const double err_stream = qtts_test::max_abs_error(pcm.data(), audio.data(), audio.size());
            std::printf("%s/%s: %d frames, max abs %.3g (full), %.3g (1-frame streaming)\n", sc.model, sc.name, n, err,
                        err_stream);
            CHECK(err <= 1e-4);
            CHECK(err_stream <= 1e-4);
        }
    }
}

TEST_CASE("the goldens pin the decoder's RoPE table: another rope_theta misses them after frame 0", "[decoder][golden]") {
    // Frame 0 (position 0, where RoPE is the identity) matches whatever the table; later frames
    // only with the config's. This is what makes the golden comparisons above a RoPE check.
    const Golden g("tiny-customvoice", "decoder_long");
    int n = 0;
    const auto codes = g.codes("codes", &n);
    const auto audio_full = g.f32("audio_full");
    const auto ckpt = qtts::checkpoint_load(qtts_test::reference_model_dir("tiny-customvoice"));
    qtts::Checkpoint detuned = *ckpt;
    detuned.speech_config.decoder.rope_theta *= 0.5;
    const int frames = 20;
    const size_t spf = size_t(decoder_get("tiny-customvoice").samples_per_frame());
    const auto pcm_config = decoder_get("tiny-customvoice").decode_full(codes.data(), frames);
    const auto pcm_detuned = CpuSpeechDecoder(detuned).decode_full(codes.data(), frames);
    const double err_config = qtts_test::max_abs_error(pcm_config.data(), audio_full.data(), frames * spf);
    const double err_frame0 = qtts_test::max_abs_error(pcm_detuned.data(), audio_full.data(), spf);
    const double err_rest =
        qtts_test::max_abs_error(pcm_detuned.data() + spf, audio_full.data() + spf, (frames - 1) * spf);
    std::printf("config RoPE: max abs %.3g; half rope_theta: frame 0 %.3g, frames 1..%d %.3g\n", err_config,
                err_frame0, frames - 1, err_rest);
    CHECK(err_config <= 1e-4);
    CHECK(err_frame0 <= 1e-5);
    CHECK(err_rest > 1e-3);
}
