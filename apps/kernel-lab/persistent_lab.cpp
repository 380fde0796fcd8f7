// qtts-kernel-lab persist: the code predictor's passes as the product runs them (a graph of
// gemv and attention launches, PDL on) against one cooperative launch of the lab's persistent
// kernel (persistent_pass.h), on a checkpoint's predictor: logits and caches compared bitwise,
// then both timed.
#include "apps/kernel-lab/persistent_lab.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "apps/kernel-lab/attention_o.h"
#include "apps/kernel-lab/gemv_variants.h"
#include "apps/kernel-lab/persistent_pass.h"
#include "apps/qtts/bench_stats.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/event_timer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "engine/model/weights.h"
#include "kernels/rmsnorm.cuh"

namespace qtts::kernel_lab {

namespace {

namespace qc = ::qtts::cuda;
namespace k = ::qtts::kernels;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> uni(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = uni(rng);
    return v;
}

template <typename T>
std::vector<T> download(const qc::DeviceArray<T>& d, size_t n) {
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

// The code predictor's passes as the product launches them, on random inputs and caches: pass p
// from input row p at position pos0 + p (T = 1), 5 layers and the head into logits row p.
// `o_fused` (the attno mode) replaces each layer's attention and o launches by the lab's
// attention folded into the o product.
struct PredictorChain {
    PredictorChain(qc::GpuContext& ctx, const qc::GpuLmWeights& w, uint64_t seed)
        : ctx(ctx), w(w), P(w.predictor), H(P.hidden), passes(w.num_code_groups - 1), max_ctx(w.num_code_groups),
          cache_floats(P.layers.size() * size_t(P.n_kv) * size_t(max_ctx) * P.head_dim),
          logit_floats(size_t(passes) * size_t(w.predictor_vocab)) {
        std::mt19937 rng{uint32_t(seed)};
        x_in_host = random_vector(size_t(passes) * H, rng, -2.0f, 2.0f);
        caches0 = random_vector(2 * cache_floats, rng, -1.0f, 1.0f);  // k | v
        d_x_in = qc::DeviceArray<float>(x_in_host.size());
        d_caches = qc::DeviceArray<float>(caches0.size());
        x = qc::DeviceArray<float>(size_t(H));
        qkv = qc::DeviceArray<float>(size_t(P.qkv_dim()));
        attn = qc::DeviceArray<float>(size_t(P.q_dim()));
        mlp = qc::DeviceArray<float>(size_t(P.intermediate));
        CUDA_CHECK(cudaMemcpy(d_x_in.get(), x_in_host.data(), x_in_host.size() * 4, cudaMemcpyHostToDevice));
    }
    float* k_cache() const { return d_caches.get(); }
    float* v_cache() const { return d_caches.get() + cache_floats; }
    void caches_reset() const {
        CUDA_CHECK(cudaMemcpy(d_caches.get(), caches0.data(), caches0.size() * 4, cudaMemcpyHostToDevice));
    }
    // Enqueues the passes (capturable).
    void run(float* logits, bool o_fused) const {
        const k::Launch l = ctx.launch();
        const size_t layer_stride = size_t(P.n_kv) * size_t(max_ctx) * size_t(P.head_dim);
        for (int p = 0; p < passes; ++p) {
            CUDA_CHECK(cudaMemcpyAsync(x.get(), d_x_in.get() + size_t(p) * H, size_t(H) * 4, cudaMemcpyDeviceToDevice,
                                       ctx.stream()));
            const auto attend = [&](int layer) {
                return qc::attention_args(P, layer, qkv.get(), attn.get(), k_cache(), v_cache(), max_ctx, 1, nullptr,
                                          nullptr, 1, nullptr, pos0 + p);
            };
            if (!o_fused) {
                qc::stack_decode_pass(
                    P, qc::DecodeRows{x.get(), qkv.get(), attn.get(), mlp.get(), 1},
                    [&l](const k::GemvArgs& a) { qc::gemv_launch(a, l); }, attend, l);
            } else {
                const int I = P.intermediate;
                for (size_t i = 0; i < P.layers.size(); ++i) {
                    const qc::GpuStack::Layer& L = P.layers[i];
                    qc::gemv_launch(qc::gemv_normed(qc::gemv_product(L.qkv, P.qkv_dim(), H, 1, x.get(), qkv.get()),
                                                    L.input_norm, P.eps),
                                    l);
                    AttnOArgs o;
                    o.qkv = qkv.get();
                    o.o = L.o;
                    o.q_norm = L.q_norm;
                    o.k_norm = L.k_norm;
                    o.eps = P.eps;
                    o.inv_freq = P.inv_freq;
                    o.k_cache = k_cache() + layer_stride * i;
                    o.v_cache = v_cache() + layer_stride * i;
                    o.max_ctx = max_ctx;
                    o.pos = pos0 + p;
                    o.hidden = H;
                    o.n_heads = P.n_heads;
                    o.n_kv = P.n_kv;
                    o.head_dim = P.head_dim;
                    o.x = x.get();
                    attno_launch(o, l);
                    qc::gemv_launch(qc::gemv_swiglu(qc::gemv_normed(qc::gemv_product(L.gate_up, I, H, 1, x.get(), mlp.get()),
                                                                    L.post_norm, P.eps),
                                                    L.gate_up + size_t(I) * H),
                                    l);
                    qc::gemv_launch(qc::gemv_residual(qc::gemv_product(L.down, H, I, 1, mlp.get(), x.get())), l);
                }
            }
            qc::gemv_launch(qc::gemv_normed(qc::gemv_product(w.predictor_head[0], w.predictor_vocab, H, 1, x.get(),
                                                             logits + size_t(p) * w.predictor_vocab),
                                            P.norm, P.eps),
                            l);
        }
    }

    qc::GpuContext& ctx;
    const qc::GpuLmWeights& w;
    const qc::GpuStack& P;
    const int H, passes, max_ctx, pos0 = 1;
    const size_t cache_floats, logit_floats;
    std::vector<float> x_in_host, caches0;
    qc::DeviceArray<float> d_x_in, d_caches, x, qkv, attn, mlp;
};


// ---- parts: what each kind of launch costs inside the chain --------------------------------

// A kind of launch a `parts` variant leaves out; TRIVIAL replaces every launch by a one-row
// RMSNorm (a kernel with next to no work: the chain's floor of dependent launches).
// The *_HALVES are not removals: the product as two launches of half the rows each (a talker
// gate/up launch of 768 blocks takes ~1.45 waves of the SM slots, a half fits in one; a q/k/v
// launch's 512 blocks fill every SM's registers, a half leaves room for the attention's blocks);
// QKV_ROWS2 runs the q/k/v product with the lab's two-rows-a-warp gemv (gemv_variants.h: 256
// blocks, one wave at two an SM, the same bits); GATE_UP_ROWS2 the gate/up product (a talker's
// 768 blocks become 384: one wave at three an SM, where the product's take ~1.45). *_TURNS run
// the q/k/v product, the gate/up product or both on the lab's `turns` gemv (at most two blocks an
// SM, rows in turn: the next launch's blocks have room to load their rows before their wait).
enum class Part {
    NONE,
    QKV,
    ATTENTION,
    O,
    GATE_UP,
    DOWN,
    HEAD,
    TRIVIAL,
    GATE_UP_HALVES,
    QKV_HALVES,
    QKV_ROWS2,
    GATE_UP_ROWS2,
    QKV_TURNS,
    GATE_UP_TURNS,
    BOTH_TURNS
};

const char* part_name(Part p) {
    switch (p) {
        case Part::NONE: return "every launch";
        case Part::QKV: return "without q/k/v";
        case Part::ATTENTION: return "without attention";
        case Part::O: return "without o";
        case Part::GATE_UP: return "without gate/up";
        case Part::DOWN: return "without down";
        case Part::HEAD: return "without the head";
        case Part::TRIVIAL: return "trivial launches only";
        case Part::GATE_UP_HALVES: return "gate/up as two half launches";
        case Part::QKV_HALVES: return "q/k/v as two half launches";
        case Part::QKV_ROWS2: return "q/k/v with two rows a warp";
        case Part::GATE_UP_ROWS2: return "gate/up with two rows a warp";
        case Part::QKV_TURNS: return "q/k/v with rows in turn";
        case Part::GATE_UP_TURNS: return "gate/up with rows in turn";
        case Part::BOTH_TURNS: return "q/k/v and gate/up with rows in turn";
    }
    return "?";
}

// One decode pass of stack `s` as stack_decode_pass launches it (the same launchers), less the
// launches of kind `skip`; plus the head when `head` is set. Every launch is a kernel (PDL on
// when the context has it): no copy node breaks the chain.
template <typename Attend>
void pass_parts(const qc::GpuStack& s, const qc::DecodeRows& b, Attend&& attend, const k::Launch& l, Part skip,
                const qc::bf16_t* head, int vocab, float* logits, float* scratch) {
    const int H = s.hidden, I = s.intermediate;
    const auto product = [&](Part kind, const k::GemvArgs& a) {
        if (skip == Part::TRIVIAL)
            CUDA_CHECK_KERNEL(k::rmsnorm(b.x, 1, H, H, s.norm, s.eps, scratch, H, l));
        else if (skip != kind)
            qc::gemv_launch(a, l);
    };
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const qc::GpuStack::Layer& L = s.layers[i];
        if (skip == Part::QKV_HALVES) {
            const int half = s.qkv_dim() / 2;
            for (int i2 = 0; i2 < 2; ++i2)
                qc::gemv_launch(qc::gemv_normed(qc::gemv_product(L.qkv + size_t(i2) * half * H, half, H, 1, b.x,
                                                                 b.qkv + size_t(i2) * half),
                                                L.input_norm, s.eps),
                                l);
        } else if (skip == Part::QKV_ROWS2 || skip == Part::QKV_TURNS || skip == Part::BOTH_TURNS) {
            gemv_variant(skip == Part::QKV_ROWS2 ? GemvVariant::GEMV_VARIANT_ROWS2 : GemvVariant::GEMV_VARIANT_TURNS,
                         qc::gemv_normed(qc::gemv_product(L.qkv, s.qkv_dim(), H, 1, b.x, b.qkv), L.input_norm, s.eps), l);
        } else {
            product(Part::QKV,
                    qc::gemv_normed(qc::gemv_product(L.qkv, s.qkv_dim(), H, 1, b.x, b.qkv), L.input_norm, s.eps));
        }
        if (skip == Part::TRIVIAL)
            CUDA_CHECK_KERNEL(k::rmsnorm(b.x, 1, H, H, s.norm, s.eps, scratch, H, l));
        else if (skip != Part::ATTENTION)
            CUDA_CHECK_KERNEL(k::attention(attend(int(i)), l));
        product(Part::O, qc::gemv_residual(qc::gemv_product(L.o, H, s.q_dim(), 1, b.attn, b.x)));
        if (skip == Part::GATE_UP_HALVES) {
            for (int half = 0; half < 2; ++half) {
                const size_t r0 = size_t(half) * size_t(I / 2);
                qc::gemv_launch(qc::gemv_swiglu(qc::gemv_normed(qc::gemv_product(L.gate_up + r0 * H, I / 2, H, 1, b.x,
                                                                                 b.mlp + r0),
                                                                L.post_norm, s.eps),
                                                L.gate_up + (size_t(I) + r0) * H),
                                l);
            }
        } else {
            const k::GemvArgs gate_up = qc::gemv_swiglu(
                qc::gemv_normed(qc::gemv_product(L.gate_up, I, H, 1, b.x, b.mlp), L.post_norm, s.eps),
                L.gate_up + size_t(I) * H);
            if (skip == Part::GATE_UP_ROWS2)
                gemv_variant(GemvVariant::GEMV_VARIANT_ROWS2, gate_up, l);
            else if (skip == Part::GATE_UP_TURNS || skip == Part::BOTH_TURNS)
                gemv_variant(GemvVariant::GEMV_VARIANT_TURNS, gate_up, l);
            else
                product(Part::GATE_UP, gate_up);
        }
        product(Part::DOWN, qc::gemv_residual(qc::gemv_product(L.down, H, I, 1, b.mlp, b.x)));
    }
    if (head) product(Part::HEAD, qc::gemv_normed(qc::gemv_product(head, vocab, H, 1, b.x, logits), s.norm, s.eps));
}

// The talker's layers for one decode step at a fixed context (cached keys constant), as GpuLm's
// frame step runs them: a block per 16-key slice, the position read from device memory.
struct TalkerChain {
    TalkerChain(const qc::GpuLmWeights& w, int ctx_len, uint64_t seed)
        : T(w.talker), max_ctx(4096), splits(k::attention_splits(4096)) {
        const size_t cache_floats = T.layers.size() * size_t(T.n_kv) * size_t(max_ctx) * T.head_dim;
        std::mt19937 rng{uint32_t(seed)};
        const std::vector<float> x0 = random_vector(size_t(T.hidden), rng, -2.0f, 2.0f);
        x = qc::DeviceArray<float>(x0.size());
        CUDA_CHECK(cudaMemcpy(x.get(), x0.data(), x0.size() * 4, cudaMemcpyHostToDevice));
        qkv = qc::DeviceArray<float>(size_t(T.qkv_dim()));
        attn = qc::DeviceArray<float>(size_t(T.q_dim()));
        mlp = qc::DeviceArray<float>(size_t(T.intermediate));
        scratch = qc::DeviceArray<float>(size_t(T.hidden));
        caches = qc::DeviceArray<float>(2 * cache_floats);
        CUDA_CHECK(cudaMemset(caches.get(), 0x3c, caches.bytes()));  // ~0.0115 everywhere: the timing needs no more
        partial = qc::DeviceArray<float>(k::attention_partial_floats(T.n_heads, 1, splits, T.head_dim));
        counters = qc::DeviceArray<uint32_t>(k::attention_counter_count(T.n_kv, 1));
        CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
        pos = qc::DeviceArray<int32_t>(1);
        CUDA_CHECK(cudaMemcpy(pos.get(), &ctx_len, 4, cudaMemcpyHostToDevice));
    }
    void run(const k::Launch& l, Part skip) const {
        const size_t cache_floats = T.layers.size() * size_t(T.n_kv) * size_t(max_ctx) * T.head_dim;
        pass_parts(
            T, qc::DecodeRows{x.get(), qkv.get(), attn.get(), mlp.get(), 1},
            [&](int layer) {
                k::AttentionArgs a = qc::attention_args(T, layer, qkv.get(), attn.get(), caches.get(),
                                                        caches.get() + cache_floats, max_ctx, splits, partial.get(),
                                                        counters.get(), 1, pos.get(), 0);
                a.pos_settled = true;
                return a;
            },
            l, skip, nullptr, 0, nullptr, scratch.get());
    }
    const qc::GpuStack& T;
    const int max_ctx, splits;
    qc::DeviceArray<float> x, qkv, attn, mlp, scratch, caches, partial;
    qc::DeviceArray<uint32_t> counters;
    qc::DeviceArray<int32_t> pos;
};

}  // namespace

int lab_persist(const std::string& model, int device, uint64_t seed) {
    qc::GpuContext ctx(device);
    const auto weights = qc::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const qc::GpuLmWeights& w = *weights;
    const qc::GpuStack& P = w.predictor;
    const PredictorChain pc(ctx, w, seed);
    const int H = P.hidden, passes = pc.passes, max_ctx = pc.max_ctx, pos0 = pc.pos0;
    const size_t logit_floats = pc.logit_floats;
    qc::DeviceArray<float> logits_chain{logit_floats}, logits_persist{logit_floats};
    qc::DeviceArray<unsigned> barrier(4096);
    CUDA_CHECK(cudaMemset(barrier.get(), 0, barrier.bytes()));
    const auto chain = [&] { pc.run(logits_chain.get(), false); };

    PersistArgs a;
    a.n_layers = int(P.layers.size());
    for (int i = 0; i < a.n_layers; ++i) {
        const qc::GpuStack::Layer& L = P.layers[size_t(i)];
        a.layers[i] = PersistLayer{L.qkv, L.o, L.gate_up, L.down, L.input_norm, L.post_norm, L.q_norm, L.k_norm};
    }
    a.head = w.predictor_head[0];
    a.final_norm = P.norm;
    a.eps = P.eps;
    a.inv_freq = P.inv_freq;
    a.hidden = H;
    a.intermediate = P.intermediate;
    a.n_heads = P.n_heads;
    a.n_kv = P.n_kv;
    a.head_dim = P.head_dim;
    a.vocab = w.predictor_vocab;
    a.x_in = pc.d_x_in.get();
    a.x = pc.x.get();
    a.qkv = pc.qkv.get();
    a.attn = pc.attn.get();
    a.mlp = pc.mlp.get();
    a.k_cache = pc.k_cache();
    a.v_cache = pc.v_cache();
    a.max_ctx = max_ctx;
    a.pos0 = pos0;
    a.passes = passes;
    a.logits = logits_persist.get();
    a.barrier = barrier.get();
    if (!persist_supported(a)) {
        std::printf("qtts-kernel-lab persist: the checkpoint's predictor shapes are not supported\n");
        return 1;
    }
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int per_sm = persist_blocks_per_sm(device);
    const int blocks = sms * per_sm;

    // Same inputs, same caches: bitwise the same logits and appended cache rows?
    pc.caches_reset();
    chain();
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    const auto ref_logits = download(logits_chain, logit_floats);
    const auto ref_caches = download(pc.d_caches, pc.caches0.size());
    pc.caches_reset();
    persist_launch(a, blocks, ctx.stream());
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    const auto got_logits = download(logits_persist, logit_floats);
    const auto got_caches = download(pc.d_caches, pc.caches0.size());
    const bool same_logits = std::memcmp(got_logits.data(), ref_logits.data(), ref_logits.size() * 4) == 0;
    const bool same_caches = std::memcmp(got_caches.data(), ref_caches.data(), ref_caches.size() * 4) == 0;
    const bool finite = std::all_of(ref_logits.begin(), ref_logits.end(), [](float v) { return std::isfinite(v); });
    // Another form's run from fresh caches and barrier words: bitwise the chain's logits and cache
    // rows? And the largest difference. `launch` returns false when the form does not fit.
    struct Compared {
        bool ran = false, same = false;
        double diff = 0.0;
    };
    const auto compared = [&](const auto& launch) {
        Compared c;
        CUDA_CHECK(cudaMemsetAsync(barrier.get(), 0, barrier.bytes(), ctx.stream()));
        pc.caches_reset();
        c.ran = launch();
        CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
        if (!c.ran) return c;
        const auto l = download(logits_persist, logit_floats);
        const auto k = download(pc.d_caches, pc.caches0.size());
        c.same = std::memcmp(l.data(), ref_logits.data(), ref_logits.size() * 4) == 0 &&
                 std::memcmp(k.data(), ref_caches.data(), ref_caches.size() * 4) == 0;
        c.diff = std::max(max_abs_diff(l, ref_logits), max_abs_diff(k, ref_caches));
        return c;
    };
    // The second form (weights streamed through a ring in shared memory, one block per SM, the
    // growing-counter barrier), in several ring shapes: same bits?
    struct RingRun {
        PersistArgs::Ring ring;
        bool fits = false, same = false;
        double diff = 0.0, ms = 0.0, bare_ms = 0.0;
    };
    const auto ring_run = [](uint32_t slot, bool issuers, bool cp_async, bool strided, bool eager) {
        RingRun r;
        r.ring.slot = slot;
        r.ring.issuers = issuers;
        r.ring.cp_async = cp_async;
        r.ring.strided = strided;
        r.ring.eager = eager;
        return r;
    };
    std::vector<RingRun> rings = {ring_run(16384, false, false, false, false), ring_run(32768, false, false, false, false),
                                  ring_run(32768, true, false, false, false),  ring_run(16384, true, false, false, false),
                                  ring_run(8192, true, false, false, false),   ring_run(32768, false, true, true, false),
                                  ring_run(16384, false, false, false, true),  ring_run(32768, false, false, false, true),
                                  ring_run(8192, true, false, false, true)};
    const auto ring_args = [&](const RingRun& r) {
        PersistArgs s = a;
        s.monotonic_barrier = true;
        s.ring = r.ring;
        return s;
    };
    for (RingRun& r : rings) {
        const Compared c = compared([&] { return persist_staged_launch(ring_args(r), sms, ctx.stream()); });
        r.fits = c.ran;
        r.same = c.same;
        r.diff = c.diff;
    }

    // The first form with the next stage's rows in registers: same bits?
    PersistArgs pre = a;
    pre.monotonic_barrier = true;
    pre.preload = true;
    const Compared preload_check = compared([&] {
        if (!persist_preload_fits(pre, blocks)) return false;
        persist_launch(pre, blocks, ctx.stream());
        return true;
    });
    const bool preload_same = preload_check.same;
    const double preload_diff = preload_check.diff;

    // Timed: the chain as one graph of `passes` passes, replayed; the persistent kernel as one
    // launch of `passes` passes (each run rewrites the same cache rows from the same inputs).
    qc::GraphStats stats;
    const qc::GraphExec graph = qc::graph_capture(ctx, "predictor passes (lab)", chain, &stats);
    for (int i = 0; i < 3; ++i) qc::graph_replay(ctx, graph);
    const double chain_ms = qtts::cuda::time_on_stream(ctx.stream(), 20, [&] { qc::graph_replay(ctx, graph); });
    // Every block starts a launch with the same arrival count: zero them for each new series.
    const auto series_time = [&](const auto& launch) {
        CUDA_CHECK(cudaMemsetAsync(barrier.get(), 0, barrier.bytes(), ctx.stream()));
        for (int i = 0; i < 3; ++i) launch();
        return qtts::cuda::time_on_stream(ctx.stream(), 20, launch);
    };
    const auto persist_time = [&](const PersistArgs& args, int grid) {
        return series_time([&] { persist_launch(args, grid, ctx.stream()); });
    };
    const double persist_ms = persist_time(a, blocks);
    // The same with one block per SM, and the barriers and prefetches alone (no stage work).
    const double one_per_sm_ms = per_sm > 1 ? persist_time(a, sms) : persist_ms;
    PersistArgs bare = a;
    bare.barriers_only = true;
    const double barriers_ms = persist_time(bare, blocks);
    bare.prefetch = false;
    const double barriers_alone_ms = persist_time(bare, blocks);
    bare.counter_barrier = true;
    const double counter_alone_ms = persist_time(bare, blocks);
    PersistArgs counter = a;
    counter.counter_barrier = true;
    const double counter_ms = persist_time(counter, blocks);
    PersistArgs no_prefetch = a;
    no_prefetch.prefetch = false;
    const double no_prefetch_ms = persist_time(no_prefetch, blocks);
    const auto staged_time = [&](const PersistArgs& args) {
        return series_time([&] { persist_staged_launch(args, sms, ctx.stream()); });
    };
    for (RingRun& r : rings) {
        if (!r.fits) continue;
        PersistArgs s = ring_args(r);
        r.ms = staged_time(s);
        s.barriers_only = true;
        r.bare_ms = staged_time(s);
    }
    // The growing counter in the first form, and alone.
    PersistArgs mono = a;
    mono.monotonic_barrier = true;
    const double mono_ms = persist_time(mono, blocks);
    const bool preload_fits = preload_check.ran;
    const double preload_ms = preload_fits ? persist_time(pre, blocks) : 0.0;
    mono.barriers_only = true;
    mono.prefetch = false;
    const double mono_alone_ms = persist_time(mono, blocks);
    const double mono_alone_sms_ms = persist_time(mono, sms);
    const double chain_again_ms = qtts::cuda::time_on_stream(ctx.stream(), 20, [&] { qc::graph_replay(ctx, graph); });
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));

    const double bytes = double(P.layer_weight_bytes()) + double(w.predictor_vocab) * H * 2.0;  // per pass
    std::printf("qtts-kernel-lab persist: %s, device %d (%s), seed %llu\n", model.c_str(), device,
                ctx.device_name().c_str(), static_cast<unsigned long long>(seed));
    std::printf("  %d passes of %zu layers + head, positions %d..%d, %.1f MB of weights a pass\n", passes,
                P.layers.size(), pos0, pos0 + passes - 1, bytes / 1e6);
    std::printf("  chain (graph, %zu nodes, PDL %s): %8.2f us a pass\n", stats.nodes, ctx.pdl() ? "on" : "off",
                chain_ms * 1e3 / passes);
    std::printf("  persistent (%d blocks of 256, one launch): %8.2f us a pass (%.2fx)\n", blocks,
                persist_ms * 1e3 / passes, chain_ms / persist_ms);
    std::printf("  persistent, %d blocks (one per SM): %8.2f us a pass\n", sms, one_per_sm_ms * 1e3 / passes);
    std::printf("  persistent, barriers and prefetches only (%d blocks, 27 barriers a pass): %8.2f us a pass\n",
                blocks, barriers_ms * 1e3 / passes);
    std::printf("  persistent, barriers alone (no prefetch): %8.2f us a pass; with the one-counter barrier %8.2f us\n",
                barriers_alone_ms * 1e3 / passes, counter_alone_ms * 1e3 / passes);
    std::printf("  persistent with the one-counter barrier: %8.2f us a pass; without weight prefetches: %8.2f us a pass\n",
                counter_ms * 1e3 / passes, no_prefetch_ms * 1e3 / passes);
    std::printf("  bitwise: logits %s, caches %s (max |diff| logits %.3g, caches %.3g); chain logits finite: %s\n",
                same_logits ? "equal" : "DIFFER", same_caches ? "equal" : "DIFFER",
                max_abs_diff(got_logits, ref_logits), max_abs_diff(got_caches, ref_caches), finite ? "yes" : "NO");
    std::printf("  the growing-counter barrier: first form %8.2f us a pass; barriers alone %8.2f us (%d blocks), "
                "%8.2f us (%d blocks)\n",
                mono_ms * 1e3 / passes, mono_alone_ms * 1e3 / passes, blocks, mono_alone_sms_ms * 1e3 / passes, sms);
    std::printf("  chain again %8.2f us a pass\n", chain_again_ms * 1e3 / passes);
    if (preload_fits)
        std::printf("  first form, growing counter, next rows in registers: %8.2f us a pass (%.2fx the chain); "
                    "bitwise %s (max |diff| %.3g)\n",
                    preload_ms * 1e3 / passes, chain_ms / preload_ms, preload_same ? "equal" : "DIFFER", preload_diff);
    else
        std::printf("  first form, next rows in registers: the rows do not fit %d warps' registers\n", blocks * 8);
    bool rings_same = true;
    for (const RingRun& r : rings) {
        const PersistArgs s = ring_args(r);
        if (!r.fits) {
            std::printf("  ring of %u-byte slots: does not fit (%.1f KiB a block, %d blocks)\n", r.ring.slot,
                        double(persist_staged_smem(s)) / 1024.0, sms);
            continue;
        }
        rings_same = rings_same && r.same;
        std::printf("  ring of %5u-byte slots, copies by %s (%d blocks, %.1f KiB each): %8.2f us a pass (%.2fx the "
                    "chain); barriers and copies alone %8.2f us; bitwise %s (max |diff| %.3g)%s%s%s\n",
                    r.ring.slot, r.ring.cp_async ? "every thread (cp.async)" : r.ring.issuers ? "the warps in turn" : "thread 0", sms,
                    double(persist_staged_smem(s)) / 1024.0, r.ms * 1e3 / passes, chain_ms / r.ms,
                    r.bare_ms * 1e3 / passes, r.same ? "equal" : "DIFFER", r.diff,
                    r.ring.strided ? "; rows strided over the blocks" : "", r.ring.spin ? "; test_wait spin" : "",
                    r.ring.eager ? "; slot by slot" : "");
    }
    return same_logits && same_caches && finite && rings_same && (!preload_fits || preload_same) ? 0 : 1;
}

int lab_attno(const std::string& model, int device, uint64_t seed) {
    qc::GpuContext ctx(device);
    const auto weights = qc::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const PredictorChain pc(ctx, *weights, seed);
    const size_t logit_floats = pc.logit_floats;
    qc::DeviceArray<float> logits_chain{logit_floats}, logits_fused{logit_floats};

    // Same inputs, same caches: bitwise the same logits and appended cache rows?
    const auto result = [&](const qc::DeviceArray<float>& logits, bool fused) {
        pc.caches_reset();
        pc.run(logits.get(), fused);
        CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
        return std::make_pair(download(logits, logit_floats), download(pc.d_caches, pc.caches0.size()));
    };
    const auto ref = result(logits_chain, false);
    const auto got = result(logits_fused, true);
    const bool same_logits = std::memcmp(got.first.data(), ref.first.data(), ref.first.size() * 4) == 0;
    const bool same_caches = std::memcmp(got.second.data(), ref.second.data(), ref.second.size() * 4) == 0;
    const bool finite = std::all_of(ref.first.begin(), ref.first.end(), [](float v) { return std::isfinite(v); });

    // Timed: each as one graph of the passes, replayed, alternately three times.
    qc::GraphStats chain_stats, fused_stats;
    const qc::GraphExec chain = qc::graph_capture(ctx, "predictor passes (lab)", [&] { pc.run(logits_chain.get(), false); },
                                                  &chain_stats);
    const qc::GraphExec fused = qc::graph_capture(ctx, "predictor passes, attention in o (lab)",
                                                  [&] { pc.run(logits_fused.get(), true); }, &fused_stats);
    const auto timed = [&](const qc::GraphExec& g) {
        for (int i = 0; i < 3; ++i) qc::graph_replay(ctx, g);
        return qtts::cuda::time_on_stream(ctx.stream(), 20, [&] { qc::graph_replay(ctx, g); }) * 1e3 / pc.passes;
    };
    std::printf("qtts-kernel-lab attno: %s, device %d (%s), seed %llu\n", model.c_str(), device,
                ctx.device_name().c_str(), static_cast<unsigned long long>(seed));
    std::printf("  %d passes of %zu layers + head, positions %d..%d, PDL %s\n", pc.passes, pc.P.layers.size(), pc.pos0,
                pc.pos0 + pc.passes - 1, ctx.pdl() ? "on" : "off");
    for (int round = 0; round < 3; ++round) {
        const double c = timed(chain), f = timed(fused);
        std::printf("  round %d: chain (%zu nodes) %8.2f us a pass; attention in o (%zu nodes) %8.2f us a pass "
                    "(%+.2f us a layer)\n",
                    round, chain_stats.nodes, c, fused_stats.nodes, f, (f - c) / double(pc.P.layers.size()));
    }
    std::printf("  bitwise: logits %s, caches %s (max |diff| logits %.3g, caches %.3g); chain logits finite: %s\n",
                same_logits ? "equal" : "DIFFER", same_caches ? "equal" : "DIFFER", max_abs_diff(got.first, ref.first),
                max_abs_diff(got.second, ref.second), finite ? "yes" : "NO");
    return same_logits && same_caches && finite ? 0 : 1;
}

int lab_parts(const std::string& model, int device, uint64_t seed) {
    qc::GpuContext ctx(device);
    const auto weights = qc::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const qc::GpuLmWeights& w = *weights;
    const PredictorChain pc(ctx, w, seed);
    qc::DeviceArray<float> logits{pc.logit_floats}, scratch{size_t(std::max(w.talker.hidden, pc.H))};
    const k::Launch l = ctx.launch();
    std::printf("qtts-kernel-lab parts: %s, device %d (%s), seed %llu, PDL %s\n", model.c_str(), device,
                ctx.device_name().c_str(), static_cast<unsigned long long>(seed), ctx.pdl() ? "on" : "off");

    // The predictor: 15 passes of 5 layers and the head, one graph, no copy between passes.
    const Part predictor_parts[] = {Part::NONE,       Part::QKV,       Part::ATTENTION,     Part::O,
                                    Part::GATE_UP,    Part::DOWN,      Part::HEAD,          Part::TRIVIAL,
                                    Part::QKV_HALVES, Part::QKV_ROWS2, Part::QKV_TURNS,     Part::GATE_UP_TURNS,
                                    Part::BOTH_TURNS};
    const auto predictor_run = [&](Part skip) {
        for (int p = 0; p < pc.passes; ++p)
            pass_parts(
                pc.P, qc::DecodeRows{pc.x.get(), pc.qkv.get(), pc.attn.get(), pc.mlp.get(), 1},
                [&](int layer) {
                    return qc::attention_args(pc.P, layer, pc.qkv.get(), pc.attn.get(), pc.k_cache(), pc.v_cache(),
                                              pc.max_ctx, 1, nullptr, nullptr, 1, nullptr, pc.pos0 + p);
                },
                l, skip, w.predictor_head[size_t(p)], w.predictor_vocab, logits.get() + size_t(p) * w.predictor_vocab,
                scratch.get());
    };
    // The talker: one step's 28 layers at contexts 100 and 300.
    const TalkerChain t100(w, 100, seed), t300(w, 300, seed + 1);
    const Part talker_parts[] = {Part::NONE,           Part::QKV,        Part::ATTENTION, Part::O,
                                 Part::GATE_UP,        Part::DOWN,       Part::TRIVIAL,   Part::GATE_UP_HALVES,
                                 Part::QKV_HALVES,     Part::QKV_ROWS2,  Part::GATE_UP_ROWS2,
                                 Part::QKV_TURNS,      Part::GATE_UP_TURNS, Part::BOTH_TURNS};

    struct Timed {
        std::string name;
        double per;  // divide the replay's time by this
        qc::GraphExec graph;
        std::vector<double> us;
    };
    std::vector<Timed> runs;
    for (Part p : predictor_parts)
        runs.push_back({std::string("predictor pass, ") + part_name(p), double(pc.passes),
                        qc::graph_capture(ctx, "parts (lab)", [&] { predictor_run(p); }, nullptr), {}});
    for (const TalkerChain* tc : {&t100, &t300})
        for (Part p : talker_parts)
            runs.push_back({std::string(tc == &t100 ? "talker step ctx 100, " : "talker step ctx 300, ") + part_name(p),
                            1.0, qc::graph_capture(ctx, "parts (lab)", [&] { tc->run(l, p); }, nullptr), {}});
    for (int round = 0; round < 3; ++round)
        for (Timed& r : runs) {
            for (int i = 0; i < 3; ++i) qc::graph_replay(ctx, r.graph);
            r.us.push_back(qtts::cuda::time_on_stream(ctx.stream(), 20, [&] { qc::graph_replay(ctx, r.graph); }) * 1e3 /
                           r.per);
        }
    double full = 0.0;
    for (const Timed& r : runs) {
        const double m = qtts_cli::bench_median(r.us);
        if (r.name.find(part_name(Part::NONE)) != std::string::npos) full = m;
        const int layers = int(r.name.rfind("predictor", 0) == 0 ? pc.P.layers.size() : w.talker.layers.size());
        std::printf("  %-52s %9.2f us (rounds %.2f / %.2f / %.2f); saves %7.2f us, %6.2f a layer\n", r.name.c_str(), m,
                    r.us[0], r.us[1], r.us[2], full - m, (full - m) / layers);
    }
    return 0;
}

}  // namespace qtts::kernel_lab
