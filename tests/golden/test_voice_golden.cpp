// Base voice cloning end to end on tiny-base (../shared/reference): a voice made from the
// golden reference clip (written to a WAV file) carries the golden x-vector; greedy x-vector and
// in-context (ICL) runs through saved voices give the golden codes and audio (the reference
// codes are the decoder's left context and are cut off); the clear errors around voices; and an
// in-context clone's start sliced against a playing stream on cpu-fast (its reference codes and
// prompt a piece a round) speaking as when started whole.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audio_io/audio_file.h"
#include "audio_io/wav_writer.h"
#include "engine/common/error.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/runtime/speech_model.h"
#include "engine/runtime/utterance.h"
#include "engine/runtime/voice.h"
#include "engine/cpu/speech_decoder.h"
#include "test_engine_batching.h"
#include "test_errors.h"
#include "test_support.h"

namespace {

using qtts_test::require_error;

using qtts::ErrorCode;

// tiny-base on the CPU backend, as a user loads it.
std::shared_ptr<const qtts::SpeechModel> tiny_base() {
    static auto model = [] {
        qtts::BackendOptions options;
        options.name = "cpu";
        return qtts::SpeechModel::load(qtts_test::reference_model_dir("tiny-base"), options);
    }();
    return model;
}

nlohmann::json scenario_spec(const std::string& name) {
    std::ifstream in(qtts_test::reference_dir() + "/golden/scenarios.json");
    const nlohmann::json all = nlohmann::json::parse(in);
    for (const auto& s : all.at("tiny-base"))
        if (s.at("name") == name) return s;
    FAIL("scenario " << name << " missing from scenarios.json");
    return {};
}

std::vector<int32_t> to_i32(const std::vector<int64_t>& v) { return std::vector<int32_t>(v.begin(), v.end()); }

// The golden reference clip as a float WAV in the temp folder.
std::string reference_wav(const qtts::SafetensorsFile& golden) {
    const std::string path = qtts_test::temp_dir() + "/reference.wav";
    const std::vector<float> audio = qtts::tensor_to_f32(golden.get("ref_audio"));
    qtts::WavWriter wav(path, 24000, 1, qtts::WavFormat::WAV_FORMAT_F32);
    wav.write(audio);
    wav.close();
    return path;
}

// A voice holding the golden's own x-vector (and, for ICL, its ref_codes and ref_ids).
qtts::Voice golden_voice(const qtts::SafetensorsFile& golden, const nlohmann::json& spec) {
    const qtts::Checkpoint& ckpt = tiny_base()->checkpoint();
    qtts::Voice v;
    v.tts_model_type = qtts::model_type_name(ckpt.config.type);
    v.size_tag = ckpt.config.size_tag;
    v.hidden_size = ckpt.config.talker.hidden_size;
    v.fingerprint = qtts::voice_fingerprint(ckpt);
    v.x_vector = qtts::tensor_to_f32(golden.get("ref_speaker_embedding"));
    v.x_vector_only = !spec.at("icl").get<bool>();
    if (!v.x_vector_only) {
        const auto& codes = golden.get("ref_codes");
        v.ref_frames = int(codes.shape[0]);
        v.ref_codes = to_i32(qtts::tensor_to_i64(codes));
        v.ref_ids = spec.at("ref_ids").get<std::vector<int32_t>>();
        v.ref_text = spec.at("ref_text").get<std::string>();
    }
    return v;
}

}  // namespace

TEST_CASE("a voice made from the reference clip carries the golden x-vector and transcript ids", "[voice][golden]") {
    const auto model = tiny_base();
    const nlohmann::json spec = scenario_spec("base-icl-stream");
    const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-base", "base-icl-stream"));
    const std::string wav = reference_wav(*golden);
    const std::vector<int32_t> ref_ids = spec.at("ref_ids").get<std::vector<int32_t>>();
    const std::string ref_text = spec.at("ref_text").get<std::string>();  // the transcript the reference was given
    REQUIRE_FALSE(ref_text.empty());

    const std::vector<float> audio = qtts::audio_read_mono_24k(wav);
    const qtts::Voice voice = qtts::voice_create(*model, audio, ref_text, false);
    const std::vector<float> expected = qtts::tensor_to_f32(golden->get("ref_speaker_embedding"));
    REQUIRE(voice.x_vector.size() == expected.size());
    const double rel = qtts_test::rel_error(voice.x_vector.data(), expected.data(), expected.size());
    std::printf("  x-vector from the WAV: relative error %.2e\n", rel);
    CHECK(rel < 1e-4);
    CHECK(voice.ref_ids == ref_ids);
    CHECK(voice.ref_text == ref_text);
    const auto& golden_codes = golden->get("ref_codes");
    REQUIRE(voice.ref_frames == int(golden_codes.shape[0]));
    const std::vector<int64_t> codes = qtts::tensor_to_i64(golden_codes);
    // Only frame 0 of the golden ref_codes is reproducible (docs/voice-cloning.md).
    for (int g = 0; g < 16; ++g) CHECK(voice.ref_codes[size_t(g)] == codes[size_t(g)]);

    // Saved, loaded and accepted by the same model.
    const std::string path = qtts_test::temp_dir() + "/clip.qv";
    qtts::voice_save(voice, path);
    const qtts::Voice loaded = qtts::voice_load(path);
    CHECK(loaded.x_vector == voice.x_vector);
    CHECK(loaded.ref_codes == voice.ref_codes);
    CHECK(loaded.ref_ids == voice.ref_ids);
    CHECK_NOTHROW(qtts::voice_check_compatible(loaded, model->checkpoint()));

    // x-vector-only: no transcript needed, no ICL data stored.
    const qtts::Voice xvec = qtts::voice_create(*model, audio, "", true);
    CHECK(xvec.x_vector == voice.x_vector);
    CHECK(xvec.ref_frames == 0);
    CHECK(xvec.ref_ids.empty());

    // A request with reference audio fills the prompt the same way a saved voice does.
    qtts::SpeechRequest req;
    req.text = "Hello world.";
    req.ref_audio = audio;  // the clip as the CLI and server hand it over: decoded samples
    req.ref_text = ref_text;
    const qtts::PreparedSpeech prep = model->prepare(req);
    CHECK(prep.base.x_vector == voice.x_vector);
    CHECK(prep.base.ref_codes == voice.ref_codes);
    CHECK(prep.base.ref_ids == ref_ids);
    req.x_vector_only = true;
    const qtts::PreparedSpeech prep_x = model->prepare(req);
    CHECK(prep_x.base.x_vector == voice.x_vector);
    CHECK(prep_x.base.ref_frames == 0);
    CHECK(prep_x.base.ref_ids.empty());
}

// Saved voices made from the golden x-vector / reference codes, run greedily through
// SpeechModel + Utterance (voice file -> prompt -> talker/predictor -> warm streaming decoder).
TEST_CASE("greedy runs through saved voices give the golden codes and audio", "[voice][golden]") {
    const auto model = tiny_base();
    for (const char* name : {"base-xvec-stream", "base-icl-stream", "base-icl-nonstream"}) {
        INFO("scenario " << name);
        const nlohmann::json spec = scenario_spec(name);
        const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-base", name));
        const std::string path = qtts_test::temp_dir() + "/" + name + ".qv";
        qtts::voice_save(golden_voice(*golden, spec), path);

        qtts::SpeechRequest req;
        req.voice_path = path;
        qtts::SpeechRequestDebug ids;  // the scenario's own ids, not re-tokenized text
        ids.input_ids = spec.at("input_ids").get<std::vector<int32_t>>();
        req.language = spec.at("language").get<std::string>();
        req.text_layout = spec.at("non_streaming").get<bool>() ? qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING
                                                               : qtts::TextLayout::TEXT_LAYOUT_STREAMING;
        req.greedy = true;
        const int N = spec.at("max_frames").get<int>();
        req.max_frames = N - 1;  // the last sampled codebook-0 token is never expanded
        qtts::Utterance utt(model, model->prepare(req, ids));

        std::vector<float> pcm;
        std::vector<qtts::FrameCodes> frames;
        int first = 1;  // a 1-frame first chunk, then 4 (the engine's default shape)
        while (utt.chunk(first, &pcm, &frames) != qtts::UtteranceStatus::UTTERANCE_DONE) first = 4;

        const std::vector<int64_t> golden_codes = qtts::tensor_to_i64(golden->get("codes"));
        REQUIRE(frames.size() * 16 == golden_codes.size());
        int mismatches = 0;
        for (size_t f = 0; f < frames.size(); ++f)
            for (size_t g = 0; g < 16; ++g) mismatches += int64_t(frames[f][g]) != golden_codes[f * 16 + g];
        if (mismatches) {
            std::string got;
            for (size_t g = 0; g < 16; ++g) got += std::to_string(frames[0][g]) + " ";
            std::printf("  %s frame 0: %s\n", name, got.c_str());
        }
        CHECK(mismatches == 0);

        // The reference frames were decoded as left context only: the output is exactly the
        // golden tail of decode(ref_codes ++ codes).
        const std::vector<float> audio = qtts::tensor_to_f32(golden->get("audio"));
        REQUIRE(pcm.size() == audio.size());
        const double err = qtts_test::max_abs_error(pcm.data(), audio.data(), audio.size());
        std::printf("  %s: %zu frames identical, audio max abs error %.2e\n", name, frames.size(), err);
        CHECK(err < 1e-4);
    }
}

// The reference codes as the decoder's left context (what ChunkGenerator::reference_decode does for ICL).
TEST_CASE("the reference codes as decoder left context give the golden ICL audio", "[voice][golden]") {
    const qtts::cpu::CpuSpeechDecoder decoder(*qtts::checkpoint_load(qtts_test::reference_model_dir("tiny-base")));
    const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-base", "base-icl-stream"));
    const std::vector<int32_t> codes = to_i32(qtts::tensor_to_i64(golden->get("codes")));
    const std::vector<float> audio = qtts::tensor_to_f32(golden->get("audio"));
    // Decoding the generated codes from a fresh decoder state must not already match the
    // golden, otherwise this test could not catch a missing warm-up.
    const std::vector<float> cold = decoder.decode_full(codes.data(), int(codes.size() / 16));
    REQUIRE(cold.size() == audio.size());
    CHECK(qtts_test::max_abs_error(cold.data(), audio.data(), audio.size()) > 1e-3);

    // Warm-up as the backend does it: the reference codes decoded into the streaming state,
    // their audio dropped, then the generated codes in chunks of 1 and 4 frames.
    const std::vector<int32_t> ref = to_i32(qtts::tensor_to_i64(golden->get("ref_codes")));
    qtts::cpu::DecoderState state = decoder.state_new();
    std::vector<float> discarded, warm;
    decoder.decode(state, ref.data(), int(ref.size() / 16), &discarded);
    const int frames = int(codes.size() / 16);
    for (int f = 0; f < frames;) {
        const int n = std::min(f == 0 ? 1 : 4, frames - f);
        decoder.decode(state, codes.data() + size_t(f) * 16, n, &warm);
        f += n;
    }
    REQUIRE(warm.size() == audio.size());
    const double err = qtts_test::max_abs_error(warm.data(), audio.data(), audio.size());
    std::printf("  warm streaming decode vs golden tail: max abs error %.2e\n", err);
    CHECK(err < 1e-4);
}

TEST_CASE("voice errors: missing voice, bad audio, foreign voice, missing transcript", "[voice][golden]") {
    const auto model = tiny_base();
    const std::string dir = qtts_test::temp_dir();
    qtts::SpeechRequest req;
    req.text = "Hello world.";

    require_error([&] { model->prepare(req); }, ErrorCode::ERROR_INVALID_ARGUMENT, "need a voice");

    // Reference clips reach the engine as samples: the caller (CLI, server) decodes the file, so
    // file errors come from the decoder and content errors from prepare().
    std::string clip;
    const auto prepare_clip = [&] {
        req.ref_audio = qtts::audio_read_mono_24k(clip);
        return model->prepare(req);
    };

    clip = dir + "/no-such.wav";
    req.x_vector_only = true;
    require_error([&] { prepare_clip(); }, ErrorCode::ERROR_NOT_FOUND, "no-such.wav");
    {
        std::ofstream f(dir + "/not-audio.wav");
        f << "this is plain text, not audio\n";
    }
    clip = dir + "/not-audio.wav";
    CHECK_THROWS_AS(prepare_clip(), qtts::Error);
    {
        // 10 ms of audio: too short for the speaker encoder.
        qtts::WavWriter wav(dir + "/short.wav", 24000, 1, qtts::WavFormat::WAV_FORMAT_F32);
        wav.write(qtts_test::random_floats(240, 3, -0.5f, 0.5f));
        wav.close();
    }
    clip = dir + "/short.wav";
    require_error([&] { prepare_clip(); }, ErrorCode::ERROR_INVALID_ARGUMENT, "accepts 1 to 30 s");
    {
        // 31 s: longer than the in-context prompt allows.
        qtts::WavWriter wav(dir + "/long.wav", 24000, 1, qtts::WavFormat::WAV_FORMAT_F32);
        wav.write(qtts_test::random_floats(24000 * 31, 4, -0.5f, 0.5f));
        wav.close();
    }
    clip = dir + "/long.wav";
    require_error([&] { prepare_clip(); }, ErrorCode::ERROR_INVALID_ARGUMENT, "31.00 s long");
    {
        // 2 s of digital silence, and 2 s of near-silence (-90 dBFS noise).
        qtts::WavWriter wav(dir + "/silent.wav", 24000, 1, qtts::WavFormat::WAV_FORMAT_F32);
        wav.write(std::vector<float>(48000, 0.0f));
        wav.close();
        qtts::WavWriter quiet(dir + "/quiet.wav", 24000, 1, qtts::WavFormat::WAV_FORMAT_F32);
        quiet.write(qtts_test::random_floats(48000, 6, -5e-5f, 5e-5f));
        quiet.close();
    }
    clip = dir + "/silent.wav";
    require_error([&] { prepare_clip(); }, ErrorCode::ERROR_INVALID_ARGUMENT, "silent");
    clip = dir + "/quiet.wav";
    require_error([&] { prepare_clip(); }, ErrorCode::ERROR_INVALID_ARGUMENT, "silent");
    {
        // A WAV header with no samples.
        qtts::WavWriter wav(dir + "/empty.wav", 24000, 1, qtts::WavFormat::WAV_FORMAT_F32);
        wav.close();
    }
    clip = dir + "/empty.wav";
    CHECK_THROWS_AS(prepare_clip(), qtts::Error);

    // ICL without a transcript.
    const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-base", "base-icl-stream"));
    clip = reference_wav(*golden);
    req.x_vector_only = false;
    req.ref_text = "  ";
    require_error([&] { prepare_clip(); }, ErrorCode::ERROR_INVALID_ARGUMENT, "transcript");

    // A voice made for another model (other weights, other size) is refused.
    qtts::Voice voice = golden_voice(*golden, scenario_spec("base-icl-stream"));
    voice.fingerprint = "00000000deadbeef";
    qtts::voice_save(voice, dir + "/foreign.qv");
    qtts::SpeechRequest vreq;
    vreq.text = "Hello world.";
    vreq.voice_path = dir + "/foreign.qv";
    require_error([&] { model->prepare(vreq); }, ErrorCode::ERROR_INVALID_ARGUMENT, "other weights");
    voice = golden_voice(*golden, scenario_spec("base-icl-stream"));
    voice.size_tag = "1b7";
    qtts::voice_save(voice, dir + "/foreign-size.qv");
    vreq.voice_path = dir + "/foreign-size.qv";
    require_error([&] { model->prepare(vreq); }, ErrorCode::ERROR_INVALID_ARGUMENT, "made for another model");

    // A corrupt voice file reaches the caller as a format error.
    {
        std::ofstream f(dir + "/corrupt.qv");
        f << "QTTSVOICE";
    }
    vreq.voice_path = dir + "/corrupt.qv";
    require_error([&] { model->prepare(vreq); }, ErrorCode::ERROR_FORMAT, "corrupt.qv");

    // Voices belong to Base models only.
    auto custom = qtts::SpeechModel::load(qtts_test::reference_model_dir("tiny-customvoice"));
    qtts::SpeechRequest creq;
    creq.text = "Hello world.";
    creq.voice_path = dir + "/foreign.qv";
    require_error([&] { custom->prepare(creq); }, ErrorCode::ERROR_INVALID_ARGUMENT, "Base");
    require_error([&] { qtts::voice_create(*custom, qtts_test::random_floats(24000, 5), "hi", true); },
                  ErrorCode::ERROR_UNSUPPORTED, "Base model");
}

// Sliced starts (docs/engine.md, "Sliced starts") on an in-context clone: its first start decodes
// the reference codes into its decoder state and prefills its prompt. With another stream
// playing and slices of 4 rows (a steady chunk's 4 reference frames a round), both run a piece a
// round on cpu-fast; its codes are bitwise those of an engine that starts it whole, its audio
// within float rounding (the reference decoded in 4-frame pieces instead of at once).
TEST_CASE("cpu-fast sliced starts take an in-context clone's reference codes a chunk a round", "[voice][golden][slice]") {
    const std::string dir = qtts_test::temp_dir() + "/sliced-voices";
    std::filesystem::create_directories(dir);
    std::vector<qtts::SpeechRequest> requests(2);
    const char* scenarios[] = {"base-xvec-stream", "base-icl-stream"};
    int ref_frames = 0;
    for (size_t i = 0; i < 2; ++i) {
        const nlohmann::json spec = scenario_spec(scenarios[i]);
        const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-base", scenarios[i]));
        const qtts::Voice voice = golden_voice(*golden, spec);
        if (i == 1) ref_frames = voice.ref_frames;
        const std::string path = dir + "/" + scenarios[i] + ".qv";
        qtts::voice_save(voice, path);
        requests[i].voice_path = path;
        requests[i].language = spec.at("language").get<std::string>();
        requests[i].greedy = true;
        requests[i].seed = 5;
    }
    requests[0].text = "This stream plays on while the cloned voice starts.";
    requests[0].max_frames = 60;
    requests[1].text = "A cloned voice.";
    requests[1].max_frames = 8;
    REQUIRE(ref_frames >= 8);
    qtts::EngineOptions whole;
    whole.model_dir = qtts_test::reference_model_dir("tiny-base");
    whole.backend.name = "cpu-fast";
    whole.max_streams = 2;
    whole.prefill_slice = 0;
    qtts::EngineOptions sliced = whole;
    sliced.prefill_slice = 4;
    sliced.prefill_slice_by_deadline = false;
    qtts::EngineStats whole_stats, sliced_stats;
    const auto reference = qtts_test::speak_joining(whole, requests, std::chrono::milliseconds(30), &whole_stats);
    const auto heard = qtts_test::speak_joining(sliced, requests, std::chrono::milliseconds(30), &sliced_stats);
    CHECK(whole_stats.prefill_slices == 0);
    CHECK(sliced_stats.sliced_starts == 1);
    // ceil(ref_frames / 4) reference pieces, then the prompt's rows in slices of 4.
    CHECK(sliced_stats.prefill_slices >= (ref_frames + 3) / 4 + 1);
    WARN(ref_frames << " reference frames; the clone's start took " << sliced_stats.prefill_slices << " slices");
    for (size_t i = 0; i < requests.size(); ++i) {
        INFO("stream " << i);
        CHECK(heard[i].error.empty());
        CHECK(heard[i].stop == reference[i].stop);
        REQUIRE(!reference[i].codes.empty());
        CHECK(heard[i].codes == reference[i].codes);
        REQUIRE(heard[i].pcm.size() == reference[i].pcm.size());
        CHECK(qtts_test::max_abs_error(heard[i].pcm.data(), reference[i].pcm.data(), reference[i].pcm.size()) < 1e-5);
    }
}
