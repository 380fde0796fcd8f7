#include "kernels/rmsnorm.cuh"

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int NORM_THREADS = 256;

// Block-wide sum; every thread gets the total.
__device__ float block_sum(float v, float* shared /* [32] */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // `shared` may still be read from a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) total += shared[w];
    return total;
}

// One block per row. mode 0: fp32 out; mode 1: bf16 hi/lo split.
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(const float* x, int T, int C, int ldx, const float* w, float eps, float* y, int ldy,
                   bf16_t* split) {
    __shared__ float shared[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const float* xr = x + size_t(t) * ldx;
    float inv = 1.0f;
    if (w) {
        float ss = 0.0f;
        for (int c = threadIdx.x; c < C; c += NORM_THREADS) ss += xr[c] * xr[c];
        ss = block_sum(ss, shared);
        inv = 1.0f / sqrtf(ss / float(C) + eps);
    }
    for (int c = threadIdx.x; c < C; c += NORM_THREADS) {
        const float v = w ? (xr[c] * inv) * w[c] : xr[c];
        if (split) {
            bf16_split(v, &split[size_t(t) * C + c], &split[size_t(T + t) * C + c]);
        } else {
            y[size_t(t) * ldy + c] = v;
        }
    }
}

}  // namespace

void rmsnorm(const float* x, int T, int C, int ldx, const float* w, float eps, float* y, int ldy, const Launch& l) {
    if (T <= 0 || C <= 0 || !x || !y || !w)
        check_fail("rmsnorm", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(NORM_THREADS), 0, rmsnorm_kernel, x, T, C, ldx, w, eps, y, ldy,
                             static_cast<bf16_t*>(nullptr)));
}

void rmsnorm_split_bf16(const float* x, int T, int C, int ldx, const float* w, float eps, bf16_t* out,
                        const Launch& l) {
    if (T <= 0 || C <= 0 || !x || !out)
        check_fail("rmsnorm_split_bf16", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(NORM_THREADS), 0, rmsnorm_kernel, x, T, C, ldx, w, eps,
                             static_cast<float*>(nullptr), 0, out));
}

}  // namespace qtts::kernels
