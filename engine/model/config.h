// Typed configuration of a Qwen3-TTS checkpoint: config.json, generation_config.json and
// speech_tokenizer/config.json. Parsing accepts what the real files contain (extra keys are
// ignored; spk_id values may be an int or a one-element list).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts {

enum class ModelType { MODEL_TYPE_CUSTOM_VOICE, MODEL_TYPE_VOICE_DESIGN, MODEL_TYPE_BASE };
const char* model_type_name(ModelType type);  // "custom_voice", "voice_design", "base"

// A Qwen3-style decoder stack (talker or code predictor).
struct TransformerConfig {
    int hidden_size = 0;
    int intermediate_size = 0;
    int num_layers = 0;
    int num_heads = 0;
    int num_kv_heads = 0;
    int head_dim = 0;
    float rms_norm_eps = 1e-6f;
    double rope_theta = 1e6;
    int max_position_embeddings = 0;
    int vocab_size = 0;  // talker: 3072 codec ids; code predictor: 2048
};

struct CodePredictorConfig : TransformerConfig {
    int num_code_groups = 16;
};

struct TalkerConfig : TransformerConfig {
    int text_vocab_size = 151936;
    int text_hidden_size = 2048;
    int num_code_groups = 16;
    std::vector<int> mrope_section;
    bool rope_interleaved = false;

    int codec_pad_id = 2148;
    int codec_bos_id = 2149;
    int codec_eos_id = 2150;
    int codec_think_id = 2154;
    int codec_nothink_id = 2155;
    int codec_think_bos_id = 2156;
    int codec_think_eos_id = 2157;

    std::map<std::string, int> speaker_ids;             // lower-case name -> codec row
    std::map<std::string, std::string> speaker_dialect;  // name -> dialect language ("" = none)
    std::map<std::string, int> language_ids;             // language or dialect name -> codec id

    CodePredictorConfig code_predictor;
};

// ECAPA-TDNN speaker encoder (Base models).
struct SpeakerEncoderConfig {
    int mel_dim = 128;
    int enc_dim = 1024;
    std::vector<int> enc_channels{512, 512, 512, 512, 1536};
    std::vector<int> enc_kernel_sizes{5, 3, 3, 3, 1};
    std::vector<int> enc_dilations{1, 2, 3, 4, 1};
    int enc_attention_channels = 128;
    int enc_res2net_scale = 8;
    int enc_se_channels = 128;
    int sample_rate = SAMPLE_RATE;
};

struct ModelConfig {
    ModelType type = ModelType::MODEL_TYPE_CUSTOM_VOICE;
    std::string size_tag;  // "0b6" or "1b7"
    int im_start_token_id = 151644;
    int im_end_token_id = 151645;
    int tts_pad_token_id = 151671;
    int tts_bos_token_id = 151672;
    int tts_eos_token_id = 151673;
    int assistant_token_id = 77091;
    TalkerConfig talker;
    std::optional<SpeakerEncoderConfig> speaker_encoder;  // present in config (Base models)
};

// Speech-tokenizer decoder ("code2wav").
struct DecoderConfig {
    int codebook_size = 2048;
    int codebook_dim = 512;  // RVQ vectors are codebook_dim / 2 wide
    int latent_dim = 1024;
    int decoder_dim = 1536;
    int hidden_size = 512;
    int intermediate_size = 1024;
    int head_dim = 64;
    int num_heads = 16;
    int num_kv_heads = 16;
    int num_layers = 8;
    float rms_norm_eps = 1e-5f;
    double rope_theta = 10000.0;
    int sliding_window = 72;
    float layer_scale_initial_scale = 0.01f;
    int num_quantizers = 16;
    int num_semantic_quantizers = 1;
    std::vector<int> upsample_rates{8, 5, 4, 3};
    std::vector<int> upsampling_ratios{2, 2};
};

// Speech-tokenizer encoder (Mimi-style; used for Base in-context cloning).
struct EncoderConfig {
    int num_filters = 64;
    int kernel_size = 7;
    int residual_kernel_size = 3;
    int last_kernel_size = 3;
    int num_residual_layers = 1;
    int compress = 2;
    int dilation_growth_rate = 2;
    std::vector<int> upsampling_ratios{8, 6, 5, 4};
    int hidden_size = 512;
    int num_layers = 8;
    int num_heads = 8;
    int num_kv_heads = 8;
    int head_dim = 64;
    int intermediate_size = 2048;
    float norm_eps = 1e-5f;
    double rope_theta = 10000.0;
    int sliding_window = 250;
    float layer_scale_initial_scale = 0.01f;
    int num_quantizers = 32;
    int num_semantic_quantizers = 1;
    int codebook_size = 2048;
    int codebook_dim = 256;
};

struct SpeechTokenizerConfig {
    int encoder_valid_num_quantizers = 16;
    int input_sample_rate = SAMPLE_RATE;
    int output_sample_rate = SAMPLE_RATE;
    int decode_upsample_rate = SAMPLES_PER_FRAME;
    int encode_downsample_rate = SAMPLES_PER_FRAME;
    DecoderConfig decoder;
    EncoderConfig encoder;
};

struct GenerationConfig {
    bool do_sample = true;
    float repetition_penalty = 1.05f;
    float temperature = 0.9f;
    float top_p = 1.0f;
    int top_k = 50;
    bool subtalker_do_sample = true;
    float subtalker_temperature = 0.9f;
    float subtalker_top_p = 1.0f;
    int subtalker_top_k = 50;
    int max_new_tokens = 8192;
};

// Parse from a file; errors name the file and the offending key.
ModelConfig model_config_load(const std::string& path);
SpeechTokenizerConfig speech_tokenizer_config_load(const std::string& path);
GenerationConfig generation_config_load(const std::string& path);

// Parse from JSON text (the `source` names it in errors).
ModelConfig model_config_parse(const std::string& text, const std::string& source);
SpeechTokenizerConfig speech_tokenizer_config_parse(const std::string& text, const std::string& source);
GenerationConfig generation_config_parse(const std::string& text, const std::string& source);

// Serialise (used by `qtts make-model`), in the official key layout.
std::string model_config_to_json(const ModelConfig& config);
std::string speech_tokenizer_config_to_json(const SpeechTokenizerConfig& config);
std::string generation_config_to_json(const GenerationConfig& config);

// Reads a whole file; throws ERROR_IO naming it.
std::string file_read_text(const std::string& path);

}  // namespace qtts
