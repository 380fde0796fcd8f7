// SwiGLU activation: out = silu(gate) * up, fp32, elementwise (silu(x) = x / (1 + e^-x)).
#pragma once

#include "kernels/common.cuh"

namespace qtts::kernels {

// gate/up/out: [T, n] with row strides; out may alias gate.
void swiglu(const float* gate, int ld_gate, const float* up, int ld_up, int T, int n, float* out, int ld_out,
            const Launch& launch);

}  // namespace qtts::kernels
