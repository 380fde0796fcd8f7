// Device pieces the kernel lab's experiments share (persistent_pass.cu, attention_o.cu,
// gemv_variants.cu). They repeat the product kernels' arithmetic in its order (kernels/attention.cu,
// kernels/gemv_device.cuh), so that the lab's results can be compared bitwise with the product's
// launches. Include from .cu files only.
#pragma once

#ifdef __CUDACC__

#include "kernels/common.cuh"

namespace qtts::kernel_lab {

// One query's softmax over the n scores at sq (shared memory; -inf = masked), by one warp, as
// attention_finish computes it: sq[j] becomes exp(sq[j] - max) (0 where masked), unnormalised;
// returns their sum (every lane).
__device__ __forceinline__ float warp_softmax_unnormalised(float* sq, int n) {
    const int lane = threadIdx.x & 31;
    float m = -INFINITY;
    for (int j = lane; j < n; j += 32) m = fmaxf(m, sq[j]);
    m = kernels::warp_max(m);
    float l = 0.0f;
    for (int j = lane; j < n; j += 32) {
        const float e = sq[j] == -INFINITY ? 0.0f : expf(sq[j] - m);
        sq[j] = e;
        l += e;
    }
    return kernels::warp_sum(l);
}

// The block's copy of one input row x [in] (times norm_w when given) in xs; returns the RMSNorm
// factor (1 without a norm). The sums as gemv_vec_kernel makes them for one row with the block's
// threads: thread t takes float4 t, t + blockDim.x, ...; warp sums into partial [warps], then the
// warps' in order. The row is read with __ldcg (another block of a persistent launch may have
// written it). Ends with a block barrier.
__device__ __forceinline__ float stage_input_row(const float* x, const float* norm_w, int in, float eps, float* xs,
                                                 float* partial) {
    const bool norm = norm_w != nullptr;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = int(blockDim.x >> 5);
    const float4* src = reinterpret_cast<const float4*>(x);
    const float4* nw = reinterpret_cast<const float4*>(norm_w);
    float4* dst = reinterpret_cast<float4*>(xs);
    float sumsq = 0.0f;
    for (int i = threadIdx.x; i < in / 4; i += int(blockDim.x)) {
        float4 v = __ldcg(src + i);
        if (norm) {
            sumsq += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            const float4 n = nw[i];
            v = make_float4(v.x * n.x, v.y * n.y, v.z * n.z, v.w * n.w);
        }
        dst[i] = v;
    }
    if (norm) {
        const float total_w = kernels::warp_sum(sumsq);
        if (lane == 0) partial[warp] = total_w;
    }
    __syncthreads();
    if (!norm) return 1.0f;
    float total = 0.0f;
    for (int w = 0; w < warps; ++w) total += partial[w];
    return 1.0f / sqrtf(total / float(in) + eps);
}

// One chunk of a warp's weight row(s) into registers as the product's gemv loads it: lane l
// takes 16-byte columns base + 32 u + l (u < U) of row w0 (and w1 for SwiGLU's second matrix).
template <int NMAT, int U>
__device__ __forceinline__ void weight_chunk_load(const uint4* w0, const uint4* w1, int base, int in8,
                                                  uint4 (&cur)[NMAT][U]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int k = base + u * 32 + lane;
        if (k < in8) {
            cur[0][u] = __ldg(w0 + k);
            if (NMAT == 2) cur[NMAT - 1][u] = __ldg(w1 + k);
        }
    }
}

// Asks L2 for the 128-byte line at ptr: a hint that no copy unit carries and nothing waits for
// (unlike kernels::prefetch_l2, a bulk prefetch by the SM's copy unit).
__device__ __forceinline__ void prefetch_line_l2(const void* ptr) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.global.L2 [%0];" ::"l"(ptr));
#else
    (void)ptr;
#endif
}

// mbarriers in shared memory (sm_90; trap elsewhere), for the lab's copy rings.
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t smem_address(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_address(bar)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    (void)bar, (void)count;
    __trap();
#endif
}

// Until the barrier's phase of this parity has completed: try_wait (the thread may be suspended
// until then, or until a time limit), or with `spin` test_wait in a loop (never suspended).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity, bool spin) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uint32_t at = smem_address(bar);
    uint32_t done = 0;
    do {
        if (spin)
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                : "=r"(done)
                : "r"(at), "r"(parity)
                : "memory");
        else
            asm volatile(
                "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                : "=r"(done)
                : "r"(at), "r"(parity)
                : "memory");
    } while (!done);
#else
    (void)bar, (void)parity, (void)spin;
    __trap();
#endif
}

}  // namespace qtts::kernel_lab

#endif  // __CUDACC__
