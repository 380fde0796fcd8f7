#include "engine/cpu_fast/fast_lm.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cpu/ops.h"

namespace qtts::cpu_fast {

namespace {

// Stacks checkpoint matrices [rows_i, cols] (same cols) into one packed [Σ rows_i, cols] (or reads
// it back from the pack cache).
PackedMatrix pack_stacked(std::initializer_list<Tensor> parts, PackSource& source) {
    int rows = 0;
    const int cols = int(parts.begin()[0]->shape.at(1));
    for (const Tensor t : parts) {
        QTTS_ASSERT(t->shape.size() == 2 && int(t->shape[1]) == cols);
        rows += int(t->shape[0]);
    }
    return source.matrix(rows, cols, [&](float* all) {  // all [rows, cols]
        size_t at = 0;
        for (const Tensor t : parts) {
            tensor_to_f32(*t, all + at);
            at += size_t(t->numel());
        }
    });
}

PackedMatrix pack(Tensor t, PackSource& source) { return pack_stacked({t}, source); }

FastLayer layer_pack(const TransformerLayerWeights& l, PackSource& source) {
    FastLayer out;
    out.input_norm = tensor_to_f32(*l.input_norm);
    out.q_norm = tensor_to_f32(*l.q_norm);
    out.k_norm = tensor_to_f32(*l.k_norm);
    out.post_norm = tensor_to_f32(*l.post_norm);
    out.qkv = pack_stacked({l.q_proj, l.k_proj, l.v_proj}, source);
    out.o_proj = pack(l.o_proj, source);
    out.gate_up = pack_stacked({l.gate_proj, l.up_proj}, source);
    out.down_proj = pack(l.down_proj, source);
    return out;
}

FastStack stack_pack(const TransformerConfig& c, const std::vector<TransformerLayerWeights>& layers, Tensor norm,
                     PackSource& source) {
    FastStack s;
    static_cast<StackShape&>(s) = stack_shape(c);
    s.rope_inv_freq = rope_inv_freq(s.head_dim, s.rope_theta);
    for (const auto& l : layers) s.layers.push_back(layer_pack(l, source));
    s.norm = tensor_to_f32(*norm);
    return s;
}

void cache_grow(std::vector<float>& cache, int keep, int capacity, int width) {
    std::vector<float> bigger(size_t(capacity) * size_t(width));
    std::copy(cache.begin(), cache.begin() + long(size_t(keep) * size_t(width)), bigger.begin());
    cache.swap(bigger);
}

}  // namespace

size_t FastStack::bytes() const {
    size_t n = 0;
    for (const FastLayer& l : layers) n += l.qkv.bytes() + l.o_proj.bytes() + l.gate_up.bytes() + l.down_proj.bytes();
    return n;
}

std::shared_ptr<const FastLmWeights> FastLmWeights::load(std::shared_ptr<const Checkpoint> checkpoint,
                                                         WeightFormat format, const std::string& cache_dir) {
    QTTS_ASSERT(checkpoint);
    if (cache_dir.empty()) {
        PackSource source(format);
        return load_from(checkpoint, source);
    }
    const std::string key = pack_cache_key(checkpoint->dir, format);
    const std::string path = pack_cache_path(cache_dir, key);
    std::error_code ec;
    const bool existed = std::filesystem::exists(path, ec);
    if (existed) {
        try {
            PackSource source(format, path, key, false);
            auto w = load_from(checkpoint, source);
            source.finish();
            w->cache_status_ = PackCacheStatus::PACK_CACHE_HIT;
            return w;
        } catch (const PackCacheInvalid& e) {
            QTTS_LOG_WARN("pack cache: {} is unusable ({}): packing the weights again", path, e.reason);
        }
    }
    PackSource source(format, path, key, true);
    auto w = load_from(checkpoint, source);
    const bool written = source.finish();
    w->cache_status_ = !written  ? PackCacheStatus::PACK_CACHE_WRITE_FAILED
                       : existed ? PackCacheStatus::PACK_CACHE_REBUILT
                                 : PackCacheStatus::PACK_CACHE_WRITTEN;
    return w;
}

std::shared_ptr<FastLmWeights> FastLmWeights::load_from(const std::shared_ptr<const Checkpoint>& checkpoint,
                                                        PackSource& source) {
    const WeightFormat format = source.format();
    auto w = std::make_shared<FastLmWeights>();
    const TalkerConfig& tc = checkpoint->config.talker;
    const TalkerWeights& tw = checkpoint->talker;
    const CodePredictorWeights& pw = checkpoint->code_predictor;

    w->checkpoint_ = checkpoint;
    w->format_ = format;
    w->embeddings_load(*checkpoint);
    w->talker = stack_pack(tc, tw.layers, tw.norm, source);
    w->codec_head = pack(tw.codec_head, source);
    w->predictor = stack_pack(tc.code_predictor, pw.layers, pw.norm, source);
    for (const Tensor t : pw.lm_head) w->predictor_head.push_back(pack(t, source));
    if (pw.proj_w) {
        w->predictor_proj = pack(pw.proj_w, source);
        w->predictor_proj_b = tensor_to_f32(*pw.proj_b);
    } else if (w->predictor.hidden != w->talker.hidden) {
        fail(ErrorCode::ERROR_FORMAT,
             "checkpoint: code predictor width {} differs from the talker width {} but small_to_mtp_projection is "
             "missing",
             w->predictor.hidden, w->talker.hidden);
    }
    if (w->num_code_groups_ < 2 || int(w->predictor_head.size()) != w->num_code_groups_ - 1 ||
        int(w->predictor_codec_embedding.size()) != w->num_code_groups_ - 1)
        fail(ErrorCode::ERROR_FORMAT, "checkpoint: {} code groups but {} predictor heads and {} embeddings",
             w->num_code_groups_, w->predictor_head.size(), w->predictor_codec_embedding.size());
    return w;
}

size_t FastLmWeights::frame_bytes() const {
    const size_t groups = size_t(num_code_groups_);
    size_t n = talker.bytes() + codec_head.bytes();
    n += (groups - 1) * predictor.bytes();  // the 2-row prefill reads the stack once, then G-2 steps
    for (const PackedMatrix& h : predictor_head) n += h.bytes();
    if (!predictor_proj.empty()) n += (groups - 1) * predictor_proj.bytes();
    return n;
}

size_t FastLmWeights::packed_bytes() const {
    size_t n = talker.bytes() + codec_head.bytes() + predictor.bytes() + predictor_proj.bytes();
    for (const PackedMatrix& h : predictor_head) n += h.bytes();
    return n;
}

// ---------------------------------------------------------------------------------------------
// Decoder stack
// ---------------------------------------------------------------------------------------------

void fast_stack_reserve(const FastStack& w, FastStackState& s, int capacity, int rows) {
    const int q_width = w.n_heads * w.head_dim, kv_width = w.n_kv * w.head_dim;
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
        s.qkv.resize(r * size_t(q_width + 2 * kv_width));
        s.q.resize(r * size_t(q_width));
        s.attn.resize(r * size_t(q_width));
        s.proj.resize(r * size_t(w.hidden));
        s.gate_up.resize(r * 2 * size_t(w.intermediate));
        s.act.resize(r * size_t(w.intermediate));
        s.positions.resize(r);
        s.rows = rows;
    }
}

namespace {

// T new positions for each of n sequences (input [n·T, H]: sequence i's rows i·T..i·T+T-1)
// through every layer: each product over all n·T rows at once (the weights read once for all of
// them), each sequence's attention over its own cache. Per row, every operation is the one a
// sequence alone gets, so the results are bitwise those of n separate calls. The activations
// live in `act` (a sequence's own state when n = 1); the pre-norm output is left in act.x.
void stack_forward_rows(const FastLm& lm, const FastStack& w, FastStackState* const* states, int n, int T,
                        FastStackState& act, const float* input) {
    ThreadPool& pool = *lm.pool;
    const size_t pmin = lm.parallel_min;
    const int H = w.hidden, I = w.intermediate, HD = w.head_dim;
    const int NH = w.n_heads, NKV = w.n_kv;
    const int q_width = NH * HD, kv_width = NKV * HD, qkv_width = q_width + 2 * kv_width;
    const int rows = n * T;
    for (int i = 0; i < n; ++i) {
        FastStackState& s = *states[i];
        if (s.length + T > s.capacity) fast_stack_reserve(w, s, std::max(2 * s.capacity, s.length + T), T);
    }
    if (rows > act.rows) fast_stack_reserve(w, act, act.capacity, rows);

    for (int i = 0; i < n; ++i)
        for (int t = 0; t < T; ++t) act.positions[size_t(i * T + t)] = states[i]->length + t;
    std::copy(input, input + size_t(rows) * size_t(H), act.x.begin());

    for (size_t l = 0; l < w.layers.size(); ++l) {
        const FastLayer& L = w.layers[l];

        // attention block: norm → fused q/k/v → split → q/k norm → RoPE → attention → o_proj → residual
        cpu::rms_norm(act.x.data(), rows, H, L.input_norm.data(), w.eps, act.x_norm.data());
        matmul(pool, L.qkv, act.x_norm.data(), rows, nullptr, act.qkv.data(), pmin);
        for (int i = 0; i < n; ++i) {
            FastStackState& s = *states[i];
            const int start = s.length;
            float* k_new = s.k_cache[l].data() + size_t(start) * size_t(kv_width);  // [T, kv_width]
            float* v_new = s.v_cache[l].data() + size_t(start) * size_t(kv_width);
            float* q = act.q.data() + size_t(i * T) * size_t(q_width);             // [T, q_width]
            const int64_t* positions = act.positions.data() + size_t(i * T);
            for (int t = 0; t < T; ++t) {
                const float* row = act.qkv.data() + size_t(i * T + t) * size_t(qkv_width);
                std::copy(row, row + q_width, q + size_t(t) * size_t(q_width));
                std::copy(row + q_width, row + q_width + kv_width, k_new + size_t(t) * size_t(kv_width));
                std::copy(row + q_width + kv_width, row + qkv_width, v_new + size_t(t) * size_t(kv_width));
            }
            cpu::rms_norm(q, T * NH, HD, L.q_norm.data(), w.eps, q);
            cpu::rms_norm(k_new, T * NKV, HD, L.k_norm.data(), w.eps, k_new);
            cpu::rope_apply_table(q, T, NH, HD, positions, w.rope_inv_freq.data());
            cpu::rope_apply_table(k_new, T, NKV, HD, positions, w.rope_inv_freq.data());
            cpu::attention(q, T, positions, s.k_cache[l].data(), s.v_cache[l].data(), start + T, 0, NH, NKV, HD, 0,
                           act.attn.data() + size_t(i * T) * size_t(q_width));
        }
        matmul(pool, L.o_proj, act.attn.data(), rows, nullptr, act.proj.data(), pmin);
        cpu::add_inplace(act.x.data(), act.proj.data(), size_t(rows) * size_t(H));

        // MLP block: norm → fused gate/up → SwiGLU → down → residual
        cpu::rms_norm(act.x.data(), rows, H, L.post_norm.data(), w.eps, act.x_norm.data());
        matmul(pool, L.gate_up, act.x_norm.data(), rows, nullptr, act.gate_up.data(), pmin);
        for (int t = 0; t < rows; ++t) {
            const float* gate = act.gate_up.data() + size_t(t) * 2 * size_t(I);
            cpu::swiglu(gate, gate + I, size_t(I), act.act.data() + size_t(t) * size_t(I));
        }
        matmul(pool, L.down_proj, act.act.data(), rows, nullptr, act.proj.data(), pmin);
        cpu::add_inplace(act.x.data(), act.proj.data(), size_t(rows) * size_t(H));
    }
    for (int i = 0; i < n; ++i) states[i]->length += T;
}

}  // namespace

void fast_stack_forward(const FastLm& lm, const FastStack& w, FastStackState& s, const float* input, int T) {
    FastStackState* const one[] = {&s};
    stack_forward_rows(lm, w, one, 1, T, s, input);
}

// ---------------------------------------------------------------------------------------------
// Talker
// ---------------------------------------------------------------------------------------------

void fast_talker_state_init(const FastLmWeights& w, FastTalkerState& s, int capacity) {
    s.stack.length = 0;
    fast_stack_reserve(w.talker, s.stack, std::max(capacity, 1), 1);
    s.hidden.resize(size_t(w.talker.hidden));
    s.logits.resize(size_t(w.codec_vocab()));
}

namespace {
void talker_head(const FastLm& lm, FastTalkerState& s, int T) {
    const FastLmWeights& w = *lm.weights;
    const int H = w.talker.hidden;
    const float* last = s.stack.x.data() + size_t(T - 1) * size_t(H);
    cpu::rms_norm(last, 1, H, w.talker.norm.data(), w.talker.eps, s.hidden.data());
    matmul(*lm.pool, w.codec_head, s.hidden.data(), 1, nullptr, s.logits.data(), lm.parallel_min);
}
}  // namespace

void fast_talker_prefill(const FastLm& lm, FastTalkerState& s, const float* embeds, int L) {
    QTTS_ASSERT(L > 0);
    if (s.hidden.empty()) fast_talker_state_init(*lm.weights, s, L);
    s.stack.length = 0;
    fast_stack_forward(lm, lm.weights->talker, s.stack, embeds, L);
    talker_head(lm, s, L);
}

void fast_talker_step(const FastLm& lm, FastTalkerState& s, const float* input) { fast_talker_extend(lm, s, input, 1); }

void fast_talker_extend(const FastLm& lm, FastTalkerState& s, const float* embeds, int T) {
    QTTS_ASSERT(s.stack.length > 0 && T > 0);
    fast_stack_forward(lm, lm.weights->talker, s.stack, embeds, T);
    talker_head(lm, s, T);
}

// ---------------------------------------------------------------------------------------------
// Code predictor
// ---------------------------------------------------------------------------------------------

void fast_predictor_state_init(const FastLmWeights& w, FastPredictorState& s) {
    fast_stack_reserve(w.predictor, s.stack, w.num_code_groups(), 2);
    s.stack.length = 0;
    s.talker_rows.resize(2 * size_t(w.talker.hidden));
    s.input.resize(2 * size_t(w.predictor.hidden));
    s.hidden.resize(size_t(w.predictor.hidden));
    s.logits.resize(size_t(w.predictor_vocab()));
}

namespace {
// P(x): small_to_mtp_projection when present, identity otherwise. rows x [H] → [rows, Hc].
void predictor_project(const FastLm& lm, const float* x, int rows, float* out) {
    const FastLmWeights& w = *lm.weights;
    if (w.predictor_proj.empty()) {
        std::copy(x, x + size_t(rows) * size_t(w.talker.hidden), out);
        return;
    }
    matmul(*lm.pool, w.predictor_proj, x, rows, w.predictor_proj_b.data(), out, lm.parallel_min);
}

void predictor_head(const FastLm& lm, FastPredictorState& s, int T, int head) {
    const FastLmWeights& w = *lm.weights;
    const int Hc = w.predictor.hidden;
    const float* last = s.stack.x.data() + size_t(T - 1) * size_t(Hc);
    cpu::rms_norm(last, 1, Hc, w.predictor.norm.data(), w.predictor.eps, s.hidden.data());
    matmul(*lm.pool, w.predictor_head[size_t(head)], s.hidden.data(), 1, nullptr, s.logits.data(),
           lm.parallel_min);
}
}  // namespace

void fast_predictor_prefill(const FastLm& lm, FastPredictorState& s, const float* talker_hidden, int32_t code0) {
    const FastLmWeights& w = *lm.weights;
    if (s.hidden.empty()) fast_predictor_state_init(w, s);
    const size_t H = size_t(w.talker.hidden);
    std::copy(talker_hidden, talker_hidden + H, s.talker_rows.begin());
    w.codec_vector(0, code0, s.talker_rows.data() + H);
    predictor_project(lm, s.talker_rows.data(), 2, s.input.data());
    s.stack.length = 0;  // fresh cache every frame
    fast_stack_forward(lm, w.predictor, s.stack, s.input.data(), 2);
    predictor_head(lm, s, 2, 0);
}

void fast_predictor_step(const FastLm& lm, FastPredictorState& s, int group, int32_t previous_code) {
    const FastLmWeights& w = *lm.weights;
    QTTS_ASSERT(group >= 2 && group < w.num_code_groups());
    QTTS_ASSERT(s.stack.length == group);
    w.codec_vector(group - 1, previous_code, s.talker_rows.data());
    predictor_project(lm, s.talker_rows.data(), 1, s.input.data());
    fast_stack_forward(lm, w.predictor, s.stack, s.input.data(), 1);
    predictor_head(lm, s, 1, group - 1);
}

// ---------------------------------------------------------------------------------------------
// Batched steps
// ---------------------------------------------------------------------------------------------

namespace {

// The heads of n sequences after a batched forward of T rows each (act): each sequence's last
// row normed into its `hidden`, the head product over the n rows into its `logits`: per row
// what talker_head / predictor_head compute for a sequence alone.
template <typename State>
void heads_batch(const FastLm& lm, const FastStack& w, const PackedMatrix& head, State* const* states, int n, int T,
                 const FastStackState& act, FastBatchScratch& b) {
    const size_t H = size_t(w.hidden), V = size_t(head.rows);
    b.hidden.resize(size_t(n) * H);
    b.logits.resize(size_t(n) * V);
    for (int i = 0; i < n; ++i)
        cpu::rms_norm(act.x.data() + size_t(i * T + T - 1) * H, 1, int(H), w.norm.data(), w.eps,
                      b.hidden.data() + size_t(i) * H);
    matmul(*lm.pool, head, b.hidden.data(), n, nullptr, b.logits.data(), lm.parallel_min);
    for (int i = 0; i < n; ++i) {
        std::copy_n(b.hidden.data() + size_t(i) * H, H, states[i]->hidden.data());
        std::copy_n(b.logits.data() + size_t(i) * V, V, states[i]->logits.data());
    }
}

}  // namespace

void fast_talker_step_batch(const FastLm& lm, FastTalkerState* const* states, int n, const float* inputs,
                            FastBatchScratch& b) {
    QTTS_ASSERT(n >= 1);
    b.stacks.clear();
    for (int i = 0; i < n; ++i) {
        QTTS_ASSERT(states[i]->stack.length > 0);
        b.stacks.push_back(&states[i]->stack);
    }
    const FastLmWeights& w = *lm.weights;
    stack_forward_rows(lm, w.talker, b.stacks.data(), n, 1, b.talker, inputs);
    heads_batch(lm, w.talker, w.codec_head, states, n, 1, b.talker, b);
}

void fast_predictor_prefill_batch(const FastLm& lm, FastPredictorState* const* states, int n,
                                  const float* const* talker_hidden, const int32_t* code0, FastBatchScratch& b) {
    QTTS_ASSERT(n >= 1);
    const FastLmWeights& w = *lm.weights;
    const size_t H = size_t(w.talker.hidden);
    b.rows.resize(2 * size_t(n) * H);  // [2n, H]: each frame's talker hidden state and codebook 0
    b.input.resize(2 * size_t(n) * size_t(w.predictor.hidden));
    b.stacks.clear();
    for (int i = 0; i < n; ++i) {
        FastPredictorState& s = *states[i];
        if (s.hidden.empty()) fast_predictor_state_init(w, s);
        s.stack.length = 0;  // fresh cache every frame
        b.stacks.push_back(&s.stack);
        std::copy_n(talker_hidden[i], H, b.rows.data() + size_t(2 * i) * H);
        w.codec_vector(0, code0[i], b.rows.data() + size_t(2 * i + 1) * H);
    }
    predictor_project(lm, b.rows.data(), 2 * n, b.input.data());
    stack_forward_rows(lm, w.predictor, b.stacks.data(), n, 2, b.predictor, b.input.data());
    heads_batch(lm, w.predictor, w.predictor_head[0], states, n, 2, b.predictor, b);
}

void fast_predictor_step_batch(const FastLm& lm, FastPredictorState* const* states, int n, int group,
                               const int32_t* previous_code, FastBatchScratch& b) {
    QTTS_ASSERT(n >= 1);
    const FastLmWeights& w = *lm.weights;
    QTTS_ASSERT(group >= 2 && group < w.num_code_groups());
    const size_t H = size_t(w.talker.hidden);
    b.rows.resize(size_t(n) * H);
    b.input.resize(size_t(n) * size_t(w.predictor.hidden));
    b.stacks.clear();
    for (int i = 0; i < n; ++i) {
        QTTS_ASSERT(states[i]->stack.length == group);
        b.stacks.push_back(&states[i]->stack);
        w.codec_vector(group - 1, previous_code[i], b.rows.data() + size_t(i) * H);
    }
    predictor_project(lm, b.rows.data(), n, b.input.data());
    stack_forward_rows(lm, w.predictor, b.stacks.data(), n, 1, b.predictor, b.input.data());
    heads_batch(lm, w.predictor, w.predictor_head[size_t(group - 1)], states, n, 1, b.predictor, b);
}

}  // namespace qtts::cpu_fast
