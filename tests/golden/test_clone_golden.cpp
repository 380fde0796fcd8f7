// Base voice cloning networks against the reference (../shared/reference, tiny-base):
// log-mel (ref_mel), ECAPA x-vector (ref_speaker_embedding, from ref_audio and from ref_mel) and
// speech-tokenizer encoder codes (ref_codes, and transformers' MimiModel codes on the same
// weights), for every Base scenario; plus causality of the encoder, thread safety, and the clear
// errors for unusable audio and inconsistent configs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/mel.h"
#include "engine/cpu/speaker_encoder.h"
#include "engine/cpu/speech_encoder.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "test_errors.h"
#include "test_support.h"

namespace {

using qtts_test::require_error;

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

// Codes of Hugging Face transformers' MimiModel (transformers 5.17.0, torch 2.11.0, SDPA, fp32,
// CPU) loaded with this checkpoint's encoder.* tensors and run on the first N samples of
// ref_audio: an external reference for the speech encoder, including clips that end inside a
// frame (the right-padding path). The script that produced them is in docs/voice-cloning.md.
struct HfCase {
    size_t samples;
    std::vector<int32_t> codes;  // [ceil(samples / 1920), 16]
};
const HfCase kHfMimiCodes[] = {
    {38400, {
     1210, 323, 512, 1124, 412, 1188, 138, 2009, 106, 1252, 303, 1599, 1490, 116, 471, 753,
     343, 1006, 90, 1206, 1224, 826, 138, 529, 1312, 773, 704, 1759, 37, 262, 221, 1424,
     913, 923, 511, 281, 1369, 1227, 1161, 917, 1903, 1967, 670, 1141, 36, 404, 248, 1690,
     1210, 1705, 1790, 1133, 1394, 415, 138, 1356, 87, 1652, 1740, 1929, 37, 1945, 214, 1832,
     977, 1727, 511, 1847, 54, 385, 1506, 667, 284, 1717, 310, 833, 917, 457, 1878, 1523,
     796, 1574, 481, 1441, 258, 253, 1427, 797, 314, 2009, 1552, 1198, 1545, 947, 1566, 1151,
     1804, 166, 188, 1506, 693, 9, 124, 1555, 1638, 2021, 1093, 1929, 414, 1708, 785, 1163,
     823, 977, 90, 1468, 384, 1692, 1314, 667, 1008, 1080, 1552, 1747, 137, 262, 271, 666,
     1252, 108, 480, 121, 1307, 88, 307, 583, 1132, 1414, 848, 1747, 1586, 1965, 1196, 1940,
     292, 100, 1781, 1506, 1307, 1753, 800, 1018, 609, 1652, 957, 248, 1979, 695, 1465, 1836,
     1911, 1560, 90, 1344, 1764, 1298, 627, 480, 957, 249, 433, 679, 1829, 311, 471, 1438,
     1128, 965, 1633, 105, 1200, 204, 1805, 1063, 1397, 330, 704, 918, 1116, 32, 1791, 1948,
     515, 879, 90, 1918, 1472, 1439, 1427, 1937, 249, 1928, 310, 1929, 1586, 262, 1686, 1832,
     687, 108, 1017, 420, 1996, 1967, 627, 1555, 743, 841, 1279, 918, 1530, 1899, 533, 1593,
     1414, 977, 90, 427, 829, 313, 1665, 1282, 1263, 9, 433, 1178, 1334, 1447, 1535, 1593,
     863, 1705, 1733, 111, 520, 1753, 1088, 1018, 1318, 1760, 531, 1982, 1508, 457, 836, 226,
     1062, 166, 766, 1405, 384, 1468, 1427, 865, 513, 1984, 1633, 1302, 1764, 262, 296, 1163,
     2040, 1465, 278, 579, 537, 1227, 1161, 1499, 1783, 422, 698, 205, 780, 1682, 1196, 290,
     1062, 166, 1616, 869, 1237, 1298, 1438, 667, 1231, 1219, 313, 643, 917, 1447, 1020, 1733,
     455, 1412, 495, 1405, 1816, 71, 1314, 1037, 1700, 74, 1611, 1929, 1530, 1940, 471, 82,
     }},
    {37180, {
     1210, 323, 512, 1124, 412, 1188, 138, 2009, 106, 1252, 303, 1599, 1490, 116, 471, 753,
     343, 1006, 90, 1206, 1224, 826, 138, 529, 1312, 773, 704, 1759, 37, 262, 221, 1424,
     913, 923, 511, 281, 1369, 1227, 1161, 917, 1903, 1967, 670, 1141, 36, 404, 248, 1690,
     1210, 1705, 1790, 1133, 1394, 415, 138, 1356, 87, 1652, 1740, 1929, 37, 1945, 214, 1832,
     977, 1727, 511, 1847, 54, 385, 1506, 667, 284, 1717, 310, 833, 917, 457, 1878, 1523,
     796, 1574, 481, 1441, 258, 253, 1427, 797, 314, 2009, 1552, 1198, 1545, 947, 1566, 1151,
     1804, 166, 188, 1506, 693, 9, 124, 1555, 1638, 2021, 1093, 1929, 414, 1708, 785, 1163,
     823, 977, 90, 1468, 384, 1692, 1314, 667, 1008, 1080, 1552, 1747, 137, 262, 271, 666,
     1252, 108, 480, 121, 1307, 88, 307, 583, 1132, 1414, 848, 1747, 1586, 1965, 1196, 1940,
     292, 100, 1781, 1506, 1307, 1753, 800, 1018, 609, 1652, 957, 248, 1979, 695, 1465, 1836,
     1911, 1560, 90, 1344, 1764, 1298, 627, 480, 957, 249, 433, 679, 1829, 311, 471, 1438,
     1128, 965, 1633, 105, 1200, 204, 1805, 1063, 1397, 330, 704, 918, 1116, 32, 1791, 1948,
     515, 879, 90, 1918, 1472, 1439, 1427, 1937, 249, 1928, 310, 1929, 1586, 262, 1686, 1832,
     687, 108, 1017, 420, 1996, 1967, 627, 1555, 743, 841, 1279, 918, 1530, 1899, 533, 1593,
     1414, 977, 90, 427, 829, 313, 1665, 1282, 1263, 9, 433, 1178, 1334, 1447, 1535, 1593,
     863, 1705, 1733, 111, 520, 1753, 1088, 1018, 1318, 1760, 531, 1982, 1508, 457, 836, 226,
     1062, 166, 766, 1405, 384, 1468, 1427, 865, 513, 1984, 1633, 1302, 1764, 262, 296, 1163,
     2040, 1465, 278, 579, 537, 1227, 1161, 1499, 1783, 422, 698, 205, 780, 1682, 1196, 290,
     1062, 166, 1616, 869, 1237, 1298, 1438, 667, 1231, 1219, 313, 643, 917, 1447, 1020, 1733,
     1804, 1412, 495, 1519, 57, 9, 1281, 1555, 705, 773, 433, 1929, 939, 843, 1537, 1123,
     }},
    {9601, {
     1210, 323, 512, 1124, 412, 1188, 138, 2009, 106, 1252, 303, 1599, 1490, 116, 471, 753,
     343, 1006, 90, 1206, 1224, 826, 138, 529, 1312, 773, 704, 1759, 37, 262, 221, 1424,
     913, 923, 511, 281, 1369, 1227, 1161, 917, 1903, 1967, 670, 1141, 36, 404, 248, 1690,
     1210, 1705, 1790, 1133, 1394, 415, 138, 1356, 87, 1652, 1740, 1929, 37, 1945, 214, 1832,
     977, 1727, 511, 1847, 54, 385, 1506, 667, 284, 1717, 310, 833, 917, 457, 1878, 1523,
     1062, 1705, 1677, 332, 1550, 515, 124, 794, 858, 249, 1279, 643, 1293, 262, 968, 778,
     }},
    {2000, {
     1210, 323, 512, 1124, 412, 1188, 138, 2009, 106, 1252, 303, 1599, 1490, 116, 471, 753,
     343, 486, 90, 1401, 1816, 1734, 1881, 1307, 1845, 1414, 1241, 1157, 883, 1719, 1352, 1923,
     }},
    {1920, {
     1210, 323, 512, 1124, 412, 1188, 138, 2009, 106, 1252, 303, 1599, 1490, 116, 471, 753,
     }},
};

TEST_CASE("speech encoder codes equal transformers' MimiModel on the same weights", "[clone][codes]") {
    auto ckpt = tiny_base();
    REQUIRE(ckpt->encoder.has_value());
    const SpeechEncoder encoder(ckpt->speech_config, *ckpt->encoder);
    REQUIRE(encoder.num_codebooks() == 16);
    const CloneGolden g = golden_load(kScenarios[0]);
    for (const HfCase& c : kHfMimiCodes) {
        REQUIRE(c.samples <= g.audio.size());
        const qtts::cpu::SpeechCodes codes = encoder.encode(g.audio.data(), c.samples);
        REQUIRE(codes.frames == int((c.samples + 1919) / 1920));
        REQUIRE(codes.values.size() == c.codes.size());
        int mismatches = 0;
        for (size_t i = 0; i < c.codes.size(); ++i) mismatches += codes.values[i] != c.codes[i];
        std::printf("[%zu samples] codes vs transformers MimiModel: %d of %zu differ\n", c.samples, mismatches,
                    c.codes.size());
        CHECK(mismatches == 0);
    }
}

TEST_CASE("speech encoder: the first frame equals ref_codes exactly", "[clone][codes]") {
    // The first frame's 16 codes are sensitive to a 1% change of the latent (the deep residual
    // stages have small margins), so this is a real check of the SEANet, the transformer at the
    // first positions, the replicate-padded downsample and both RVQ branches.
    auto ckpt = tiny_base();
    const SpeechEncoder encoder(ckpt->speech_config, *ckpt->encoder);
    for (const char* scenario : kScenarios) {
        const CloneGolden g = golden_load(scenario);
        const qtts::cpu::SpeechCodes codes = encoder.encode(g.audio.data(), g.audio.size());
        REQUIRE(codes.frames == g.code_frames);
        CHECK(count_code_mismatches(codes.values, g.codes, 16) == 0);
    }
}

TEST_CASE("speech encoder with the config's RoPE table: codes equal ref_codes (all frames)", "[clone][codes]") {
    auto ckpt = tiny_base();
    const SpeechEncoder encoder(ckpt->speech_config, *ckpt->encoder);
    for (const char* scenario : kScenarios) {
        const CloneGolden g = golden_load(scenario);
        const qtts::cpu::SpeechCodes codes = encoder.encode(g.audio.data(), g.audio.size());
        REQUIRE(codes.frames == g.code_frames);
        REQUIRE(codes.num_codebooks == 16);
        const int mismatches = count_code_mismatches(codes.values, g.codes, g.codes.size());
        std::printf("[%s] codes vs ref_codes: %d frames x 16, %d of %zu differ\n", scenario, codes.frames, mismatches,
                    g.codes.size());
        CHECK(mismatches == 0);
    }
}

TEST_CASE("ref_codes pin the encoder's RoPE table: another rope_theta misses them after frame 0", "[clone][codes]") {
    // RoPE is the identity at position 0, so frame 0 matches whatever the table; later frames
    // only with the config's. This makes the comparison above a check of the rotary table too.
    auto ckpt = tiny_base();
    qtts::SpeechTokenizerConfig detuned = ckpt->speech_config;
    detuned.encoder.rope_theta *= 0.5;
    const SpeechEncoder encoder(detuned, *ckpt->encoder);
    const CloneGolden g = golden_load(kScenarios[0]);
    const qtts::cpu::SpeechCodes codes = encoder.encode(g.audio.data(), g.audio.size());
    REQUIRE(codes.frames == g.code_frames);
    REQUIRE(codes.frames > 1);
    const int frame0 = count_code_mismatches(codes.values, g.codes, 16);
    const std::vector<int32_t> later(codes.values.begin() + 16, codes.values.end());
    const std::vector<int64_t> later_expected(g.codes.begin() + 16, g.codes.end());
    const int mismatches = count_code_mismatches(later, later_expected, later.size());
    std::printf("codes (half rope_theta) vs ref_codes: frame 0 %d of 16 differ, frames 1.. %d of %zu differ\n", frame0,
                mismatches, later.size());
    CHECK(frame0 == 0);
    CHECK(mismatches > int(later.size()) / 10);  // 96 of 304 measured: RoPE moves many codes
}

TEST_CASE("speech encoder is causal: a prefix encodes to the leading frames", "[clone][codes]") {
    auto ckpt = tiny_base();
    const SpeechEncoder encoder(ckpt->speech_config, *ckpt->encoder);
    const CloneGolden g = golden_load(kScenarios[0]);
    const qtts::cpu::SpeechCodes full = encoder.encode(g.audio.data(), g.audio.size());
    // Frame j depends on samples before (j+1)·1920 only.
    for (int keep : {1, 7, 19}) {
        const qtts::cpu::SpeechCodes codes = encoder.encode(g.audio.data(), size_t(keep) * 1920);
        REQUIRE(codes.frames == keep);
        CHECK(std::equal(codes.values.begin(), codes.values.end(), full.values.begin()));
    }
    // A partial last frame is completed with zeros: the whole frames before it are unchanged and
    // the count is ceil(N / 1920).
    const qtts::cpu::SpeechCodes partial = encoder.encode(g.audio.data(), 19 * 1920 + 700);
    REQUIRE(partial.frames == 20);
    CHECK(std::equal(partial.values.begin(), partial.values.begin() + 19 * 16, full.values.begin()));
    for (int32_t c : partial.values) {
        CHECK(c >= 0);
        CHECK(c < 2048);
    }
}

TEST_CASE("a sliding window wider than the clip changes nothing", "[clone][codes]") {
    auto ckpt = tiny_base();
    const CloneGolden g = golden_load(kScenarios[0]);
    const SpeechEncoder full(ckpt->speech_config, *ckpt->encoder);
    qtts::cpu::SpeechEncoderOptions options;
    options.attention_window = 40;  // the clip is 40 frames at 25 Hz
    const SpeechEncoder windowed(ckpt->speech_config, *ckpt->encoder, options);
    CHECK(windowed.encode(g.audio.data(), g.audio.size()).values == full.encode(g.audio.data(), g.audio.size()).values);
    // A narrow window must change something, or the option would not be wired.
    options.attention_window = 2;
    const SpeechEncoder narrow(ckpt->speech_config, *ckpt->encoder, options);
    CHECK(narrow.encode(g.audio.data(), g.audio.size()).values != full.encode(g.audio.data(), g.audio.size()).values);
}

TEST_CASE("the cloning encoders run on several threads at once", "[clone][threads]") {
    auto ckpt = tiny_base();
    const SpeakerEncoder speaker(*ckpt->config.speaker_encoder, *ckpt->speaker_encoder);
    const SpeechEncoder speech(ckpt->speech_config, *ckpt->encoder);
    const CloneGolden g = golden_load(kScenarios[0]);
    const std::vector<float> serial_embedding = speaker.embed_audio(g.audio.data(), g.audio.size());
    const qtts::cpu::SpeechCodes serial_codes = speech.encode(g.audio.data(), g.audio.size());
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
        CHECK(codes[i].values == serial_codes.values);
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
