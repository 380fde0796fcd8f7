#include "engine/model/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/strings.h"

namespace qtts {

using json = nlohmann::json;

const char* model_type_name(ModelType type) {
    switch (type) {
        case ModelType::MODEL_TYPE_CUSTOM_VOICE: return "custom_voice";
        case ModelType::MODEL_TYPE_VOICE_DESIGN: return "voice_design";
        case ModelType::MODEL_TYPE_BASE: return "base";
    }
    return "?";
}

std::string file_read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorCode::ERROR_IO, "{}: cannot open", path);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail(ErrorCode::ERROR_IO, "{}: read error", path);
    return ss.str();
}

namespace {

json parse_json(const std::string& text, const std::string& source) {
    try {
        json j = json::parse(text);
        if (!j.is_object()) fail(ErrorCode::ERROR_FORMAT, "{}: expected a JSON object at the top level", source);
        return j;
    } catch (const json::exception& e) {
        fail(ErrorCode::ERROR_FORMAT, "{}: invalid JSON: {}", source, e.what());
    }
}

// The value as an int when it is an integer that fits one (an integral float such as 1024.0
// counts); nullopt for anything else, so 1e300 or 2^40 are refused instead of wrapped.
std::optional<int> int_fit(const json& v) {
    constexpr int lo = std::numeric_limits<int>::min();
    constexpr int hi = std::numeric_limits<int>::max();
    if (v.is_number_unsigned()) {
        const uint64_t u = v.get<uint64_t>();
        return u <= uint64_t(hi) ? std::optional<int>(int(u)) : std::nullopt;
    }
    if (v.is_number_integer()) {
        const int64_t i = v.get<int64_t>();
        return i >= lo && i <= hi ? std::optional<int>(int(i)) : std::nullopt;
    }
    if (v.is_number_float()) {
        const double d = v.get<double>();
        if (std::isfinite(d) && d == std::floor(d) && d >= lo && d <= hi) return int(d);
    }
    return std::nullopt;
}

// Reads typed values with errors that name the file and the key path.
struct Reader {
    const json& j;
    std::string source;
    std::string prefix;

    bool has(const char* key) const { return j.contains(key) && !j[key].is_null(); }

    [[noreturn]] void bad(const char* key, const char* expected) const {
        fail(ErrorCode::ERROR_FORMAT, "{}: key '{}{}' should be {}, found {}", source, prefix, key, expected,
             has(key) ? j[key].dump() : "nothing");
    }

    void num(const char* key, int* out) const {
        if (!has(key)) return;
        const std::optional<int> v = int_fit(j[key]);
        if (!v) bad(key, "an integer of at most 32 bits");
        *out = *v;
    }
    template <typename T>
    void num(const char* key, T* out) const {
        static_assert(std::is_floating_point_v<T>, "integer keys are read as int");
        if (!has(key)) return;
        if (!j[key].is_number()) bad(key, "a number");
        const double v = j[key].get<double>();
        if (!(std::fabs(v) <= double(std::numeric_limits<T>::max()))) bad(key, "a finite number");
        *out = T(v);
    }
    template <typename T>
    void num_required(const char* key, T* out) const {
        if (!has(key)) fail(ErrorCode::ERROR_FORMAT, "{}: missing required key '{}{}'", source, prefix, key);
        num(key, out);
    }
    void boolean(const char* key, bool* out) const {
        if (!has(key)) return;
        if (!j[key].is_boolean()) bad(key, "true or false");
        *out = j[key].get<bool>();
    }
    void str(const char* key, std::string* out) const {
        if (!has(key)) return;
        if (!j[key].is_string()) bad(key, "a string");
        *out = j[key].get<std::string>();
    }
    void ints(const char* key, std::vector<int>* out) const {
        if (!has(key)) return;
        if (!j[key].is_array()) bad(key, "an array of integers");
        out->clear();
        for (const json& v : j[key]) {
            const std::optional<int> i = int_fit(v);
            if (!i) bad(key, "an array of integers of at most 32 bits");
            out->push_back(*i);
        }
    }
    Reader child(const char* key) const {
        if (!has(key) || !j[key].is_object()) bad(key, "an object");
        return Reader{j[key], source, prefix + key + "."};
    }
};

void read_transformer(const Reader& r, TransformerConfig* c) {
    r.num_required("hidden_size", &c->hidden_size);
    r.num_required("intermediate_size", &c->intermediate_size);
    r.num_required("num_hidden_layers", &c->num_layers);
    r.num_required("num_attention_heads", &c->num_heads);
    c->num_kv_heads = c->num_heads;
    r.num("num_key_value_heads", &c->num_kv_heads);
    c->head_dim = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
    r.num("head_dim", &c->head_dim);
    r.num("rms_norm_eps", &c->rms_norm_eps);
    r.num("rope_theta", &c->rope_theta);
    r.num("max_position_embeddings", &c->max_position_embeddings);
    r.num_required("vocab_size", &c->vocab_size);
    std::string act = "silu";
    r.str("hidden_act", &act);
    if (act != "silu") fail(ErrorCode::ERROR_UNSUPPORTED, "{}: {}hidden_act '{}' is not supported (only silu)", r.source, r.prefix, act);
    bool bias = false;
    r.boolean("attention_bias", &bias);
    if (bias) fail(ErrorCode::ERROR_UNSUPPORTED, "{}: {}attention_bias=true is not supported", r.source, r.prefix);
}

void validate_transformer(const TransformerConfig& c, const std::string& source, const std::string& what) {
    auto positive = [&](int v, const char* name) {
        if (v <= 0) fail(ErrorCode::ERROR_FORMAT, "{}: {} {} must be positive, got {}", source, what, name, v);
    };
    positive(c.hidden_size, "hidden_size");
    positive(c.intermediate_size, "intermediate_size");
    positive(c.num_layers, "num_hidden_layers");
    positive(c.num_heads, "num_attention_heads");
    positive(c.num_kv_heads, "num_key_value_heads");
    positive(c.head_dim, "head_dim");
    positive(c.vocab_size, "vocab_size");
    if (c.num_heads % c.num_kv_heads != 0)
        fail(ErrorCode::ERROR_FORMAT, "{}: {} num_attention_heads {} is not a multiple of num_key_value_heads {}", source,
             what, c.num_heads, c.num_kv_heads);
    if (c.head_dim % 2 != 0) fail(ErrorCode::ERROR_FORMAT, "{}: {} head_dim {} must be even for RoPE", source, what, c.head_dim);
}

// spk_id values: an int or a one-element list of ints.
int speaker_id_value(const json& v, const std::string& source, const std::string& name) {
    const std::optional<int> id = int_fit(v.is_array() && v.size() == 1 ? v[0] : v);
    if (id) return *id;
    fail(ErrorCode::ERROR_FORMAT, "{}: talker_config.spk_id['{}'] should be an int or a one-element list, found {}",
         source, name, v.dump());
}

}  // namespace

ModelConfig model_config_parse(const std::string& text, const std::string& source) {
    const json j = parse_json(text, source);
    const Reader top{j, source, ""};
    ModelConfig c;

    std::string type = "custom_voice";
    top.str("tts_model_type", &type);
    if (type == "custom_voice") c.type = ModelType::MODEL_TYPE_CUSTOM_VOICE;
    else if (type == "voice_design") c.type = ModelType::MODEL_TYPE_VOICE_DESIGN;
    else if (type == "base") c.type = ModelType::MODEL_TYPE_BASE;
    else fail(ErrorCode::ERROR_UNSUPPORTED, "{}: tts_model_type '{}' is not supported (custom_voice, voice_design, base)", source, type);
    top.str("tts_model_size", &c.size_tag);
    top.num("im_start_token_id", &c.im_start_token_id);
    top.num("im_end_token_id", &c.im_end_token_id);
    top.num("tts_pad_token_id", &c.tts_pad_token_id);
    top.num("tts_bos_token_id", &c.tts_bos_token_id);
    top.num("tts_eos_token_id", &c.tts_eos_token_id);
    top.num("assistant_token_id", &c.assistant_token_id);

    const Reader tr = top.child("talker_config");
    TalkerConfig& t = c.talker;
    read_transformer(tr, &t);
    tr.num("text_vocab_size", &t.text_vocab_size);
    tr.num("text_hidden_size", &t.text_hidden_size);
    tr.num("num_code_groups", &t.num_code_groups);
    tr.num("codec_pad_id", &t.codec_pad_id);
    tr.num("codec_bos_id", &t.codec_bos_id);
    tr.num("codec_eos_token_id", &t.codec_eos_id);
    tr.num("codec_think_id", &t.codec_think_id);
    tr.num("codec_nothink_id", &t.codec_nothink_id);
    tr.num("codec_think_bos_id", &t.codec_think_bos_id);
    tr.num("codec_think_eos_id", &t.codec_think_eos_id);
    if (tr.has("rope_scaling") && tr.j["rope_scaling"].is_object()) {
        const Reader rs = tr.child("rope_scaling");
        rs.ints("mrope_section", &t.mrope_section);
        rs.boolean("interleaved", &t.rope_interleaved);
    }
    if (tr.has("spk_id")) {
        if (!tr.j["spk_id"].is_object()) tr.bad("spk_id", "an object");
        for (auto it = tr.j["spk_id"].begin(); it != tr.j["spk_id"].end(); ++it)
            t.speaker_ids[ascii_lower(it.key())] = speaker_id_value(it.value(), source, it.key());
    }
    if (tr.has("spk_is_dialect")) {
        if (!tr.j["spk_is_dialect"].is_object()) tr.bad("spk_is_dialect", "an object");
        for (auto it = tr.j["spk_is_dialect"].begin(); it != tr.j["spk_is_dialect"].end(); ++it) {
            const json& v = it.value();
            std::string dialect;
            if (v.is_string()) dialect = ascii_lower(v.get<std::string>());
            else if (!(v.is_boolean() && !v.get<bool>()) && !v.is_null())
                fail(ErrorCode::ERROR_FORMAT, "{}: talker_config.spk_is_dialect['{}'] should be false or a dialect name, found {}",
                     source, it.key(), v.dump());
            t.speaker_dialect[ascii_lower(it.key())] = dialect;
        }
    }
    if (tr.has("codec_language_id")) {
        if (!tr.j["codec_language_id"].is_object()) tr.bad("codec_language_id", "an object");
        for (auto it = tr.j["codec_language_id"].begin(); it != tr.j["codec_language_id"].end(); ++it) {
            const std::optional<int> id = int_fit(it.value());
            if (!id)
                fail(ErrorCode::ERROR_FORMAT, "{}: talker_config.codec_language_id['{}'] should be an integer", source, it.key());
            t.language_ids[ascii_lower(it.key())] = *id;
        }
    }
    validate_transformer(t, source, "talker_config");
    if (t.text_hidden_size <= 0 || t.text_vocab_size <= 0)
        fail(ErrorCode::ERROR_FORMAT, "{}: talker_config text_hidden_size/text_vocab_size must be positive", source);
    if (t.num_code_groups < 2) fail(ErrorCode::ERROR_FORMAT, "{}: talker_config.num_code_groups must be at least 2", source);
    for (const auto& [name, id] : t.speaker_ids) {
        if (id < 0 || id >= t.vocab_size)
            fail(ErrorCode::ERROR_FORMAT, "{}: speaker '{}' id {} is outside the codec vocabulary [0, {})", source, name, id, t.vocab_size);
    }
    for (const auto& [name, dialect] : t.speaker_dialect) {
        if (!dialect.empty() && !t.language_ids.count(dialect))
            fail(ErrorCode::ERROR_FORMAT, "{}: speaker '{}' has dialect '{}' which is not in codec_language_id", source, name, dialect);
    }

    const Reader cr = tr.child("code_predictor_config");
    read_transformer(cr, &t.code_predictor);
    cr.num("num_code_groups", &t.code_predictor.num_code_groups);
    validate_transformer(t.code_predictor, source, "talker_config.code_predictor_config");

    if (top.has("speaker_encoder_config")) {
        const Reader sr = top.child("speaker_encoder_config");
        SpeakerEncoderConfig s;
        sr.num("mel_dim", &s.mel_dim);
        sr.num("enc_dim", &s.enc_dim);
        sr.ints("enc_channels", &s.enc_channels);
        sr.ints("enc_kernel_sizes", &s.enc_kernel_sizes);
        sr.ints("enc_dilations", &s.enc_dilations);
        sr.num("enc_attention_channels", &s.enc_attention_channels);
        sr.num("enc_res2net_scale", &s.enc_res2net_scale);
        sr.num("enc_se_channels", &s.enc_se_channels);
        sr.num("sample_rate", &s.sample_rate);
        if (s.enc_channels.size() != 5 || s.enc_kernel_sizes.size() != 5 || s.enc_dilations.size() != 5)
            fail(ErrorCode::ERROR_FORMAT, "{}: speaker_encoder_config enc_channels/enc_kernel_sizes/enc_dilations need 5 entries", source);
        if (s.enc_res2net_scale < 2 || s.enc_channels[1] % s.enc_res2net_scale != 0)
            fail(ErrorCode::ERROR_FORMAT, "{}: speaker_encoder_config enc_res2net_scale {} must divide enc_channels[1] {}", source,
                 s.enc_res2net_scale, s.enc_channels[1]);
        c.speaker_encoder = s;
    }
    return c;
}

SpeechTokenizerConfig speech_tokenizer_config_parse(const std::string& text, const std::string& source) {
    const json j = parse_json(text, source);
    const Reader top{j, source, ""};
    SpeechTokenizerConfig c;
    top.num("encoder_valid_num_quantizers", &c.encoder_valid_num_quantizers);
    top.num("input_sample_rate", &c.input_sample_rate);
    top.num("output_sample_rate", &c.output_sample_rate);
    top.num("decode_upsample_rate", &c.decode_upsample_rate);
    top.num("encode_downsample_rate", &c.encode_downsample_rate);

    const Reader dr = top.child("decoder_config");
    DecoderConfig& d = c.decoder;
    dr.num_required("codebook_size", &d.codebook_size);
    dr.num_required("codebook_dim", &d.codebook_dim);
    dr.num_required("latent_dim", &d.latent_dim);
    dr.num_required("decoder_dim", &d.decoder_dim);
    dr.num_required("hidden_size", &d.hidden_size);
    dr.num_required("intermediate_size", &d.intermediate_size);
    dr.num("head_dim", &d.head_dim);
    dr.num_required("num_attention_heads", &d.num_heads);
    d.num_kv_heads = d.num_heads;
    dr.num("num_key_value_heads", &d.num_kv_heads);
    dr.num_required("num_hidden_layers", &d.num_layers);
    dr.num("rms_norm_eps", &d.rms_norm_eps);
    dr.num("rope_theta", &d.rope_theta);
    dr.num("sliding_window", &d.sliding_window);
    dr.num("layer_scale_initial_scale", &d.layer_scale_initial_scale);
    dr.num("num_quantizers", &d.num_quantizers);
    dr.num("num_semantic_quantizers", &d.num_semantic_quantizers);
    dr.ints("upsample_rates", &d.upsample_rates);
    dr.ints("upsampling_ratios", &d.upsampling_ratios);

    // Checked as it goes: rates must be positive and the product stays far below int's range.
    int64_t total = 1;
    for (const std::vector<int>* rates : {&d.upsample_rates, &d.upsampling_ratios}) {
        for (int r : *rates) {
            if (r <= 0) fail(ErrorCode::ERROR_FORMAT, "{}: decoder upsampling rate {} must be positive", source, r);
            total = std::min<int64_t>(total * r, int64_t(1) << 32);
        }
    }
    if (total != c.decode_upsample_rate)
        fail(ErrorCode::ERROR_FORMAT, "{}: decoder upsampling product {} does not equal decode_upsample_rate {}", source, total,
             c.decode_upsample_rate);
    if (d.num_semantic_quantizers != 1 || d.num_quantizers < 2)
        fail(ErrorCode::ERROR_UNSUPPORTED, "{}: decoder needs 1 semantic quantizer and >= 2 quantizers", source);
    if (d.codebook_dim % 2 != 0) fail(ErrorCode::ERROR_FORMAT, "{}: decoder codebook_dim must be even", source);
    if (d.num_heads <= 0 || d.num_kv_heads <= 0 || d.num_heads % d.num_kv_heads != 0 || d.head_dim % 2 != 0)
        fail(ErrorCode::ERROR_FORMAT, "{}: decoder attention heads/head_dim are inconsistent", source);

    if (top.has("encoder_config")) {
        const Reader er = top.child("encoder_config");
        EncoderConfig& e = c.encoder;
        er.num("num_filters", &e.num_filters);
        er.num("kernel_size", &e.kernel_size);
        er.num("residual_kernel_size", &e.residual_kernel_size);
        er.num("last_kernel_size", &e.last_kernel_size);
        er.num("num_residual_layers", &e.num_residual_layers);
        er.num("compress", &e.compress);
        er.num("dilation_growth_rate", &e.dilation_growth_rate);
        er.ints("upsampling_ratios", &e.upsampling_ratios);
        er.num("hidden_size", &e.hidden_size);
        er.num("num_hidden_layers", &e.num_layers);
        er.num("num_attention_heads", &e.num_heads);
        e.num_kv_heads = e.num_heads;
        er.num("num_key_value_heads", &e.num_kv_heads);
        er.num("head_dim", &e.head_dim);
        er.num("intermediate_size", &e.intermediate_size);
        er.num("norm_eps", &e.norm_eps);
        er.num("rope_theta", &e.rope_theta);
        er.num("sliding_window", &e.sliding_window);
        er.num("layer_scale_initial_scale", &e.layer_scale_initial_scale);
        er.num("num_quantizers", &e.num_quantizers);
        er.num("num_semantic_quantizers", &e.num_semantic_quantizers);
        er.num("codebook_size", &e.codebook_size);
        er.num("codebook_dim", &e.codebook_dim);
    }
    return c;
}

GenerationConfig generation_config_parse(const std::string& text, const std::string& source) {
    const json j = parse_json(text, source);
    const Reader r{j, source, ""};
    GenerationConfig g;
    r.boolean("do_sample", &g.do_sample);
    r.num("repetition_penalty", &g.repetition_penalty);
    r.num("temperature", &g.temperature);
    r.num("top_p", &g.top_p);
    r.num("top_k", &g.top_k);
    r.boolean("subtalker_dosample", &g.subtalker_do_sample);
    r.num("subtalker_temperature", &g.subtalker_temperature);
    r.num("subtalker_top_p", &g.subtalker_top_p);
    r.num("subtalker_top_k", &g.subtalker_top_k);
    r.num("max_new_tokens", &g.max_new_tokens);
    if (g.repetition_penalty <= 0 || g.temperature < 0 || g.top_p <= 0 || g.top_p > 1 || g.top_k < 0 || g.max_new_tokens <= 0)
        fail(ErrorCode::ERROR_FORMAT, "{}: sampling parameters out of range", source);
    return g;
}

ModelConfig model_config_load(const std::string& path) { return model_config_parse(file_read_text(path), path); }
SpeechTokenizerConfig speech_tokenizer_config_load(const std::string& path) {
    return speech_tokenizer_config_parse(file_read_text(path), path);
}
GenerationConfig generation_config_load(const std::string& path) { return generation_config_parse(file_read_text(path), path); }

// ---------------------------------------------------------------------------------------------
// Serialisation
// ---------------------------------------------------------------------------------------------

namespace {
json transformer_json(const TransformerConfig& c) {
    return {{"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_heads},
            {"num_key_value_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"hidden_act", "silu"},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"max_position_embeddings", c.max_position_embeddings},
            {"vocab_size", c.vocab_size},
            {"attention_bias", false}};
}
}  // namespace

std::string model_config_to_json(const ModelConfig& c) {
    const TalkerConfig& t = c.talker;
    json talker = transformer_json(t);
    talker["text_vocab_size"] = t.text_vocab_size;
    talker["text_hidden_size"] = t.text_hidden_size;
    talker["num_code_groups"] = t.num_code_groups;
    talker["rope_scaling"] = {{"interleaved", t.rope_interleaved}, {"mrope_section", t.mrope_section}, {"rope_type", "default"}};
    talker["codec_pad_id"] = t.codec_pad_id;
    talker["pad_token_id"] = t.codec_pad_id;
    talker["codec_bos_id"] = t.codec_bos_id;
    talker["codec_eos_token_id"] = t.codec_eos_id;
    talker["codec_think_id"] = t.codec_think_id;
    talker["codec_nothink_id"] = t.codec_nothink_id;
    talker["codec_think_bos_id"] = t.codec_think_bos_id;
    talker["codec_think_eos_id"] = t.codec_think_eos_id;
    talker["spk_id"] = json::object();
    for (const auto& [k, v] : t.speaker_ids) talker["spk_id"][k] = v;
    talker["spk_is_dialect"] = json::object();
    for (const auto& [k, v] : t.speaker_dialect) talker["spk_is_dialect"][k] = v.empty() ? json(false) : json(v);
    talker["codec_language_id"] = t.language_ids;
    json cp = transformer_json(t.code_predictor);
    cp["num_code_groups"] = t.code_predictor.num_code_groups;
    cp["layer_types"] = std::vector<std::string>(size_t(t.code_predictor.num_layers), "full_attention");
    cp["use_sliding_window"] = false;
    talker["code_predictor_config"] = cp;

    json j = {{"architectures", {"Qwen3TTSForConditionalGeneration"}},
              {"model_type", "qwen3_tts"},
              {"talker_config", talker},
              {"tokenizer_type", "qwen3_tts_tokenizer_12hz"},
              {"tts_model_size", c.size_tag},
              {"tts_model_type", model_type_name(c.type)},
              {"im_start_token_id", c.im_start_token_id},
              {"im_end_token_id", c.im_end_token_id},
              {"tts_pad_token_id", c.tts_pad_token_id},
              {"tts_bos_token_id", c.tts_bos_token_id},
              {"tts_eos_token_id", c.tts_eos_token_id},
              {"assistant_token_id", c.assistant_token_id},
              {"transformers_version", "4.57.3"}};
    if (c.speaker_encoder) {
        const SpeakerEncoderConfig& s = *c.speaker_encoder;
        j["speaker_encoder_config"] = {{"mel_dim", s.mel_dim},
                                       {"enc_dim", s.enc_dim},
                                       {"enc_channels", s.enc_channels},
                                       {"enc_kernel_sizes", s.enc_kernel_sizes},
                                       {"enc_dilations", s.enc_dilations},
                                       {"enc_attention_channels", s.enc_attention_channels},
                                       {"enc_res2net_scale", s.enc_res2net_scale},
                                       {"enc_se_channels", s.enc_se_channels},
                                       {"sample_rate", s.sample_rate}};
    }
    return j.dump(2);
}

std::string speech_tokenizer_config_to_json(const SpeechTokenizerConfig& c) {
    const DecoderConfig& d = c.decoder;
    const EncoderConfig& e = c.encoder;
    json dec = {{"codebook_size", d.codebook_size},
                {"codebook_dim", d.codebook_dim},
                {"latent_dim", d.latent_dim},
                {"decoder_dim", d.decoder_dim},
                {"hidden_size", d.hidden_size},
                {"intermediate_size", d.intermediate_size},
                {"head_dim", d.head_dim},
                {"num_attention_heads", d.num_heads},
                {"num_key_value_heads", d.num_kv_heads},
                {"num_hidden_layers", d.num_layers},
                {"hidden_act", "silu"},
                {"rms_norm_eps", d.rms_norm_eps},
                {"rope_theta", d.rope_theta},
                {"max_position_embeddings", 8000},
                {"sliding_window", d.sliding_window},
                {"layer_scale_initial_scale", d.layer_scale_initial_scale},
                {"num_quantizers", d.num_quantizers},
                {"num_semantic_quantizers", d.num_semantic_quantizers},
                {"semantic_codebook_size", 4096},
                {"upsample_rates", d.upsample_rates},
                {"upsampling_ratios", d.upsampling_ratios},
                {"attention_bias", false}};
    json enc = {{"sampling_rate", c.input_sample_rate},
                {"audio_channels", 1},
                {"num_filters", e.num_filters},
                {"kernel_size", e.kernel_size},
                {"residual_kernel_size", e.residual_kernel_size},
                {"last_kernel_size", e.last_kernel_size},
                {"num_residual_layers", e.num_residual_layers},
                {"compress", e.compress},
                {"dilation_growth_rate", e.dilation_growth_rate},
                {"upsampling_ratios", e.upsampling_ratios},
                {"use_causal_conv", true},
                {"pad_mode", "constant"},
                {"hidden_size", e.hidden_size},
                {"num_hidden_layers", e.num_layers},
                {"num_attention_heads", e.num_heads},
                {"num_key_value_heads", e.num_kv_heads},
                {"head_dim", e.head_dim},
                {"intermediate_size", e.intermediate_size},
                {"hidden_act", "gelu"},
                {"norm_eps", e.norm_eps},
                {"layer_scale_initial_scale", e.layer_scale_initial_scale},
                {"rope_theta", e.rope_theta},
                {"max_position_embeddings", 8000},
                {"sliding_window", e.sliding_window},
                {"num_quantizers", e.num_quantizers},
                {"num_semantic_quantizers", e.num_semantic_quantizers},
                {"codebook_size", e.codebook_size},
                {"codebook_dim", e.codebook_dim},
                {"vector_quantization_hidden_dimension", e.codebook_dim},
                {"frame_rate", 12.5},
                {"trim_right_ratio", 1.0},
                {"use_conv_shortcut", false},
                {"normalize", false},
                {"upsample_groups", e.hidden_size}};
    json j = {{"architectures", {"Qwen3TTSTokenizerV2Model"}},
              {"model_type", "qwen3_tts_tokenizer_12hz"},
              {"encoder_valid_num_quantizers", c.encoder_valid_num_quantizers},
              {"input_sample_rate", c.input_sample_rate},
              {"output_sample_rate", c.output_sample_rate},
              {"decode_upsample_rate", c.decode_upsample_rate},
              {"encode_downsample_rate", c.encode_downsample_rate},
              {"decoder_config", dec},
              {"encoder_config", enc}};
    return j.dump(2);
}

std::string generation_config_to_json(const GenerationConfig& g) {
    json j = {{"do_sample", g.do_sample},
              {"repetition_penalty", g.repetition_penalty},
              {"temperature", g.temperature},
              {"top_p", g.top_p},
              {"top_k", g.top_k},
              {"subtalker_dosample", g.subtalker_do_sample},
              {"subtalker_temperature", g.subtalker_temperature},
              {"subtalker_top_p", g.subtalker_top_p},
              {"subtalker_top_k", g.subtalker_top_k},
              {"max_new_tokens", g.max_new_tokens}};
    return j.dump(2);
}

}  // namespace qtts
