// The kernel lab's attention folded into the o product (see attention_o.h for the design).
#include "apps/kernel-lab/attention_o.h"

#include <atomic>
#include <cstdint>

#include <cuda_pipeline.h>

#include "apps/kernel-lab/lab_device.cuh"
#include "kernels/attention.cuh"
#include "kernels/check.cuh"
#include "kernels/rope.cuh"

namespace qtts::kernel_lab {

namespace {

using namespace ::qtts::kernels;

constexpr int AO_WARPS = 8;
constexpr int AO_THREADS = AO_WARPS * 32;  // as the product's gemv: one output row per warp
constexpr int AO_KEY_BATCH = 4;            // (KV head, key) pairs a warp scores together

// Shared memory (floats): the attention output = the product's input [n_heads hd]; the new
// row's projections [qkv_dim]; the queries [n_heads hd]; K and V of every KV head [n_kv, ctx, hd]
// each; scores [n_heads, ATTNO_MAX_CTX]; softmax sums [n_heads]; rotation scratch [8, 128].
size_t attno_smem_floats(const AttnOArgs& a, int ctx) {
    const size_t qd = size_t(a.n_heads) * a.head_dim, qkv = qd + 2 * size_t(a.n_kv) * a.head_dim;
    return qd + qkv + qd + 2 * size_t(a.n_kv) * ctx * a.head_dim + size_t(a.n_heads) * ATTNO_MAX_CTX + a.n_heads +
           AO_WARPS * 128;
}

__global__ void __launch_bounds__(AO_THREADS, 1) attno_kernel(const AttnOArgs a) {
    extern __shared__ float4 ao_smem4[];
    const int hd = a.head_dim, group = a.n_heads / a.n_kv, pos = a.pos, ctx = pos + 1;
    const int qd = a.n_heads * hd, qkv_dim = qd + 2 * a.n_kv * hd;
    float* xs = reinterpret_cast<float*>(ao_smem4);
    float* fresh = xs + qd;
    float* q_s = fresh + qkv_dim;
    float* k_s = q_s + qd;                    // row (g, j) at (g * ctx + j) * hd
    float* v_s = k_s + size_t(a.n_kv) * ctx * hd;
    float* s_s = v_s + size_t(a.n_kv) * ctx * hd;
    float* l_s = s_s + a.n_heads * ATTNO_MAX_CTX;
    float* scratch = l_s + a.n_heads;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* my_scratch = scratch + warp * 128;

    // Before the wait: this warp's product row (first chunk into registers, the rest into L2), as
    // the gemv does, and the cached rows 0..pos-1 of every KV head (written by earlier passes).
    constexpr int U = 8, STEP = 32 * U;
    const int row = blockIdx.x * AO_WARPS + warp, in8 = qd >> 3;
    const bool active = row < a.hidden;
    const uint4* w0 = reinterpret_cast<const uint4*>(a.o) + size_t(active ? row : 0) * in8;
    uint4 cur[U];
    if (active) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = u * 32 + lane;
            if (k < in8) cur[u] = __ldg(w0 + k);
        }
        if (lane == 0 && in8 > STEP) prefetch_l2(w0 + STEP, uint32_t(in8 - STEP) * 16u);
    }
    const int vec = hd / 4;
    for (int i = threadIdx.x; i < a.n_kv * pos * vec; i += AO_THREADS) {
        const int g = i / (pos * vec), r = (i / vec) % pos, c = i % vec;
        const size_t src = (size_t(g) * a.max_ctx + r) * hd + c * 4;
        const size_t dst = (size_t(g) * ctx + r) * hd + c * 4;
        __pipeline_memcpy_async(k_s + dst, a.k_cache + src, 16);
        __pipeline_memcpy_async(v_s + dst, a.v_cache + src, 16);
    }
    __pipeline_commit();
    pdl_wait();
    pdl_trigger();

    // The new row's projections in one round of loads.
    for (int i = threadIdx.x; i < qkv_dim / 4; i += AO_THREADS)
        reinterpret_cast<float4*>(fresh)[i] = __ldcg(reinterpret_cast<const float4*>(a.qkv) + i);
    __pipeline_wait_prior(0);
    __syncthreads();

    // Per KV head: the new key (normalised, rotated) and value into the stage (block 0: and into
    // the cache), the group's queries (normalised, rotated).
    const int jobs_per_head = 2 + group;
    for (int job = warp; job < a.n_kv * jobs_per_head; job += AO_WARPS) {
        const int g = job / jobs_per_head, kind = job % jobs_per_head;
        const size_t cache_row = (size_t(g) * a.max_ctx + pos) * hd;
        if (kind == 0) {
            float* k_row = k_s + (size_t(g) * ctx + pos) * hd;
            warp_head_norm_rope(fresh + size_t(a.n_heads + g) * hd, my_scratch, k_row, hd, a.k_norm, a.eps, a.inv_freq,
                                pos);
            if (blockIdx.x == 0)
                for (int d = lane; d < hd; d += 32) a.k_cache[cache_row + d] = k_row[d];
        } else if (kind == 1) {
            for (int d = lane; d < hd; d += 32) {
                const float v = fresh[size_t(a.n_heads + a.n_kv + g) * hd + d];
                v_s[(size_t(g) * ctx + pos) * hd + d] = v;
                if (blockIdx.x == 0) a.v_cache[cache_row + d] = v;
            }
        } else {
            const int h = g * group + kind - 2;
            warp_head_norm_rope(fresh + size_t(h) * hd, my_scratch, q_s + size_t(h) * hd, hd, a.q_norm, a.eps,
                                a.inv_freq, pos);
        }
    }
    __syncthreads();

    // Scores: a warp takes AO_KEY_BATCH (KV head, key) pairs at a time, lanes split the head
    // dimension (every key is visible to the one new query).
    const float scale = 1.0f / sqrtf(float(hd));
    const int pairs = a.n_kv * ctx;
    for (int p0 = warp * AO_KEY_BATCH; p0 < pairs; p0 += AO_WARPS * AO_KEY_BATCH) {
        float kv[AO_KEY_BATCH][4];
#pragma unroll
        for (int b = 0; b < AO_KEY_BATCH; ++b) {
            const float* k_row = k_s + size_t(p0 + b < pairs ? p0 + b : 0) * hd;  // pair (g, j) = row g * ctx + j
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int d = lane + 32 * i;
                kv[b][i] = d < hd ? k_row[d] : 0.0f;
            }
        }
        for (int qi = 0; qi < group; ++qi) {
#pragma unroll
            for (int b = 0; b < AO_KEY_BATCH; ++b) {
                const int pr = p0 + b, g = pr / ctx, j = pr % ctx;
                const int h = (pr < pairs ? g : 0) * group + qi;
                float p = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int d = lane + 32 * i;
                    p = fmaf(d < hd ? q_s[size_t(h) * hd + d] : 0.0f, kv[b][i], p);
                }
                p = warp_sum(p);
                if (lane == 0 && pr < pairs) s_s[h * ATTNO_MAX_CTX + j] = p * scale;
            }
        }
    }
    __syncthreads();

    // Softmax per query head (unnormalised probabilities stay in s_s).
    for (int h = warp; h < a.n_heads; h += AO_WARPS) {
        const float l = warp_softmax_unnormalised(s_s + h * ATTNO_MAX_CTX, ctx);
        if (lane == 0) l_s[h] = l;
    }
    __syncthreads();

    // Probabilities times values: the product's input.
    for (int o = threadIdx.x; o < qd; o += AO_THREADS) {
        const int h = o / hd, d = o % hd, g = h / group;
        const float* p = s_s + h * ATTNO_MAX_CTX;
        const float* v_col = v_s + size_t(g) * ctx * hd + d;
        float acc = 0.0f;
#pragma unroll 4
        for (int j = 0; j < ctx; ++j) acc = fmaf(p[j], v_col[size_t(j) * hd], acc);
        const float l = l_s[h];
        xs[o] = l > 0.0f ? acc / l : 0.0f;
    }
    __syncthreads();
    if (!active) return;

    // The product row, as the gemv computes it: x[row] += W_o[row] · xs.
    float acc = 0.0f;
    for (int base = 0; base < in8; base += STEP) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = base + u * 32 + lane;
            if (k < in8) {
                const float4* xv = reinterpret_cast<const float4*>(xs) + 2 * k;
                acc += dot8(cur[u], xv[0], xv[1]);
            }
        }
        if (base + STEP < in8) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = base + STEP + u * 32 + lane;
                if (k < in8) cur[u] = __ldg(w0 + k);
            }
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) a.x[row] += acc + 0.0f;
}

}  // namespace

bool attno_supported(const AttnOArgs& a) {
    return a.qkv && a.o && a.k_cache && a.v_cache && a.x && a.n_kv >= 1 && a.n_heads % a.n_kv == 0 &&
           a.n_heads / a.n_kv <= ATTN_MAX_GROUP && a.head_dim % 8 == 0 && a.head_dim <= ATTN_MAX_HEAD_DIM &&
           a.pos >= 0 && a.pos < a.max_ctx && a.pos < ATTNO_MAX_CTX && a.hidden >= 1 &&
           smem_fits(attno_smem_floats(a, a.pos + 1) * sizeof(float));
}

void attno_launch(const AttnOArgs& a, const Launch& l) {
    if (!attno_supported(a)) check_fail("attno_launch", "unsupported shapes or arguments", __func__, __FILE__, __LINE__);
    const size_t smem = attno_smem_floats(a, a.pos + 1) * sizeof(float);
    static std::atomic<uint64_t> raised{0};
    smem_limit_raise(attno_kernel, smem, raised);  // before a capture: the eager check runs first
    const dim3 grid((a.hidden + AO_WARPS - 1) / AO_WARPS);
    KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(AO_THREADS), smem, attno_kernel, a));
}

}  // namespace qtts::kernel_lab
