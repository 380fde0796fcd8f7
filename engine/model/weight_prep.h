// Weight preparation shared by the two backends: what engine/cpu builds its fp32 tables from
// and engine/cuda uploads (RoPE frequencies, fp32 copies of decoder tensors, the normalised RVQ
// codebooks) and the layout checks both speech decoders make before using a checkpoint.
#pragma once

#include <cmath>

#include <cstdint>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace qtts {

// The dimensions of one transformer stack (talker or code predictor) as both backends use them.
struct StackShape {
    int hidden = 0;
    int intermediate = 0;
    int n_heads = 0;
    int n_kv = 0;
    int head_dim = 0;
    float eps = 1e-6f;
    double rope_theta = 1e6;
};
// Reads the shape from a config; throws ERROR_FORMAT when the heads do not group (num_heads not
// a multiple of num_kv_heads) or head_dim is odd (rotary pairs).
StackShape stack_shape(const TransformerConfig& config);

// The default RoPE frequency table [head_dim / 2]: inv_freq[i] = 1 / theta^(2i / head_dim), in fp32
// as the reference computes it.
std::vector<float> rope_inv_freq(int head_dim, double theta);

// An fp32 copy of a speech-decoder tensor, checked present and of `numel` values (numel < 0: any
// size); throws ERROR_SHAPE naming `what` otherwise.
std::vector<float> speech_weight_f32(Tensor t, int64_t numel, const char* what);

// SnakeBeta's per-channel factors from the checkpoint's log-scale parameters, as the reference
// computes them: alpha = exp(log_alpha), 1 / beta = 1 / (exp(log_beta) + 1e-9). Every speech
// decoder (CPU reference, cpu-fast, CUDA) and the tests that build its tables derive them here.
inline float snake_alpha(float log_alpha) { return std::exp(log_alpha); }
inline float snake_inv_beta(float log_beta) { return 1.0f / (std::exp(log_beta) + 1e-9f); }

// One RVQ codebook as the reference uses it: embedding_sum / max(cluster_usage, 1e-5),
// [codebook_size, dim].
std::vector<float> rvq_codebook_normalised(Tensor embedding_sum, Tensor cluster_usage, int codebook_size, int dim);

// Throws ERROR_INVALID_ARGUMENT naming `who`, the frame and the codebook when a code of
// codes [n, num_quantizers] is outside 0..codebook_size-1 (both decoders check before touching
// their state).
void speech_codes_validate(const DecoderConfig& config, const int32_t* codes, int n, const char* who);

// The argument checks at the top of every speech decoder's decode(codes, n, pcm_out): n >= 0, an
// output, codes for n > 0 frames, each in range (speech_codes_validate); ERROR_INVALID_ARGUMENT
// naming `who`. False when there is nothing to decode (n == 0).
bool speech_decode_args_check(const DecoderConfig& config, const int32_t* codes, int n, const void* pcm_out,
                              const char* who);

// Appends n frames of audio to *pcm_out in chunks of at most max_chunk frames: `chunk(codes of the
// chunk, m, where its m * samples_per_frame samples go)` decodes one (the CPU decoders' loop).
template <typename ChunkFn>
void speech_decode_chunked(const int32_t* codes, int n, int num_quantizers, int max_chunk, int samples_per_frame,
                           std::vector<float>* pcm_out, ChunkFn&& chunk) {
    const size_t base = pcm_out->size();
    pcm_out->resize(base + size_t(n) * size_t(samples_per_frame));
    for (int done = 0; done < n;) {
        const int m = n - done < max_chunk ? n - done : max_chunk;
        chunk(codes + size_t(done) * size_t(num_quantizers), m,
              pcm_out->data() + base + size_t(done) * size_t(samples_per_frame));
        done += m;
    }
}

// The speech decoder's fixed structure (the same in every checkpoint, not in its config), for
// every implementation (CPU reference, cpu-fast, CUDA): the upsampler's ConvNeXt depthwise kernel
// and LayerNorm epsilon, and each decoder block's residual units with their dilations.
constexpr int SPEECH_DECODER_CONVNEXT_KERNEL = 7;
constexpr float SPEECH_DECODER_CONVNEXT_EPS = 1e-6f;
constexpr int SPEECH_DECODER_RESIDUAL_UNITS = 3;
constexpr int SPEECH_DECODER_RESIDUAL_DILATIONS[SPEECH_DECODER_RESIDUAL_UNITS] = {1, 3, 9};

// Throws (ERROR_UNSUPPORTED / ERROR_SHAPE, naming `who`) unless the config has the layout the
// decoders implement (one semantic quantizer, even codebook_dim, grouped heads, even head_dim)
// and the weights hold as many layers, blocks, residual units per block and codebooks as the
// config (and the fixed structure above) says.
void speech_decoder_layout_check(const DecoderConfig& config, const SpeechDecoderWeights& weights, const char* who);

}  // namespace qtts
