// Row-wise RMSNorm (fp32): y = x / sqrt(mean(x^2) + eps) * w, and the prefill variant that
// writes the normalised rows as a bf16 hi/lo pair for the split-bf16 cuBLAS products
// (kernels/linear.cuh): rows [0, T) = bf16(y), rows [T, 2T) = bf16(y - bf16(y)).
#pragma once

#include "kernels/common.cuh"

namespace qtts::kernels {

// x [T, ldx] -> y [T, ldy]; y may alias x.
void rmsnorm(const float* x, int T, int C, int ldx, const float* w, float eps, float* y, int ldy,
             const Launch& launch);

// x [T, ldx] -> out bf16 [2T, C]. w == nullptr: no normalisation (a plain split).
void rmsnorm_split_bf16(const float* x, int T, int C, int ldx, const float* w, float eps, bf16_t* out,
                        const Launch& launch);

}  // namespace qtts::kernels
