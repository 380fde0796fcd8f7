// qtts voice create --model DIR --audio ref.wav --text "transcript" -o voice.qv [--x-vector-only]
// qtts voice info voice.qv
// Saved voices for the Base (voice cloning) models (docs/voice-cloning.md).
#include <cstdio>

#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/runtime/speech_model.h"
#include "engine/runtime/voice.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;

void print_usage() {
    std::printf(
        "usage: qtts voice create --model DIR --audio REF -o VOICE.qv [--text TRANSCRIPT] [--x-vector-only]\n"
        "       qtts voice info VOICE.qv\n"
        "  --model DIR       a Base checkpoint directory (the voice only works with this model)\n"
        "  --audio FILE      reference clip (WAV/FLAC/Ogg; any rate, mixed to mono, resampled to 24 kHz)\n"
        "  --text T          transcript of the clip (needed for in-context cloning)\n"
        "  -o, --out FILE    the voice file to write\n"
        "  --x-vector-only   store only the speaker x-vector (no transcript needed; weaker likeness)\n");
}

int voice_create_command(const qtts_cli::Args& args) {
    if (!args.get("model")) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing --model DIR (a Base checkpoint)");
    if (!args.get("audio")) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing --audio FILE (the reference clip)");
    if (!args.get("out")) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing -o FILE.qv (the voice file to write)");
    const bool x_vector_only = args.has("x-vector-only");
    const std::string text = args.get_or("text", "");
    if (!x_vector_only && text.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "missing --text TRANSCRIPT: in-context cloning needs what the clip says (or pass --x-vector-only)");
    // The clip first: a missing, undecodable, too short or silent one fails before the model loads.
    const std::vector<float> audio = qtts_cli::reference_clip_read(*args.get("audio"));
    // Only the tokenizer and the cloning encoders are needed: no LM conversion, no GPU upload.
    qtts::BackendOptions options;
    options.name = "cpu";
    options.lm_eager = false;
    auto model = qtts::SpeechModel::load(*args.get("model"), options);
    const qtts::Voice voice = qtts::voice_create(*model, audio, text, x_vector_only);
    qtts::voice_save(voice, *args.get("out"));
    std::printf("wrote %s: %s voice for %s %s (hidden %d), %.2f s reference, %d frames, %zu transcript ids\n",
                args.get("out")->c_str(), voice.x_vector_only ? "x-vector-only" : "in-context",
                voice.tts_model_type.c_str(), voice.size_tag.c_str(), voice.hidden_size, double(audio.size()) / qtts::SAMPLE_RATE,
                voice.ref_frames, voice.ref_ids.size());
    return 0;
}

int voice_info_command(const std::string& path) {
    const qtts::Voice voice = qtts::voice_load(path);
    std::printf("%s\n  model: %s %s, hidden size %d, fingerprint %s\n  mode: %s\n  reference: %d frames (%.2f s), "
                "%zu transcript ids\n  transcript: %s\n",
                path.c_str(), voice.tts_model_type.c_str(), voice.size_tag.c_str(), voice.hidden_size,
                voice.fingerprint.c_str(), voice.x_vector_only ? "x-vector only" : "in-context (ICL)", voice.ref_frames,
                voice.ref_frames * 0.08, voice.ref_ids.size(), voice.ref_text.c_str());
    return 0;
}

int cmd_voice(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "audio", "text", "out"}, {"help", "x-vector-only"});
    const auto& pos = args.positional();
    if (args.has("help") || pos.empty()) {
        print_usage();
        if (pos.empty() && !args.has("help")) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing subcommand: create or info");
        return 0;
    }
    if (pos[0] == "create") {
        if (pos.size() > 1) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unexpected argument '{}'", pos[1]);
        return voice_create_command(args);
    }
    if (pos[0] == "info") {
        if (pos.size() != 2) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "usage: qtts voice info VOICE.qv");
        return voice_info_command(pos[1]);
    }
    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown voice subcommand '{}' (expected create or info)", pos[0]);
}

}  // namespace

QTTS_COMMAND("voice", "create or inspect a saved voice (.qv) for Base voice-cloning models", cmd_voice);
