#include "engine/cpu/speech_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cpu/conv_ops.h"
#include "engine/cpu/ops.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_prep.h"

namespace qtts::cpu {

namespace {

ConvTail conv_tail_new(int channels, int len) {
    ConvTail tail;
    tail.channels = channels;
    tail.len = len;
    tail.data.assign(size_t(channels) * size_t(len), 0.0f);
    return tail;
}

// y [C, T] += x_time_major [T, C]
void add_transposed(float* y, const float* x_time_major, int C, int T) {
    for (int t = 0; t < T; ++t) {
        const float* row = x_time_major + size_t(t) * C;
        for (int c = 0; c < C; ++c) y[size_t(c) * T + t] += row[c];
    }
}

// Rotate-half RoPE in place on x [T, n_heads * head_dim]; row t is at absolute position
// positions[t]. Angles are formed in fp32 as the reference does (inv_freq · position).
void rope_rotate(float* x, int T, int n_heads, int head_dim, const int64_t* positions, const float* inv_freq) {
    const int half = head_dim / 2;
    for (int t = 0; t < T; ++t) {
        const float pos = float(positions[t]);
        for (int i = 0; i < half; ++i) {
            const float angle = inv_freq[i] * pos;
            const float c = std::cos(angle), s = std::sin(angle);
            for (int h = 0; h < n_heads; ++h) {
                float* v = x + (size_t(t) * n_heads + h) * head_dim;
                const float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

// h [T, D] += scale[D] ⊙ x [T, D]   (LayerScale residual)
void add_scaled_rows(float* h, const float* x, const float* scale, int T, int D) {
    for (int t = 0; t < T; ++t) {
        float* hr = h + size_t(t) * D;
        const float* xr = x + size_t(t) * D;
        for (int d = 0; d < D; ++d) hr[d] += scale[d] * xr[d];
    }
}

}  // namespace

size_t DecoderState::carried_bytes() const {
    size_t floats = pre_conv.data.size() + conv_in.data.size() + conv_out.data.size();
    for (const auto& a : attention) floats += a.k.size() + a.v.size();
    for (const auto& t : upsample_overlap) floats += t.data.size();
    for (const auto& t : convnext) floats += t.data.size();
    for (const auto& b : blocks) {
        floats += b.upsample_overlap.data.size();
        for (const auto& u : b.units) floats += u.data.size();
    }
    return floats * sizeof(float);
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

CpuSpeechDecoder::Conv CpuSpeechDecoder::conv_load(const ConvWeights& w, int dilation, int groups) {
    if (!w.w || w.w->shape.size() != 3) fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: a conv weight is missing or not 3-D");
    Conv c;
    c.cout = int(w.w->shape[0]);
    c.cin = int(w.w->shape[1]) * groups;
    c.k = int(w.w->shape[2]);
    c.dilation = dilation;
    c.groups = groups;
    c.w = tensor_to_f32(*w.w);
    if (w.b) c.b = speech_weight_f32(w.b, c.cout, "conv bias");
    return c;
}

CpuSpeechDecoder::TransConv CpuSpeechDecoder::trans_conv_load(const ConvWeights& w, int stride) {
    if (!w.w || w.w->shape.size() != 3)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: a transposed-conv weight is missing or not 3-D");
    TransConv c;
    c.cin = int(w.w->shape[0]);
    c.cout = int(w.w->shape[1]);
    c.k = int(w.w->shape[2]);
    c.stride = stride;
    if (c.k < stride)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: transposed conv '{}' has kernel {} < stride {}", w.w->name,
             c.k, stride);
    c.w = tensor_to_f32(*w.w);
    c.b = speech_weight_f32(w.b, c.cout, "transposed conv bias");
    return c;
}

CpuSpeechDecoder::Snake CpuSpeechDecoder::snake_load(const SnakeWeights& w) {
    Snake s;
    if (!w.alpha || !w.beta) fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: a SnakeBeta alpha/beta is missing");
    s.log_alpha = tensor_to_f32(*w.alpha);
    s.log_beta = speech_weight_f32(w.beta, int64_t(s.log_alpha.size()), "snake beta");
    return s;
}

CpuSpeechDecoder::CpuSpeechDecoder(const Checkpoint& checkpoint, CpuSpeechDecoderOptions options)
    : CpuSpeechDecoder(checkpoint.speech_config.decoder, checkpoint.decoder, options) {
    if (checkpoint.speech_config.decode_upsample_rate != samples_per_frame_) {
        QTTS_LOG_WARN("speech tokenizer config says decode_upsample_rate {}, the decoder's rates give {} samples per frame",
                      checkpoint.speech_config.decode_upsample_rate, samples_per_frame_);
    }
}

CpuSpeechDecoder::CpuSpeechDecoder(const DecoderConfig& config, const SpeechDecoderWeights& w,
                                   CpuSpeechDecoderOptions options)
    : config_(config), options_(options) {
    const DecoderConfig& d = config_;
    if (options_.max_chunk_frames < 1)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "max_chunk_frames must be >= 1, got {}", options_.max_chunk_frames);
    speech_decoder_layout_check(d, w, "speech decoder");

    const int cs = d.codebook_size, cd = d.codebook_dim, half = cd / 2;
    const int latent = d.latent_dim, D = d.hidden_size, I = d.intermediate_size;
    const int qd = d.num_heads * d.head_dim, kvd = d.num_kv_heads * d.head_dim;
    codebook_half_ = half;

    // RoPE inverse frequencies from the config, in fp32 like the reference: 1 / theta^(2i / head_dim).
    rope_inv_freq_ = rope_inv_freq(d.head_dim, d.rope_theta);

    // RVQ codebooks, normalised once: embedding_sum / max(cluster_usage, eps).
    codebooks_.push_back(rvq_codebook_normalised(w.rvq_first_embedding_sum, w.rvq_first_cluster_usage, cs, half));
    for (int k = 0; k < d.num_quantizers - 1; ++k)
        codebooks_.push_back(rvq_codebook_normalised(w.rvq_rest_embedding_sum[size_t(k)],
                                                     w.rvq_rest_cluster_usage[size_t(k)], cs, half));
    rvq_first_proj_ = speech_weight_f32(w.rvq_first_output_proj, int64_t(cd) * half, "rvq_first.output_proj");
    rvq_rest_proj_ = speech_weight_f32(w.rvq_rest_output_proj, int64_t(cd) * half, "rvq_rest.output_proj");

    pre_conv_ = conv_load(w.pre_conv, 1, 1);
    if (pre_conv_.cin != cd || pre_conv_.cout != latent)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder pre_conv is {}->{}, expected {}->{}", pre_conv_.cin, pre_conv_.cout, cd,
             latent);

    tr_input_proj_w_ = speech_weight_f32(w.tr_input_proj_w, int64_t(D) * latent, "pre_transformer.input_proj.weight");
    tr_input_proj_b_ = speech_weight_f32(w.tr_input_proj_b, D, "pre_transformer.input_proj.bias");
    for (const auto& lw : w.tr_layers) {
        TransformerLayer l;
        l.input_norm = speech_weight_f32(lw.input_norm, D, "input_layernorm");
        l.q_proj = speech_weight_f32(lw.q_proj, int64_t(qd) * D, "q_proj");
        l.k_proj = speech_weight_f32(lw.k_proj, int64_t(kvd) * D, "k_proj");
        l.v_proj = speech_weight_f32(lw.v_proj, int64_t(kvd) * D, "v_proj");
        l.o_proj = speech_weight_f32(lw.o_proj, int64_t(D) * qd, "o_proj");
        l.attn_scale = speech_weight_f32(lw.attn_scale, D, "self_attn_layer_scale");
        l.post_norm = speech_weight_f32(lw.post_norm, D, "post_attention_layernorm");
        l.gate_proj = speech_weight_f32(lw.gate_proj, int64_t(I) * D, "gate_proj");
        l.up_proj = speech_weight_f32(lw.up_proj, int64_t(I) * D, "up_proj");
        l.down_proj = speech_weight_f32(lw.down_proj, int64_t(D) * I, "down_proj");
        l.mlp_scale = speech_weight_f32(lw.mlp_scale, D, "mlp_layer_scale");
        tr_layers_.push_back(std::move(l));
    }
    tr_norm_ = speech_weight_f32(w.tr_norm, D, "pre_transformer.norm");
    tr_output_proj_w_ = speech_weight_f32(w.tr_output_proj_w, int64_t(latent) * D, "pre_transformer.output_proj.weight");
    tr_output_proj_b_ = speech_weight_f32(w.tr_output_proj_b, latent, "pre_transformer.output_proj.bias");

    samples_per_frame_ = 1;
    for (size_t i = 0; i < d.upsampling_ratios.size(); ++i) {
        const int r = d.upsampling_ratios[i];
        upsample_conv_.push_back(trans_conv_load(w.upsample_conv[i], r));
        const ConvNeXtWeights& cw = w.upsample_convnext[i];
        ConvNeXt cx;
        cx.dwconv = conv_load(cw.dwconv, 1, latent);
        if (cx.dwconv.k != SPEECH_DECODER_CONVNEXT_KERNEL || cx.dwconv.cout != latent)
            fail(ErrorCode::ERROR_SHAPE, "speech decoder ConvNeXt {} depthwise conv has an unexpected shape", i);
        cx.norm_w = speech_weight_f32(cw.norm_w, latent, "convnext norm.weight");
        cx.norm_b = speech_weight_f32(cw.norm_b, latent, "convnext norm.bias");
        cx.pw1_w = speech_weight_f32(cw.pw1_w, int64_t(4) * latent * latent, "convnext pwconv1.weight");
        cx.pw1_b = speech_weight_f32(cw.pw1_b, int64_t(4) * latent, "convnext pwconv1.bias");
        cx.pw2_w = speech_weight_f32(cw.pw2_w, int64_t(4) * latent * latent, "convnext pwconv2.weight");
        cx.pw2_b = speech_weight_f32(cw.pw2_b, latent, "convnext pwconv2.bias");
        cx.gamma = speech_weight_f32(cw.gamma, latent, "convnext gamma");
        upsample_convnext_.push_back(std::move(cx));
        samples_per_frame_ *= r;
    }

    conv_in_ = conv_load(w.conv_in, 1, 1);
    int C = d.decoder_dim;
    for (size_t i = 0; i < d.upsample_rates.size(); ++i) {
        const int r = d.upsample_rates[i];
        const DecoderBlockWeights& bw = w.blocks[i];
        Block blk;
        blk.snake = snake_load(bw.snake);
        blk.upsample = trans_conv_load(bw.upsample, r);
        if (blk.upsample.cin != C || int(blk.snake.log_alpha.size()) != C)
            fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} expects {} input channels", i, C);
        for (size_t u = 0; u < size_t(SPEECH_DECODER_RESIDUAL_UNITS); ++u) {
            const ResidualUnitWeights& uw = bw.units[u];
            ResidualUnit ru;
            ru.act1 = snake_load(uw.act1);
            ru.conv1 = conv_load(uw.conv1, SPEECH_DECODER_RESIDUAL_DILATIONS[u], 1);
            ru.act2 = snake_load(uw.act2);
            ru.conv2 = conv_load(uw.conv2, 1, 1);
            if (ru.conv2.k != 1) fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} unit {}: conv2 must be 1x1", i, u);
            blk.units.push_back(std::move(ru));
        }
        C = blk.upsample.cout;
        blocks_.push_back(std::move(blk));
        samples_per_frame_ *= r;
    }
    snake_out_ = snake_load(w.snake_out);
    conv_out_ = conv_load(w.conv_out, 1, 1);
    if (conv_out_.cin != C || conv_out_.cout != 1)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder output conv is {}->{}, expected {}->1", conv_out_.cin, conv_out_.cout, C);
}

// ---------------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------------

DecoderState CpuSpeechDecoder::state_new() const {
    DecoderState s;
    s.frames_done = 0;
    s.pre_conv = conv_tail_new(pre_conv_.cin, (pre_conv_.k - 1) * pre_conv_.dilation);
    const int kvd = config_.num_kv_heads * config_.head_dim;
    const int keep = config_.sliding_window > 0 ? config_.sliding_window - 1 : 0;
    s.attention.resize(tr_layers_.size());
    for (auto& a : s.attention) {
        a.rows = 0;
        a.k.reserve(size_t(keep) * kvd);
        a.v.reserve(size_t(keep) * kvd);
    }
    for (size_t i = 0; i < upsample_conv_.size(); ++i) {
        s.upsample_overlap.push_back(conv_tail_new(upsample_conv_[i].cout, upsample_conv_[i].k - upsample_conv_[i].stride));
        const Conv& dw = upsample_convnext_[i].dwconv;
        s.convnext.push_back(conv_tail_new(dw.cin, (dw.k - 1) * dw.dilation));
    }
    s.conv_in = conv_tail_new(conv_in_.cin, (conv_in_.k - 1) * conv_in_.dilation);
    for (const Block& blk : blocks_) {
        DecoderBlockState bs;
        bs.upsample_overlap = conv_tail_new(blk.upsample.cout, blk.upsample.k - blk.upsample.stride);
        for (const ResidualUnit& ru : blk.units) bs.units.push_back(conv_tail_new(ru.conv1.cin, (ru.conv1.k - 1) * ru.conv1.dilation));
        s.blocks.push_back(std::move(bs));
    }
    s.conv_out = conv_tail_new(conv_out_.cin, (conv_out_.k - 1) * conv_out_.dilation);
    return s;
}

void CpuSpeechDecoder::state_check(const DecoderState& s) const {
    bool ok = s.attention.size() == tr_layers_.size() && s.blocks.size() == blocks_.size() &&
              s.upsample_overlap.size() == upsample_conv_.size() && s.convnext.size() == upsample_convnext_.size() &&
              s.pre_conv.channels == pre_conv_.cin && s.conv_in.channels == conv_in_.cin &&
              s.conv_out.channels == conv_out_.cin && s.frames_done >= 0;
    for (size_t i = 0; ok && i < blocks_.size(); ++i)
        ok = s.blocks[i].units.size() == blocks_[i].units.size() &&
             s.blocks[i].upsample_overlap.channels == blocks_[i].upsample.cout;
    if (!ok)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speech decoder: the DecoderState does not belong to this decoder (create it with state_new())");
}

// ---------------------------------------------------------------------------------------------
// Streaming building blocks
// ---------------------------------------------------------------------------------------------

// Causal conv over x [cin, T] -> y [cout, T]: the carried tail stands in for the left zero
// padding of a full decode, then becomes the last `len` input columns.
void CpuSpeechDecoder::causal_conv(const Conv& conv, ConvTail& tail, const float* x, int T, std::vector<float>& buf,
                                   float* y) {
    const int C = conv.cin, L = tail.len;
    QTTS_ASSERT(L == (conv.k - 1) * conv.dilation && tail.channels == C);
    const float* bias = conv.b.empty() ? nullptr : conv.b.data();
    if (L == 0) {
        conv1d(x, C, T, conv.w.data(), bias, conv.cout, conv.k, 1, conv.dilation, conv.groups, y);
        return;
    }
    const int W = L + T;
    buf.resize(size_t(C) * W);
    for (int c = 0; c < C; ++c) {
        float* row = buf.data() + size_t(c) * W;
        std::memcpy(row, tail.data.data() + size_t(c) * L, sizeof(float) * size_t(L));
        std::memcpy(row + L, x + size_t(c) * T, sizeof(float) * size_t(T));
    }
    conv1d(buf.data(), C, W, conv.w.data(), bias, conv.cout, conv.k, 1, conv.dilation, conv.groups, y);
    for (int c = 0; c < C; ++c)
        std::memcpy(tail.data.data() + size_t(c) * L, buf.data() + size_t(c) * W + T, sizeof(float) * size_t(L));
}

// Causal transposed conv over x [cin, T] -> y [cout, T*stride]. The untrimmed output of this
// chunk is (T-1)*stride + k long; its first k-stride samples still owe the previous chunk's
// spill-over (carried in `overlap`), and its last k-stride samples are this chunk's spill-over
// into the next one — exactly what the full decode's right trim would cut at the very end.
void CpuSpeechDecoder::causal_trans_conv(const TransConv& tc, ConvTail& overlap, const float* x, int T,
                                         std::vector<float>& buf, float* y) {
    const int O = overlap.len, s = tc.stride;
    QTTS_ASSERT(O == tc.k - s && overlap.channels == tc.cout);
    const int full = conv_transpose1d_out_len(T, tc.k, s);
    const int emit = T * s;
    buf.resize(size_t(tc.cout) * full);
    conv_transpose1d(x, tc.cin, T, tc.w.data(), nullptr, tc.cout, tc.k, s, buf.data());
    for (int c = 0; c < tc.cout; ++c) {
        float* row = buf.data() + size_t(c) * full;
        float* tail = overlap.data.data() + size_t(c) * O;
        for (int j = 0; j < O; ++j) row[j] += tail[j];
        const float bias = tc.b[size_t(c)];
        float* yc = y + size_t(c) * emit;
        for (int m = 0; m < emit; ++m) yc[m] = row[m] + bias;
        if (O > 0) std::memcpy(tail, row + emit, sizeof(float) * size_t(O));  // k == stride: no spill-over, no buffer
    }
}

// ---------------------------------------------------------------------------------------------
// Stages
// ---------------------------------------------------------------------------------------------

void CpuSpeechDecoder::rvq_dequantize(const int32_t* codes, int n, float* z) const {
    const int nq = config_.num_quantizers, half = codebook_half_, cd = config_.codebook_dim;
    std::vector<float> q_sem(size_t(n) * half, 0.0f), q_ac(size_t(n) * half, 0.0f), z_ac(size_t(n) * cd);
    for (int t = 0; t < n; ++t) {
        const int32_t* frame = codes + size_t(t) * nq;
        std::memcpy(q_sem.data() + size_t(t) * half, codebooks_[0].data() + size_t(frame[0]) * half,
                    sizeof(float) * size_t(half));
        float* acc = q_ac.data() + size_t(t) * half;
        for (int q = 1; q < nq; ++q) {
            const float* row = codebooks_[size_t(q)].data() + size_t(frame[q]) * half;
            for (int j = 0; j < half; ++j) acc[j] += row[j];
        }
    }
    // z = W_first · q_sem + W_rest · q_ac (the output projections are 1×1 convs = linears)
    linear(q_sem.data(), n, half, rvq_first_proj_.data(), nullptr, cd, z);
    linear(q_ac.data(), n, half, rvq_rest_proj_.data(), nullptr, cd, z_ac.data());
    add_inplace(z, z_ac.data(), size_t(n) * cd);
}

void CpuSpeechDecoder::transformer_layer_forward(DecoderState& state, int layer, int n, float* h) const {
    const DecoderConfig& d = config_;
    const TransformerLayer& L = tr_layers_[size_t(layer)];
    AttentionCache& cache = state.attention[size_t(layer)];
    DecoderScratch& s = state.scratch;
    const int D = d.hidden_size, I = d.intermediate_size;
    const int qd = d.num_heads * d.head_dim, kvd = d.num_kv_heads * d.head_dim;

    // Attention: x += ls_attn ⊙ o_proj(Attn(RMSNorm(x)))
    s.xn.resize(size_t(n) * D);
    rms_norm(h, n, D, L.input_norm.data(), d.rms_norm_eps, s.xn.data());
    s.q.resize(size_t(n) * qd);
    s.k.resize(size_t(n) * kvd);
    s.v.resize(size_t(n) * kvd);
    linear(s.xn.data(), n, D, L.q_proj.data(), nullptr, qd, s.q.data());
    linear(s.xn.data(), n, D, L.k_proj.data(), nullptr, kvd, s.k.data());
    linear(s.xn.data(), n, D, L.v_proj.data(), nullptr, kvd, s.v.data());
    rope_rotate(s.q.data(), n, d.num_heads, d.head_dim, s.positions.data(), rope_inv_freq_.data());
    rope_rotate(s.k.data(), n, d.num_kv_heads, d.head_dim, s.positions.data(), rope_inv_freq_.data());

    // Keys/values visible to this chunk: the cached past, then the chunk itself.
    const int S = cache.rows + n;
    s.kbuf.resize(size_t(S) * kvd);
    s.vbuf.resize(size_t(S) * kvd);
    std::memcpy(s.kbuf.data(), cache.k.data(), sizeof(float) * size_t(cache.rows) * kvd);
    std::memcpy(s.vbuf.data(), cache.v.data(), sizeof(float) * size_t(cache.rows) * kvd);
    std::memcpy(s.kbuf.data() + size_t(cache.rows) * kvd, s.k.data(), sizeof(float) * size_t(n) * kvd);
    std::memcpy(s.vbuf.data() + size_t(cache.rows) * kvd, s.v.data(), sizeof(float) * size_t(n) * kvd);
    const int64_t k_pos0 = state.frames_done - cache.rows;
    s.att.resize(size_t(n) * qd);
    attention(s.q.data(), n, s.positions.data(), s.kbuf.data(), s.vbuf.data(), S, k_pos0, d.num_heads, d.num_kv_heads,
              d.head_dim, d.sliding_window, s.att.data());

    // Keep what the next chunk can still see: the last window-1 positions.
    const int keep = d.sliding_window > 0 ? std::min(S, d.sliding_window - 1) : S;
    cache.k.assign(s.kbuf.begin() + ptrdiff_t(S - keep) * kvd, s.kbuf.begin() + ptrdiff_t(S) * kvd);
    cache.v.assign(s.vbuf.begin() + ptrdiff_t(S - keep) * kvd, s.vbuf.begin() + ptrdiff_t(S) * kvd);
    cache.rows = keep;

    s.proj.resize(size_t(n) * D);
    linear(s.att.data(), n, qd, L.o_proj.data(), nullptr, D, s.proj.data());
    add_scaled_rows(h, s.proj.data(), L.attn_scale.data(), n, D);

    // MLP: x += ls_mlp ⊙ down(silu(gate(y)) · up(y)),  y = RMSNorm(x)
    rms_norm(h, n, D, L.post_norm.data(), d.rms_norm_eps, s.xn.data());
    s.gate.resize(size_t(n) * I);
    s.up.resize(size_t(n) * I);
    linear(s.xn.data(), n, D, L.gate_proj.data(), nullptr, I, s.gate.data());
    linear(s.xn.data(), n, D, L.up_proj.data(), nullptr, I, s.up.data());
    swiglu(s.gate.data(), s.up.data(), size_t(n) * I, s.gate.data());
    linear(s.gate.data(), n, I, L.down_proj.data(), nullptr, D, s.proj.data());
    add_scaled_rows(h, s.proj.data(), L.mlp_scale.data(), n, D);
}

// s.x [latent, n] -> s.x [latent, n], through the time-major transformer.
void CpuSpeechDecoder::transformer_forward(DecoderState& state, int n) const {
    DecoderScratch& s = state.scratch;
    const int latent = config_.latent_dim, D = config_.hidden_size;
    s.tmp.resize(size_t(n) * latent);
    transpose(s.x.data(), latent, n, s.tmp.data());  // [n, latent]
    s.tmp2.resize(size_t(n) * D);
    float* h = s.tmp2.data();  // [n, D]
    linear(s.tmp.data(), n, latent, tr_input_proj_w_.data(), tr_input_proj_b_.data(), D, h);

    // Absolute positions continue across calls (a full decode starts at 0).
    s.positions.resize(size_t(n));
    for (int t = 0; t < n; ++t) s.positions[size_t(t)] = state.frames_done + t;
    for (int l = 0; l < int(tr_layers_.size()); ++l) transformer_layer_forward(state, l, n, h);

    rms_norm(h, n, D, tr_norm_.data(), config_.rms_norm_eps, h);
    linear(h, n, D, tr_output_proj_w_.data(), tr_output_proj_b_.data(), latent, s.tmp.data());  // [n, latent]
    transpose(s.tmp.data(), n, latent, s.x.data());                                              // [latent, n]
}

// ConvNeXt on s.x [C, T] in place: x += gamma ⊙ pw2(gelu(pw1(LayerNorm(dwconv(x))))).
void CpuSpeechDecoder::convnext_forward(const ConvNeXt& cx, ConvTail& tail, DecoderScratch& s, int T) const {
    const int C = cx.dwconv.cout, C4 = 4 * C;
    s.y.resize(size_t(C) * T);
    causal_conv(cx.dwconv, tail, s.x.data(), T, s.concat, s.y.data());  // [C, T]
    s.tmp.resize(size_t(T) * C);
    transpose(s.y.data(), C, T, s.tmp.data());  // [T, C]
    layer_norm(s.tmp.data(), T, C, cx.norm_w.data(), cx.norm_b.data(), SPEECH_DECODER_CONVNEXT_EPS, s.tmp.data());
    s.tmp2.resize(size_t(T) * C4);
    linear(s.tmp.data(), T, C, cx.pw1_w.data(), cx.pw1_b.data(), C4, s.tmp2.data());  // [T, 4C]
    for (float& v : s.tmp2) v = gelu_erf(v);
    linear(s.tmp2.data(), T, C4, cx.pw2_w.data(), cx.pw2_b.data(), C, s.tmp.data());  // [T, C]
    for (int t = 0; t < T; ++t) {
        float* row = s.tmp.data() + size_t(t) * C;
        for (int c = 0; c < C; ++c) row[c] *= cx.gamma[size_t(c)];
    }
    add_transposed(s.x.data(), s.tmp.data(), C, T);
}

// Decoder block on s.x [C_in, T] -> s.x [C_out, T*r]; returns T*r.
int CpuSpeechDecoder::block_forward(const Block& blk, DecoderBlockState& bs, DecoderScratch& s, int T) const {
    const int C_in = blk.upsample.cin, C = blk.upsample.cout, r = blk.upsample.stride;
    snake_beta(s.x.data(), C_in, T, blk.snake.log_alpha.data(), blk.snake.log_beta.data());
    s.y.resize(size_t(C) * T * r);
    causal_trans_conv(blk.upsample, bs.upsample_overlap, s.x.data(), T, s.concat, s.y.data());
    std::swap(s.x, s.y);
    T *= r;
    const size_t count = size_t(C) * T;
    for (size_t u = 0; u < blk.units.size(); ++u) {
        const ResidualUnit& ru = blk.units[u];
        // x += conv2(snake2(conv1_dilated(snake1(x))))
        s.tmp.assign(s.x.begin(), s.x.begin() + ptrdiff_t(count));
        snake_beta(s.tmp.data(), C, T, ru.act1.log_alpha.data(), ru.act1.log_beta.data());
        s.y.resize(count);
        causal_conv(ru.conv1, bs.units[u], s.tmp.data(), T, s.concat, s.y.data());
        snake_beta(s.y.data(), C, T, ru.act2.log_alpha.data(), ru.act2.log_beta.data());
        s.tmp.resize(count);
        conv1d(s.y.data(), C, T, ru.conv2.w.data(), ru.conv2.b.data(), C, 1, 1, 1, 1, s.tmp.data());
        add_inplace(s.x.data(), s.tmp.data(), count);
    }
    return T;
}

void CpuSpeechDecoder::chunk_decode(DecoderState& state, const int32_t* codes, int n, float* pcm) const {
    DecoderScratch& s = state.scratch;
    const int cd = config_.codebook_dim, latent = config_.latent_dim;

    // 1. RVQ dequantize -> [cd, n]
    s.tmp.resize(size_t(n) * cd);
    rvq_dequantize(codes, n, s.tmp.data());
    s.y.resize(size_t(cd) * n);
    transpose(s.tmp.data(), n, cd, s.y.data());

    // 2. pre_conv (causal k3) -> [latent, n]
    s.x.resize(size_t(latent) * n);
    causal_conv(pre_conv_, state.pre_conv, s.y.data(), n, s.concat, s.x.data());

    // 3. pre_transformer -> [latent, n]
    transformer_forward(state, n);

    // 4. upsample: transposed conv ×r, then ConvNeXt, per stage
    int T = n;
    for (size_t i = 0; i < upsample_conv_.size(); ++i) {
        const TransConv& up = upsample_conv_[i];
        s.y.resize(size_t(up.cout) * T * up.stride);
        causal_trans_conv(up, state.upsample_overlap[i], s.x.data(), T, s.concat, s.y.data());
        std::swap(s.x, s.y);
        T *= up.stride;
        convnext_forward(upsample_convnext_[i], state.convnext[i], s, T);
    }

    // 5. decoder.0: causal conv k7 latent -> decoder_dim
    s.y.resize(size_t(conv_in_.cout) * T);
    causal_conv(conv_in_, state.conv_in, s.x.data(), T, s.concat, s.y.data());
    std::swap(s.x, s.y);

    // 6. decoder blocks
    for (size_t i = 0; i < blocks_.size(); ++i) T = block_forward(blocks_[i], state.blocks[i], s, T);

    // 7. SnakeBeta -> causal conv k7 -> 1 channel, clamp to [-1, 1]
    snake_beta(s.x.data(), conv_out_.cin, T, snake_out_.log_alpha.data(), snake_out_.log_beta.data());
    QTTS_ASSERT(T == n * samples_per_frame_);
    causal_conv(conv_out_, state.conv_out, s.x.data(), T, s.concat, pcm);
    for (int i = 0; i < T; ++i) pcm[i] = std::min(1.0f, std::max(-1.0f, pcm[i]));

    state.frames_done += n;
}

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

void CpuSpeechDecoder::decode(DecoderState& state, const int32_t* codes, int n, std::vector<float>* pcm_out) const {
    if (!speech_decode_args_check(config_, codes, n, pcm_out, "speech decoder")) return;
    state_check(state);
    speech_decode_chunked(codes, n, config_.num_quantizers, options_.max_chunk_frames, samples_per_frame_, pcm_out,
                          [&](const int32_t* chunk, int m, float* pcm) { chunk_decode(state, chunk, m, pcm); });
}

std::vector<float> CpuSpeechDecoder::decode_full(const int32_t* codes, int n) const {
    DecoderState state = state_new();
    std::vector<float> pcm;
    decode(state, codes, n, &pcm);
    return pcm;
}

std::vector<float> CpuSpeechDecoder::dequantize(const int32_t* codes, int n) const {
    if (n < 0 || (n > 0 && !codes)) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "speech decoder: bad codes ({} frames)", n);
    speech_codes_validate(config_, codes, n, "speech decoder");
    std::vector<float> z(size_t(n) * config_.codebook_dim);
    if (n > 0) rvq_dequantize(codes, n, z.data());
    return z;
}

}  // namespace qtts::cpu
