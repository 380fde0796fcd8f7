// Speech-tokenizer encoder (Kyutai Mimi encoder, spec §10), fp32 on the CPU: 24 kHz audio ->
// 16 codes per 80 ms frame, for Base in-context cloning.
//
// Stages, read top-down in speech_encoder.cpp:
//   seanet_forward       causal SEANet conv stack (ELU, residual blocks, strided convs), /960
//   transformer_forward  LayerNorm / RoPE causal attention / GELU MLP layers with LayerScale
//   downsample_forward   causal conv k4 stride 2 with replicate padding, /2 -> 12.5 Hz
//   quantize             split RVQ: semantic codebook(s), then the acoustic residual VQ
// Every conv is Mimi's causal conv: left padding (k-1)·d + 1 - stride, plus right padding so the
// last window is complete; output length ceil(T / stride). Frames = ceil(samples / 1920).
//
// Weights stay views into the mapped checkpoint where they already are aligned fp32 (the
// checkpoint must outlive the encoder); codebooks (embed_sum / max(cluster_usage, 1e-5)) are
// computed once at construction. encode() is const and may run on several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace qtts::cpu {

// An fp32 tensor: a view into the checkpoint, or an owned converted copy.
struct F32Tensor {
    const float* data = nullptr;
    std::shared_ptr<const std::vector<float>> owned;  // set when converted
    std::vector<int64_t> shape;
};

struct SpeechEncoderOptions {
    // Attention window in 25 Hz frames; 0 = plain causal over the whole clip. The reference's
    // default (SDPA) path ignores the config's sliding_window (250 = 10 s) and attends causally
    // to everything; the two differ only for clips longer than 10 s (spec §10, §15.6).
    int attention_window = 0;
};

struct SpeechCodes {
    int frames = 0;
    int num_codebooks = 0;
    std::vector<int32_t> values;  // [frames, num_codebooks], codebook 0 = semantic
};

class SpeechEncoder {
public:
    // Validates the config (layout the loader binds, strides, head sizes, quantizer counts,
    // 24 kHz input) and every weight shape. Throws qtts::Error naming the field or tensor.
    SpeechEncoder(const SpeechTokenizerConfig& config, const SpeechEncoderWeights& weights,
                  const SpeechEncoderOptions& options = SpeechEncoderOptions());

    int sample_rate() const { return config_.input_sample_rate; }
    int samples_per_frame() const { return config_.encode_downsample_rate; }  // 1920
    int num_codebooks() const { return config_.encoder_valid_num_quantizers; }
    // Fewest samples encode() accepts: one full frame (shorter clips carry no usable voice).
    size_t min_samples() const { return size_t(config_.encode_downsample_rate); }
    // ceil(num_samples / samples_per_frame()).
    int frame_count(size_t num_samples) const;

    // audio: mono float at sample_rate(). Throws ERROR_INVALID_ARGUMENT for a clip shorter than
    // min_samples() or with NaN/Inf samples.
    SpeechCodes encode(const float* audio, size_t num_samples) const;

    // The stages, public so tests and debug dumps can look at intermediates.
    // x: [C, T] channel-major. seanet: [1, N] -> [hidden, ceil(N / hop)].
    std::vector<float> seanet_forward(const float* audio, int num_samples, int* frames_out) const;
    // x: [T, hidden] time-major, in place.
    void transformer_forward(std::vector<float>& x, int T) const;
    // x: [hidden, T] -> [hidden, ceil(T / 2)].
    std::vector<float> downsample_forward(const std::vector<float>& x, int T, int* frames_out) const;
    // latent: [T, hidden] time-major -> codes [T, num_codebooks()].
    std::vector<int32_t> quantize(const std::vector<float>& latent, int T) const;

private:
    struct Conv {
        F32Tensor w;  // [out, in, k]
        F32Tensor b;  // [out] (data null: no bias)
        int out = 0, in = 0, k = 0, stride = 1, dilation = 1;
    };
    struct ResBlock {
        Conv conv1;  // [C/compress, C, residual_kernel]
        Conv conv2;  // [C, C/compress, 1]
    };
    struct Layer {
        F32Tensor input_norm_w, input_norm_b;  // [D]
        F32Tensor q_proj, k_proj, v_proj;      // [heads*hd, D], [kv*hd, D]
        F32Tensor o_proj;                      // [D, heads*hd]
        F32Tensor attn_scale;                  // [D]
        F32Tensor post_norm_w, post_norm_b;    // [D]
        F32Tensor fc1;                         // [I, D]
        F32Tensor fc2;                         // [D, I]
        F32Tensor mlp_scale;                   // [D]
    };
    struct Codebook {
        std::vector<float> entries;  // [codebook_size, dim] = embed_sum / max(usage, 1e-5)
        std::vector<float> norms;    // [codebook_size] squared L2 norm of each entry
    };

    Conv conv_bind(const ConvWeights& src, int out, int in, int k, int stride, int dilation, bool bias,
                   const char* what) const;
    std::vector<float> causal_conv(const Conv& conv, const float* x, int T, bool replicate, int* frames_out) const;
    // Residual VQ over `books` on residual [T, dim] (modified in place); writes codes into
    // out[t * stride + offset + k].
    void residual_quantize(const std::vector<Codebook>& books, std::vector<float>& residual, int T, int32_t* out,
                           int stride, int offset) const;

    SpeechTokenizerConfig config_;
    SpeechEncoderOptions options_;
    std::vector<float> rope_inv_freq_;  // [head_dim / 2]
    Conv conv_in_;
    std::vector<ResBlock> res_;
    std::vector<Conv> down_;
    Conv conv_out_;
    std::vector<Layer> layers_;
    Conv downsample_;
    F32Tensor semantic_proj_;  // [cd, D, 1]
    F32Tensor acoustic_proj_;  // [cd, D, 1]
    std::vector<Codebook> semantic_books_;
    std::vector<Codebook> acoustic_books_;  // only the ones needed for the valid codebooks
};

}  // namespace qtts::cpu
