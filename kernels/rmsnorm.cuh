// Row-wise RMSNorm (fp32): y = x / sqrt(mean(x^2) + eps) * w, and the prefill variant that
// writes the normalised rows as a bf16 hi/lo pair for the split-bf16 cuBLAS products
// (kernels/linear.cuh): rows [0, T) = bf16(y), rows [T, 2T) = bf16(y - bf16(y)).
#pragma once

#include "kernels/common.cuh"
#include "kernels/linear.cuh"

namespace qtts::kernels {

// x [T, ldx] -> y [T, ldy]; y may alias x.
void rmsnorm(const float* x, int T, int C, int ldx, const float* w, float eps, float* y, int ldy,
             const Launch& launch);

// x [T, ldx] -> out bf16 [2T, C]. w == nullptr: no normalisation (a plain split).
void rmsnorm_split_bf16(const float* x, int T, int C, int ldx, const float* w, float eps, bf16_t* out,
                        const Launch& launch);

// A split product's residual combine fused with the split of its output for the next product,
// in one launch: y [T, ldy] += the halves of y2 (what linear_split_combine writes under
// LINEAR_EPILOGUE_ADD, no bias), and out [2T, n] gets what rmsnorm_split_bf16(y, w, eps) then
// writes, bit for bit (w null: a plain split). y2 [2T, ld_y2] as linear_split_combine reads it.
// (The SwiGLU combine has no norm after it, so its split is element-wise: kernels/linear.cuh's
// linear_split_combine_split_bf16. One block per row of 3072-6144 outputs, as here, took 7-11 us
// against ~5 for two launches; docs/performance.md.)
void combine_add_rmsnorm_split_bf16(const float* y2, int ld_y2, int T, int n, float* y, int ldy, const float* w,
                                    float eps, bf16_t* out, const Launch& launch);

}  // namespace qtts::kernels
