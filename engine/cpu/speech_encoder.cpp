#include "engine/cpu/speech_encoder.h"
#include "engine/api/qtts.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <cblas.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cpu/conv_ops.h"
#include "engine/cpu/mel.h"
#include "engine/cpu/ops.h"
#include "engine/model/weight_prep.h"
#include "engine/model/safetensors.h"

namespace qtts::cpu {

namespace {

// A checked fp32 view of a checkpoint tensor (converted when not aligned fp32 already).
F32Tensor f32_tensor(Tensor t, const std::vector<int64_t>& shape, const std::string& what) {
    if (t == nullptr) fail(ErrorCode::ERROR_SHAPE, "speech encoder: tensor {} is missing", what);
    if (t->shape != shape) {
        std::string expected = "[";
        for (size_t i = 0; i < shape.size(); ++i) expected += (i ? ", " : "") + std::to_string(shape[i]);
        expected += "]";
        fail(ErrorCode::ERROR_SHAPE, "speech encoder: {} ({}) has shape {}, the config implies {}", what, t->name,
             t->shape_str(), expected);
    }
    F32Tensor out;
    out.shape = shape;
    if (t->dtype == DType::DTYPE_F32 && reinterpret_cast<uintptr_t>(t->data) % alignof(float) == 0) {
        out.data = reinterpret_cast<const float*>(t->data);
    } else {
        auto owned = std::make_shared<std::vector<float>>(tensor_to_f32(*t));
        out.data = owned->data();
        out.owned = std::move(owned);
    }
    return out;
}

int ceil_div(int a, int b) { return (a + b - 1) / b; }

void scale_rows_add(float* x, const float* y, const float* scale, int T, int D) {
    for (int t = 0; t < T; ++t) {
        float* xr = x + size_t(t) * D;
        const float* yr = y + size_t(t) * D;
        for (int d = 0; d < D; ++d) xr[d] += scale[d] * yr[d];
    }
}

}  // namespace

SpeechEncoder::Conv SpeechEncoder::conv_bind(const ConvWeights& src, int out, int in, int k, int stride, int dilation,
                                             bool bias, const char* what) const {
    Conv c;
    c.out = out;
    c.in = in;
    c.k = k;
    c.stride = stride;
    c.dilation = dilation;
    c.w = f32_tensor(src.w, {out, in, k}, std::string(what) + " weight");
    if (bias) c.b = f32_tensor(src.b, {out}, std::string(what) + " bias");
    return c;
}

SpeechEncoder::SpeechEncoder(const SpeechTokenizerConfig& config, const SpeechEncoderWeights& weights,
                             const SpeechEncoderOptions& options)
    : config_(config), options_(options) {
    const EncoderConfig& e = config_.encoder;
    if (e.num_filters <= 0 || e.kernel_size <= 0 || e.residual_kernel_size <= 0 || e.last_kernel_size <= 0 ||
        e.compress <= 0 || e.dilation_growth_rate <= 0 || e.upsampling_ratios.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speech encoder config: num_filters {}, kernel_size {}, residual_kernel_size {}, last_kernel_size {}, "
             "compress {}, dilation_growth_rate {} must be positive and upsampling_ratios non-empty",
             e.num_filters, e.kernel_size, e.residual_kernel_size, e.last_kernel_size, e.compress,
             e.dilation_growth_rate);
    if (e.num_residual_layers != 1)
        fail(ErrorCode::ERROR_UNSUPPORTED,
             "speech encoder config: num_residual_layers {}: only 1 (the released layout) is supported",
             e.num_residual_layers);
    int hop = 1;
    for (int r : e.upsampling_ratios) {
        if (r <= 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "speech encoder config: upsampling ratio {} must be positive", r);
        hop *= r;
    }
    // Mimi's downsample conv is stride 2 (kernel 4): 25 Hz -> 12.5 Hz.
    if (config_.encode_downsample_rate != 2 * hop)
        fail(ErrorCode::ERROR_UNSUPPORTED,
             "speech encoder config: encode_downsample_rate {} must be 2 x the SEANet hop {} (= {}), as the downsample "
             "conv has stride 2",
             config_.encode_downsample_rate, hop, 2 * hop);
    if (config_.input_sample_rate != SAMPLE_RATE)
        fail(ErrorCode::ERROR_UNSUPPORTED, "speech encoder config: input_sample_rate {}: only 24000 Hz is supported",
             config_.input_sample_rate);
    if (e.hidden_size <= 0 || e.num_layers < 0 || e.num_heads <= 0 || e.num_kv_heads <= 0 || e.head_dim <= 0 ||
        e.head_dim % 2 != 0 || e.num_heads % e.num_kv_heads != 0 || e.intermediate_size <= 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speech encoder config: hidden_size {}, num_hidden_layers {}, heads {}/{} (kv), head_dim {}, "
             "intermediate_size {}: sizes must be positive, head_dim even, heads a multiple of kv heads",
             e.hidden_size, e.num_layers, e.num_heads, e.num_kv_heads, e.head_dim, e.intermediate_size);
    if (e.codebook_size <= 0 || e.codebook_dim <= 0 || e.num_semantic_quantizers < 1 ||
        e.num_quantizers <= e.num_semantic_quantizers ||
        config_.encoder_valid_num_quantizers <= e.num_semantic_quantizers ||
        config_.encoder_valid_num_quantizers > e.num_quantizers)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speech encoder config: codebook_size {}, codebook_dim {}, num_semantic_quantizers {}, num_quantizers {}, "
             "encoder_valid_num_quantizers {}: need positive sizes and semantic < valid <= num_quantizers",
             e.codebook_size, e.codebook_dim, e.num_semantic_quantizers, e.num_quantizers,
             config_.encoder_valid_num_quantizers);
    if (options_.attention_window < 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "speech encoder: attention_window {} must be >= 0 (0 = full causal)",
             options_.attention_window);
    rope_inv_freq_ = rope_inv_freq(e.head_dim, e.rope_theta);  // the config's table, shared by every layer

    const size_t n_stages = e.upsampling_ratios.size();
    if (weights.res.size() != n_stages || weights.down.size() != n_stages ||
        weights.tr_layers.size() != size_t(e.num_layers) ||
        weights.semantic_embed_sum.size() != size_t(e.num_semantic_quantizers) ||
        weights.semantic_cluster_usage.size() != size_t(e.num_semantic_quantizers) ||
        weights.acoustic_embed_sum.size() != size_t(e.num_quantizers - e.num_semantic_quantizers) ||
        weights.acoustic_cluster_usage.size() != size_t(e.num_quantizers - e.num_semantic_quantizers))
        fail(ErrorCode::ERROR_SHAPE,
             "speech encoder: the weights have {} residual stages, {} transformer layers, {}+{} codebooks; the config "
             "implies {}, {}, {}+{}",
             weights.res.size(), weights.tr_layers.size(), weights.semantic_embed_sum.size(),
             weights.acoustic_embed_sum.size(), n_stages, e.num_layers, e.num_semantic_quantizers,
             e.num_quantizers - e.num_semantic_quantizers);

    // SEANet: ratios are applied in reverse order (the decoder's upsampling mirrored).
    int C = e.num_filters;
    conv_in_ = conv_bind(weights.conv_in, C, 1, e.kernel_size, 1, 1, true, "encoder.layers.0.conv");
    for (size_t s = 0; s < n_stages; ++s) {
        const int r = e.upsampling_ratios[n_stages - 1 - s];
        if (C % e.compress != 0)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "speech encoder config: {} channels not divisible by compress {}", C,
                 e.compress);
        const std::string p = "encoder stage " + std::to_string(s);
        ResBlock rb;
        rb.conv1 = conv_bind(weights.res[s].conv1, C / e.compress, C, e.residual_kernel_size, 1, 1, true,
                             (p + " residual conv1").c_str());
        rb.conv2 = conv_bind(weights.res[s].conv2, C, C / e.compress, 1, 1, 1, true, (p + " residual conv2").c_str());
        res_.push_back(rb);
        down_.push_back(conv_bind(weights.down[s], 2 * C, C, 2 * r, r, 1, true, (p + " strided conv").c_str()));
        C *= 2;
    }
    const int D = e.hidden_size;
    conv_out_ = conv_bind(weights.conv_out, D, C, e.last_kernel_size, 1, 1, true, "encoder final conv");

    const int qd = e.num_heads * e.head_dim, kvd = e.num_kv_heads * e.head_dim, I = e.intermediate_size;
    for (int l = 0; l < e.num_layers; ++l) {
        const EncoderTransformerLayerWeights& src = weights.tr_layers[size_t(l)];
        const std::string p = "encoder_transformer.layers." + std::to_string(l) + ".";
        Layer w;
        w.input_norm_w = f32_tensor(src.input_norm_w, {D}, p + "input_layernorm.weight");
        w.input_norm_b = f32_tensor(src.input_norm_b, {D}, p + "input_layernorm.bias");
        w.q_proj = f32_tensor(src.q_proj, {qd, D}, p + "q_proj");
        w.k_proj = f32_tensor(src.k_proj, {kvd, D}, p + "k_proj");
        w.v_proj = f32_tensor(src.v_proj, {kvd, D}, p + "v_proj");
        w.o_proj = f32_tensor(src.o_proj, {D, qd}, p + "o_proj");
        w.attn_scale = f32_tensor(src.attn_scale, {D}, p + "self_attn_layer_scale");
        w.post_norm_w = f32_tensor(src.post_norm_w, {D}, p + "post_attention_layernorm.weight");
        w.post_norm_b = f32_tensor(src.post_norm_b, {D}, p + "post_attention_layernorm.bias");
        w.fc1 = f32_tensor(src.fc1, {I, D}, p + "mlp.fc1");
        w.fc2 = f32_tensor(src.fc2, {D, I}, p + "mlp.fc2");
        w.mlp_scale = f32_tensor(src.mlp_scale, {D}, p + "mlp_layer_scale");
        layers_.push_back(std::move(w));
    }
    downsample_ = conv_bind(weights.downsample, D, D, 4, 2, 1, false, "downsample conv");

    const int cd = e.codebook_dim, cs = e.codebook_size;
    semantic_proj_ = f32_tensor(weights.semantic_input_proj, {cd, D, 1}, "semantic input_proj");
    acoustic_proj_ = f32_tensor(weights.acoustic_input_proj, {cd, D, 1}, "acoustic input_proj");
    auto codebook_build = [&](Tensor sum, Tensor usage, const std::string& what) {
        const F32Tensor s = f32_tensor(sum, {cs, cd}, what + " embed_sum");
        const F32Tensor u = f32_tensor(usage, {cs}, what + " cluster_usage");
        Codebook book;
        book.entries.resize(size_t(cs) * cd);
        book.norms.resize(size_t(cs));
        for (int i = 0; i < cs; ++i) {
            // fp32, as the reference normalises the running sums.
            const float inv_usage = 1.0f / std::max(u.data[i], 1e-5f);
            double norm = 0.0;
            for (int j = 0; j < cd; ++j) {
                const float v = s.data[size_t(i) * cd + j] * inv_usage;
                book.entries[size_t(i) * cd + j] = v;
                norm += double(v) * v;
            }
            book.norms[size_t(i)] = float(norm);
        }
        return book;
    };
    for (int k = 0; k < e.num_semantic_quantizers; ++k)
        semantic_books_.push_back(codebook_build(weights.semantic_embed_sum[size_t(k)],
                                                 weights.semantic_cluster_usage[size_t(k)],
                                                 "semantic codebook " + std::to_string(k)));
    const int acoustic_needed = config_.encoder_valid_num_quantizers - e.num_semantic_quantizers;
    for (int k = 0; k < acoustic_needed; ++k)
        acoustic_books_.push_back(codebook_build(weights.acoustic_embed_sum[size_t(k)],
                                                 weights.acoustic_cluster_usage[size_t(k)],
                                                 "acoustic codebook " + std::to_string(k)));
}

int SpeechEncoder::frame_count(size_t num_samples) const {
    return int((num_samples + size_t(config_.encode_downsample_rate) - 1) / size_t(config_.encode_downsample_rate));
}

std::vector<float> SpeechEncoder::causal_conv(const Conv& conv, const float* x, int T, bool replicate,
                                              int* frames_out) const {
    // Mimi: pad (k_eff - stride) on the left; on the right, just enough for ceil(T / stride)
    // complete windows.
    const int k_eff = (conv.k - 1) * conv.dilation + 1;
    const int left = k_eff - conv.stride;
    const int frames = ceil_div(T, conv.stride);
    const int right = frames * conv.stride - T;
    const std::vector<float> padded =
        pad1d(x, conv.in, T, left, right, replicate ? PadMode::PAD_REPLICATE : PadMode::PAD_ZERO);
    const int padded_len = left + T + right;
    QTTS_ASSERT(conv1d_out_len(padded_len, conv.k, conv.stride, conv.dilation) == frames);
    std::vector<float> y(size_t(conv.out) * frames);
    conv1d(padded.data(), conv.in, padded_len, conv.w.data, conv.b.data, conv.out, conv.k, conv.stride, conv.dilation,
           1, y.data());
    *frames_out = frames;
    return y;
}

std::vector<float> SpeechEncoder::seanet_forward(const float* audio, int num_samples, int* frames_out) const {
    int T = num_samples;
    std::vector<float> x = causal_conv(conv_in_, audio, T, false, &T);  // [F, N]
    for (size_t s = 0; s < res_.size(); ++s) {
        // Residual block: ELU -> conv k3 (C -> C/compress) -> ELU -> conv k1 -> + skip.
        std::vector<float> h = x;
        elu_inplace(h.data(), h.size());
        int t1 = 0;
        std::vector<float> reduced = causal_conv(res_[s].conv1, h.data(), T, false, &t1);
        elu_inplace(reduced.data(), reduced.size());
        std::vector<float> expanded = causal_conv(res_[s].conv2, reduced.data(), t1, false, &t1);
        add_inplace(x.data(), expanded.data(), x.size());
        // ELU -> strided conv doubling the channels.
        elu_inplace(x.data(), x.size());
        x = causal_conv(down_[s], x.data(), T, false, &T);
    }
    elu_inplace(x.data(), x.size());
    x = causal_conv(conv_out_, x.data(), T, false, &T);  // [D, N / hop]
    *frames_out = T;
    return x;
}

void SpeechEncoder::transformer_forward(std::vector<float>& x, int T) const {
    const EncoderConfig& e = config_.encoder;
    const int D = e.hidden_size, H = e.num_heads, KV = e.num_kv_heads, hd = e.head_dim, I = e.intermediate_size;
    std::vector<int64_t> positions(static_cast<size_t>(T));
    for (int t = 0; t < T; ++t) positions[size_t(t)] = t;
    std::vector<float> normed(size_t(T) * D), q(size_t(T) * H * hd), k(size_t(T) * KV * hd), v(size_t(T) * KV * hd);
    std::vector<float> attn(size_t(T) * H * hd), attn_out(size_t(T) * D), mlp_hidden(size_t(T) * I),
        mlp_out(size_t(T) * D);
    for (const Layer& w : layers_) {
        layer_norm(x.data(), T, D, w.input_norm_w.data, w.input_norm_b.data, e.norm_eps, normed.data());
        linear(normed.data(), T, D, w.q_proj.data, nullptr, H * hd, q.data());
        linear(normed.data(), T, D, w.k_proj.data, nullptr, KV * hd, k.data());
        linear(normed.data(), T, D, w.v_proj.data, nullptr, KV * hd, v.data());
        rope_apply_table(q.data(), T, H, hd, positions.data(), rope_inv_freq_.data());
        rope_apply_table(k.data(), T, KV, hd, positions.data(), rope_inv_freq_.data());
        attention(q.data(), T, positions.data(), k.data(), v.data(), T, 0, H, KV, hd, options_.attention_window,
                  attn.data());
        linear(attn.data(), T, H * hd, w.o_proj.data, nullptr, D, attn_out.data());
        scale_rows_add(x.data(), attn_out.data(), w.attn_scale.data, T, D);

        layer_norm(x.data(), T, D, w.post_norm_w.data, w.post_norm_b.data, e.norm_eps, normed.data());
        linear(normed.data(), T, D, w.fc1.data, nullptr, I, mlp_hidden.data());
        for (float& h : mlp_hidden) h = gelu_erf(h);
        linear(mlp_hidden.data(), T, I, w.fc2.data, nullptr, D, mlp_out.data());
        scale_rows_add(x.data(), mlp_out.data(), w.mlp_scale.data, T, D);
    }
}

std::vector<float> SpeechEncoder::downsample_forward(const std::vector<float>& x, int T, int* frames_out) const {
    return causal_conv(downsample_, x.data(), T, true, frames_out);
}

void SpeechEncoder::residual_quantize(const std::vector<Codebook>& books, std::vector<float>& residual, int T,
                                      int32_t* out, int stride, int offset) const {
    const int cd = config_.encoder.codebook_dim, cs = config_.encoder.codebook_size;
    std::vector<float> dots(size_t(T) * cs);
    for (size_t k = 0; k < books.size(); ++k) {
        const Codebook& book = books[k];
        // ‖r − e‖² = ‖r‖² − 2 r·e + ‖e‖²: the fp32 products screen the candidates, and the few
        // within rounding distance of the best are compared exactly in double, so near-ties are
        // decided by the true distance.
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, cs, cd, 1.0f, residual.data(), cd, book.entries.data(),
                    cd, 0.0f, dots.data(), cs);
        for (int t = 0; t < T; ++t) {
            float* r = residual.data() + size_t(t) * cd;
            const float* dt = dots.data() + size_t(t) * cs;
            double r_norm = 0.0;
            for (int j = 0; j < cd; ++j) r_norm += double(r[j]) * r[j];
            float best_approx = std::numeric_limits<float>::infinity();
            float max_norm = 0.0f;
            for (int i = 0; i < cs; ++i) {
                best_approx = std::min(best_approx, book.norms[size_t(i)] - 2.0f * dt[i]);
                max_norm = std::max(max_norm, book.norms[size_t(i)]);
            }
            const float tolerance = 1e-4f * float(r_norm + max_norm) + 1e-30f;
            int best = -1;
            double best_exact = std::numeric_limits<double>::infinity();
            for (int i = 0; i < cs; ++i) {
                if (book.norms[size_t(i)] - 2.0f * dt[i] > best_approx + tolerance) continue;
                const float* entry = book.entries.data() + size_t(i) * cd;
                double d2 = 0.0;
                for (int j = 0; j < cd; ++j) {
                    const double diff = double(r[j]) - double(entry[j]);
                    d2 += diff * diff;
                }
                if (d2 < best_exact) {  // strict: the first index wins a tie, as argmin does
                    best_exact = d2;
                    best = i;
                }
            }
            QTTS_ASSERT(best >= 0);
            out[size_t(t) * stride + offset + k] = best;
            const float* chosen = book.entries.data() + size_t(best) * cd;
            for (int j = 0; j < cd; ++j) r[j] -= chosen[j];
        }
    }
}

std::vector<int32_t> SpeechEncoder::quantize(const std::vector<float>& latent, int T) const {
    const EncoderConfig& e = config_.encoder;
    const int D = e.hidden_size, cd = e.codebook_dim, n_codes = config_.encoder_valid_num_quantizers;
    std::vector<int32_t> codes(size_t(T) * n_codes);
    // Both branches project the same latent (the acoustic one does not see the semantic residual).
    std::vector<float> semantic(size_t(T) * cd), acoustic(size_t(T) * cd);
    linear(latent.data(), T, D, semantic_proj_.data, nullptr, cd, semantic.data());
    linear(latent.data(), T, D, acoustic_proj_.data, nullptr, cd, acoustic.data());
    residual_quantize(semantic_books_, semantic, T, codes.data(), n_codes, 0);
    residual_quantize(acoustic_books_, acoustic, T, codes.data(), n_codes, e.num_semantic_quantizers);
    return codes;
}

SpeechCodes SpeechEncoder::encode(const float* audio, size_t num_samples) const {
    reference_audio_validate(audio, num_samples, min_samples(), "speech encoder");
    const int D = config_.encoder.hidden_size;
    if (options_.attention_window == 0 && num_samples > size_t(config_.encoder.sliding_window) * size_t(
                                                                 config_.encode_downsample_rate / 2))
        QTTS_LOG_DEBUG("speech encoder: clip of {:.1f} s is longer than the {}-frame window of the config; using "
                       "full causal attention as the reference's default path does",
                       double(num_samples) / config_.input_sample_rate, config_.encoder.sliding_window);

    int T25 = 0;
    std::vector<float> seanet_out = seanet_forward(audio, int(num_samples), &T25);  // [D, T25]
    std::vector<float> hidden(size_t(T25) * D);                                     // [T25, D]
    transpose(seanet_out.data(), D, T25, hidden.data());
    transformer_forward(hidden, T25);
    std::vector<float> transformer_out(size_t(D) * T25);  // [D, T25]
    transpose(hidden.data(), T25, D, transformer_out.data());
    int T12 = 0;
    const std::vector<float> downsampled = downsample_forward(transformer_out, T25, &T12);  // [D, T12]
    std::vector<float> latent(size_t(T12) * D);                                           // [T12, D]
    transpose(downsampled.data(), D, T12, latent.data());
    QTTS_ASSERT(T12 == frame_count(num_samples));

    SpeechCodes result;
    result.frames = T12;
    result.num_codebooks = config_.encoder_valid_num_quantizers;
    result.values = quantize(latent, T12);
    return result;
}

}  // namespace qtts::cpu
