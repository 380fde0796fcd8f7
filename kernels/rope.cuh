// Per-head RMSNorm followed by the rotary embedding (rotate-half pairs (i, i + d/2)), the way
// Qwen3 prepares queries and keys. Device helpers used by attention.cu, plus a standalone
// launcher used by tests and by anything that needs normed+rotated heads in a plain buffer.
#pragma once

#include "kernels/common.cuh"
#include "kernels/linear.cuh"

namespace qtts::kernels {

// x [T, n_heads * head_dim] in place: optional RMSNorm per head with `norm_w` [head_dim], then
// rotation at positions pos0 + t (pos0 from pos_dev when given). head_dim <= 128, even.
void head_norm_rope(float* x, int T, int n_heads, int head_dim, const float* norm_w, float eps,
                    const float* inv_freq, const int32_t* pos_dev, int pos_host, const Launch& launch);

}  // namespace qtts::kernels

#ifdef __CUDACC__
namespace qtts::kernels {

// Element d of a projection row: src[d], or, with src_lo, the sum of a split GEMM's two halves as
// linear_split_combine's store gives it.
__device__ __forceinline__ float projection_value(const float* src, const float* src_lo, int d) {
    if (src_lo) return split_combine_value(LinearEpilogue::LINEAR_EPILOGUE_STORE, src, src_lo, 0, d, nullptr, 0.0f);
    return src[d];
}

// One warp normalises and rotates one head vector. src: global or shared [head_dim];
// scratch: this warp's shared [head_dim]; dst may be global or shared (may equal scratch).
// src_lo (optional): src and src_lo are a split GEMM's two halves and the vector is their sum
// (projection_value). Lane l owns dims l, l+32, l+64, l+96.
__device__ __forceinline__ void warp_head_norm_rope(const float* src, float* scratch, float* dst, int head_dim,
                                                    const float* norm_w, float eps, const float* inv_freq, int pos,
                                                    const float* src_lo = nullptr) {
    const int lane = threadIdx.x & 31;
    const int half = head_dim / 2;
    // The vector, its norm weights and its rotary frequencies are loaded in one round: the later
    // uses sit behind shared-memory stores the compiler will not move these loads past.
    float v[4], w[4], freq[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int d = lane + 32 * i;
        v[i] = d < head_dim ? projection_value(src, src_lo, d) : 0.0f;
        w[i] = (norm_w && d < head_dim) ? norm_w[d] : 1.0f;
        freq[i] = (inv_freq && d < head_dim) ? inv_freq[d < half ? d : d - half] : 0.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) ss += v[i] * v[i];
    if (norm_w) {
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / float(head_dim) + eps);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = lane + 32 * i;
            if (d < head_dim) v[i] = (v[i] * inv) * w[i];
        }
    }
    if (inv_freq) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = lane + 32 * i;
            if (d < head_dim) scratch[d] = v[i];
        }
        __syncwarp();
        const float p = float(pos);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = lane + 32 * i;
            if (d >= head_dim) continue;
            float s, c;
            sincosf(p * freq[i], &s, &c);
            if (d < half) {
                const float b = scratch[d + half];
                v[i] = v[i] * c - b * s;
            } else {
                const float a = scratch[d - half];
                v[i] = v[i] * c + a * s;
            }
        }
        __syncwarp();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int d = lane + 32 * i;
        if (d < head_dim) dst[d] = v[i];
    }
    __syncwarp();
}

}  // namespace qtts::kernels
#endif
