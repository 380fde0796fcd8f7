// Device pieces the kernel lab's attention experiments share (persistent_pass.cu, attention_o.cu).
// They repeat kernels/attention.cu's arithmetic in its order, so that the lab's results can be
// compared bitwise with the product's launches. Include from .cu files only.
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

}  // namespace qtts::kernel_lab

#endif  // __CUDACC__
