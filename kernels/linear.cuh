// Epilogues of the prefill products. A prefill linear layer runs as one cuBLAS bf16 GEMM over
// the split input [x_hi; x_lo] (kernels/rmsnorm.cuh), so the fp32 activations keep ~16 bits of
// mantissa while the weights stay bf16: y2 = [W x_hi; W x_lo] in fp32, and the epilogue adds
// the halves, the bias, and applies the layer's output rule.
#pragma once

#include "kernels/common.cuh"

namespace qtts::kernels {

enum class LinearEpilogue {
    LINEAR_EPILOGUE_STORE,      // y = a + b (+ bias)
    LINEAR_EPILOGUE_ADD,        // y += a + b (+ bias)                      (residual)
    LINEAR_EPILOGUE_SWIGLU,     // y[:, i] = silu(h[:, i]) * h[:, n + i]    (h = a + b, 2n columns)
    LINEAR_EPILOGUE_SILU_BIAS,  // y = silu(a + b + bias)                   (text projection fc1)
};

#ifdef __CUDACC__
// Output column i of a row under `epilogue`: hi / lo are the row's two halves in y2, old the
// output's current value (ADD). One expression for every kernel that combines (so a fused
// combine gives the same bits as linear_split_combine).
__device__ __forceinline__ float split_combine_value(LinearEpilogue epilogue, const float* hi, const float* lo, int n,
                                                     int i, const float* bias, float old) {
    switch (epilogue) {
        case LinearEpilogue::LINEAR_EPILOGUE_STORE: return hi[i] + lo[i] + (bias ? bias[i] : 0.0f);
        case LinearEpilogue::LINEAR_EPILOGUE_ADD: return old + (hi[i] + lo[i] + (bias ? bias[i] : 0.0f));
        case LinearEpilogue::LINEAR_EPILOGUE_SWIGLU: return silu_ref(hi[i] + lo[i]) * (hi[n + i] + lo[n + i]);
        case LinearEpilogue::LINEAR_EPILOGUE_SILU_BIAS: return silu_ref(hi[i] + lo[i] + (bias ? bias[i] : 0.0f));
    }
    return 0.0f;
}
#endif

// y2: [2T, ld_y2] fp32 from the GEMM (rows [0,T) = W x_hi, [T,2T) = W x_lo); n output columns.
void linear_split_combine(const float* y2, int ld_y2, int T, int n, const float* bias, LinearEpilogue epilogue,
                          float* y, int ldy, const Launch& launch);

// The same combine with its rows also written as the bf16 hi/lo pair the next split product
// reads: out [2T, n] gets what rmsnorm_split_bf16(y, T, n, ldy, nullptr) would write from them,
// bit for bit, in the same element-wise launch (the SwiGLU combine before the down product).
// y may be null (only the split is needed). Not for LINEAR_EPILOGUE_ADD, whose fused form is
// combine_add_rmsnorm_split_bf16 (kernels/rmsnorm.cuh).
void linear_split_combine_split_bf16(const float* y2, int ld_y2, int T, int n, const float* bias,
                                     LinearEpilogue epilogue, float* y, int ldy, bf16_t* out, const Launch& launch);

}  // namespace qtts::kernels
