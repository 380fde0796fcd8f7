// Tensor-core helpers of the products that run x rows against bf16 weights with mma.sync
// (kernels/skinny.cu, and the kernel lab's variants): the m16n8k16 product, the split of fp32
// activations into bf16 hi + lo pairs (so a product keeps ~16 bits of their mantissa against
// bf16 weights), and weight loads that bypass L1. Device code only.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "kernels/common.cuh"

namespace qtts::kernels {

// D += A · B for one m16n8k16 tile (bf16 in, fp32 accumulate; sm_80+).
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two fp32 values as bf16 pairs hi (round to nearest) and lo (the rest, rounded): v ~ hi + lo.
// The first value goes to the low half (the lower input index of an mma fragment register).
__device__ __forceinline__ void split_pair(float v0, float v1, uint32_t& hi, uint32_t& lo) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(v0, v1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(v0 - hf.x, v1 - hf.y);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
}

// Weights are read once: keep them out of L1, which holds the x rows every warp re-reads. p 16-byte
// aligned.
__device__ __forceinline__ uint4 load_weights(const bf16_t* p) {
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

}  // namespace qtts::kernels
