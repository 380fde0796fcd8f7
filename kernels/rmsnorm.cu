#include "kernels/rmsnorm.cuh"

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int NORM_THREADS = 256;

// 1 / rms of row xr [C] (thread t sums columns t, t + NORM_THREADS, ...; then block_sum): the one
// reduction order of every kernel here, so the fused combine below gives rmsnorm's bits.
__device__ __forceinline__ float row_inv_rms(const float* xr, int C, float eps, float* shared) {
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += NORM_THREADS) ss += xr[c] * xr[c];
    ss = block_sum(ss, shared);
    return 1.0f / sqrtf(ss / float(C) + eps);
}

// Row t of the output: (xr[c] * inv) * w[c] (w null: xr[c]), as fp32 into y or as a bf16 hi/lo pair
// into split rows t and T + t.
__device__ __forceinline__ void row_write(const float* xr, int T, int t, int C, const float* w, float inv, float* y,
                                          int ldy, bf16_t* split) {
    for (int c = threadIdx.x; c < C; c += NORM_THREADS) {
        const float v = w ? (xr[c] * inv) * w[c] : xr[c];
        if (split) {
            bf16_split(v, &split[size_t(t) * C + c], &split[size_t(T + t) * C + c]);
        } else {
            y[size_t(t) * ldy + c] = v;
        }
    }
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
    const float inv = w ? row_inv_rms(xr, C, eps, shared) : 1.0f;
    row_write(xr, T, t, C, w, inv, y, ldy, split);
}

// One block per row: the row's combine (each thread its columns, written to y), then the same
// threads read their columns back for the norm and the split.
__global__ void __launch_bounds__(NORM_THREADS)
    combine_rmsnorm_split_kernel(const float* y2, int ld_y2, int T, int n, LinearEpilogue epilogue, float* y, int ldy,
                                 const float* w, float eps, bf16_t* split) {
    __shared__ float shared[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const float* hi = y2 + size_t(t) * ld_y2;
    const float* lo = y2 + size_t(T + t) * ld_y2;
    float* yr = y + size_t(t) * ldy;
    const bool add = epilogue == LinearEpilogue::LINEAR_EPILOGUE_ADD;
    for (int c = threadIdx.x; c < n; c += NORM_THREADS)
        yr[c] = split_combine_value(epilogue, hi, lo, n, c, nullptr, add ? yr[c] : 0.0f);
    const float inv = w ? row_inv_rms(yr, n, eps, shared) : 1.0f;
    row_write(yr, T, t, n, w, inv, nullptr, 0, split);
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

void combine_rmsnorm_split_bf16(const float* y2, int ld_y2, int T, int n, LinearEpilogue epilogue, float* y, int ldy,
                                const float* w, float eps, bf16_t* out, const Launch& l) {
    const bool rule = epilogue == LinearEpilogue::LINEAR_EPILOGUE_STORE ||
                      epilogue == LinearEpilogue::LINEAR_EPILOGUE_ADD ||
                      epilogue == LinearEpilogue::LINEAR_EPILOGUE_SWIGLU;
    if (T <= 0 || n <= 0 || !y2 || !y || !out || !rule || ld_y2 < (epilogue == LinearEpilogue::LINEAR_EPILOGUE_SWIGLU ? 2 * n : n) ||
        ldy < n)
        check_fail("combine_rmsnorm_split_bf16", "invalid arguments (STORE, ADD or SWIGLU; y2 rows hold the output)",
                   __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(NORM_THREADS), 0, combine_rmsnorm_split_kernel, y2, ld_y2, T, n,
                                    epilogue, y, ldy, w, eps, out));
}

}  // namespace qtts::kernels
