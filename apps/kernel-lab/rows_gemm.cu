// The split path's GEMM for the batched step's shapes (kernel lab; rows_gemm.h says what and why).
#include "apps/kernel-lab/rows_gemm.h"

#include <atomic>

#include <cuda_pipeline.h>

#include "kernels/mma.cuh"

namespace qtts::kernel_lab {

namespace k = qtts::kernels;
using k::bf16_t;

namespace {

constexpr int STEPS = ROWS_GEMM_WARP_K / 32;  // 32-input steps per warp
// Staged xb rows are padded by 32 bf16 (64 bytes): rows g and g + 1 of a fragment read then fall
// in opposite halves of the 128-byte bank window, so a quarter warp's 16-byte reads do not collide.
constexpr int PAD = 32;

size_t staged_bytes(int n, const RowsGemmConfig& c) {
    return size_t(n) * size_t(ROWS_GEMM_WARP_K * c.warps_k + PAD) * sizeof(bf16_t);
}
size_t reduce_bytes(int nt, const RowsGemmConfig& c) {
    return size_t(c.warps_k - 1) * size_t(c.warps_m) * size_t(nt) * 32 * 4 * sizeof(float);
}

// NT: tiles of 8 xb rows (n = 8 NT). Warp (wm, wk) of block (bx, by): features bx·16·warps_m +
// 16 wm .. + 16, inputs by·256·warps_k + 256 wk .. + 256. Within a 32-input step lane (g, t) holds
// inputs 8t .. 8t + 7 of its rows (W rows g and g + 8, xb row g of each tile): any order of the
// inputs gives the products as long as A and B take the same one.
template <int NT>
__global__ void __launch_bounds__(256, 1)
    rows_gemm_kernel(const bf16_t* __restrict__ w, int out, int in, const bf16_t* __restrict__ xb,
                     float* __restrict__ y, int warps_m, int warps_k, int splits, float* __restrict__ partial,
                     uint32_t* __restrict__ counters) {
    extern __shared__ __align__(16) unsigned char smem[];
    constexpr int n = NT * 8;
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int wm = warp % warps_m, wk = warp / warps_m;
    const int g = lane >> 2, t = lane & 3;
    const int features = 16 * warps_m;
    const int f0 = int(blockIdx.x) * features + 16 * wm;
    const int block_k = ROWS_GEMM_WARP_K * warps_k;
    const int k0 = int(blockIdx.y) * block_k;

    // This warp's weights, all of them, before the wait (constant: they stream in while the
    // previous kernel finishes).
    uint4 wa[STEPS], wb[STEPS];
    const bf16_t* pa = w + size_t(f0 + g) * size_t(in) + k0 + ROWS_GEMM_WARP_K * wk + 8 * t;
    const bf16_t* pb = pa + size_t(8) * size_t(in);
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
        wa[s] = k::load_weights(pa + 32 * s);
        wb[s] = k::load_weights(pb + 32 * s);
    }
    k::pdl_wait();  // xb comes from the previous kernel
    k::pdl_trigger();

    // The block's slice of xb [n, block_k] into shared memory, every copy in flight at once.
    const int ld = block_k + PAD;
    bf16_t* xs = reinterpret_cast<bf16_t*>(smem);
    const int pieces = block_k / 8;
    for (int i = int(threadIdx.x); i < n * pieces; i += int(blockDim.x)) {
        const int r = i / pieces, c = i - r * pieces;
        __pipeline_memcpy_async(xs + size_t(r) * ld + 8 * c, xb + size_t(r) * size_t(in) + k0 + 8 * c, 16);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
    for (int s = 0; s < STEPS; ++s) {
        const bf16_t* row = xs + size_t(g) * ld + ROWS_GEMM_WARP_K * wk + 32 * s + 8 * t;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const uint4 b = *reinterpret_cast<const uint4*>(row + size_t(8 * j) * ld);
            k::mma_16816(acc[j], wa[s].x, wb[s].x, wa[s].y, wb[s].y, b.x, b.y);
            k::mma_16816(acc[j], wa[s].z, wb[s].z, wa[s].w, wb[s].w, b.z, b.w);
        }
    }

    // Warps along K add their sums into warp (wm, 0), in warp order, through shared memory.
    if (warps_k > 1) {
        __syncthreads();  // every warp is done with the staged rows
        float* red = reinterpret_cast<float*>(smem);  // [warps_k - 1][warps_m][NT][32][4]
        if (wk > 0) {
            float* mine = red + ((size_t(wk - 1) * warps_m + wm) * NT * 32 + lane) * 4;
#pragma unroll
            for (int j = 0; j < NT; ++j)
                *reinterpret_cast<float4*>(mine + size_t(j) * 32 * 4) = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        }
        __syncthreads();
        if (wk > 0) {
            if (splits == 1) return;
        } else {
            for (int q = 1; q < warps_k; ++q) {
                const float* theirs = red + ((size_t(q - 1) * warps_m + wm) * NT * 32 + lane) * 4;
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const float4 v = *reinterpret_cast<const float4*>(theirs + size_t(j) * 32 * 4);
                    acc[j][0] += v.x;
                    acc[j][1] += v.y;
                    acc[j][2] += v.z;
                    acc[j][3] += v.w;
                }
            }
        }
    }

    // C fragment: acc[j] = (feature g, row 8j + 2t), (g, 8j + 2t + 1), (g + 8, 8j + 2t), (g + 8, 8j + 2t + 1).
    if (wk == 0) {
        float* dst = splits == 1 ? y : partial + size_t(blockIdx.y) * n * size_t(out);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            float* r0 = dst + size_t(8 * j + 2 * t) * out + f0 + g;
            r0[0] = acc[j][0];
            r0[out] = acc[j][1];
            r0[8] = acc[j][2];
            r0[out + 8] = acc[j][3];
        }
    }
    if (splits == 1) return;

    // The last block of this feature block to finish adds the splits' partial sums in split order.
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(&counters[blockIdx.x], 1u) == uint32_t(splits - 1);
        if (last) counters[blockIdx.x] = 0;  // every other block of it has counted
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const int fb = int(blockIdx.x) * features;
    for (int e = int(threadIdx.x); e < n * features; e += int(blockDim.x)) {
        const int r = e / features, f = fb + (e - r * features);
        const float* p = partial + size_t(r) * out + f;
        float sum = 0.0f;
        for (int sp = 0; sp < splits; ++sp) sum += __ldcg(p + size_t(sp) * n * out);
        y[size_t(r) * out + f] = sum;
    }
}

template <int NT>
void launch(const bf16_t* w, int out, int in, const bf16_t* xb, float* y, const RowsGemmConfig& c, float* partial,
            uint32_t* counters, const k::Launch& l) {
    static std::atomic<uint64_t> raised{0};
    const size_t smem = std::max(staged_bytes(NT * 8, c), reduce_bytes(NT, c));
    k::smem_limit_raise(rows_gemm_kernel<NT>, smem, raised);
    const int splits = rows_gemm_splits(in, c);
    const dim3 grid(unsigned(out / (16 * c.warps_m)), unsigned(splits));
    KERNEL_CUDA_CHECK(k::launch_kernel(l, grid, dim3(unsigned(32 * c.warps_m * c.warps_k)), smem, rows_gemm_kernel<NT>,
                                       w, out, in, xb, y, c.warps_m, c.warps_k, splits, partial, counters));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

int rows_gemm_splits(int in, const RowsGemmConfig& c) { return in / (ROWS_GEMM_WARP_K * c.warps_k); }

bool rows_gemm_supported(int out, int in, int n, const RowsGemmConfig& c) {
    if (c.warps_m < 1 || c.warps_k < 1 || c.warps_m * c.warps_k > 8) return false;
    if (n != 48 && n != 64 && n != 96 && n != 128) return false;
    if (out <= 0 || out % (16 * c.warps_m) != 0 || in <= 0 || in % (ROWS_GEMM_WARP_K * c.warps_k) != 0) return false;
    return k::smem_fits(std::max(staged_bytes(n, c), reduce_bytes(n / 8, c)));
}

size_t rows_gemm_partial_floats(int out, int in, int n, const RowsGemmConfig& c) {
    const int splits = rows_gemm_splits(in, c);
    return splits > 1 ? size_t(splits) * size_t(n) * size_t(out) : 0;
}

size_t rows_gemm_counter_count(int out, const RowsGemmConfig& c) { return size_t(out / (16 * c.warps_m)); }

void rows_gemm(const bf16_t* w, int out, int in, const bf16_t* xb, int n, float* y, const RowsGemmConfig& c,
               float* partial, uint32_t* counters, const k::Launch& l) {
    if (!rows_gemm_supported(out, in, n, c) || !w || !xb || !y || !aligned16(w) || !aligned16(xb) ||
        (rows_gemm_splits(in, c) > 1 && (!partial || !counters)))
        k::check_fail("rows_gemm", "unsupported arguments (rows_gemm.h: requirements)", __func__, __FILE__, __LINE__);
    switch (n / 8) {
        case 6: return launch<6>(w, out, in, xb, y, c, partial, counters, l);
        case 8: return launch<8>(w, out, in, xb, y, c, partial, counters, l);
        case 12: return launch<12>(w, out, in, xb, y, c, partial, counters, l);
        default: return launch<16>(w, out, in, xb, y, c, partial, counters, l);
    }
}

}  // namespace qtts::kernel_lab
