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

__device__ __forceinline__ void grid_barrier(const PersistArgs& a, unsigned& target) {
    if (a.counter_barrier)
        grid_barrier_counter(a.barrier);
    else
        grid_barrier_flags(a.barrier, target);
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
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = base + u * 32 + lane;
                if (k < in8) {
                    cur[0][u] = __ldg(w0 + k);
                    if (NMAT == 2) cur[NMAT - 1][u] = __ldg(w1 + k);
                }
            }
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
        if (lane == 0) {
            float* y = s.y + row;
            if (s.rule == Rule::SWIGLU)
                *y = silu_ref(acc[0]) * acc[NMAT - 1];
            else if (s.rule == Rule::ADD)
                *y = __ldcg(y) + (acc[0] + 0.0f);
            else
                *y = acc[0] + 0.0f;
        }
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
    const int group = a.n_heads / a.n_kv, H = a.hidden, I = a.intermediate, hd = a.head_dim;
    const AttnSmem sm = attn_smem(xs + PS_MAX_IN, hd, group);
    const int qkv_dim = (a.n_heads + 2 * a.n_kv) * hd, qd = a.n_heads * hd;
    const bool attends = int(blockIdx.x) < a.n_kv && !a.barriers_only;
    unsigned target = *reinterpret_cast<volatile unsigned*>(a.barrier + blockIdx.x);  // this block's count

    auto qkv_stage = [&](int l) {
        const PersistLayer& L = a.layers[l];
        return Stage{L.qkv, nullptr, qkv_dim, H, a.x, L.input_norm, Rule::STORE, a.qkv};
    };
    auto o_stage = [&](int l) { return Stage{a.layers[l].o, nullptr, H, qd, a.attn, nullptr, Rule::ADD, a.x}; };
    auto gu_stage = [&](int l) {
        const PersistLayer& L = a.layers[l];
        return Stage{L.gate_up, L.gate_up + size_t(I) * H, I, H, a.x, L.post_norm, Rule::SWIGLU, a.mlp};
    };
    auto down_stage = [&](int l) { return Stage{a.layers[l].down, nullptr, H, I, a.mlp, nullptr, Rule::ADD, a.x}; };

    for (int p = 0; p < a.passes; ++p) {
        const int pos = a.pos0 + p;
        const Stage head{a.head, nullptr, a.vocab, H, a.x, a.final_norm, Rule::STORE, a.logits + size_t(p) * a.vocab};
        for (int i = blockIdx.x * PS_THREADS + threadIdx.x; i < H; i += gridDim.x * PS_THREADS)
            a.x[i] = a.x_in[size_t(p) * H + i];
        if (p == 0) stage_prefetch(qkv_stage(0), a.prefetch);  // later passes: during the previous one's last layer
        grid_barrier(a, target);
        // Each stage's work starts with the prefetch of the next product's weights, so that they
        // have that stage and two barriers to arrive.
        for (int l = 0; l < a.n_layers; ++l) {
            const bool last = l + 1 == a.n_layers;
            stage_prefetch(o_stage(l), a.prefetch);
            stage_run<1>(qkv_stage(l), a.eps, xs, partial, a.barriers_only);
            if (attends) attention_stage_begin(a, l, pos, sm);
            grid_barrier(a, target);
            stage_prefetch(gu_stage(l), a.prefetch);
            if (attends) attention_stage(a, l, pos, sm);
            grid_barrier(a, target);
            stage_prefetch(down_stage(l), a.prefetch);
            stage_run<1>(o_stage(l), a.eps, xs, partial, a.barriers_only);
            grid_barrier(a, target);
            stage_prefetch(last ? head : qkv_stage(l + 1), a.prefetch);
            stage_run<2>(gu_stage(l), a.eps, xs, partial, a.barriers_only);
            grid_barrier(a, target);
            if (last && p + 1 < a.passes) stage_prefetch(qkv_stage(0), a.prefetch);
            stage_run<1>(down_stage(l), a.eps, xs, partial, a.barriers_only);
            grid_barrier(a, target);
        }
        stage_run<1>(head, a.eps, xs, partial, a.barriers_only);
        grid_barrier(a, target);  // the next pass overwrites x
    }
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

void persist_launch(const PersistArgs& a, int blocks, cudaStream_t stream) {
    if (!persist_supported(a) || blocks < a.n_kv)
        check_fail("persist_launch", "unsupported shapes or arguments", __func__, __FILE__, __LINE__);
    const size_t smem = persist_smem(a);
    KERNEL_CUDA_CHECK(cudaFuncSetAttribute(persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    PersistArgs args = a;
    void* params[] = {&args};
    KERNEL_CUDA_CHECK(cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(persistent_kernel), dim3(blocks),
                                                  dim3(PS_THREADS), params, smem, stream));
}

}  // namespace qtts::kernel_lab
