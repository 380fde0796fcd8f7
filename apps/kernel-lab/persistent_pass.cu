// The kernel lab's persistent code-predictor kernel (see persistent_pass.h for the design).
#include "apps/kernel-lab/persistent_pass.h"

#include <algorithm>

#include <cuda_pipeline.h>

#include "apps/kernel-lab/lab_device.cuh"
#include "kernels/attention.cuh"
#include "kernels/check.cuh"
#include "kernels/rope.cuh"

namespace qtts::kernel_lab {

namespace {

using namespace ::qtts::kernels;

constexpr int PS_WARPS = 8;
constexpr int PS_THREADS = PS_WARPS * 32;  // 256, as the product's gemv: the same norm sums
constexpr int PS_MAX_IN = 4096;            // floats of one staged input row

// All blocks of the grid meet here (they are resident together: cooperative launch). Each block
// has an arrival word (flags[block]) that only it writes: it stores its running barrier count
// there and then waits until every block's word has reached that count, warp 0 reading 32 words
// a load. No block waits for an atomic on a shared word (one word for all 264 blocks serialised
// their arrivals: 2.8 us a barrier). `target` is the block's count after this barrier; every
// block starts a launch with the same count (all run the same barriers), read from its own word.
// Writes before the barrier are visible to every block after it (fences around).
__device__ __forceinline__ void grid_barrier_flags(unsigned* flags, unsigned& target) {
    __syncthreads();
    ++target;
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) {
            __threadfence();
            *reinterpret_cast<volatile unsigned*>(flags + blockIdx.x) = target;
        }
        const volatile unsigned* f = flags;
        for (;;) {
            bool all = true;
            for (unsigned b = threadIdx.x; b < gridDim.x; b += 32) all &= int(f[b] - target) >= 0;
            if (__all_sync(0xffffffffu, all)) break;
        }
        __threadfence();
    }
    __syncthreads();
}

// The first form, kept for the comparison (PersistArgs::counter_barrier): one arrival counter
// (flags[gridDim.x]) that the last block to arrive resets before it advances the generation
// word (flags[gridDim.x + 1]) the others wait on.
__device__ __forceinline__ void grid_barrier_counter(unsigned* flags) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* count = flags + gridDim.x;
        volatile unsigned* generation = flags + gridDim.x + 1;
        const unsigned seen = *generation;
        __threadfence();
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            atomicExch(count, 0u);
            __threadfence();
            atomicAdd(flags + gridDim.x + 1, 1u);
        } else {
            while (*generation == seen) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// The third form (PersistArgs::monotonic_barrier): one counter that only grows. One thread of
// each block adds its arrival with release semantics (no value returned) and polls the counter
// with acquire loads until every block's arrival for this barrier is in (target barriers x
// blocks). Nobody resets anything, so there is no last-arrival step. `target` counts the barriers
// this block has passed; the kernel stores it in the block's word at the end
// (barrier_count_store), so that the next launch continues from the counter's value.
//
// The thread that does it is the last warp's first lane, which issues no copies into shared
// memory: a release may wait for copies its thread issued (moving it off the copying thread saved
// 2-4 µs a pass of the ring form).
__device__ __forceinline__ bool barrier_thread() { return threadIdx.x == blockDim.x - 32; }

// The growing-counter barrier in two halves, so that a block can start work that needs nothing
// from the others between its arrival and its wait. The arrival comes first for another reason
// too: a release waits for the thread's loads in flight, so loads issued before it (the next
// stage's weights) would hold the arrival back.
__device__ __forceinline__ void grid_arrive(unsigned* counter, unsigned& target) {
    __syncthreads();
    ++target;
    if (barrier_thread()) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
}

__device__ __forceinline__ void grid_wait(const unsigned* counter, unsigned target) {
    if (barrier_thread()) {
        const unsigned want = target * gridDim.x;
        unsigned v = 0;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(counter) : "memory");
        } while (int(v - want) < 0);
    }
    __syncthreads();
}

// The growing counter's word: after the blocks' arrival words and the reset counter's two.
__device__ __forceinline__ unsigned* growing_counter(const PersistArgs& a) { return a.barrier + gridDim.x + 2; }

__device__ __forceinline__ void grid_barrier(const PersistArgs& a, unsigned& target) {
    if (a.monotonic_barrier) {
        grid_arrive(growing_counter(a), target);
        grid_wait(growing_counter(a), target);
    } else if (a.counter_barrier)
        grid_barrier_counter(a.barrier);
    else
        grid_barrier_flags(a.barrier, target);
}

// At the start of a launch: the block's barrier count (the flags barrier's word, or what
// barrier_count_store left there).
__device__ __forceinline__ unsigned barrier_count_load(const PersistArgs& a) {
    return *reinterpret_cast<volatile unsigned*>(a.barrier + blockIdx.x);
}

// At the end of a launch: the block's barrier count for the next launch (the flags barrier keeps
// it in the word already).
__device__ __forceinline__ void barrier_count_store(const PersistArgs& a, unsigned target) {
    if (a.monotonic_barrier && threadIdx.x == 0) a.barrier[blockIdx.x] = target;
}

// Whether this block runs a KV head's attention stage (the first n_kv blocks).
__device__ __forceinline__ bool attention_block(const PersistArgs& a) {
    return int(blockIdx.x) < a.n_kv && !a.barriers_only;
}

// Pass p's input row into the residual stream x, spread over the grid (a barrier follows).
__device__ __forceinline__ void pass_input(const PersistArgs& a, int p) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < a.hidden; i += gridDim.x * blockDim.x)
        a.x[i] = a.x_in[size_t(p) * a.hidden + i];
}

// One product stage: y[row] (rule) = W[row] · input for every row, rows spread over all warps
// of the grid.
enum class Rule { STORE, ADD, SWIGLU };

struct Stage {
    const bf16_t* w = nullptr;
    const bf16_t* w2 = nullptr;  // SWIGLU: the up rows
    int out = 0, in = 0;
    const float* x = nullptr;       // [in], written earlier in this launch (read through L2)
    const float* norm_w = nullptr;  // RMSNorm input when set
    Rule rule = Rule::STORE;
    float* y = nullptr;
};

// Lane 0's store of a finished row: for SWIGLU silu(gate) * sum, for ADD residual + sum (the
// row's earlier value, read by the caller), else the sum, as gemv_vec_kernel stores them.
__device__ __forceinline__ void stage_store(const Stage& s, int row, float gate, float sum, float residual) {
    float* y = s.y + row;
    if (s.rule == Rule::SWIGLU)
        *y = silu_ref(gate) * sum;
    else if (s.rule == Rule::ADD)
        *y = residual + (sum + 0.0f);
    else
        *y = sum + 0.0f;
}

// The product stages of a pass, from the launch's arguments: layer l's q/k/v, o, gate/up and down,
// and pass p's head.
struct PassStages {
    const PersistArgs& a;
    __device__ Stage qkv(int l) const {
        const PersistLayer& L = a.layers[l];
        return Stage{L.qkv, nullptr, (a.n_heads + 2 * a.n_kv) * a.head_dim, a.hidden, a.x, L.input_norm, Rule::STORE,
                     a.qkv};
    }
    __device__ Stage o(int l) const {
        return Stage{a.layers[l].o, nullptr, a.hidden, a.n_heads * a.head_dim, a.attn, nullptr, Rule::ADD, a.x};
    }
    __device__ Stage gate_up(int l) const {
        const PersistLayer& L = a.layers[l];
        return Stage{L.gate_up, L.gate_up + size_t(a.intermediate) * a.hidden, a.intermediate, a.hidden, a.x,
                     L.post_norm, Rule::SWIGLU, a.mlp};
    }
    __device__ Stage down(int l) const {
        return Stage{a.layers[l].down, nullptr, a.hidden, a.intermediate, a.mlp, nullptr, Rule::ADD, a.x};
    }
    __device__ Stage head(int p) const {
        return Stage{a.head, nullptr, a.vocab, a.hidden, a.x, a.final_norm, Rule::STORE, a.logits + size_t(p) * a.vocab};
    }
};

// This warp's rows of `s` into L2 (fire and forget): the next stage's weights stream while the
// grid waits at the barrier.
__device__ __forceinline__ void stage_prefetch(const Stage& s, bool on) {
    const int lane = threadIdx.x & 31;
    if (lane != 0 || !on) return;
    const int warps = int(gridDim.x) * PS_WARPS, first = int(blockIdx.x) * PS_WARPS + int(threadIdx.x >> 5);
    const uint32_t bytes = uint32_t(s.in) * 2u;
    for (int row = first; row < s.out; row += warps) {
        prefetch_l2(s.w + size_t(row) * s.in, bytes);
        if (s.w2) prefetch_l2(s.w2 + size_t(row) * s.in, bytes);
    }
}

// The block's copy of the stage's input (times norm_w) in xs; returns the RMSNorm factor (1
// without a norm): lab_device.cuh's stage_input_row over the PS_THREADS threads.
__device__ __forceinline__ float stage_input(const Stage& s, float eps, float* xs, float* partial) {
    return stage_input_row(s.x, s.norm_w, s.in, eps, xs, partial);
}

// One stage over the grid: every warp computes its rows as gemv_vec_kernel computes one (16-byte
// pieces k = lane, lane + 32, ... in increasing order, then a warp sum, then the norm factor).
template <int NMAT>
__device__ __forceinline__ void stage_run(const Stage& s, float eps, float* xs, float* partial, bool skip) {
    if (skip) return;
    const float inv = stage_input(s, eps, xs, partial);
    const int lane = threadIdx.x & 31;
    const int warps = int(gridDim.x) * PS_WARPS, first = int(blockIdx.x) * PS_WARPS + int(threadIdx.x >> 5);
    const int in8 = s.in >> 3;
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    for (int row = first; row < s.out; row += warps) {
        const uint4* w0 = reinterpret_cast<const uint4*>(s.w) + size_t(row) * in8;
        const uint4* w1 = NMAT == 2 ? reinterpret_cast<const uint4*>(s.w2) + size_t(row) * in8 : w0;
        float acc[NMAT];
#pragma unroll
        for (int m = 0; m < NMAT; ++m) acc[m] = 0.0f;
        constexpr int U = 8 / NMAT;  // 16-byte pieces per lane per matrix in flight (as the product)
        for (int base = 0; base < in8; base += 32 * U) {
            uint4 cur[NMAT][U];
            weight_chunk_load<NMAT, U>(w0, w1, base, in8, cur);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = base + u * 32 + lane;
                if (k < in8) {
                    const float4 x0 = x4[2 * k], x1 = x4[2 * k + 1];
#pragma unroll
                    for (int m = 0; m < NMAT; ++m) acc[m] += dot8(cur[m][u], x0, x1);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < NMAT; ++m) acc[m] = warp_sum(acc[m]) * inv;
        if (lane == 0) stage_store(s, row, acc[0], acc[NMAT - 1], s.rule == Rule::ADD ? __ldcg(s.y + row) : 0.0f);
    }
}

// Shared memory of the attention stage (floats): K and V rows of one KV head [PERSIST_MAX_CTX,
// hd] each, the fresh q/k/v rows [(group + 2) hd], the queries [group, hd], their scores [group,
// PERSIST_MAX_CTX], the warps' rotation scratch [8, 128], softmax statistics.
struct AttnSmem {
    float* k;
    float* v;
    float* fresh;
    float* q;
    float* s;
    float* scratch;
    float* m;
    float* l;
};

__device__ __forceinline__ AttnSmem attn_smem(float* base, int hd, int group) {
    AttnSmem a;
    a.k = base;
    a.v = a.k + PERSIST_MAX_CTX * hd;
    a.fresh = a.v + PERSIST_MAX_CTX * hd;
    a.q = a.fresh + (group + 2) * hd;
    a.s = a.q + group * hd;
    a.scratch = a.s + group * PERSIST_MAX_CTX;
    a.m = a.scratch + PS_WARPS * 128;
    a.l = a.m + ATTN_MAX_GROUP;
    return a;
}

// Before the barrier that precedes the attention: KV head blockIdx.x's cached rows 0..pos-1 of
// this layer into shared memory (they were written by earlier passes).
__device__ __forceinline__ void attention_stage_begin(const PersistArgs& a, int layer, int pos, const AttnSmem& sm) {
    const int g = blockIdx.x, hd = a.head_dim, vec = hd / 4;
    const size_t base = ((size_t(layer) * a.n_kv + g) * a.max_ctx) * hd;
    for (int i = threadIdx.x; i < pos * vec; i += PS_THREADS) {
        const int r = i / vec, c = i % vec;
        __pipeline_memcpy_async(sm.k + r * hd + c * 4, a.k_cache + base + size_t(r) * hd + c * 4, 16);
        __pipeline_memcpy_async(sm.v + r * hd + c * 4, a.v_cache + base + size_t(r) * hd + c * 4, 16);
    }
    __pipeline_commit();
}

// The attention of the new row at `pos` for KV head blockIdx.x, as attention_kernel computes it
// with one key slice (T = 1): the same values in the same order.
__device__ __forceinline__ void attention_stage(const PersistArgs& a, int layer, int pos, const AttnSmem& sm) {
    const int g = blockIdx.x, hd = a.head_dim, group = a.n_heads / a.n_kv, ctx = pos + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const PersistLayer& L = a.layers[layer];
    for (int i = threadIdx.x; i < group * hd; i += PS_THREADS) sm.fresh[i] = __ldcg(a.qkv + size_t(g) * group * hd + i);
    for (int i = threadIdx.x; i < hd; i += PS_THREADS) {
        sm.fresh[group * hd + i] = __ldcg(a.qkv + size_t(a.n_heads + g) * hd + i);
        sm.fresh[(group + 1) * hd + i] = __ldcg(a.qkv + size_t(a.n_heads + a.n_kv + g) * hd + i);
    }
    __pipeline_wait_prior(0);
    __syncthreads();
    const size_t row = ((size_t(layer) * a.n_kv + g) * a.max_ctx + pos) * hd;
    float* my_scratch = sm.scratch + warp * 128;
    if (warp == 0) {  // the new key: normalised, rotated, into the stage and the cache
        float* k_row = sm.k + pos * hd;
        warp_head_norm_rope(sm.fresh + group * hd, my_scratch, k_row, hd, L.k_norm, a.eps, a.inv_freq, pos);
        for (int d = lane; d < hd; d += 32) a.k_cache[row + d] = k_row[d];
    } else if (warp == 1) {  // the new value
        for (int d = lane; d < hd; d += 32) {
            const float v = sm.fresh[(group + 1) * hd + d];
            a.v_cache[row + d] = v;
            sm.v[pos * hd + d] = v;
        }
    } else if (warp < 2 + group) {  // query head g * group + (warp - 2)
        const int qi = warp - 2;
        warp_head_norm_rope(sm.fresh + qi * hd, my_scratch, sm.q + qi * hd, hd, L.q_norm, a.eps, a.inv_freq, pos);
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(float(hd));
    for (int j = warp; j < ctx; j += PS_WARPS) {
        float kv[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = lane + 32 * i;
            kv[i] = d < hd ? sm.k[j * hd + d] : 0.0f;
        }
        for (int qi = 0; qi < group; ++qi) {
            float p = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int d = lane + 32 * i;
                p = fmaf(d < hd ? sm.q[qi * hd + d] : 0.0f, kv[i], p);
            }
            p = warp_sum(p);
            if (lane == 0) sm.s[qi * PERSIST_MAX_CTX + j] = j <= pos ? p * scale : -INFINITY;
        }
    }
    __syncthreads();
    for (int qi = warp; qi < group; qi += PS_WARPS) {
        const float l = warp_softmax_unnormalised(sm.s + qi * PERSIST_MAX_CTX, ctx);
        if (lane == 0) sm.l[qi] = l;
    }
    __syncthreads();
    for (int o = threadIdx.x; o < group * hd; o += PS_THREADS) {
        const int qi = o / hd, d = o % hd;
        const float* p = sm.s + qi * PERSIST_MAX_CTX;
        float acc = 0.0f;
#pragma unroll 4
        for (int j = 0; j < ctx; ++j) acc = fmaf(p[j], sm.v[j * hd + d], acc);
        const float l = sm.l[qi];
        a.attn[size_t(g * group + qi) * hd + d] = l > 0.0f ? acc / l : 0.0f;
    }
}

__global__ void __launch_bounds__(PS_THREADS, 2) persistent_kernel(const PersistArgs a) {
    extern __shared__ float4 ps_smem4[];
    __shared__ float partial[PS_WARPS];
    float* xs = reinterpret_cast<float*>(ps_smem4);
    const int group = a.n_heads / a.n_kv, hd = a.head_dim;
    const AttnSmem sm = attn_smem(xs + PS_MAX_IN, hd, group);
    const bool attends = attention_block(a);
    unsigned target = barrier_count_load(a);

    const PassStages st{a};

    for (int p = 0; p < a.passes; ++p) {
        const int pos = a.pos0 + p;
        const Stage head = st.head(p);
        pass_input(a, p);
        if (p == 0) stage_prefetch(st.qkv(0), a.prefetch);  // later passes: during the previous one's last layer
        grid_barrier(a, target);
        // Each stage's work starts with the prefetch of the next product's weights, so that they
        // have that stage and two barriers to arrive.
        for (int l = 0; l < a.n_layers; ++l) {
            const bool last = l + 1 == a.n_layers;
            stage_prefetch(st.o(l), a.prefetch);
            stage_run<1>(st.qkv(l), a.eps, xs, partial, a.barriers_only);
            if (attends) attention_stage_begin(a, l, pos, sm);
            grid_barrier(a, target);
            stage_prefetch(st.gate_up(l), a.prefetch);
            if (attends) attention_stage(a, l, pos, sm);
            grid_barrier(a, target);
            stage_prefetch(st.down(l), a.prefetch);
            stage_run<1>(st.o(l), a.eps, xs, partial, a.barriers_only);
            grid_barrier(a, target);
            stage_prefetch(last ? head : st.qkv(l + 1), a.prefetch);
            stage_run<2>(st.gate_up(l), a.eps, xs, partial, a.barriers_only);
            grid_barrier(a, target);
            if (last && p + 1 < a.passes) stage_prefetch(st.qkv(0), a.prefetch);
            stage_run<1>(st.down(l), a.eps, xs, partial, a.barriers_only);
            grid_barrier(a, target);
        }
        stage_run<1>(head, a.eps, xs, partial, a.barriers_only);
        grid_barrier(a, target);  // the next pass overwrites x
    }
    barrier_count_store(a, target);
}

// ---- The first form with the next stage's rows in registers ----
//
// As the product's gemv loads its first weights before its PDL wait, each warp here loads its
// rows of the next stage (all of them: PRE_MAX 16-byte pieces a lane at most) into registers
// before the barrier, and the stage after the barrier only reads its input row from L2.
// Warp gw of the grid (W warps) takes rows gw, gw + W, ...; piece i of a lane is row i / (P
// NMAT), matrix (i / P) mod NMAT, 16-byte piece k = lane + 32 (i mod P), P = in / 256.

constexpr int PRE_MAX = 16;

template <int P, int NMAT>
__device__ __forceinline__ void stage_preload_p(const Stage& s, uint4 (&w)[PRE_MAX]) {
    const int lane = threadIdx.x & 31, W = int(gridDim.x) * PS_WARPS;
    const int first = int(blockIdx.x) * PS_WARPS + int(threadIdx.x >> 5);
    constexpr int per_row = P * NMAT;
#pragma unroll
    for (int i = 0; i < PRE_MAX; ++i) {
        const int r = i / per_row, m = (i / P) % NMAT, u = i % P;
        const int row = first + r * W;
        if (row < s.out) {
            const bf16_t* base = (m == 0 ? s.w : s.w2) + size_t(row) * s.in;
            w[i] = __ldg(reinterpret_cast<const uint4*>(base) + u * 32 + lane);
        }
    }
}

// The stage from the preloaded pieces: per row the sums of stage_run in its order.
template <int P, int NMAT>
__device__ __forceinline__ void stage_run_p(const Stage& s, const uint4 (&w)[PRE_MAX], float inv, const float* xs) {
    const int lane = threadIdx.x & 31, W = int(gridDim.x) * PS_WARPS;
    const int first = int(blockIdx.x) * PS_WARPS + int(threadIdx.x >> 5);
    constexpr int per_row = P * NMAT;
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    float acc = 0.0f, gate = 0.0f;
#pragma unroll
    for (int i = 0; i < PRE_MAX; ++i) {
        const int r = i / per_row, m = (i / P) % NMAT, u = i % P;
        const int row = first + r * W;
        if (row < s.out) {
            const int k = u * 32 + lane;
            acc += dot8(w[i], x4[2 * k], x4[2 * k + 1]);
            if (u == P - 1) {
                const float sum = warp_sum(acc) * inv;
                acc = 0.0f;
                if (NMAT == 2 && m == 0) {
                    gate = sum;
                } else if (lane == 0) {
                    stage_store(s, row, gate, sum, s.rule == Rule::ADD ? __ldcg(s.y + row) : 0.0f);
                }
            }
        }
    }
}

// P = in / 256 pieces a lane a row: 4, 8 or 12 at the predictors' shapes (preload_fits checks).
template <int NMAT>
__device__ __forceinline__ void stage_preload(const Stage& s, uint4 (&w)[PRE_MAX], bool skip) {
    if (skip) return;
    switch (s.in >> 8) {
        case 4: stage_preload_p<4, NMAT>(s, w); break;
        case 8: stage_preload_p<8, NMAT>(s, w); break;
        default: stage_preload_p<12, NMAT>(s, w); break;
    }
}

template <int NMAT>
__device__ __forceinline__ void stage_run_preloaded(const Stage& s, const uint4 (&w)[PRE_MAX], float eps, float* xs,
                                                    float* partial, bool skip) {
    if (skip) return;
    const float inv = stage_input(s, eps, xs, partial);
    switch (s.in >> 8) {
        case 4: stage_run_p<4, NMAT>(s, w, inv, xs); break;
        case 8: stage_run_p<8, NMAT>(s, w, inv, xs); break;
        default: stage_run_p<12, NMAT>(s, w, inv, xs); break;
    }
}

__host__ __device__ inline bool preload_fits(int out, int in, int nmat, int warps) {
    const int p = in / 256;
    return in % 256 == 0 && (p == 4 || p == 8 || p == 12) && ((out + warps - 1) / warps) * p * nmat <= PRE_MAX;
}

__global__ void __launch_bounds__(PS_THREADS, 2) persistent_preload_kernel(const PersistArgs a) {
    extern __shared__ float4 ps_smem4[];
    __shared__ float partial[PS_WARPS];
    float* xs = reinterpret_cast<float*>(ps_smem4);
    const int group = a.n_heads / a.n_kv, hd = a.head_dim;
    const AttnSmem sm = attn_smem(xs + PS_MAX_IN, hd, group);
    const bool skip = a.barriers_only;
    const bool attends = attention_block(a);
    unsigned target = barrier_count_load(a);
    uint4 w[PRE_MAX];

    const PassStages st{a};

    unsigned* counter = growing_counter(a);
    stage_preload<1>(st.qkv(0), w, skip);
    for (int p = 0; p < a.passes; ++p) {
        const int pos = a.pos0 + p;
        const Stage head = st.head(p);
        pass_input(a, p);
        grid_arrive(counter, target);
        if (p == 0) stage_prefetch(st.o(0), a.prefetch);
        grid_wait(counter, target);
        // The L2 prefetches run two weight stages ahead, the register loads one (between a
        // barrier's arrival and its wait).
        for (int l = 0; l < a.n_layers; ++l) {
            const bool last = l + 1 == a.n_layers;
            stage_prefetch(st.gate_up(l), a.prefetch);
            stage_run_preloaded<1>(st.qkv(l), w, a.eps, xs, partial, skip);
            grid_arrive(counter, target);
            if (attends) attention_stage_begin(a, l, pos, sm);
            if (!attends) stage_preload<1>(st.o(l), w, skip);
            grid_wait(counter, target);
            stage_prefetch(st.down(l), a.prefetch);
            if (attends) attention_stage(a, l, pos, sm);
            grid_arrive(counter, target);
            if (attends) stage_preload<1>(st.o(l), w, skip);
            grid_wait(counter, target);
            stage_prefetch(last ? head : st.qkv(l + 1), a.prefetch);
            stage_run_preloaded<1>(st.o(l), w, a.eps, xs, partial, skip);
            grid_arrive(counter, target);
            stage_preload<2>(st.gate_up(l), w, skip);
            grid_wait(counter, target);
            if (!last) stage_prefetch(st.o(l + 1), a.prefetch);
            if (last && p + 1 < a.passes) stage_prefetch(st.qkv(0), a.prefetch);
            stage_run_preloaded<2>(st.gate_up(l), w, a.eps, xs, partial, skip);
            grid_arrive(counter, target);
            stage_preload<1>(st.down(l), w, skip);
            grid_wait(counter, target);
            if (last && p + 1 < a.passes) stage_prefetch(st.o(0), a.prefetch);
            stage_run_preloaded<1>(st.down(l), w, a.eps, xs, partial, skip);
            grid_arrive(counter, target);
            if (last)
                stage_preload<1>(head, w, skip);
            else
                stage_preload<1>(st.qkv(l + 1), w, skip);
            grid_wait(counter, target);
        }
        stage_run_preloaded<1>(head, w, a.eps, xs, partial, skip);
        grid_arrive(counter, target);  // the next pass overwrites x
        if (p + 1 < a.passes) stage_preload<1>(st.qkv(0), w, skip);
        grid_wait(counter, target);
    }
    barrier_count_store(a, target);
}

// ---- The second form: the weights streamed through a ring in shared memory ----
//
// One block per SM. The grid's blocks take consecutive row ranges of every product, so a block's
// rows of a matrix are one contiguous piece of it. In the order the stages use them these pieces
// are the block's weight stream (a pass: per layer q/k/v, o, gate, up, down; then the head).
// Thread 0 (or the warps' first lanes in turn) copies the stream into a ring of slots in shared
// memory with bulk copies (the copy engine moves the bytes; a slot's copies complete on its
// mbarrier), or every thread copies 16-byte pieces with cp.async; each slot is refilled as soon as
// the stages have used it, so the next stages' rows arrive while the grid waits at its barriers.
// After a barrier a stage reads its input row from L2 and its rows from the ring. With
// PersistArgs::ring.strided block b's rows are b, b + G, ... instead of a range (cp.async only).

constexpr uint32_t RING_BUDGET = 180224;  // bytes of shared memory for the ring (176 KiB)
constexpr int RING_MAX_SLOTS = 64;

// The ring's shape (PersistArgs::ring.slot): slots of `slot` bytes, as many as the budget holds.
struct RingShape {
    uint32_t slot, slots, bytes;
};
__host__ __device__ inline RingShape ring_shape(uint32_t slot) {
    const uint32_t n = RING_BUDGET / slot < RING_MAX_SLOTS ? RING_BUDGET / slot : RING_MAX_SLOTS;
    return RingShape{slot, n, slot * n};
}

__host__ __device__ inline int staged_rows(int out, int blocks) { return (out + blocks - 1) / blocks; }

// The block's rows [r0, r1) of one matrix: where they start and how many bytes they are.
struct Piece {
    const char* src;
    uint32_t bytes;
    uint32_t row_bytes, stride;  // a row's bytes; from one of the block's rows to its next
};

// The block's rows of a product with `out` rows: a range of consecutive rows, or with
// PersistArgs::ring.strided rows b, b + G, b + 2G, ... (the grid then sweeps the matrix in order,
// as the chain's launches do). Row j of the block is row first + j * step.
struct BlockRows {
    int first, step, count;
};
__device__ __forceinline__ BlockRows block_rows(int out, bool strided) {
    const int G = int(gridDim.x), b = int(blockIdx.x);
    if (strided) return BlockRows{b, G, b < out ? (out - b + G - 1) / G : 0};
    const int r0 = min(out, b * staged_rows(out, G)), r1 = min(out, r0 + staged_rows(out, G));
    return BlockRows{r0, 1, r1 - r0};
}

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
// Piece j of a pass in the block's stream: 5 a layer (q/k/v, o, gate, up, down), then the head.
__device__ __forceinline__ Piece stream_piece(const PersistArgs& a, int j) {
    const int H = a.hidden, I = a.intermediate, hd = a.head_dim, G = int(gridDim.x);
    const bf16_t* w = a.head;
    int out = a.vocab, in = H;
    if (j < 5 * a.n_layers) {
        const PersistLayer& L = a.layers[j / 5];
        switch (j % 5) {
            case 0: w = L.qkv, out = (a.n_heads + 2 * a.n_kv) * hd, in = H; break;
            case 1: w = L.o, out = H, in = a.n_heads * hd; break;
            case 2: w = L.gate_up, out = I, in = H; break;
            case 3: w = L.gate_up + size_t(I) * H, out = I, in = H; break;
            default: w = L.down, out = H, in = I; break;
        }
    }
    (void)G;
    const BlockRows br = block_rows(out, a.ring.strided);
    const uint32_t row_bytes = uint32_t(in) * 2u;
    return Piece{reinterpret_cast<const char*>(w + size_t(br.first) * in), uint32_t(br.count) * row_bytes, row_bytes,
                 uint32_t(br.step) * row_bytes};
}
#endif

// The producer's place in the block's weight stream (every thread keeps it): `issued` bytes
// requested, the next one at offset `off` of piece `piece` of pass `pass`.
struct RingProducer {
    uint32_t issued = 0;
    int pass = 0, piece = 0;
    uint32_t off = 0;
};

// Every thread keeps the producer's place (the same sums); the copies into a slot are issued by
// thread 0, or with PersistArgs::ring.issuers by lane 0 of warp (slot number mod 7). Requests
// whole slots of the stream while the slot's previous bytes are used up (`consumed` bytes are).
__device__ __forceinline__ void ring_fill(const PersistArgs& a, RingProducer& pr, uint32_t consumed, char* ring,
                                          uint64_t* bars) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const RingShape r = ring_shape(a.ring.slot);
    const int pieces = 5 * a.n_layers + 1;
    if ((threadIdx.x & 31) == 0) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // reads come first
    while (pr.pass < a.passes && pr.issued + r.slot <= consumed + r.bytes) {
        const uint32_t chunk = pr.issued / r.slot;
        const bool mine = threadIdx.x == (a.ring.issuers ? 32u * (chunk % (PS_WARPS - 1)) : 0u);  // not barrier_thread()
        char* dst = ring + (chunk % r.slots) * r.slot;
        const uint32_t bar = smem_address(&bars[chunk % r.slots]);
        uint32_t fill = 0;
        while (fill < r.slot && pr.pass < a.passes) {
            const Piece pc = stream_piece(a, pr.piece);
            const uint32_t n = min(r.slot - fill, pc.bytes - pr.off);
            if (n > 0 && a.ring.cp_async) {  // every thread copies 16-byte pieces
                const uint32_t d = smem_address(dst + fill);
                for (uint32_t i = threadIdx.x * 16u; i < n; i += PS_THREADS * 16u) {
                    const uint32_t q = pr.off + i, j = q / pc.row_bytes;  // row j of the block's, byte q - j row
                    const char* from = pc.src + size_t(j) * pc.stride + (q - j * pc.row_bytes);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d + i), "l"(from) : "memory");
                }
            } else if (n > 0 && mine) {
                asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(n) : "memory");
                asm volatile(
                    "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                        smem_address(dst + fill)),
                    "l"(pc.src + pr.off), "r"(n), "r"(bar)
                    : "memory");
            }
            fill += n;
            pr.off += n;
            if (pr.off == pc.bytes) {
                pr.off = 0;
                if (++pr.piece == pieces) pr.piece = 0, ++pr.pass;
            }
        }
        if (fill == 0) break;
        if (a.ring.cp_async)  // the slot's barrier counts every thread's copies in
            asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
        else if (mine)
            asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
        pr.issued += fill;
    }
#else
    (void)a, (void)pr, (void)consumed, (void)ring, (void)bars;
    __trap();
#endif
}

// How ring_run waits and consumes (PersistArgs's ring switches).
struct RingRunMode {
    bool skip, strided, spin, eager;
};

// One stage from the ring: the block's rows of s (the next bytes of its stream after `consumed`;
// for SWIGLU the gate rows, then the up rows), one warp a row, each row's arithmetic as
// stage_run's (pieces k = lane, lane + 32, ... in increasing order, a warp sum, the norm factor).
// `refill` is the ring's refill (ring_fill), called inside the stage in eager mode.
template <int NMAT, typename Refill>
__device__ __forceinline__ void ring_run(const Stage& s, const RingShape r, const char* ring, uint64_t* bars,
                                         uint32_t& consumed, float eps, float* xs, float* partial,
                                         const RingRunMode m, const Refill& refill) {
    const BlockRows br = block_rows(s.out, m.strided);
    const uint32_t row_bytes = uint32_t(s.in) * 2u, mat_bytes = uint32_t(br.count) * row_bytes;
    const uint32_t begin = consumed, end = begin + NMAT * mat_bytes;
    const float inv = m.skip ? 1.0f : stage_input(s, eps, xs, partial);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int in8 = s.in >> 3;
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    const auto wait_chunk = [&](uint32_t c) { mbar_wait(&bars[c % r.slots], (c / r.slots) & 1u, m.spin); };
    const auto rows = [&](int j0, int j1) {  // the block's rows j0..j1-1, a warp each
        for (int j = j0 + warp; j < j1 && !m.skip; j += PS_WARPS) {
            const int row = br.first + j * br.step;
            const uint32_t q0 = begin + uint32_t(j) * row_bytes;
            uint32_t o0 = (q0 + 16u * lane) % r.bytes, o1 = (q0 + mat_bytes + 16u * lane) % r.bytes;
            const float residual = s.rule == Rule::ADD && lane == 0 ? __ldcg(s.y + row) : 0.0f;  // read early
            float acc[NMAT];
#pragma unroll
            for (int mm = 0; mm < NMAT; ++mm) acc[mm] = 0.0f;
            for (int k = lane; k < in8; k += 32) {
                const float4 x0 = x4[2 * k], x1 = x4[2 * k + 1];
                acc[0] += dot8(*reinterpret_cast<const uint4*>(ring + o0), x0, x1);
                o0 = o0 + 512u >= r.bytes ? o0 + 512u - r.bytes : o0 + 512u;
                if (NMAT == 2) {  // the up row, mat_bytes further on
                    acc[NMAT - 1] += dot8(*reinterpret_cast<const uint4*>(ring + o1), x0, x1);
                    o1 = o1 + 512u >= r.bytes ? o1 + 512u - r.bytes : o1 + 512u;
                }
            }
#pragma unroll
            for (int mm = 0; mm < NMAT; ++mm) acc[mm] = warp_sum(acc[mm]) * inv;
            if (lane == 0) stage_store(s, row, acc[0], acc[NMAT - 1], residual);
        }
    };
    if (NMAT == 1 && m.eager && end > begin) {
        // Slot by slot: the rows whose bytes have all arrived, then their slots refilled, so the
        // ring keeps streaming inside the stage (the stream lab's loop).
        int done = 0;
        for (uint32_t c = begin / r.slot; c <= (end - 1) / r.slot; ++c) {
            wait_chunk(c);
            const int ready = int((min(end, (c + 1) * r.slot) - begin) / row_bytes);
            rows(done, ready);
            done = ready;
            __syncthreads();
            consumed = begin + uint32_t(done) * row_bytes;
            refill();
        }
        consumed = end;
        return;
    }
    if (end > begin)
        for (uint32_t c = begin / r.slot; c <= (end - 1) / r.slot; ++c) wait_chunk(c);
    rows(0, br.count);
    __syncthreads();  // every warp is done with these slots before they are refilled
    consumed = end;
}

__host__ __device__ inline size_t round128(size_t n) { return (n + 127) / 128 * 128; }

// Shared memory of the second form: the input row (or, in the attention stage, the attention's
// scratch over it), then the ring.
__host__ __device__ inline size_t staged_front(const PersistArgs& a) {
    const int group = a.n_heads / a.n_kv, hd = a.head_dim;
    const size_t attn = size_t(2 * PERSIST_MAX_CTX * hd + (group + 2) * hd + group * hd + group * PERSIST_MAX_CTX +
                               PS_WARPS * 128 + 2 * ATTN_MAX_GROUP);
    return round128((attn > size_t(PS_MAX_IN) ? attn : size_t(PS_MAX_IN)) * sizeof(float));
}

__global__ void __launch_bounds__(PS_THREADS, 1) persistent_staged_kernel(const PersistArgs a) {
    extern __shared__ float4 staged_smem4[];
    __shared__ float partial[PS_WARPS];
    __shared__ uint64_t bars[RING_MAX_SLOTS];
    const int group = a.n_heads / a.n_kv, hd = a.head_dim;
    char* base = reinterpret_cast<char*>(staged_smem4);
    float* xs = reinterpret_cast<float*>(base);
    const AttnSmem sm = attn_smem(xs, hd, group);
    char* ring = base + staged_front(a);
    const bool attends = attention_block(a);
    const bool skip = a.barriers_only;
    unsigned target = barrier_count_load(a);
    uint32_t consumed = 0;
    unsigned* counter = growing_counter(a);  // the refills go between a barrier's arrival and its wait
    RingProducer producer;
    const RingShape shape = ring_shape(a.ring.slot);

    const PassStages st{a};
    auto refill = [&] { ring_fill(a, producer, consumed, ring, bars); };
    const RingRunMode mode{skip, a.ring.strided, a.ring.spin, a.ring.eager};

    if (threadIdx.x == 0)
        for (uint32_t i = 0; i < shape.slots; ++i) mbar_init(&bars[i], a.ring.cp_async ? PS_THREADS : 1u);
    __syncthreads();
    refill();
    for (int p = 0; p < a.passes; ++p) {
        const int pos = a.pos0 + p;
        const Stage head = st.head(p);
        pass_input(a, p);
        grid_barrier(a, target);
        for (int l = 0; l < a.n_layers; ++l) {
            ring_run<1>(st.qkv(l), shape, ring, bars, consumed, a.eps, xs, partial, mode, refill);
            grid_arrive(counter, target);
            refill();
            if (attends) attention_stage_begin(a, l, pos, sm);
            grid_wait(counter, target);
            if (attends) attention_stage(a, l, pos, sm);
            grid_barrier(a, target);
            ring_run<1>(st.o(l), shape, ring, bars, consumed, a.eps, xs, partial, mode, refill);
            grid_arrive(counter, target);
            refill();
            grid_wait(counter, target);
            ring_run<2>(st.gate_up(l), shape, ring, bars, consumed, a.eps, xs, partial, mode, refill);
            grid_arrive(counter, target);
            refill();
            grid_wait(counter, target);
            ring_run<1>(st.down(l), shape, ring, bars, consumed, a.eps, xs, partial, mode, refill);
            grid_arrive(counter, target);
            refill();
            grid_wait(counter, target);
        }
        ring_run<1>(head, shape, ring, bars, consumed, a.eps, xs, partial, mode, refill);
        grid_arrive(counter, target);  // the next pass overwrites x
        refill();
        grid_wait(counter, target);
    }
    barrier_count_store(a, target);
}

size_t persist_smem(const PersistArgs& a) {
    const int group = a.n_heads / a.n_kv, hd = a.head_dim;
    const size_t attn = size_t(2 * PERSIST_MAX_CTX * hd + (group + 2) * hd + group * hd + group * PERSIST_MAX_CTX +
                               PS_WARPS * 128 + 2 * ATTN_MAX_GROUP);
    return (size_t(PS_MAX_IN) + attn) * sizeof(float);
}

}  // namespace

bool persist_supported(const PersistArgs& a) {
    const int in_max = std::max(std::max(a.hidden, a.intermediate), a.n_heads * a.head_dim);
    return a.n_layers >= 1 && a.n_layers <= PERSIST_MAX_LAYERS && a.hidden % 8 == 0 && a.intermediate % 8 == 0 &&
           in_max <= PS_MAX_IN && a.n_kv >= 1 && a.n_heads % a.n_kv == 0 && a.n_heads / a.n_kv <= ATTN_MAX_GROUP &&
           a.n_heads / a.n_kv + 2 <= PS_WARPS && a.head_dim % 4 == 0 && a.head_dim <= ATTN_MAX_HEAD_DIM &&
           a.max_ctx <= PERSIST_MAX_CTX && a.pos0 >= 0 && a.pos0 + a.passes <= a.max_ctx && a.barrier && a.head &&
           a.x_in && a.logits;
}

int persist_blocks_per_sm(int device) {
    int per_sm = 0;
    (void)device;  // the current device's limits (the caller's context made it current)
    PersistArgs probe;
    probe.n_heads = 16;
    probe.n_kv = 8;
    probe.head_dim = 128;
    const size_t smem = persist_smem(probe);
    KERNEL_CUDA_CHECK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    KERNEL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, PS_THREADS, smem));
    return std::min(per_sm, 2);
}

bool persist_preload_fits(const PersistArgs& a, int blocks) {
    const int W = blocks * PS_WARPS, H = a.hidden, I = a.intermediate;
    const int qkv_dim = (a.n_heads + 2 * a.n_kv) * a.head_dim, qd = a.n_heads * a.head_dim;
    return preload_fits(qkv_dim, H, 1, W) && preload_fits(H, qd, 1, W) && preload_fits(I, H, 2, W) &&
           preload_fits(H, I, 1, W) && preload_fits(a.vocab, H, 1, W);
}

void persist_launch(const PersistArgs& a, int blocks, cudaStream_t stream) {
    if (!persist_supported(a) || blocks < a.n_kv ||
        (a.preload && (!persist_preload_fits(a, blocks) || !a.monotonic_barrier)))
        check_fail("persist_launch", "unsupported shapes or arguments", __func__, __FILE__, __LINE__);
    const size_t smem = persist_smem(a);
    const auto kernel = a.preload ? persistent_preload_kernel : persistent_kernel;
    KERNEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    PersistArgs args = a;
    void* params[] = {&args};
    KERNEL_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(kernel), dim3(blocks),
                                                  dim3(PS_THREADS), params, smem, stream));
}

bool persist_staged_launch(const PersistArgs& a, int blocks, cudaStream_t stream) {
    if (!persist_supported(a) || blocks < a.n_kv || a.ring.slot < 1024 || a.ring.slot % 16 != 0 ||
        RING_BUDGET / a.ring.slot < 2 || !a.monotonic_barrier || (a.ring.strided && !a.ring.cp_async))
        check_fail("persist_staged_launch", "unsupported shapes or arguments", __func__, __FILE__, __LINE__);
    int device = 0, optin = 0;
    KERNEL_CUDA_CHECK(cudaGetDevice(&device));
    KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attr{};
    KERNEL_CUDA_CHECK(cudaFuncGetAttributes(&attr, persistent_staged_kernel));
    const size_t smem = staged_front(a) + ring_shape(a.ring.slot).bytes;
    if (smem + attr.sharedSizeBytes > size_t(optin)) return false;
    KERNEL_CUDA_CHECK(
        cudaFuncSetAttribute(persistent_staged_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    int per_sm = 0;
    KERNEL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_staged_kernel, PS_THREADS, smem));
    int sms = 0;
    KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (per_sm * sms < blocks) return false;
    PersistArgs args = a;
    void* params[] = {&args};
    KERNEL_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(persistent_staged_kernel),
                                                  dim3(blocks), dim3(PS_THREADS), params, smem, stream));
    return true;
}

size_t persist_staged_smem(const PersistArgs& a) {
    return staged_front(a) + ring_shape(a.ring.slot).bytes;
}

}  // namespace qtts::kernel_lab
