#include "kernels/swiglu.cuh"

#include <algorithm>

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

__global__ void swiglu_kernel(const float* gate, int ld_gate, const float* up, int ld_up, int n, float* out,
                              int ld_out) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.y;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[size_t(t) * ld_out + i] = silu_ref(gate[size_t(t) * ld_gate + i]) * up[size_t(t) * ld_up + i];
}

}  // namespace

void swiglu(const float* gate, int ld_gate, const float* up, int ld_up, int T, int n, float* out, int ld_out,
            const Launch& l) {
    if (T <= 0 || n <= 0 || !gate || !up || !out)
        check_fail("swiglu", "invalid arguments", __func__, __FILE__, __LINE__);
    const int blocks = std::min((n + 255) / 256, 64);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(blocks, T), dim3(256), 0, swiglu_kernel, gate, ld_gate, up, ld_up, n, out,
                             ld_out));
}

}  // namespace qtts::kernels
