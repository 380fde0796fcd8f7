// qtts make-model --preset P --out DIR [--seed N]: a random-weight checkpoint at real size.
#include <cstdio>

#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/model/make_model.h"
#include "engine/text/request_check.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;

std::string presets_join() {
    std::string names;
    for (const auto& n : qtts::model_preset_names()) names += (names.empty() ? "" : ", ") + n;
    return names;
}

int cmd_make_model(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"preset", "out", "seed", "tokenizer-from"}, {"help"});
    if (args.has("help")) {
        std::printf("usage: qtts make-model --preset P --out DIR [--seed N] [--tokenizer-from DIR]\n  presets: %s\n"
                    "  writes a random-weight checkpoint in the official Hugging Face layout\n"
                    "  --tokenizer-from DIR  copy vocab.json, merges.txt and tokenizer_config.json from DIR (a real\n"
                    "                        checkpoint) instead of the demo's byte-level tokenizer: real prompt lengths\n",
                    presets_join().c_str());
        return 0;
    }
    if (!args.get("preset"))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing --preset P (one of: {})", presets_join());
    if (!args.get("out"))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing --out DIR: the folder to write the checkpoint into");
    if (!args.positional().empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unexpected argument '{}'", args.positional().front());
    const auto preset = qtts::model_preset(*args.get("preset"));
    const uint64_t seed = args.get("seed") ? qtts::seed_parse(*args.get("seed")) : 1234;
    const auto stats = qtts::model_write_random(preset, *args.get("out"), seed, args.get_or("tokenizer-from", ""));
    std::printf("wrote %s (%s): model.safetensors %.1f MB, speech_tokenizer/model.safetensors %.1f MB in %.2f s\n",
                args.get("out")->c_str(), preset.name.c_str(), stats.model_bytes / 1e6, stats.speech_bytes / 1e6,
                stats.seconds);
    return 0;
}

}  // namespace

QTTS_COMMAND("make-model", "write a random-weight checkpoint (tiny or full size) in the official layout", cmd_make_model);
