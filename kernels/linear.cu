#include "kernels/linear.cuh"

#include <algorithm>

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

// Row t = blockIdx.y. y null: no fp32 output; split null: no bf16 pair (rows t and T + t, width n).
__global__ void split_combine_kernel(const float* y2, int ld_y2, int T, int n, const float* bias,
                                     LinearEpilogue epilogue, float* y, int ldy, bf16_t* split) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.y;
    const float* hi = y2 + size_t(t) * ld_y2;
    const float* lo = y2 + size_t(T + t) * ld_y2;
    float* out = y ? y + size_t(t) * ldy : nullptr;
    const bool add = epilogue == LinearEpilogue::LINEAR_EPILOGUE_ADD;  // needs y
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float value = split_combine_value(epilogue, hi, lo, n, i, bias, add ? out[i] : 0.0f);
        if (out) out[i] = value;
        if (split) bf16_split(value, &split[size_t(t) * n + i], &split[size_t(T + t) * n + i]);
    }
}

void combine_launch(const float* y2, int ld_y2, int T, int n, const float* bias, LinearEpilogue epilogue, float* y,
                    int ldy, bf16_t* split, const Launch& l) {
    const int blocks = std::min((n + 255) / 256, 64);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(blocks, T), dim3(256), 0, split_combine_kernel, y2, ld_y2, T, n, bias,
                                    epilogue, y, ldy, split));
}

}  // namespace

void linear_split_combine(const float* y2, int ld_y2, int T, int n, const float* bias, LinearEpilogue epilogue,
                          float* y, int ldy, const Launch& l) {
    if (T <= 0 || n <= 0 || !y2 || !y)
        check_fail("linear_split_combine", "invalid arguments", __func__, __FILE__, __LINE__);
    combine_launch(y2, ld_y2, T, n, bias, epilogue, y, ldy, nullptr, l);
}

void linear_split_combine_split_bf16(const float* y2, int ld_y2, int T, int n, const float* bias,
                                     LinearEpilogue epilogue, float* y, int ldy, bf16_t* out, const Launch& l) {
    if (T <= 0 || n <= 0 || !y2 || !out || epilogue == LinearEpilogue::LINEAR_EPILOGUE_ADD)
        check_fail("linear_split_combine_split_bf16", "invalid arguments (an output split; no residual add)", __func__,
                   __FILE__, __LINE__);
    combine_launch(y2, ld_y2, T, n, bias, epilogue, y, ldy, out, l);
}

}  // namespace qtts::kernels
