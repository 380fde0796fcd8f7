#include "kernels/rope.cuh"

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int ROPE_WARPS = 4;

// grid: (T, ceil(n_heads / ROPE_WARPS)); one warp per head.
__global__ void __launch_bounds__(ROPE_WARPS * 32)
    head_norm_rope_kernel(float* x, int n_heads, int head_dim, const float* norm_w, float eps,
                          const float* inv_freq, const int32_t* pos_dev, int pos_host) {
    __shared__ float scratch[ROPE_WARPS][128];
    pdl_wait();
    pdl_trigger();
    const int warp = threadIdx.x >> 5;
    const int t = blockIdx.x, h = blockIdx.y * ROPE_WARPS + warp;
    if (h >= n_heads) return;
    const int pos = position_read(pos_dev, pos_host) + t;
    float* row = x + (size_t(t) * n_heads + h) * head_dim;
    warp_head_norm_rope(row, scratch[warp], row, head_dim, norm_w, eps, inv_freq, pos);
}

}  // namespace

void head_norm_rope(float* x, int T, int n_heads, int head_dim, const float* norm_w, float eps,
                    const float* inv_freq, const int32_t* pos_dev, int pos_host, const Launch& l) {
    if (T <= 0 || n_heads <= 0 || head_dim <= 0 || head_dim > 128 || head_dim % 2 != 0)
        check_fail("head_norm_rope", "invalid arguments (head_dim even and <= 128)", __func__, __FILE__,
                         __LINE__);
    const dim3 grid(T, (n_heads + ROPE_WARPS - 1) / ROPE_WARPS);
    KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(ROPE_WARPS * 32), 0, head_norm_rope_kernel, x, n_heads, head_dim, norm_w,
                             eps, inv_freq, pos_dev, pos_host));
}

}  // namespace qtts::kernels
