#include "engine/model/make_model.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"

namespace qtts {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::vector<AddedTokenSpec>& qwen3_tts_added_tokens() {
    static const std::vector<AddedTokenSpec> tokens = {
        {151643, "<|endoftext|>", true},     {151644, "<|im_start|>", true},       {151645, "<|im_end|>", true},
        {151646, "<|object_ref_start|>", true}, {151647, "<|object_ref_end|>", true}, {151648, "<|box_start|>", true},
        {151649, "<|box_end|>", true},       {151650, "<|quad_start|>", true},     {151651, "<|quad_end|>", true},
        {151652, "<|vision_start|>", true},  {151653, "<|vision_end|>", true},     {151654, "<|vision_pad|>", true},
        {151655, "<|image_pad|>", true},     {151656, "<|video_pad|>", true},      {151657, "<tool_call>", false},
        {151658, "</tool_call>", false},     {151659, "<|fim_prefix|>", false},    {151660, "<|fim_middle|>", false},
        {151661, "<|fim_suffix|>", false},   {151662, "<|fim_pad|>", false},       {151663, "<|repo_name|>", false},
        {151664, "<|file_sep|>", false},     {151665, "<tool_response>", false},   {151666, "</tool_response>", false},
        {151667, "<think>", false},          {151668, "</think>", false},          {151669, "<|audio_start|>", true},
        {151670, "<|audio_end|>", true},     {151671, "<tts_pad>", true},          {151672, "<tts_text_bos>", true},
        {151673, "<tts_text_eod>", true},    {151674, "<tts_text_bos_single>", true}, {151675, "<|audio_pad|>", true},
    };
    return tokens;
}

namespace {

void set_languages(TalkerConfig* t, bool with_dialects) {
    t->language_ids = {{"chinese", 2055}, {"english", 2050}, {"german", 2053},   {"italian", 2070}, {"portuguese", 2071},
                       {"spanish", 2054}, {"japanese", 2058}, {"korean", 2064}, {"french", 2061},  {"russian", 2069}};
    if (with_dialects) {
        t->language_ids["beijing_dialect"] = 2074;
        t->language_ids["sichuan_dialect"] = 2062;
    }
}

void set_custom_voice_speakers(TalkerConfig* t) {
    t->speaker_ids = {{"serena", 3066}, {"vivian", 3065}, {"uncle_fu", 3010}, {"ryan", 3061}, {"aiden", 2861},
                      {"ono_anna", 2873}, {"sohee", 2864}, {"eric", 2875}, {"dylan", 2878}};
    t->speaker_dialect.clear();
    for (const auto& [name, id] : t->speaker_ids) t->speaker_dialect[name] = "";
    t->speaker_dialect["eric"] = "sichuan_dialect";
    t->speaker_dialect["dylan"] = "beijing_dialect";
}

void set_transformer(TransformerConfig* c, int hidden, int inter, int layers, int heads, int kv, int head_dim,
                     int vocab, int max_pos) {
    c->hidden_size = hidden;
    c->intermediate_size = inter;
    c->num_layers = layers;
    c->num_heads = heads;
    c->num_kv_heads = kv;
    c->head_dim = head_dim;
    c->rms_norm_eps = 1e-6f;
    c->rope_theta = 1e6;
    c->vocab_size = vocab;
    c->max_position_embeddings = max_pos;
}

SpeechTokenizerConfig real_speech_config() { return SpeechTokenizerConfig{}; }  // defaults = the real release

SpeechTokenizerConfig tiny_speech_config() {
    SpeechTokenizerConfig s;
    DecoderConfig& d = s.decoder;
    d.codebook_dim = 32;
    d.latent_dim = 48;
    d.decoder_dim = 96;
    d.hidden_size = 32;
    d.intermediate_size = 64;
    d.head_dim = 8;
    d.num_heads = 4;
    d.num_kv_heads = 4;
    d.num_layers = 2;
    EncoderConfig& e = s.encoder;
    e.num_filters = 8;
    e.hidden_size = 32;
    e.num_layers = 2;
    e.num_heads = 4;
    e.num_kv_heads = 4;
    e.head_dim = 8;
    e.intermediate_size = 64;
    e.codebook_dim = 16;
    return s;
}

ModelPreset make_preset(const std::string& name) {
    ModelPreset p;
    p.name = name;
    ModelConfig& c = p.config;
    TalkerConfig& t = c.talker;
    t.mrope_section = {24, 20, 20};
    t.rope_interleaved = true;
    t.text_vocab_size = 151936;
    t.num_code_groups = 16;
    t.code_predictor.num_code_groups = 16;

    bool is_tiny = name == "tiny-customvoice";
    bool is_06 = name.rfind("0.6b-", 0) == 0;
    bool is_17 = name.rfind("1.7b-", 0) == 0;
    std::string variant = is_tiny ? "customvoice" : name.substr(5);
    if (!(is_tiny || is_06 || is_17) ||
        (variant != "customvoice" && variant != "voicedesign" && variant != "base") || (is_06 && variant == "voicedesign")) {
        std::string known;
        for (const auto& n : model_preset_names()) known += (known.empty() ? "" : ", ") + n;
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown preset '{}' (known: {})", name, known);
    }

    if (is_tiny) {
        set_transformer(&t, 64, 128, 2, 4, 2, 16, 3072, 32768);
        set_transformer(&t.code_predictor, 64, 96, 2, 4, 2, 16, 2048, 65536);
        t.text_hidden_size = 16;
        t.mrope_section = {4, 2, 2};
        c.size_tag = "0b6";
        p.speech_config = tiny_speech_config();
    } else {
        const int H = is_06 ? 1024 : 2048, I = is_06 ? 3072 : 6144;
        set_transformer(&t, H, I, 28, 16, 8, 128, 3072, 32768);
        set_transformer(&t.code_predictor, 1024, 3072, 5, 16, 8, 128, 2048, 65536);
        t.text_hidden_size = 2048;
        c.size_tag = is_06 ? "0b6" : "1b7";
        p.speech_config = real_speech_config();
    }
    if (variant == "customvoice") {
        c.type = ModelType::MODEL_TYPE_CUSTOM_VOICE;
        set_custom_voice_speakers(&t);
        set_languages(&t, true);
    } else if (variant == "voicedesign") {
        c.type = ModelType::MODEL_TYPE_VOICE_DESIGN;
        set_languages(&t, false);
    } else {
        c.type = ModelType::MODEL_TYPE_BASE;
        set_languages(&t, false);
        SpeakerEncoderConfig s;
        s.enc_dim = t.hidden_size;
        c.speaker_encoder = s;
    }
    return p;
}

// splitmix64: seeds; xoshiro-style mixing per element is overkill, a counter hash is enough.
inline uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t name_hash(const std::string& s) {
    uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
    return h;
}

// Value distribution for a tensor: uniform in [center - half_width, center + half_width].
struct InitRange {
    float center;
    float half_width;
};

InitRange init_range(const TensorSpec& spec) {
    using Init = TensorSpec::Init;
    const float uniform_for_unit_std = std::sqrt(3.0f);
    switch (spec.init) {
        case Init::WEIGHT: return {0.0f, uniform_for_unit_std / std::sqrt(float(spec.fan_in))};
        case Init::SMALL:
            // Residual-branch outputs and LayerScale/gamma vectors: damped so activations stay in range.
            if (spec.shape.size() == 1) return {0.05f, 0.02f};
            return {0.0f, 0.2f * uniform_for_unit_std / std::sqrt(float(spec.fan_in))};
        case Init::OUTPUT:
            // The waveform conv: small enough that random codes give speech-level audio (rms ~0.1).
            return {0.0f, 0.04f * uniform_for_unit_std / std::sqrt(float(spec.fan_in))};
        case Init::NORM_ONE: return {1.0f, spec.shape.size() == 1 && spec.shape[0] == 1 ? 0.0f : 0.05f};
        case Init::ZERO: return {0.0f, 0.02f};
        case Init::LOG_SCALE: return {0.0f, 0.1f};
        case Init::USAGE: return {1.25f, 0.75f};
    }
    return {0.0f, 0.0f};
}

SafetensorsWriter::FillFn random_fill(const TensorSpec& spec, DType dtype, uint64_t seed) {
    const InitRange range = init_range(spec);
    const uint64_t key = mix64(seed ^ name_hash(spec.name));
    return [range, key, dtype](uint8_t* dst, size_t nbytes) {
        const size_t n = nbytes / dtype_size(dtype);
        uint64_t state = key;
        for (size_t i = 0; i < n; ++i) {
            state += 0x9E3779B97F4A7C15ull;
            uint64_t z = state;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            const float u = float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
            const float v = range.center + range.half_width * u;
            if (dtype == DType::DTYPE_BF16) {
                const uint16_t b = f32_to_bf16(v);
                std::memcpy(dst + 2 * i, &b, 2);
            } else {
                std::memcpy(dst + 4 * i, &v, 4);
            }
        }
    };
}

// GPT-2 byte-level alphabet in vocabulary order: the printable bytes first, then the others
// (mapped to U+0100 onwards). Id i of a Qwen2 vocabulary is entry i of this list, so "\n" = 198.
std::vector<std::string> byte_level_tokens() {
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    auto utf8 = [](int cp) {
        std::string s;
        if (cp < 0x80) {
            s.push_back(char(cp));
        } else {  // at most U+0143: two UTF-8 bytes
            s.push_back(char(0xC0 | (cp >> 6)));
            s.push_back(char(0x80 | (cp & 0x3F)));
        }
        return s;
    };
    std::vector<std::string> out;
    for (int b = 0; b < 256; ++b)
        if (printable(b)) out.push_back(utf8(b));
    int next = 256;
    for (int b = 0; b < 256; ++b)
        if (!printable(b)) out.push_back(utf8(next++));
    return out;
}

void write_text(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    if (!out) fail(ErrorCode::ERROR_IO, "{}: cannot create", path);
    out << text;
    if (!out) fail(ErrorCode::ERROR_IO, "{}: write failed", path);
}

void write_tokenizer_files(const std::string& dir) {
    json vocab = json::object();
    const auto tokens = byte_level_tokens();
    for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = int(i);
    // The prompt templates need the real ids of "assistant" (77091) and "user" (872): add them
    // with a chain of merges whose intermediate pieces take ids 256 onwards.
    std::string merges = "#version: 0.2\n";
    int next_id = 256;
    for (const auto& [word, id] : {std::pair<std::string, int>{"assistant", 77091}, {"user", 872}}) {
        std::string piece(1, word[0]);
        for (size_t i = 1; i < word.size(); ++i) {
            merges += piece + " " + word[i] + "\n";
            piece += word[i];
            if (!vocab.contains(piece)) vocab[piece] = i + 1 == word.size() ? id : next_id++;
        }
    }
    write_text(dir + "/vocab.json", vocab.dump());
    write_text(dir + "/merges.txt", merges);
    json added = json::object();
    for (const AddedTokenSpec& t : qwen3_tts_added_tokens()) {
        added[std::to_string(t.id)] = {{"content", t.content}, {"lstrip", false}, {"normalized", false},
                                       {"rstrip", false},      {"single_word", false}, {"special", t.special}};
    }
    json cfg = {{"add_bos_token", false},
                {"add_prefix_space", false},
                {"added_tokens_decoder", added},
                {"bos_token", nullptr},
                {"clean_up_tokenization_spaces", false},
                {"eos_token", "<|im_end|>"},
                {"errors", "replace"},
                {"model_max_length", 131072},
                {"pad_token", "<|endoftext|>"},
                {"split_special_tokens", false},
                {"tokenizer_class", "Qwen2Tokenizer"},
                {"unk_token", nullptr},
                {"qtts_demo_vocabulary", true}};
    write_text(dir + "/tokenizer_config.json", cfg.dump(2));
}

}  // namespace

std::vector<std::string> model_preset_names() {
    return {"tiny-customvoice", "0.6b-customvoice", "0.6b-base", "1.7b-customvoice", "1.7b-voicedesign", "1.7b-base"};
}

ModelPreset model_preset(const std::string& name) { return make_preset(name); }

MakeModelStats model_write_random(const ModelPreset& preset, const std::string& out_dir, uint64_t seed,
                                  const std::string& tokenizer_from) {
    const auto t0 = std::chrono::steady_clock::now();
    const char* const tokenizer_files[] = {"vocab.json", "merges.txt", "tokenizer_config.json"};
    if (!tokenizer_from.empty())  // checked before anything is written
        for (const char* f : tokenizer_files)
            if (!fs::is_regular_file(tokenizer_from + "/" + f))
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}: no {} to take the text tokenizer from", tokenizer_from, f);
    std::error_code ec;
    fs::create_directories(out_dir + "/speech_tokenizer", ec);
    if (ec) fail(ErrorCode::ERROR_IO, "{}: cannot create directory: {}", out_dir, ec.message());

    write_text(out_dir + "/config.json", model_config_to_json(preset.config));
    write_text(out_dir + "/generation_config.json", generation_config_to_json(preset.generation));
    write_text(out_dir + "/speech_tokenizer/config.json", speech_tokenizer_config_to_json(preset.speech_config));
    if (tokenizer_from.empty()) {
        write_tokenizer_files(out_dir);
    } else {
        for (const char* f : tokenizer_files) {
            fs::copy_file(tokenizer_from + "/" + f, out_dir + "/" + f, fs::copy_options::overwrite_existing, ec);
            if (ec) fail(ErrorCode::ERROR_IO, "{}/{}: cannot copy into {}: {}", tokenizer_from, f, out_dir, ec.message());
        }
    }

    MakeModelStats stats;
    {
        SafetensorsWriter w;
        w.set_metadata("format", "pt");
        w.set_metadata("qtts_preset", preset.name);
        w.set_metadata("qtts_seed", std::to_string(seed));
        for (const TensorSpec& spec : model_tensor_specs(preset.config))
            w.add(spec.name, DType::DTYPE_BF16, spec.shape, random_fill(spec, DType::DTYPE_BF16, seed));
        stats.model_bytes = w.write(out_dir + "/model.safetensors");
    }
    {
        SafetensorsWriter w;
        w.set_metadata("format", "pt");
        for (const TensorSpec& spec : speech_tokenizer_tensor_specs(preset.speech_config))
            w.add(spec.name, DType::DTYPE_F32, spec.shape, random_fill(spec, DType::DTYPE_F32, seed + 1));
        stats.speech_bytes = w.write(out_dir + "/speech_tokenizer/model.safetensors");
    }
    stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return stats;
}

std::string default_model_dir() {
    std::string cache;
    if (const char* env = std::getenv("QTTS_CACHE_DIR"); env && *env) {
        cache = env;
    } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
        cache = std::string(xdg) + "/qtts";
    } else if (const char* home = std::getenv("HOME"); home && *home) {
        cache = std::string(home) + "/.cache/qtts";
    } else {
        cache = (fs::temp_directory_path() / "qtts-cache").string();
    }
    const std::string dir = cache + "/tiny-customvoice-v2";
    if (fs::exists(dir + "/speech_tokenizer/model.safetensors")) return dir;

    // Write into a temporary sibling and rename, so a concurrent or interrupted first run never
    // leaves a half-written model behind.
    QTTS_LOG_INFO("writing the embedded default model (tiny-customvoice, random weights) to {}", dir);
    const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
    model_write_random(model_preset("tiny-customvoice"), tmp, 20261129);
    std::error_code ec;
    fs::rename(tmp, dir, ec);
    if (ec) {
        fs::remove_all(tmp, ec);
        if (!fs::exists(dir + "/speech_tokenizer/model.safetensors"))
            fail(ErrorCode::ERROR_IO, "cannot create the default model in {}", dir);
    }
    return dir;
}

}  // namespace qtts
