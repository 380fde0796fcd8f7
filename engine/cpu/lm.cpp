#include "engine/cpu/lm.h"

#include <algorithm>
#include <cstring>

#include "engine/common/error.h"
#include "engine/cpu/ops.h"
#include "engine/model/weight_prep.h"

namespace qtts::cpu {

namespace {

LayerF32 layer_convert(const TransformerLayerWeights& l) {
    LayerF32 out;
    out.input_norm = tensor_to_f32(*l.input_norm);
    out.q_proj = tensor_to_f32(*l.q_proj);
    out.k_proj = tensor_to_f32(*l.k_proj);
    out.v_proj = tensor_to_f32(*l.v_proj);
    out.o_proj = tensor_to_f32(*l.o_proj);
    out.q_norm = tensor_to_f32(*l.q_norm);
    out.k_norm = tensor_to_f32(*l.k_norm);
    out.post_norm = tensor_to_f32(*l.post_norm);
    out.gate_proj = tensor_to_f32(*l.gate_proj);
    out.up_proj = tensor_to_f32(*l.up_proj);
    out.down_proj = tensor_to_f32(*l.down_proj);
    return out;
}

StackF32 stack_convert(const TransformerConfig& c, const std::vector<TransformerLayerWeights>& layers, Tensor norm) {
    StackF32 s;
    static_cast<StackShape&>(s) = stack_shape(c);
    s.rope_inv_freq = rope_inv_freq(s.head_dim, s.rope_theta);
    for (const auto& l : layers) s.layers.push_back(layer_convert(l));
    s.norm = tensor_to_f32(*norm);
    return s;
}

// Grows a per-layer cache to `capacity` rows, keeping the first `keep` rows.
void cache_grow(std::vector<float>& cache, int keep, int capacity, int width) {
    std::vector<float> bigger(size_t(capacity) * size_t(width));
    std::copy(cache.begin(), cache.begin() + long(size_t(keep) * size_t(width)), bigger.begin());
    cache.swap(bigger);
}

}  // namespace

std::shared_ptr<const LmWeights> LmWeights::load(std::shared_ptr<const Checkpoint> checkpoint) {
    QTTS_ASSERT(checkpoint);
    auto w = std::make_shared<LmWeights>();
    const ModelConfig& config = checkpoint->config;
    const TalkerConfig& tc = config.talker;
    const TalkerWeights& tw = checkpoint->talker;
    const CodePredictorWeights& pw = checkpoint->code_predictor;

    w->checkpoint_ = checkpoint;
    w->embeddings_load(*checkpoint);
    w->talker = stack_convert(tc, tw.layers, tw.norm);
    w->codec_head = tensor_to_f32(*tw.codec_head);
    w->predictor = stack_convert(tc.code_predictor, pw.layers, pw.norm);
    for (const Tensor t : pw.lm_head) w->predictor_head.push_back(tensor_to_f32(*t));
    if (pw.proj_w) {
        w->predictor_proj_w = tensor_to_f32(*pw.proj_w);
        w->predictor_proj_b = tensor_to_f32(*pw.proj_b);
    } else if (w->predictor.hidden != w->talker.hidden) {
        fail(ErrorCode::ERROR_FORMAT,
             "checkpoint: code predictor width {} differs from the talker width {} but small_to_mtp_projection is "
             "missing",
             w->predictor.hidden, w->talker.hidden);
    }
    QTTS_ASSERT(int(w->predictor_codec_embedding.size()) == w->num_code_groups_ - 1);
    QTTS_ASSERT(int(w->predictor_head.size()) == w->num_code_groups_ - 1);
    return w;
}

void LmEmbeddings::embeddings_load(const Checkpoint& checkpoint) {
    const TalkerConfig& tc = checkpoint.config.talker;
    const TalkerWeights& tw = checkpoint.talker;
    hidden_ = tc.hidden_size;
    num_code_groups_ = tc.num_code_groups;
    codec_vocab_ = tc.vocab_size;
    predictor_vocab_ = tc.code_predictor.vocab_size;
    text_hidden_ = tc.text_hidden_size;
    text_vocab_ = tc.text_vocab_size;
    codec_embedding = tensor_to_f32(*tw.codec_embedding);
    text_fc1_w = tensor_to_f32(*tw.text_fc1_w);
    text_fc1_b = tensor_to_f32(*tw.text_fc1_b);
    text_fc2_w = tensor_to_f32(*tw.text_fc2_w);
    text_fc2_b = tensor_to_f32(*tw.text_fc2_b);
    text_embedding = tw.text_embedding;
    for (const Tensor t : checkpoint.code_predictor.codec_embedding)
        predictor_codec_embedding.push_back(tensor_to_f32(*t));
}

void LmEmbeddings::text_vector(int32_t id, float* out) const {
    if (id < 0 || id >= text_vocab_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text id {} is outside the text vocabulary [0, {})", id, text_vocab_);
    const int Ht = text_hidden_;
    std::vector<float> row(static_cast<size_t>(Ht)), mid(static_cast<size_t>(Ht));
    tensor_rows_to_f32(*text_embedding, id, 1, row.data());
    linear(row.data(), 1, Ht, text_fc1_w.data(), text_fc1_b.data(), Ht, mid.data());
    for (float& v : mid) v = silu(v);
    linear(mid.data(), 1, Ht, text_fc2_w.data(), text_fc2_b.data(), hidden_, out);
}

void LmEmbeddings::codec_vector(int codebook, int32_t id, float* out) const {
    const size_t H = size_t(hidden_);
    if (codebook == 0) {
        if (id < 0 || id >= codec_vocab_)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codec id {} is outside [0, {})", id, codec_vocab_);
        std::memcpy(out, codec_embedding.data() + size_t(id) * H, H * sizeof(float));
        return;
    }
    if (codebook < 0 || codebook >= num_code_groups_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codebook {} is outside [0, {})", codebook, num_code_groups_);
    if (id < 0 || id >= predictor_vocab_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "code {} of codebook {} is outside [0, {})", id, codebook,
             predictor_vocab_);
    std::memcpy(out, predictor_codec_embedding[size_t(codebook - 1)].data() + size_t(id) * H, H * sizeof(float));
}

// ---------------------------------------------------------------------------------------------
// Decoder stack
// ---------------------------------------------------------------------------------------------

void stack_reserve(const StackF32& w, StackState& s, int capacity, int rows) {
    const int kv_width = w.n_kv * w.head_dim;
    if (s.k_cache.size() != w.layers.size()) {
        s.k_cache.assign(w.layers.size(), {});
        s.v_cache.assign(w.layers.size(), {});
        s.capacity = 0;
        s.length = 0;
    }
    if (capacity > s.capacity) {
        for (size_t l = 0; l < w.layers.size(); ++l) {
            cache_grow(s.k_cache[l], s.length, capacity, kv_width);
            cache_grow(s.v_cache[l], s.length, capacity, kv_width);
        }
        s.capacity = capacity;
    }
    if (rows > s.rows) {
        const size_t r = size_t(rows);
        s.x.resize(r * size_t(w.hidden));
        s.x_norm.resize(r * size_t(w.hidden));
        s.q.resize(r * size_t(w.n_heads * w.head_dim));
        s.attn.resize(r * size_t(w.n_heads * w.head_dim));
        s.proj.resize(r * size_t(w.hidden));
        s.gate.resize(r * size_t(w.intermediate));
        s.up.resize(r * size_t(w.intermediate));
        s.positions.resize(r);
        s.rows = rows;
    }
}

void stack_forward(const StackF32& w, StackState& s, const float* input, int T) {
    const int H = w.hidden, I = w.intermediate, HD = w.head_dim;
    const int NH = w.n_heads, NKV = w.n_kv;
    const int q_width = NH * HD, kv_width = NKV * HD;
    if (s.length + T > s.capacity) stack_reserve(w, s, std::max(2 * s.capacity, s.length + T), T);
    if (T > s.rows) stack_reserve(w, s, s.capacity, T);

    QTTS_ASSERT(int(w.rope_inv_freq.size()) == HD / 2);
    const int start = s.length;
    for (int t = 0; t < T; ++t) s.positions[size_t(t)] = start + t;
    std::copy(input, input + size_t(T) * size_t(H), s.x.begin());

    for (size_t l = 0; l < w.layers.size(); ++l) {
        const LayerF32& L = w.layers[l];
        float* k_new = s.k_cache[l].data() + size_t(start) * size_t(kv_width);  // [T, kv_width]
        float* v_new = s.v_cache[l].data() + size_t(start) * size_t(kv_width);

        // attention block: norm → q/k/v → per-head q/k norm → RoPE → attention → o_proj → residual
        rms_norm(s.x.data(), T, H, L.input_norm.data(), w.eps, s.x_norm.data());
        linear(s.x_norm.data(), T, H, L.q_proj.data(), nullptr, q_width, s.q.data());
        linear(s.x_norm.data(), T, H, L.k_proj.data(), nullptr, kv_width, k_new);
        linear(s.x_norm.data(), T, H, L.v_proj.data(), nullptr, kv_width, v_new);
        rms_norm(s.q.data(), T * NH, HD, L.q_norm.data(), w.eps, s.q.data());
        rms_norm(k_new, T * NKV, HD, L.k_norm.data(), w.eps, k_new);
        rope_apply_table(s.q.data(), T, NH, HD, s.positions.data(), w.rope_inv_freq.data());
        rope_apply_table(k_new, T, NKV, HD, s.positions.data(), w.rope_inv_freq.data());
        attention(s.q.data(), T, s.positions.data(), s.k_cache[l].data(), s.v_cache[l].data(), start + T, 0, NH, NKV,
                  HD, 0, s.attn.data());
        linear(s.attn.data(), T, q_width, L.o_proj.data(), nullptr, H, s.proj.data());
        add_inplace(s.x.data(), s.proj.data(), size_t(T) * size_t(H));

        // MLP block: norm → SwiGLU → down → residual
        rms_norm(s.x.data(), T, H, L.post_norm.data(), w.eps, s.x_norm.data());
        linear(s.x_norm.data(), T, H, L.gate_proj.data(), nullptr, I, s.gate.data());
        linear(s.x_norm.data(), T, H, L.up_proj.data(), nullptr, I, s.up.data());
        swiglu(s.gate.data(), s.up.data(), size_t(T) * size_t(I), s.gate.data());
        linear(s.gate.data(), T, I, L.down_proj.data(), nullptr, H, s.proj.data());
        add_inplace(s.x.data(), s.proj.data(), size_t(T) * size_t(H));
    }
    s.length = start + T;
}

// ---------------------------------------------------------------------------------------------
// Talker
// ---------------------------------------------------------------------------------------------

void talker_state_init(const LmWeights& w, TalkerState& s, int capacity) {
    s.stack.length = 0;
    stack_reserve(w.talker, s.stack, std::max(capacity, 1), 1);
    s.hidden.resize(size_t(w.talker.hidden));
    s.logits.resize(size_t(w.codec_vocab()));
}

namespace {
// Final norm of the last row of the stack output, then the codec head.
void talker_head(const LmWeights& w, TalkerState& s, int T) {
    const int H = w.talker.hidden;
    const float* last = s.stack.x.data() + size_t(T - 1) * size_t(H);
    rms_norm(last, 1, H, w.talker.norm.data(), w.talker.eps, s.hidden.data());
    linear(s.hidden.data(), 1, H, w.codec_head.data(), nullptr, w.codec_vocab(), s.logits.data());
}
}  // namespace

void talker_prefill(const LmWeights& w, TalkerState& s, const float* embeds, int L) {
    QTTS_ASSERT(L > 0);
    if (s.hidden.empty()) talker_state_init(w, s, L);
    s.stack.length = 0;
    stack_forward(w.talker, s.stack, embeds, L);
    talker_head(w, s, L);
}

void talker_step(const LmWeights& w, TalkerState& s, const float* input) {
    QTTS_ASSERT(s.stack.length > 0);
    stack_forward(w.talker, s.stack, input, 1);
    talker_head(w, s, 1);
}

// ---------------------------------------------------------------------------------------------
// Code predictor
// ---------------------------------------------------------------------------------------------

void predictor_state_init(const LmWeights& w, PredictorState& s) {
    stack_reserve(w.predictor, s.stack, w.num_code_groups(), 2);
    s.stack.length = 0;
    s.talker_rows.resize(2 * size_t(w.talker.hidden));
    s.input.resize(2 * size_t(w.predictor.hidden));
    s.hidden.resize(size_t(w.predictor.hidden));
    s.logits.resize(size_t(w.predictor_vocab()));
}

namespace {
// P(x): small_to_mtp_projection when present, identity otherwise. rows x [H] → [rows, Hc].
void predictor_project(const LmWeights& w, const float* x, int rows, float* out) {
    if (w.predictor_proj_w.empty()) {
        std::copy(x, x + size_t(rows) * size_t(w.talker.hidden), out);
        return;
    }
    linear(x, rows, w.talker.hidden, w.predictor_proj_w.data(), w.predictor_proj_b.data(), w.predictor.hidden, out);
}

void predictor_head(const LmWeights& w, PredictorState& s, int T, int head) {
    const int Hc = w.predictor.hidden;
    const float* last = s.stack.x.data() + size_t(T - 1) * size_t(Hc);
    rms_norm(last, 1, Hc, w.predictor.norm.data(), w.predictor.eps, s.hidden.data());
    linear(s.hidden.data(), 1, Hc, w.predictor_head[size_t(head)].data(), nullptr, w.predictor_vocab(),
           s.logits.data());
}
}  // namespace

void predictor_prefill(const LmWeights& w, PredictorState& s, const float* talker_hidden, int32_t code0) {
    if (s.hidden.empty()) predictor_state_init(w, s);
    const size_t H = size_t(w.talker.hidden);
    std::copy(talker_hidden, talker_hidden + H, s.talker_rows.begin());
    w.codec_vector(0, code0, s.talker_rows.data() + H);
    predictor_project(w, s.talker_rows.data(), 2, s.input.data());
    s.stack.length = 0;  // fresh cache every frame
    stack_forward(w.predictor, s.stack, s.input.data(), 2);
    predictor_head(w, s, 2, 0);
}

void predictor_step(const LmWeights& w, PredictorState& s, int group, int32_t previous_code) {
    QTTS_ASSERT(group >= 2 && group < w.num_code_groups());
    QTTS_ASSERT(s.stack.length == group);  // positions 0..group-1 are cached
    w.codec_vector(group - 1, previous_code, s.talker_rows.data());
    predictor_project(w, s.talker_rows.data(), 1, s.input.data());
    stack_forward(w.predictor, s.stack, s.input.data(), 1);
    predictor_head(w, s, 1, group - 1);
}

}  // namespace qtts::cpu
