// qtts make-model --preset P --out DIR [--seed N]: a random-weight checkpoint at real size.
#include <cstdio>

#include "cli.h"
#include "model/make_model.h"

namespace {

int cmd_make_model(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"preset", "out", "seed"}, {"help"});
    if (args.has("help") || !args.get("preset") || !args.get("out")) {
        std::printf("usage: qtts make-model --preset P --out DIR [--seed N]\n  presets:");
        for (const auto& n : qtts::model_preset_names()) std::printf(" %s", n.c_str());
        std::printf("\n  writes a random-weight checkpoint in the official Hugging Face layout\n");
        return args.has("help") ? 0 : 2;
    }
    const auto preset = qtts::model_preset(*args.get("preset"));
    const auto seed = uint64_t(args.get_int("seed", 1234));
    const auto stats = qtts::model_write_random(preset, *args.get("out"), seed);
    std::printf("wrote %s (%s): model.safetensors %.1f MB, speech_tokenizer/model.safetensors %.1f MB in %.2f s\n",
                args.get("out")->c_str(), preset.name.c_str(), stats.model_bytes / 1e6, stats.speech_bytes / 1e6,
                stats.seconds);
    return 0;
}

}  // namespace

QTTS_COMMAND("make-model", "write a random-weight checkpoint (tiny or full size) in the official layout", cmd_make_model);
