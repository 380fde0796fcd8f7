#include "engine/cpu_fast/fast_speech_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"
#include "engine/cpu/ops.h"
#include "engine/model/safetensors.h"
#include "engine/model/weight_prep.h"

namespace qtts::cpu_fast {

namespace {

TimeTail time_tail_new(int rows, int channels) {
    TimeTail tail;
    tail.rows = rows;
    tail.channels = channels;
    tail.data.assign(size_t(rows) * size_t(channels), 0.0f);
    return tail;
}

// h [T, D] += scale[D] ⊙ x [T, D]   (LayerScale residual)
void add_scaled_rows(float* h, const float* x, const float* scale, int T, int D) {
    for (int t = 0; t < T; ++t) {
        float* hr = h + size_t(t) * D;
        const float* xr = x + size_t(t) * D;
        for (int d = 0; d < D; ++d) hr[d] += scale[d] * xr[d];
    }
}

// Copies columns c0..c0+width-1 of src [T, ld] into dst [T, width].
void columns_copy(const float* src, int T, int ld, int c0, int width, float* dst) {
    for (int t = 0; t < T; ++t)
        std::memcpy(dst + size_t(t) * width, src + size_t(t) * ld + c0, sizeof(float) * size_t(width));
}

// Appends a tail's rows and x's T rows into concat [tail.rows + T, C], then keeps the last
// tail.rows rows of it as the new tail (what the next chunk's first outputs look back at).
void tail_concat(TimeTail& tail, const float* x, int T, std::vector<float>& concat) {
    const size_t C = size_t(tail.channels), L = size_t(tail.rows);
    concat.resize((L + size_t(T)) * C);
    std::memcpy(concat.data(), tail.data.data(), sizeof(float) * L * C);
    std::memcpy(concat.data() + L * C, x, sizeof(float) * size_t(T) * C);
    std::memcpy(tail.data.data(), concat.data() + size_t(T) * C, sizeof(float) * L * C);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

FastSpeechDecoder::Snake FastSpeechDecoder::snake_load(const SnakeWeights& w) const {
    if (!w.alpha || !w.beta) fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: a SnakeBeta alpha/beta is missing");
    const std::vector<float> log_alpha = tensor_to_f32(*w.alpha);
    const std::vector<float> log_beta = speech_weight_f32(w.beta, int64_t(log_alpha.size()), "snake beta");
    Snake s;
    for (size_t c = 0; c < log_alpha.size(); ++c) {
        s.alpha.push_back(snake_alpha(log_alpha[c]));
        s.inv_beta.push_back(snake_inv_beta(log_beta[c]));
    }
    return s;
}

PackedConv FastSpeechDecoder::conv_load(const ConvWeights& w, int dilation) const {
    if (!w.w || w.w->shape.size() != 3) fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: a conv weight is missing or not 3-D");
    const int cout = int(w.w->shape[0]), cin = int(w.w->shape[1]), k = int(w.w->shape[2]);
    const std::vector<float> wf = tensor_to_f32(*w.w);  // [cout, cin, k]
    std::vector<float> bias;
    if (w.b) bias = speech_weight_f32(w.b, cout, "conv bias");
    return conv_pack(wf.data(), bias.empty() ? nullptr : bias.data(), cout, cin, k, dilation, format_);
}

FastSpeechDecoder::TransConv FastSpeechDecoder::trans_conv_load(const ConvWeights& w, int stride) const {
    if (!w.w || w.w->shape.size() != 3)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: a transposed-conv weight is missing or not 3-D");
    TransConv tc;
    const int cin = int(w.w->shape[0]);
    tc.cout = int(w.w->shape[1]);
    tc.k = int(w.w->shape[2]);
    tc.stride = stride;
    if (tc.k < stride)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: transposed conv '{}' has kernel {} < stride {}", w.w->name,
             tc.k, stride);
    const std::vector<float> wf = tensor_to_f32(*w.w);  // [cin, cout, k]
    tc.cols = trans_conv_pack(wf.data(), cin, tc.cout, tc.k, format_);
    tc.bias = speech_weight_f32(w.b, tc.cout, "transposed conv bias");
    return tc;
}

FastSpeechDecoder::FastSpeechDecoder(const DecoderConfig& config, const SpeechDecoderWeights& w, ConvFormat format,
                                     std::shared_ptr<ThreadPool> pool, int max_chunk_frames)
    : config_(config), format_(format), pool_(std::move(pool)), max_chunk_frames_(max_chunk_frames) {
    QTTS_ASSERT(pool_);
    if (max_chunk_frames_ < 1)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "max_chunk_frames must be >= 1, got {}", max_chunk_frames_);
    const DecoderConfig& d = config_;
    speech_decoder_layout_check(d, w, "fast speech decoder");
    const int cs = d.codebook_size, cd = d.codebook_dim, half = cd / 2;
    const int latent = d.latent_dim, D = d.hidden_size, I = d.intermediate_size;
    const int qd = d.num_heads * d.head_dim, kvd = d.num_kv_heads * d.head_dim;
    codebook_half_ = half;
    rope_inv_freq_ = rope_inv_freq(d.head_dim, d.rope_theta);

    codebooks_.push_back(rvq_codebook_normalised(w.rvq_first_embedding_sum, w.rvq_first_cluster_usage, cs, half));
    for (int q = 0; q < d.num_quantizers - 1; ++q)
        codebooks_.push_back(rvq_codebook_normalised(w.rvq_rest_embedding_sum[size_t(q)],
                                                     w.rvq_rest_cluster_usage[size_t(q)], cs, half));
    const auto linear_load = [&](const Tensor& wt, const Tensor& bt, int out, int in, const char* what) {
        const std::vector<float> wf = speech_weight_f32(wt, int64_t(out) * in, what);
        std::vector<float> bf;
        if (bt) bf = speech_weight_f32(bt, out, what);
        return linear_pack(wf.data(), bf.empty() ? nullptr : bf.data(), out, in, format_);
    };
    rvq_first_proj_ = linear_load(w.rvq_first_output_proj, nullptr, cd, half, "rvq_first.output_proj");
    rvq_rest_proj_ = linear_load(w.rvq_rest_output_proj, nullptr, cd, half, "rvq_rest.output_proj");

    pre_conv_ = conv_load(w.pre_conv, 1);
    if (pre_conv_.cin != cd || pre_conv_.cout != latent)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder pre_conv is {}->{}, expected {}->{}", pre_conv_.cin, pre_conv_.cout, cd,
             latent);

    tr_input_proj_ = linear_load(w.tr_input_proj_w, w.tr_input_proj_b, D, latent, "pre_transformer.input_proj");
    for (const auto& lw : w.tr_layers) {
        Layer l;
        l.input_norm = speech_weight_f32(lw.input_norm, D, "input_layernorm");
        l.attn_scale = speech_weight_f32(lw.attn_scale, D, "self_attn_layer_scale");
        l.post_norm = speech_weight_f32(lw.post_norm, D, "post_attention_layernorm");
        l.mlp_scale = speech_weight_f32(lw.mlp_scale, D, "mlp_layer_scale");
        std::vector<float> qkv = speech_weight_f32(lw.q_proj, int64_t(qd) * D, "q_proj");  // [qd + 2·kvd, D]
        for (const auto& part : {speech_weight_f32(lw.k_proj, int64_t(kvd) * D, "k_proj"),
                                 speech_weight_f32(lw.v_proj, int64_t(kvd) * D, "v_proj")})
            qkv.insert(qkv.end(), part.begin(), part.end());
        l.qkv = linear_pack(qkv.data(), nullptr, qd + 2 * kvd, D, format_);
        l.o_proj = linear_load(lw.o_proj, nullptr, D, qd, "o_proj");
        std::vector<float> gate_up = speech_weight_f32(lw.gate_proj, int64_t(I) * D, "gate_proj");  // [2·I, D]
        const std::vector<float> up = speech_weight_f32(lw.up_proj, int64_t(I) * D, "up_proj");
        gate_up.insert(gate_up.end(), up.begin(), up.end());
        l.gate_up = linear_pack(gate_up.data(), nullptr, 2 * I, D, format_);
        l.down = linear_load(lw.down_proj, nullptr, D, I, "down_proj");
        tr_layers_.push_back(std::move(l));
    }
    tr_norm_ = speech_weight_f32(w.tr_norm, D, "pre_transformer.norm");
    tr_output_proj_ = linear_load(w.tr_output_proj_w, w.tr_output_proj_b, latent, D, "pre_transformer.output_proj");

    samples_per_frame_ = 1;
    for (size_t i = 0; i < d.upsampling_ratios.size(); ++i) {
        const int r = d.upsampling_ratios[i];
        upsample_conv_.push_back(trans_conv_load(w.upsample_conv[i], r));
        const ConvNeXtWeights& cw = w.upsample_convnext[i];
        if (!cw.dwconv.w || cw.dwconv.w->shape.size() != 3 || cw.dwconv.w->shape[0] != latent ||
            cw.dwconv.w->shape[1] != 1 || cw.dwconv.w->shape[2] != SPEECH_DECODER_CONVNEXT_KERNEL)
            fail(ErrorCode::ERROR_SHAPE, "speech decoder ConvNeXt {} depthwise conv has an unexpected shape", i);
        ConvNeXt cx;
        const std::vector<float> dw = tensor_to_f32(*cw.dwconv.w);  // [C, 1, 7]
        cx.dw_w.resize(size_t(SPEECH_DECODER_CONVNEXT_KERNEL) * latent);
        for (int c = 0; c < latent; ++c)
            for (int k = 0; k < SPEECH_DECODER_CONVNEXT_KERNEL; ++k)
                cx.dw_w[size_t(k) * latent + c] = dw[size_t(c) * SPEECH_DECODER_CONVNEXT_KERNEL + k];
        cx.dw_b = cw.dwconv.b ? speech_weight_f32(cw.dwconv.b, latent, "convnext dwconv.bias")
                              : std::vector<float>(size_t(latent), 0.0f);
        cx.norm_w = speech_weight_f32(cw.norm_w, latent, "convnext norm.weight");
        cx.norm_b = speech_weight_f32(cw.norm_b, latent, "convnext norm.bias");
        cx.gamma = speech_weight_f32(cw.gamma, latent, "convnext gamma");
        cx.pw1 = linear_load(cw.pw1_w, cw.pw1_b, 4 * latent, latent, "convnext pwconv1");
        cx.pw2 = linear_load(cw.pw2_w, cw.pw2_b, latent, 4 * latent, "convnext pwconv2");
        upsample_convnext_.push_back(std::move(cx));
        samples_per_frame_ *= r;
    }

    conv_in_ = conv_load(w.conv_in, 1);
    int C = d.decoder_dim;
    for (size_t i = 0; i < d.upsample_rates.size(); ++i) {
        const int r = d.upsample_rates[i];
        const DecoderBlockWeights& bw = w.blocks[i];
        Block blk;
        blk.snake = snake_load(bw.snake);
        blk.upsample = trans_conv_load(bw.upsample, r);
        if (blk.upsample.cols.cin != C || int(blk.snake.alpha.size()) != C)
            fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} expects {} input channels", i, C);
        C = blk.upsample.cout;
        for (size_t u = 0; u < size_t(SPEECH_DECODER_RESIDUAL_UNITS); ++u) {
            const ResidualUnitWeights& uw = bw.units[u];
            Unit unit;
            unit.act1 = snake_load(uw.act1);
            unit.conv1 = conv_load(uw.conv1, SPEECH_DECODER_RESIDUAL_DILATIONS[u]);
            unit.act2 = snake_load(uw.act2);
            unit.conv2 = conv_load(uw.conv2, 1);
            if (unit.conv2.k != 1) fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} unit {}: conv2 must be 1x1", i, u);
            if (unit.conv1.cin != C || unit.conv1.cout != C || unit.conv2.cin != C || unit.conv2.cout != C ||
                int(unit.act1.alpha.size()) != C || int(unit.act2.alpha.size()) != C)
                fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} unit {}: expected {} channels", i, u, C);
            blk.units.push_back(std::move(unit));
        }
        blocks_.push_back(std::move(blk));
        samples_per_frame_ *= r;
    }
    snake_out_ = snake_load(w.snake_out);
    conv_out_ = conv_load(w.conv_out, 1);
    if (conv_out_.cin != C || conv_out_.cout != 1 || int(snake_out_.alpha.size()) != C)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder output conv is {}->{}, expected {}->1", conv_out_.cin, conv_out_.cout, C);
}

size_t FastSpeechDecoder::packed_bytes() const {
    size_t n = rvq_first_proj_.bytes() + rvq_rest_proj_.bytes() + pre_conv_.bytes() + tr_input_proj_.bytes() +
               tr_output_proj_.bytes() + conv_in_.bytes() + conv_out_.bytes();
    for (const Layer& l : tr_layers_) n += l.qkv.bytes() + l.o_proj.bytes() + l.gate_up.bytes() + l.down.bytes();
    for (const TransConv& t : upsample_conv_) n += t.cols.bytes();
    for (const ConvNeXt& cx : upsample_convnext_) n += cx.pw1.bytes() + cx.pw2.bytes();
    for (const Block& b : blocks_) {
        n += b.upsample.cols.bytes();
        for (const Unit& u : b.units) n += u.conv1.bytes() + u.conv2.bytes();
    }
    return n;
}

double FastSpeechDecoder::macs_per_frame() const {
    const auto macs = [](const PackedConv& c, double rows) { return double(c.cout) * c.cin * c.k * rows; };
    double n = macs(rvq_first_proj_, 1) + macs(rvq_rest_proj_, 1) + macs(pre_conv_, 1) + macs(tr_input_proj_, 1) +
               macs(tr_output_proj_, 1);
    for (const Layer& l : tr_layers_) n += macs(l.qkv, 1) + macs(l.o_proj, 1) + macs(l.gate_up, 1) + macs(l.down, 1);
    double rows = 1;  // time rows per frame at the current stage
    for (size_t i = 0; i < upsample_conv_.size(); ++i) {
        n += macs(upsample_conv_[i].cols, rows);
        rows *= upsample_conv_[i].stride;
        n += macs(upsample_convnext_[i].pw1, rows) + macs(upsample_convnext_[i].pw2, rows);
    }
    n += macs(conv_in_, rows);
    for (const Block& b : blocks_) {
        n += macs(b.upsample.cols, rows);
        rows *= b.upsample.stride;
        for (const Unit& u : b.units) n += macs(u.conv1, rows) + macs(u.conv2, rows);
    }
    return n + macs(conv_out_, rows);
}

// ---------------------------------------------------------------------------------------------
// State
// ---------------------------------------------------------------------------------------------

FastDecoderState FastSpeechDecoder::state_new() const {
    FastDecoderState s;
    s.pre_conv = time_tail_new((pre_conv_.k - 1) * pre_conv_.dilation, pre_conv_.cin);
    const int kvd = config_.num_kv_heads * config_.head_dim;
    const int keep = config_.sliding_window > 0 ? config_.sliding_window - 1 : 0;
    s.attention.resize(tr_layers_.size());
    for (auto& a : s.attention) {
        a.k.reserve(size_t(keep) * kvd);
        a.v.reserve(size_t(keep) * kvd);
    }
    for (size_t i = 0; i < upsample_conv_.size(); ++i) {
        const TransConv& up = upsample_conv_[i];
        s.upsample_overlap.push_back(time_tail_new(up.k - up.stride, up.cout));
        s.convnext.push_back(time_tail_new(SPEECH_DECODER_CONVNEXT_KERNEL - 1, config_.latent_dim));
    }
    s.conv_in = time_tail_new((conv_in_.k - 1) * conv_in_.dilation, conv_in_.cin);
    for (const Block& blk : blocks_) {
        FastDecoderBlockState bs;
        bs.upsample_overlap = time_tail_new(blk.upsample.k - blk.upsample.stride, blk.upsample.cout);
        for (const Unit& u : blk.units) bs.units.push_back(time_tail_new((u.conv1.k - 1) * u.conv1.dilation, u.conv1.cin));
        s.blocks.push_back(std::move(bs));
    }
    s.conv_out = time_tail_new((conv_out_.k - 1) * conv_out_.dilation, conv_out_.cin);
    return s;
}

void FastSpeechDecoder::state_check(const FastDecoderState& s) const {
    bool ok = s.attention.size() == tr_layers_.size() && s.blocks.size() == blocks_.size() &&
              s.upsample_overlap.size() == upsample_conv_.size() && s.convnext.size() == upsample_convnext_.size() &&
              s.pre_conv.channels == pre_conv_.cin && s.conv_in.channels == conv_in_.cin &&
              s.conv_out.channels == conv_out_.cin && s.frames_done >= 0;
    for (size_t i = 0; ok && i < blocks_.size(); ++i)
        ok = s.blocks[i].units.size() == blocks_[i].units.size() &&
             s.blocks[i].upsample_overlap.channels == blocks_[i].upsample.cout;
    if (!ok)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "fast speech decoder: the state does not belong to this decoder (create it with state_new())");
}

// ---------------------------------------------------------------------------------------------
// Streaming building blocks (time-major)
// ---------------------------------------------------------------------------------------------

// Causal conv x [T, cin] -> y [T, cout] (y += with accumulate): the tail stands in for the left
// zero padding of a full decode.
void FastSpeechDecoder::causal_conv(const PackedConv& conv, TimeTail& tail, const float* x, int T,
                                    FastDecoderScratch& s, float* y, bool accumulate) const {
    QTTS_ASSERT(tail.rows == (conv.k - 1) * conv.dilation && tail.channels == conv.cin);
    if (tail.rows == 0) {
        conv_gemm(*pool_, conv, x, size_t(conv.cin), T, y, size_t(conv.cout), accumulate);
        return;
    }
    tail_concat(tail, x, T, s.concat);
    conv_gemm(*pool_, conv, s.concat.data(), size_t(conv.cin), T, y, size_t(conv.cout), accumulate);
}

// Causal transposed conv x [T, cin] -> y [T·stride, cout]. The untrimmed output of this chunk is
// (T-1)·stride + k rows: its first k-stride rows still owe the previous chunk's spill-over
// (`overlap`), its last k-stride rows are this chunk's spill-over into the next.
void FastSpeechDecoder::causal_trans_conv(const TransConv& tc, TimeTail& overlap, const float* x, int T,
                                          FastDecoderScratch& s, float* y) const {
    const int C = tc.cout, r = tc.stride, O = overlap.rows;
    QTTS_ASSERT(O == tc.k - r && overlap.channels == C);
    s.cols.resize(size_t(T) * tc.k * C);
    conv_gemm(*pool_, tc.cols, x, size_t(tc.cols.cin), T, s.cols.data(), size_t(tc.k) * C);  // [T, k·C]
    const int full = (T - 1) * r + tc.k, emit = T * r;
    s.concat.assign(size_t(full) * C, 0.0f);  // [full, C] untrimmed output
    float* out = s.concat.data();
    for (size_t i = 0; i < size_t(O) * C; ++i) out[i] = overlap.data[i];
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < tc.k; ++j) {
            float* row = out + size_t(t * r + j) * C;
            const float* col = s.cols.data() + (size_t(t) * tc.k + j) * C;
            for (int c = 0; c < C; ++c) row[c] += col[c];
        }
    for (int m = 0; m < emit; ++m) {
        const float* row = out + size_t(m) * C;
        float* yr = y + size_t(m) * C;
        for (int c = 0; c < C; ++c) yr[c] = row[c] + tc.bias[size_t(c)];
    }
    if (O > 0) std::memcpy(overlap.data.data(), out + size_t(emit) * C, sizeof(float) * size_t(O) * C);  // k == stride: none
}

// ---------------------------------------------------------------------------------------------
// Stages
// ---------------------------------------------------------------------------------------------

// codes [n, nq] -> s.y [n, cd]: first_proj · q_semantic + rest_proj · Σ q_acoustic.
void FastSpeechDecoder::rvq_dequantize(FastDecoderScratch& s, const int32_t* codes, int n) const {
    const int nq = config_.num_quantizers, half = codebook_half_, cd = config_.codebook_dim;
    s.q_sem.resize(size_t(n) * half);
    s.q_ac.assign(size_t(n) * half, 0.0f);
    for (int t = 0; t < n; ++t) {
        const int32_t* frame = codes + size_t(t) * nq;
        std::memcpy(s.q_sem.data() + size_t(t) * half, codebooks_[0].data() + size_t(frame[0]) * half,
                    sizeof(float) * size_t(half));
        float* acc = s.q_ac.data() + size_t(t) * half;
        for (int q = 1; q < nq; ++q) {
            const float* row = codebooks_[size_t(q)].data() + size_t(frame[q]) * half;
            for (int j = 0; j < half; ++j) acc[j] += row[j];
        }
    }
    s.y.resize(size_t(n) * cd);
    conv_gemm(*pool_, rvq_first_proj_, s.q_sem.data(), size_t(half), n, s.y.data(), size_t(cd));
    conv_gemm(*pool_, rvq_rest_proj_, s.q_ac.data(), size_t(half), n, s.y.data(), size_t(cd), true);
}

void FastSpeechDecoder::layer_forward(FastDecoderState& state, int layer, int n, float* h) const {
    const DecoderConfig& d = config_;
    const Layer& L = tr_layers_[size_t(layer)];
    cpu::AttentionCache& cache = state.attention[size_t(layer)];
    FastDecoderScratch& s = state.scratch;
    const int D = d.hidden_size, I = d.intermediate_size;
    const int qd = d.num_heads * d.head_dim, kvd = d.num_kv_heads * d.head_dim, qkvd = qd + 2 * kvd;

    // Attention: h += ls_attn ⊙ o_proj(Attn(RMSNorm(h)))
    s.xn.resize(size_t(n) * D);
    cpu::rms_norm(h, n, D, L.input_norm.data(), d.rms_norm_eps, s.xn.data());
    s.qkv.resize(size_t(n) * qkvd);
    conv_gemm(*pool_, L.qkv, s.xn.data(), size_t(D), n, s.qkv.data(), size_t(qkvd));  // [n, q | k | v]
    s.q.resize(size_t(n) * qd);
    s.k.resize(size_t(n) * kvd);
    s.v.resize(size_t(n) * kvd);
    columns_copy(s.qkv.data(), n, qkvd, 0, qd, s.q.data());
    columns_copy(s.qkv.data(), n, qkvd, qd, kvd, s.k.data());
    columns_copy(s.qkv.data(), n, qkvd, qd + kvd, kvd, s.v.data());
    cpu::rope_apply_table(s.q.data(), n, d.num_heads, d.head_dim, s.positions.data(), rope_inv_freq_.data());
    cpu::rope_apply_table(s.k.data(), n, d.num_kv_heads, d.head_dim, s.positions.data(), rope_inv_freq_.data());

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
    cpu::attention(s.q.data(), n, s.positions.data(), s.kbuf.data(), s.vbuf.data(), S, k_pos0, d.num_heads,
                   d.num_kv_heads, d.head_dim, d.sliding_window, s.att.data());
    const int keep = d.sliding_window > 0 ? std::min(S, d.sliding_window - 1) : S;
    cache.k.assign(s.kbuf.begin() + ptrdiff_t(S - keep) * kvd, s.kbuf.begin() + ptrdiff_t(S) * kvd);
    cache.v.assign(s.vbuf.begin() + ptrdiff_t(S - keep) * kvd, s.vbuf.begin() + ptrdiff_t(S) * kvd);
    cache.rows = keep;

    s.proj.resize(size_t(n) * D);
    conv_gemm(*pool_, L.o_proj, s.att.data(), size_t(qd), n, s.proj.data(), size_t(D));
    add_scaled_rows(h, s.proj.data(), L.attn_scale.data(), n, D);

    // MLP: h += ls_mlp ⊙ down(silu(gate(y)) · up(y)),  y = RMSNorm(h)
    cpu::rms_norm(h, n, D, L.post_norm.data(), d.rms_norm_eps, s.xn.data());
    s.wide.resize(size_t(n) * 2 * I);
    conv_gemm(*pool_, L.gate_up, s.xn.data(), size_t(D), n, s.wide.data(), size_t(2) * I);  // [n, gate | up]
    s.gate.resize(size_t(n) * I);
    for (int t = 0; t < n; ++t) {
        const float* row = s.wide.data() + size_t(t) * 2 * I;
        cpu::swiglu(row, row + I, size_t(I), s.gate.data() + size_t(t) * I);
    }
    conv_gemm(*pool_, L.down, s.gate.data(), size_t(I), n, s.proj.data(), size_t(D));
    add_scaled_rows(h, s.proj.data(), L.mlp_scale.data(), n, D);
}

// s.x [n, latent] -> s.x [n, latent] through the sliding-window transformer.
void FastSpeechDecoder::transformer_forward(FastDecoderState& state, int n) const {
    FastDecoderScratch& s = state.scratch;
    const int latent = config_.latent_dim, D = config_.hidden_size;
    s.y.resize(size_t(n) * D);
    float* h = s.y.data();  // [n, D]
    conv_gemm(*pool_, tr_input_proj_, s.x.data(), size_t(latent), n, h, size_t(D));
    s.positions.resize(size_t(n));
    for (int t = 0; t < n; ++t) s.positions[size_t(t)] = state.frames_done + t;
    for (int l = 0; l < int(tr_layers_.size()); ++l) layer_forward(state, l, n, h);
    cpu::rms_norm(h, n, D, tr_norm_.data(), config_.rms_norm_eps, h);
    conv_gemm(*pool_, tr_output_proj_, h, size_t(D), n, s.x.data(), size_t(latent));
}

// ConvNeXt on s.x [T, C] in place: x += gamma ⊙ pw2(gelu(pw1(LayerNorm(dwconv(x))))).
void FastSpeechDecoder::convnext_forward(const ConvNeXt& cx, TimeTail& tail, FastDecoderScratch& s, int T) const {
    const int C = config_.latent_dim;
    tail_concat(tail, s.x.data(), T, s.concat);  // [6 + T, C]
    s.y.resize(size_t(T) * C);
    for (int t = 0; t < T; ++t) {  // depthwise causal k7
        float* yr = s.y.data() + size_t(t) * C;
        std::copy(cx.dw_b.begin(), cx.dw_b.end(), yr);
        for (int k = 0; k < SPEECH_DECODER_CONVNEXT_KERNEL; ++k) {
            const float* xr = s.concat.data() + size_t(t + k) * C;
            const float* wk = cx.dw_w.data() + size_t(k) * C;
            for (int c = 0; c < C; ++c) yr[c] += wk[c] * xr[c];
        }
    }
    cpu::layer_norm(s.y.data(), T, C, cx.norm_w.data(), cx.norm_b.data(), SPEECH_DECODER_CONVNEXT_EPS, s.y.data());
    s.wide.resize(size_t(T) * 4 * C);
    conv_gemm(*pool_, cx.pw1, s.y.data(), size_t(C), T, s.wide.data(), size_t(4) * C);  // [T, 4C]
    for (float& v : s.wide) v = cpu::gelu_erf(v);
    conv_gemm(*pool_, cx.pw2, s.wide.data(), size_t(4) * C, T, s.y.data(), size_t(C));  // [T, C]
    add_scaled_rows(s.x.data(), s.y.data(), cx.gamma.data(), T, C);
}

// Decoder block on s.x [T, C_in] -> s.x [T·r, C_out]; returns T·r.
int FastSpeechDecoder::block_forward(const Block& blk, FastDecoderBlockState& bs, FastDecoderScratch& s, int T) const {
    const MatvecIsa isa = matvec_isa_best();
    const int C_in = blk.upsample.cols.cin, C = blk.upsample.cout, r = blk.upsample.stride;
    snake_time_major(isa, s.x.data(), T, C_in, blk.snake.alpha.data(), blk.snake.inv_beta.data());
    s.y.resize(size_t(T) * r * C);
    causal_trans_conv(blk.upsample, bs.upsample_overlap, s.x.data(), T, s, s.y.data());
    std::swap(s.x, s.y);
    T *= r;
    const size_t count = size_t(T) * C;
    for (size_t u = 0; u < blk.units.size(); ++u) {
        const Unit& unit = blk.units[u];
        // x += conv2(snake2(conv1_dilated(snake1(x))))
        s.act.assign(s.x.begin(), s.x.begin() + ptrdiff_t(count));
        snake_time_major(isa, s.act.data(), T, C, unit.act1.alpha.data(), unit.act1.inv_beta.data());
        s.y.resize(count);
        causal_conv(unit.conv1, bs.units[u], s.act.data(), T, s, s.y.data());
        snake_time_major(isa, s.y.data(), T, C, unit.act2.alpha.data(), unit.act2.inv_beta.data());
        conv_gemm(*pool_, unit.conv2, s.y.data(), size_t(C), T, s.x.data(), size_t(C), true);
    }
    return T;
}

void FastSpeechDecoder::chunk_decode(FastDecoderState& state, const int32_t* codes, int n, float* pcm) const {
    FastDecoderScratch& s = state.scratch;
    const int latent = config_.latent_dim;

    rvq_dequantize(s, codes, n);  // s.y [n, cd]
    s.x.resize(size_t(n) * latent);
    causal_conv(pre_conv_, state.pre_conv, s.y.data(), n, s, s.x.data());  // [n, latent]
    transformer_forward(state, n);

    int T = n;
    for (size_t i = 0; i < upsample_conv_.size(); ++i) {
        const TransConv& up = upsample_conv_[i];
        s.y.resize(size_t(T) * up.stride * up.cout);
        causal_trans_conv(up, state.upsample_overlap[i], s.x.data(), T, s, s.y.data());
        std::swap(s.x, s.y);
        T *= up.stride;
        convnext_forward(upsample_convnext_[i], state.convnext[i], s, T);
    }

    s.y.resize(size_t(T) * conv_in_.cout);
    causal_conv(conv_in_, state.conv_in, s.x.data(), T, s, s.y.data());  // [T, decoder_dim]
    std::swap(s.x, s.y);
    for (size_t i = 0; i < blocks_.size(); ++i) T = block_forward(blocks_[i], state.blocks[i], s, T);

    snake_time_major(matvec_isa_best(), s.x.data(), T, conv_out_.cin, snake_out_.alpha.data(), snake_out_.inv_beta.data());
    QTTS_ASSERT(T == n * samples_per_frame_);
    causal_conv(conv_out_, state.conv_out, s.x.data(), T, s, pcm);  // [T, 1]
    for (int i = 0; i < T; ++i) pcm[i] = std::min(1.0f, std::max(-1.0f, pcm[i]));
    state.frames_done += n;
}

// ---------------------------------------------------------------------------------------------
// Entry points
// ---------------------------------------------------------------------------------------------

void FastSpeechDecoder::decode(FastDecoderState& state, const int32_t* codes, int n, std::vector<float>* pcm_out) const {
    if (!speech_decode_args_check(config_, codes, n, pcm_out, "fast speech decoder")) return;
    state_check(state);
    speech_decode_chunked(codes, n, config_.num_quantizers, max_chunk_frames_, samples_per_frame_, pcm_out,
                          [&](const int32_t* chunk, int m, float* pcm) { chunk_decode(state, chunk, m, pcm); });
}

std::vector<float> FastSpeechDecoder::decode_full(const int32_t* codes, int n) const {
    FastDecoderState state = state_new();
    std::vector<float> pcm;
    decode(state, codes, n, &pcm);
    return pcm;
}

}  // namespace qtts::cpu_fast
