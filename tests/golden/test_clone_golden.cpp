// Base voice cloning networks against the reference (../shared/reference, tiny-base):
// log-mel (ref_mel), ECAPA x-vector (ref_speaker_embedding, from ref_audio and from ref_mel) and
// speech-tokenizer encoder codes (ref_codes), for every Base scenario; plus causality of the
// encoder, thread safety, and the clear errors for unusable audio and inconsistent configs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "cpu/mel.h"
#include "cpu/speaker_encoder.h"
#include "cpu/speech_encoder.h"
#include "model/safetensors.h"
#include "model/weights.h"
#include "test_support.h"

namespace {

using qtts::ErrorCode;
using qtts::cpu::MelSpectrogram;
using qtts::cpu::SpeakerEncoder;
using qtts::cpu::SpeechEncoder;

const char* const kScenarios[] = {"base-xvec-stream", "base-icl-stream", "base-icl-nonstream"};

std::shared_ptr<const qtts::Checkpoint> tiny_base() {
    static std::shared_ptr<const qtts::Checkpoint> ckpt = qtts::checkpoint_load(qtts_test::reference_model_dir("tiny-base"));
    return ckpt;
}

struct CloneGolden {
    std::vector<float> audio;      // [N]
    std::vector<float> mel;        // [frames, 128]
    int mel_frames = 0;
    std::vector<float> embedding;  // [H]
    std::vector<int64_t> codes;    // [frames, 16]
    int code_frames = 0;
};

CloneGolden golden_load(const std::string& scenario) {
    auto file = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-base", scenario));
    CloneGolden g;
    g.audio = qtts::tensor_to_f32(file->get("ref_audio"));
    const auto& mel = file->get("ref_mel");
    REQUIRE(mel.shape.size() == 2);
    REQUIRE(mel.shape[1] == 128);
    g.mel_frames = int(mel.shape[0]);
    g.mel = qtts::tensor_to_f32(mel);
    g.embedding = qtts::tensor_to_f32(file->get("ref_speaker_embedding"));
    const auto& codes = file->get("ref_codes");
    REQUIRE(codes.shape.size() == 2);
    REQUIRE(codes.shape[1] == 16);
    g.code_frames = int(codes.shape[0]);
    g.codes = qtts::tensor_to_i64(codes);
    return g;
}

template <typename Fn>
void require_error(Fn&& fn, ErrorCode code, const std::string& fragment) {
    try {
        fn();
        FAIL("expected qtts::Error containing '" << fragment << "'");
    } catch (const qtts::Error& e) {
        INFO(e.what());
        CHECK(e.code() == code);
        CHECK(std::string(e.what()).find(fragment) != std::string::npos);
    }
}

int count_code_mismatches(const std::vector<int32_t>& got, const std::vector<int64_t>& expected, size_t n) {
    int mismatches = 0;
    for (size_t i = 0; i < n; ++i) mismatches += int64_t(got[i]) != expected[i];
    return mismatches;
}

}  // namespace

TEST_CASE("log-mel of the reference clip matches ref_mel", "[clone][mel]") {
    MelSpectrogram mel;
    for (const char* scenario : kScenarios) {
        const CloneGolden g = golden_load(scenario);
        const qtts::cpu::MelOutput got = mel.compute(g.audio.data(), g.audio.size());
        REQUIRE(got.frames == g.mel_frames);
        REQUIRE(got.n_mels == 128);
        const double max_abs = qtts_test::max_abs_error(got.values.data(), g.mel.data(), g.mel.size());
        const double rel = qtts_test::rel_error(got.values.data(), g.mel.data(), g.mel.size());
        std::printf("[%s] mel: %d frames, max abs error %.3g, relative error %.3g\n", scenario, got.frames, max_abs, rel);
        CHECK(max_abs < 1e-4);
        CHECK(rel < 1e-5);
    }
}

TEST_CASE("x-vector matches ref_speaker_embedding from the mel and from the audio", "[clone][speaker]") {
    auto ckpt = tiny_base();
    REQUIRE(ckpt->speaker_encoder.has_value());
    REQUIRE(ckpt->config.speaker_encoder.has_value());
    const SpeakerEncoder encoder(*ckpt->config.speaker_encoder, *ckpt->speaker_encoder);
    for (const char* scenario : kScenarios) {
        const CloneGolden g = golden_load(scenario);
        REQUIRE(int(g.embedding.size()) == encoder.embedding_dim());

        const std::vector<float> from_mel = encoder.embed_mel(g.mel.data(), g.mel_frames, 128);
        REQUIRE(from_mel.size() == g.embedding.size());
        const double rel_mel = qtts_test::rel_error(from_mel.data(), g.embedding.data(), g.embedding.size());
        const double abs_mel = qtts_test::max_abs_error(from_mel.data(), g.embedding.data(), g.embedding.size());

        const std::vector<float> from_audio = encoder.embed_audio(g.audio.data(), g.audio.size());
        REQUIRE(from_audio.size() == g.embedding.size());
        const double rel_audio = qtts_test::rel_error(from_audio.data(), g.embedding.data(), g.embedding.size());
        const double abs_audio = qtts_test::max_abs_error(from_audio.data(), g.embedding.data(), g.embedding.size());
        std::printf("[%s] x-vector from ref_mel: rel %.3g, max abs %.3g; from ref_audio: rel %.3g, max abs %.3g\n",
                    scenario, rel_mel, abs_mel, rel_audio, abs_audio);
        CHECK(rel_mel < 1e-4);
        CHECK(rel_audio < 1e-4);
    }
}

TEST_CASE("speech encoder codes equal ref_codes", "[clone][codes]") {
    auto ckpt = tiny_base();
    REQUIRE(ckpt->encoder.has_value());
    const SpeechEncoder encoder(ckpt->speech_config, *ckpt->encoder);
    REQUIRE(encoder.num_codebooks() == 16);
    for (const char* scenario : kScenarios) {
        const CloneGolden g = golden_load(scenario);
        const qtts::cpu::SpeechCodes codes = encoder.encode(g.audio.data(), g.audio.size());
        REQUIRE(codes.frames == g.code_frames);
        REQUIRE(codes.frames == int((g.audio.size() + 1919) / 1920));
        REQUIRE(codes.num_codebooks == 16);
        const int mismatches = count_code_mismatches(codes.values, g.codes, g.codes.size());
        std::printf("[%s] codes: %d frames x 16, %d of %zu differ\n", scenario, codes.frames, mismatches,
                    g.codes.size());
        for (size_t i = 0, shown = 0; i < g.codes.size() && shown < 8; ++i) {
            if (int64_t(codes.values[i]) != g.codes[i]) {
                std::printf("  frame %zu codebook %zu: got %d, expected %lld\n", i / 16, i % 16, codes.values[i],
                            static_cast<long long>(g.codes[i]));
                ++shown;
            }
        }
        CHECK(mismatches == 0);
    }
}

TEST_CASE("speech encoder is causal: a prefix encodes to the leading frames", "[clone][codes]") {
    auto ckpt = tiny_base();
    const SpeechEncoder encoder(ckpt->speech_config, *ckpt->encoder);
    const CloneGolden g = golden_load(kScenarios[0]);
    // Whole frames only: frame j depends on samples before (j+1)·1920 and nothing after.
    for (int keep : {1, 7, 19}) {
        const qtts::cpu::SpeechCodes codes = encoder.encode(g.audio.data(), size_t(keep) * 1920);
        REQUIRE(codes.frames == keep);
        CHECK(count_code_mismatches(codes.values, g.codes, size_t(keep) * 16) == 0);
    }
    // A partial last frame is completed with zeros: the whole frames before it are unchanged
    // and the count is ceil(N / 1920).
    const size_t n = 19 * 1920 + 700;
    const qtts::cpu::SpeechCodes partial = encoder.encode(g.audio.data(), n);
    REQUIRE(partial.frames == 20);
    CHECK(count_code_mismatches(partial.values, g.codes, size_t(19) * 16) == 0);
    for (int32_t c : partial.values) {
        CHECK(c >= 0);
        CHECK(c < 2048);
    }
}

TEST_CASE("a sliding window wider than the clip changes nothing", "[clone][codes]") {
    auto ckpt = tiny_base();
    const CloneGolden g = golden_load(kScenarios[0]);
    qtts::cpu::SpeechEncoderOptions options;
    options.attention_window = 40;  // the clip is 40 frames at 25 Hz
    const SpeechEncoder windowed(ckpt->speech_config, *ckpt->encoder, options);
    const qtts::cpu::SpeechCodes codes = windowed.encode(g.audio.data(), g.audio.size());
    CHECK(count_code_mismatches(codes.values, g.codes, g.codes.size()) == 0);
}

TEST_CASE("the cloning encoders run on several threads at once", "[clone][threads]") {
    auto ckpt = tiny_base();
    const SpeakerEncoder speaker(*ckpt->config.speaker_encoder, *ckpt->speaker_encoder);
    const SpeechEncoder speech(ckpt->speech_config, *ckpt->encoder);
    const CloneGolden g = golden_load(kScenarios[0]);
    const std::vector<float> serial_embedding = speaker.embed_audio(g.audio.data(), g.audio.size());
    std::vector<std::vector<float>> embeddings(3);
    std::vector<qtts::cpu::SpeechCodes> codes(3);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < 3; ++i) {
        threads.emplace_back([&, i] {
            embeddings[i] = speaker.embed_audio(g.audio.data(), g.audio.size());
            codes[i] = speech.encode(g.audio.data(), g.audio.size());
        });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < 3; ++i) {
        CHECK(qtts_test::max_abs_error(embeddings[i].data(), serial_embedding.data(), serial_embedding.size()) == 0.0);
        CHECK(count_code_mismatches(codes[i].values, g.codes, g.codes.size()) == 0);
    }
}

TEST_CASE("speaker encoder rejects unusable audio and mels", "[clone][errors]") {
    auto ckpt = tiny_base();
    const SpeakerEncoder encoder(*ckpt->config.speaker_encoder, *ckpt->speaker_encoder);
    // k3 dilation 4 needs 4 reflected frames on each side: 5 frames, i.e. 1280 samples.
    CHECK(encoder.min_frames() == 5);
    CHECK(encoder.min_samples() == 1280);
    std::vector<float> audio = qtts_test::random_floats(4000, 11, -0.5f, 0.5f);
    require_error([&] { encoder.embed_audio(audio.data(), 0); }, ErrorCode::ERROR_INVALID_ARGUMENT, "empty");
    require_error([&] { encoder.embed_audio(audio.data(), 100); }, ErrorCode::ERROR_INVALID_ARGUMENT, "too short");
    require_error([&] { encoder.embed_audio(audio.data(), 1279); }, ErrorCode::ERROR_INVALID_ARGUMENT, "too short");
    CHECK(encoder.embed_audio(audio.data(), 1280).size() == 64);
    audio[2000] = std::numeric_limits<float>::quiet_NaN();
    require_error([&] { encoder.embed_audio(audio.data(), audio.size()); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "non-finite");
    audio[2000] = std::numeric_limits<float>::infinity();
    require_error([&] { encoder.embed_audio(audio.data(), audio.size()); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "index 2000");

    std::vector<float> mel = qtts_test::random_floats(size_t(10) * 128, 5, -8.0f, 0.0f);
    require_error([&] { encoder.embed_mel(mel.data(), 4, 128); }, ErrorCode::ERROR_INVALID_ARGUMENT, "at least 5");
    require_error([&] { encoder.embed_mel(mel.data(), 10, 80); }, ErrorCode::ERROR_INVALID_ARGUMENT, "80 bins");
    mel[300] = std::numeric_limits<float>::quiet_NaN();
    require_error([&] { encoder.embed_mel(mel.data(), 10, 128); }, ErrorCode::ERROR_INVALID_ARGUMENT, "non-finite");
}

TEST_CASE("speaker encoder rejects a config that does not fit the graph or the weights", "[clone][errors]") {
    auto ckpt = tiny_base();
    const qtts::SpeakerEncoderConfig good = *ckpt->config.speaker_encoder;
    const qtts::SpeakerEncoderWeights& w = *ckpt->speaker_encoder;
    auto build = [&](const qtts::SpeakerEncoderConfig& c) { SpeakerEncoder e(c, w); };

    qtts::SpeakerEncoderConfig c = good;
    c.enc_res2net_scale = 3;  // 32 channels do not split into 3 chunks
    require_error([&] { build(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "enc_res2net_scale");
    c = good;
    c.enc_channels.back() = 100;  // mfa must map the 3 x 32 concatenation
    require_error([&] { build(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "sum of the SE-Res2Net");
    c = good;
    c.enc_dilations.pop_back();
    require_error([&] { build(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "same length");
    c = good;
    c.mel_dim = 80;
    require_error([&] { build(c); }, ErrorCode::ERROR_UNSUPPORTED, "128 mels");
    c = good;
    c.sample_rate = 16000;
    require_error([&] { build(c); }, ErrorCode::ERROR_UNSUPPORTED, "24000");
    c = good;
    c.enc_dim = 32;  // the checkpoint's fc is [64, 192, 1]
    require_error([&] { build(c); }, ErrorCode::ERROR_SHAPE, "speaker_encoder.fc");
    c = good;
    c.enc_attention_channels = 8;
    require_error([&] { build(c); }, ErrorCode::ERROR_SHAPE, "asp.tdnn");
    c = good;
    c.enc_kernel_sizes[0] = 0;
    require_error([&] { build(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "positive");
}

TEST_CASE("speech encoder rejects unusable audio", "[clone][errors]") {
    auto ckpt = tiny_base();
    const SpeechEncoder encoder(ckpt->speech_config, *ckpt->encoder);
    CHECK(encoder.min_samples() == 1920);
    std::vector<float> audio = qtts_test::random_floats(5000, 13, -0.5f, 0.5f);
    require_error([&] { encoder.encode(audio.data(), 0); }, ErrorCode::ERROR_INVALID_ARGUMENT, "empty");
    require_error([&] { encoder.encode(nullptr, 3000); }, ErrorCode::ERROR_INVALID_ARGUMENT, "empty");
    require_error([&] { encoder.encode(audio.data(), 1919); }, ErrorCode::ERROR_INVALID_ARGUMENT, "too short");
    CHECK(encoder.encode(audio.data(), 1920).frames == 1);
    CHECK(encoder.encode(audio.data(), 1921).frames == 2);
    audio[4321] = std::numeric_limits<float>::quiet_NaN();
    require_error([&] { encoder.encode(audio.data(), audio.size()); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "index 4321");
    audio[4321] = -std::numeric_limits<float>::infinity();
    require_error([&] { encoder.encode(audio.data(), audio.size()); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "non-finite");
}

TEST_CASE("speech encoder rejects a config that does not fit the graph or the weights", "[clone][errors]") {
    auto ckpt = tiny_base();
    const qtts::SpeechTokenizerConfig good = ckpt->speech_config;
    const qtts::SpeechEncoderWeights& w = *ckpt->encoder;
    auto build = [&](const qtts::SpeechTokenizerConfig& c) { SpeechEncoder e(c, w); };

    qtts::SpeechTokenizerConfig c = good;
    c.encoder.num_residual_layers = 2;
    require_error([&] { build(c); }, ErrorCode::ERROR_UNSUPPORTED, "num_residual_layers");
    c = good;
    c.encode_downsample_rate = 960;
    require_error([&] { build(c); }, ErrorCode::ERROR_UNSUPPORTED, "encode_downsample_rate");
    c = good;
    c.input_sample_rate = 16000;
    require_error([&] { build(c); }, ErrorCode::ERROR_UNSUPPORTED, "24000");
    c = good;
    c.encoder_valid_num_quantizers = 40;
    require_error([&] { build(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "encoder_valid_num_quantizers");
    c = good;
    c.encoder.codebook_dim = 8;  // the checkpoint's input_proj is [16, 32, 1]
    require_error([&] { build(c); }, ErrorCode::ERROR_SHAPE, "input_proj");
    c = good;
    c.encoder.intermediate_size = 128;
    require_error([&] { build(c); }, ErrorCode::ERROR_SHAPE, "mlp.fc1");
    c = good;
    c.encoder.num_layers = 3;
    require_error([&] { build(c); }, ErrorCode::ERROR_SHAPE, "transformer layers");
    c = good;
    c.encoder.head_dim = 7;
    require_error([&] { build(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "head_dim even");
    qtts::cpu::SpeechEncoderOptions bad_window;
    bad_window.attention_window = -1;
    require_error([&] { SpeechEncoder e(good, w, bad_window); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "attention_window");
}
