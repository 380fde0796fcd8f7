// Random-weight checkpoints in the official Hugging Face layout, at the real dimensions.
//
// Used for benchmarks (speed does not depend on the weights' values), for tests of full-size
// code paths, and as the embedded default model (`tiny-customvoice`) so that qtts speaks out
// of the box without downloading anything. The tokenizer written is a byte-level vocabulary
// (256 byte tokens, no merges) plus the real added-token ids 151643..151675.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/config.h"

namespace qtts {

struct ModelPreset {
    std::string name;
    ModelConfig config;
    SpeechTokenizerConfig speech_config;
    GenerationConfig generation;
};

// Known presets: tiny-customvoice, 0.6b-customvoice, 0.6b-base, 1.7b-customvoice,
// 1.7b-voicedesign, 1.7b-base. Throws ERROR_INVALID_ARGUMENT listing them otherwise.
ModelPreset model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

struct MakeModelStats {
    size_t model_bytes = 0;
    size_t speech_bytes = 0;
    double seconds = 0.0;
};

// Writes config.json, generation_config.json, model.safetensors (bf16),
// speech_tokenizer/{config.json, model.safetensors (fp32)}, vocab.json, merges.txt and
// tokenizer_config.json into out_dir (created if needed). The text tokenizer is the demo's
// byte-level one (a 20-word sentence is ~110 tokens), or, with tokenizer_from, the vocab.json,
// merges.txt and tokenizer_config.json of that directory (a real checkpoint's: prompts as long as
// the real model's, e.g. for benchmarks); a file missing there throws ERROR_INVALID_ARGUMENT.
MakeModelStats model_write_random(const ModelPreset& preset, const std::string& out_dir, uint64_t seed,
                                  const std::string& tokenizer_from = {});

// The embedded default model: <cache>/tiny-customvoice-v2, generated on first use.
// cache = $QTTS_CACHE_DIR, else $XDG_CACHE_HOME/qtts, else ~/.cache/qtts.
std::string default_model_dir();

// The 33 added tokens of the Qwen3-TTS tokenizer (id, content, special).
struct AddedTokenSpec {
    int id;
    const char* content;
    bool special;
};
const std::vector<AddedTokenSpec>& qwen3_tts_added_tokens();

}  // namespace qtts
