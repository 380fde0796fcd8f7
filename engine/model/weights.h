// Validated weight structs for every network of a Qwen3-TTS checkpoint.
//
// Weights are views into the memory-mapped safetensors files (read-only after load); a backend
// converts or uploads them. Mutable run state (KV caches, decoder carry, RNG) lives elsewhere.
// Linear weights are [out, in]; conv weights [out, in, k]; transposed conv [in, out, k].
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/safetensors.h"

namespace qtts {

using Tensor = const TensorView*;  // never null once loaded (unless documented optional)

// One Qwen3 decoder layer (talker and code predictor).
struct TransformerLayerWeights {
    Tensor input_norm;  // [H]
    Tensor q_proj;      // [n_heads*head_dim, H]
    Tensor k_proj;      // [n_kv*head_dim, H]
    Tensor v_proj;      // [n_kv*head_dim, H]
    Tensor o_proj;      // [H, n_heads*head_dim]
    Tensor q_norm;      // [head_dim]
    Tensor k_norm;      // [head_dim]
    Tensor post_norm;   // [H]
    Tensor gate_proj;   // [I, H]
    Tensor up_proj;     // [I, H]
    Tensor down_proj;   // [H, I]
};

struct TalkerWeights {
    Tensor codec_embedding;  // [3072, H]
    Tensor text_embedding;   // [text_vocab, text_hidden]
    Tensor text_fc1_w;       // [text_hidden, text_hidden]
    Tensor text_fc1_b;       // [text_hidden]
    Tensor text_fc2_w;       // [H, text_hidden]
    Tensor text_fc2_b;       // [H]
    std::vector<TransformerLayerWeights> layers;
    Tensor norm;        // [H]
    Tensor codec_head;  // [3072, H]
};

struct CodePredictorWeights {
    std::vector<TransformerLayerWeights> layers;
    Tensor norm;                          // [Hc]
    std::vector<Tensor> codec_embedding;  // (G-1) x [2048, H_talker]
    std::vector<Tensor> lm_head;          // (G-1) x [2048, Hc]
    Tensor proj_w = nullptr;              // [Hc, H_talker]  small_to_mtp_projection, only when Hc != H
    Tensor proj_b = nullptr;              // [Hc]
};

struct ConvWeights {
    Tensor w;  // [out, in, k] (transposed conv: [in, out, k])
    Tensor b;  // [out] (nullptr when the conv has no bias)
};

struct SpeakerEncoderBlockWeights {  // SE-Res2Net block
    ConvWeights tdnn1;                 // [C, C, 1]
    std::vector<ConvWeights> res2net;  // (scale-1) x [C/scale, C/scale, k]
    ConvWeights tdnn2;                 // [C, C, 1]
    ConvWeights se_conv1;              // [se, C, 1]
    ConvWeights se_conv2;              // [C, se, 1]
};

struct SpeakerEncoderWeights {
    ConvWeights block0;  // [C0, mel, k0]
    std::vector<SpeakerEncoderBlockWeights> blocks;  // 3
    ConvWeights mfa;       // [C4, 3*C, 1]
    ConvWeights asp_tdnn;  // [att, 3*C4, 1]
    ConvWeights asp_conv;  // [C4, att, 1]
    ConvWeights fc;        // [enc_dim, 2*C4, 1]
};

struct DecoderTransformerLayerWeights {
    Tensor input_norm;    // [D]
    Tensor q_proj;        // [heads*hd, D]
    Tensor k_proj;        // [kv*hd, D]
    Tensor v_proj;        // [kv*hd, D]
    Tensor o_proj;        // [D, heads*hd]
    Tensor attn_scale;    // [D]  LayerScale
    Tensor post_norm;     // [D]
    Tensor gate_proj;     // [I, D]
    Tensor up_proj;       // [I, D]
    Tensor down_proj;     // [D, I]
    Tensor mlp_scale;     // [D]
};

struct ConvNeXtWeights {
    ConvWeights dwconv;  // [C, 1, 7] depthwise
    Tensor norm_w;       // [C]
    Tensor norm_b;       // [C]
    Tensor pw1_w;        // [4C, C]
    Tensor pw1_b;        // [4C]
    Tensor pw2_w;        // [C, 4C]
    Tensor pw2_b;        // [C]
    Tensor gamma;        // [C]
};

struct SnakeWeights {
    Tensor alpha;  // [C] (log scale)
    Tensor beta;   // [C] (log scale)
};

struct ResidualUnitWeights {
    SnakeWeights act1;  // [C]
    ConvWeights conv1;  // [C, C, 7] dilated
    SnakeWeights act2;  // [C]
    ConvWeights conv2;  // [C, C, 1]
};

struct DecoderBlockWeights {
    SnakeWeights snake;                 // [C_in]
    ConvWeights upsample;               // transposed [C_in, C_out, 2r]
    std::vector<ResidualUnitWeights> units;  // 3 (dilation 1, 3, 9)
};

struct SpeechDecoderWeights {
    Tensor rvq_first_embedding_sum;          // [cs, cd/2]
    Tensor rvq_first_cluster_usage;          // [cs]
    Tensor rvq_first_output_proj;            // [cd, cd/2, 1]
    std::vector<Tensor> rvq_rest_embedding_sum;  // (nq-1) x [cs, cd/2]
    std::vector<Tensor> rvq_rest_cluster_usage;  // (nq-1) x [cs]
    Tensor rvq_rest_output_proj;             // [cd, cd/2, 1]
    ConvWeights pre_conv;                    // [latent, cd, 3]
    Tensor tr_input_proj_w;                  // [D, latent]
    Tensor tr_input_proj_b;                  // [D]
    std::vector<DecoderTransformerLayerWeights> tr_layers;
    Tensor tr_norm;                          // [D]
    Tensor tr_output_proj_w;                 // [latent, D]
    Tensor tr_output_proj_b;                 // [latent]
    std::vector<ConvWeights> upsample_conv;  // transposed [latent, latent, ratio]
    std::vector<ConvNeXtWeights> upsample_convnext;
    ConvWeights conv_in;                     // decoder.0 [decoder_dim, latent, 7]
    std::vector<DecoderBlockWeights> blocks; // 4
    SnakeWeights snake_out;                  // decoder.5 [C_last]
    ConvWeights conv_out;                    // decoder.6 [1, C_last, 7]
};

struct EncoderTransformerLayerWeights {
    Tensor input_norm_w, input_norm_b;  // [D] LayerNorm
    Tensor q_proj, k_proj, v_proj;      // [heads*hd, D]
    Tensor o_proj;                      // [D, heads*hd]
    Tensor attn_scale;                  // [D]
    Tensor post_norm_w, post_norm_b;    // [D]
    Tensor fc1;                         // [I, D]
    Tensor fc2;                         // [D, I]
    Tensor mlp_scale;                   // [D]
};

struct EncoderResBlockWeights {
    ConvWeights conv1;  // [C/compress, C, residual_kernel]
    ConvWeights conv2;  // [C, C/compress, 1]
};

struct SpeechEncoderWeights {
    ConvWeights conv_in;                        // layers.0 [F, 1, k]
    std::vector<EncoderResBlockWeights> res;    // one per ratio
    std::vector<ConvWeights> down;              // one per ratio [2C, C, 2r]
    ConvWeights conv_out;                       // [D, 2^n F, last_k]
    std::vector<EncoderTransformerLayerWeights> tr_layers;
    ConvWeights downsample;                     // [D, D, 4] (no bias)
    Tensor semantic_input_proj;                 // [cd, D, 1]
    Tensor acoustic_input_proj;                 // [cd, D, 1]
    std::vector<Tensor> semantic_embed_sum;     // num_semantic x [cs, cd]
    std::vector<Tensor> semantic_cluster_usage; // num_semantic x [cs]
    std::vector<Tensor> acoustic_embed_sum;     // (nq - num_semantic) x [cs, cd]
    std::vector<Tensor> acoustic_cluster_usage;
};

// Name + shape of one expected tensor (used by the loader and by `qtts make-model`).
struct TensorSpec {
    std::string name;
    std::vector<int64_t> shape;
    enum class Init { WEIGHT, NORM_ONE, ZERO, LOG_SCALE, USAGE, SMALL, OUTPUT } init = Init::WEIGHT;
    int fan_in = 1;  // for WEIGHT init
};

// Expected tensors of each file, in a fixed order.
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& config);
std::vector<TensorSpec> speech_tokenizer_tensor_specs(const SpeechTokenizerConfig& config);

struct Checkpoint {
    std::string dir;
    ModelConfig config;
    GenerationConfig generation;
    SpeechTokenizerConfig speech_config;
    std::shared_ptr<SafetensorsFile> model_file;
    std::shared_ptr<SafetensorsFile> speech_file;

    TalkerWeights talker;
    CodePredictorWeights code_predictor;
    std::optional<SpeakerEncoderWeights> speaker_encoder;  // Base models
    SpeechDecoderWeights decoder;
    std::optional<SpeechEncoderWeights> encoder;  // when the speech tokenizer has encoder tensors

    std::vector<std::string> unexpected_tensors;  // present in a file, not used by any network
};

// Loads and validates a checkpoint directory in the official Hugging Face layout.
// Throws qtts::Error naming the file and tensor for: missing files (with the expected layout
// and a download hint), malformed JSON, corrupt or truncated safetensors, missing tensors,
// wrong shapes or dtypes. Unexpected tensors are logged and listed in the result.
std::shared_ptr<const Checkpoint> checkpoint_load(const std::string& dir);

// Parameter counts for `qtts info`.
struct ParameterCount {
    std::string network;
    int64_t params = 0;
    int64_t bytes = 0;
};
std::vector<ParameterCount> checkpoint_parameter_counts(const Checkpoint& ckpt);

}  // namespace qtts
