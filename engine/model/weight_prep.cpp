#include "engine/model/weight_prep.h"

#include <algorithm>
#include <cmath>

#include "engine/common/error.h"

namespace qtts {

StackShape stack_shape(const TransformerConfig& c) {
    StackShape s;
    s.hidden = c.hidden_size;
    s.intermediate = c.intermediate_size;
    s.n_heads = c.num_heads;
    s.n_kv = c.num_kv_heads;
    s.head_dim = c.head_dim;
    s.eps = c.rms_norm_eps;
    s.rope_theta = c.rope_theta;
    if (s.n_kv <= 0 || s.n_heads % s.n_kv != 0)
        fail(ErrorCode::ERROR_FORMAT, "config: num_attention_heads {} is not a multiple of num_key_value_heads {}",
             s.n_heads, s.n_kv);
    if (s.head_dim % 2 != 0)
        fail(ErrorCode::ERROR_FORMAT, "config: head_dim {} must be even for rotary embeddings", s.head_dim);
    return s;
}

std::vector<float> rope_inv_freq(int head_dim, double theta) {
    std::vector<float> inv_freq(size_t(head_dim / 2));
    for (int i = 0; i < head_dim / 2; ++i) {
        const float exponent = float(2 * i) / float(head_dim);
        inv_freq[size_t(i)] = 1.0f / std::pow(float(theta), exponent);
    }
    return inv_freq;
}

std::vector<float> speech_weight_f32(Tensor t, int64_t numel, const char* what) {
    if (!t) fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: tensor '{}' is missing", what);
    if (numel >= 0 && t->numel() != numel)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: tensor '{}' has shape {} ({} values), expected {} values",
             t->name, t->shape_str(), t->numel(), numel);
    return tensor_to_f32(*t);
}

std::vector<float> rvq_codebook_normalised(Tensor embedding_sum, Tensor cluster_usage, int codebook_size, int dim) {
    constexpr float kCodebookEpsilon = 1e-5f;
    std::vector<float> book = speech_weight_f32(embedding_sum, int64_t(codebook_size) * dim, "codebook embedding_sum");
    const std::vector<float> usage = speech_weight_f32(cluster_usage, codebook_size, "codebook cluster_usage");
    for (int i = 0; i < codebook_size; ++i) {
        const float denom = std::max(usage[size_t(i)], kCodebookEpsilon);
        for (int j = 0; j < dim; ++j) book[size_t(i) * dim + j] /= denom;
    }
    return book;
}

bool speech_decode_args_check(const DecoderConfig& config, const int32_t* codes, int n, const void* pcm_out,
                              const char* who) {
    if (n < 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}: negative frame count {}", who, n);
    if (!pcm_out) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}: pcm_out is null", who);
    if (n == 0) return false;
    if (!codes) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}: codes is null for {} frames", who, n);
    speech_codes_validate(config, codes, n, who);
    return true;
}

void speech_codes_validate(const DecoderConfig& config, const int32_t* codes, int n, const char* who) {
    const int nq = config.num_quantizers;
    for (int t = 0; t < n; ++t) {
        for (int q = 0; q < nq; ++q) {
            const int32_t c = codes[size_t(t) * nq + q];
            if (c < 0 || c >= config.codebook_size)
                fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                     "{}: frame {} codebook {} has code {}; codes must be in 0..{} (control ids such as EOS never "
                     "reach the decoder)",
                     who, t, q, c, config.codebook_size - 1);
        }
    }
}

void speech_decoder_layout_check(const DecoderConfig& d, const SpeechDecoderWeights& w, const char* who) {
    if (d.num_semantic_quantizers != 1)
        fail(ErrorCode::ERROR_UNSUPPORTED, "{}: num_semantic_quantizers {} (only 1 is supported)", who,
             d.num_semantic_quantizers);
    if (d.num_quantizers < 2 || d.codebook_dim % 2 != 0 || d.codebook_size < 1)
        fail(ErrorCode::ERROR_UNSUPPORTED, "{}: num_quantizers {} / codebook_dim {} not supported", who,
             d.num_quantizers, d.codebook_dim);
    if (d.num_heads < 1 || d.num_kv_heads < 1 || d.num_heads % d.num_kv_heads != 0 || d.head_dim % 2 != 0)
        fail(ErrorCode::ERROR_UNSUPPORTED, "{}: {} heads / {} kv heads / head_dim {} not supported", who, d.num_heads,
             d.num_kv_heads, d.head_dim);
    if (int(w.tr_layers.size()) != d.num_layers || w.blocks.size() != d.upsample_rates.size() ||
        w.upsample_conv.size() != d.upsampling_ratios.size() || w.upsample_convnext.size() != d.upsampling_ratios.size() ||
        int(w.rvq_rest_embedding_sum.size()) != d.num_quantizers - 1)
        fail(ErrorCode::ERROR_SHAPE, "{}: the weights do not match the decoder config (layers/blocks/quantizers)", who);
    for (size_t i = 0; i < w.blocks.size(); ++i)
        if (w.blocks[i].units.size() != size_t(SPEECH_DECODER_RESIDUAL_UNITS))
            fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} has {} residual units, expected {}", i,
                 w.blocks[i].units.size(), SPEECH_DECODER_RESIDUAL_UNITS);
}

}  // namespace qtts
