#include "kernels/rmsnorm.cuh"

#include <type_traits>

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int NORM_THREADS = 256;

// A row's values in registers: thread t holds columns t, t + NORM_THREADS, ... (PER of them; a
// row is at most PER * NORM_THREADS wide), so every load of the row is in flight at once, not one
// per dependent loop step (a 2048-wide row took 8 round trips). Columns past C hold 0.
template <int PER>
struct RowValues {
    float v[PER];

    // 1 / rms (thread t sums its columns in order, then block_sum): the one reduction order of
    // every kernel here, so the fused combine gives rmsnorm's bits.
    __device__ __forceinline__ float inv_rms(int C, float eps, float* shared) const {
        float ss = 0.0f;
#pragma unroll
        for (int k = 0; k < PER; ++k)
            if (int(threadIdx.x) + k * NORM_THREADS < C) ss += v[k] * v[k];
        ss = block_sum(ss, shared);
        return 1.0f / sqrtf(ss / float(C) + eps);
    }

    // Row t of the output: (v * inv) * w[c] (w null: v), as fp32 into y or as a bf16 hi/lo pair
    // into split rows t and T + t.
    __device__ __forceinline__ void write(int T, int t, int C, const float* __restrict__ w, float inv,
                                          float* __restrict__ y, int ldy, bf16_t* __restrict__ split) const {
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int c = int(threadIdx.x) + k * NORM_THREADS;
            if (c >= C) break;
            const float value = w ? (v[k] * inv) * w[c] : v[k];
            if (split) {
                bf16_split(value, &split[size_t(t) * C + c], &split[size_t(T + t) * C + c]);
            } else {
                y[size_t(t) * ldy + c] = value;
            }
        }
    }
};

// One block per row. split null: fp32 out (y may alias x); else the bf16 hi/lo split.
template <int PER>
__global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm_kernel(const float* x, int T, int C, int ldx, const float* w, float eps, float* y, int ldy,
                   bf16_t* split) {
    __shared__ float shared[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const float* xr = x + size_t(t) * ldx;
    RowValues<PER> row;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int c = int(threadIdx.x) + k * NORM_THREADS;
        const float value = xr[min(c, C - 1)];  // in bounds without a branch: every load issued at once
        row.v[k] = c < C ? value : 0.0f;
    }
    const float inv = w ? row.inv_rms(C, eps, shared) : 1.0f;
    row.write(T, t, C, w, inv, y, ldy, split);
}

// One block per row: the residual combine of a split product (y += hi + lo, its values loaded
// together, then written to y), then the norm and the split of those values.
template <int PER>
__global__ void __launch_bounds__(NORM_THREADS)
    combine_add_rmsnorm_split_kernel(const float* __restrict__ y2, int ld_y2, int T, int n, float* __restrict__ y,
                                     int ldy, const float* __restrict__ w, float eps, bf16_t* __restrict__ split) {
    __shared__ float shared[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const float* hi = y2 + size_t(t) * ld_y2;
    const float* lo = y2 + size_t(T + t) * ld_y2;
    float* yr = y + size_t(t) * ldy;
    RowValues<PER> row;
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int c = int(threadIdx.x) + k * NORM_THREADS, cc = min(c, n - 1);  // no branch: loads issued together
        const float value = split_combine_value(LinearEpilogue::LINEAR_EPILOGUE_ADD, hi, lo, n, cc, nullptr, yr[cc]);
        row.v[k] = c < n ? value : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        const int c = int(threadIdx.x) + k * NORM_THREADS;
        if (c < n) yr[c] = row.v[k];
    }
    const float inv = w ? row.inv_rms(n, eps, shared) : 1.0f;
    row.write(T, t, n, w, inv, nullptr, 0, split);
}

// Register slots per thread for a row of C columns: the smallest instantiation that holds it.
constexpr int NORM_MAX_COLUMNS = 32 * NORM_THREADS;
int per_thread(int C) {
    const int need = (C + NORM_THREADS - 1) / NORM_THREADS;
    for (const int per : {4, 8, 12, 16, 24, 32})
        if (need <= per) return per;
    return 0;
}

template <typename Launcher>
void launch_per(int C, Launcher&& launch) {
    switch (per_thread(C)) {
        case 4: launch(std::integral_constant<int, 4>{}); break;
        case 8: launch(std::integral_constant<int, 8>{}); break;
        case 12: launch(std::integral_constant<int, 12>{}); break;
        case 16: launch(std::integral_constant<int, 16>{}); break;
        case 24: launch(std::integral_constant<int, 24>{}); break;
        default: launch(std::integral_constant<int, 32>{}); break;
    }
}

}  // namespace

void rmsnorm(const float* x, int T, int C, int ldx, const float* w, float eps, float* y, int ldy, const Launch& l) {
    if (T <= 0 || C <= 0 || C > NORM_MAX_COLUMNS || !x || !y || !w)
        check_fail("rmsnorm", "invalid arguments (rows of 1..8192 columns)", __func__, __FILE__, __LINE__);
    launch_per(C, [&](auto per) {
        KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(NORM_THREADS), 0, rmsnorm_kernel<decltype(per)::value>, x, T, C,
                                        ldx, w, eps, y, ldy, static_cast<bf16_t*>(nullptr)));
    });
}

void rmsnorm_split_bf16(const float* x, int T, int C, int ldx, const float* w, float eps, bf16_t* out,
                        const Launch& l) {
    if (T <= 0 || C <= 0 || C > NORM_MAX_COLUMNS || !x || !out)
        check_fail("rmsnorm_split_bf16", "invalid arguments (rows of 1..8192 columns)", __func__, __FILE__, __LINE__);
    launch_per(C, [&](auto per) {
        KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(NORM_THREADS), 0, rmsnorm_kernel<decltype(per)::value>, x, T, C,
                                        ldx, w, eps, static_cast<float*>(nullptr), 0, out));
    });
}

void combine_add_rmsnorm_split_bf16(const float* y2, int ld_y2, int T, int n, float* y, int ldy, const float* w,
                                    float eps, bf16_t* out, const Launch& l) {
    if (T <= 0 || n <= 0 || n > NORM_MAX_COLUMNS || !y2 || !y || !out || ld_y2 < n || ldy < n)
        check_fail("combine_add_rmsnorm_split_bf16", "invalid arguments (rows of 1..8192 columns; y2 rows hold the output)",
                   __func__, __FILE__, __LINE__);
    launch_per(n, [&](auto per) {
        KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(NORM_THREADS), 0,
                                        combine_add_rmsnorm_split_kernel<decltype(per)::value>, y2, ld_y2, T, n, y, ldy,
                                        w, eps, out));
    });
}

}  // namespace qtts::kernels
