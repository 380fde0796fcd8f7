// The gemv variants kept for measurement, beside the shipped kernel (kernels/gemv.cu, "vec1"):
//   vec  the shipped kernel with double-buffered weight chunks (80 registers; 1.6% slower per
//        1.7B frame on the H200, docs/performance.md 2026-11-29);
//   smem the default before vec1: the block stages (and normalises) the input rows in shared
//        memory first, then each warp streams its weight row (10% slower);
//   rows2 vec1 with two output rows a warp, for one input row: half the blocks (a 1.7B q/k/v
//        product in 256 blocks of at most 85 registers a thread, about two an SM, where vec1's
//        512 fill every SM's registers), each row's arithmetic in vec1's order (the same bits).
//   turns vec1 in at most two blocks an SM, each warp taking its rows in turn: half the
//        register file is left to the next launch's blocks, so they can load their rows before
//        their wait as the predictor's products do (the talker's q/k/v and gate/up products
//        fill every SM otherwise); the same bits. Slower in the chains, alone 2-6% slower but
//        on o (H100, docs/performance.md "Forty-second session").
#include "apps/kernel-lab/gemv_variants.h"

#include <algorithm>
#include <atomic>

#include "apps/kernel-lab/lab_device.cuh"
#include "kernels/check.cuh"
#include "kernels/gemv_device.cuh"

namespace qtts::kernel_lab {

namespace {

using namespace ::qtts::kernels;

// "smem": the block stages (and normalises) the input rows in
// shared memory, then each warp streams its weight row (weights prefetched into L2 before
// griddepcontrol.wait).
template <int NB, int NMAT>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_smem_kernel(const GemvArgs a) {
    extern __shared__ float4 gemv_smem_buf[];
    float* xs = reinterpret_cast<float*>(gemv_smem_buf);  // [NB, in]
    __shared__ float partial[GEMV_WARPS][NB];

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + warp;
    const int in = a.in, in8 = a.in >> 3;
    const uint4* w0 = reinterpret_cast<const uint4*>(a.w) + size_t(row) * in8;
    const uint4* w1 = NMAT == 2 ? reinterpret_cast<const uint4*>(a.w2) + size_t(row) * in8 : nullptr;
    // The weights do not depend on the previous kernel: start pulling them into L2 now.
    if (lane == 0 && row < a.out) {
        prefetch_l2(w0, uint32_t(in) * 2u);
        if (NMAT == 2) prefetch_l2(w1, uint32_t(in) * 2u);
    }
    pdl_wait();
    pdl_trigger();

    // Stage the input rows in shared memory (normalised or gathered as requested).
    const int rows = a.rows;
    float sumsq[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) sumsq[nb] = 0.0f;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        float4* dst = reinterpret_cast<float4*>(xs + size_t(nb) * in);
        if (nb >= rows) {
            for (int i = threadIdx.x; i < in / 4; i += GEMV_THREADS) dst[i] = make_float4(0.f, 0.f, 0.f, 0.f);
            continue;
        }
        if (a.input == GemvInput::GEMV_INPUT_GATHER) {
            const int32_t id = a.index[nb * a.index_stride];
            const uint4* src = reinterpret_cast<const uint4*>(a.table) + size_t(id) * in8;
            for (int i = threadIdx.x; i < in8; i += GEMV_THREADS) {
                const uint4 w = src[i];
                dst[2 * i] = make_float4(bf16_lo(w.x), bf16_hi(w.x), bf16_lo(w.y), bf16_hi(w.y));
                dst[2 * i + 1] = make_float4(bf16_lo(w.z), bf16_hi(w.z), bf16_lo(w.w), bf16_hi(w.w));
            }
        } else {
            const float4* src = reinterpret_cast<const float4*>(a.x + size_t(nb) * a.ldx);
            for (int i = threadIdx.x; i < in / 4; i += GEMV_THREADS) {
                const float4 v = src[i];
                dst[i] = v;
                sumsq[nb] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        }
    }
    if (a.input == GemvInput::GEMV_INPUT_RMSNORM) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            const float s = warp_sum(sumsq[nb]);
            if (lane == 0) partial[warp][nb] = s;
        }
        __syncthreads();
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            if (nb >= rows) continue;
            float total = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; ++w) total += partial[w][nb];
            const float inv = 1.0f / sqrtf(total / float(in) + a.eps);
            float* xr = xs + size_t(nb) * in;
            for (int i = threadIdx.x; i < in; i += GEMV_THREADS) xr[i] = (xr[i] * inv) * a.norm_w[i];
        }
    }
    __syncthreads();
    if (row >= a.out) return;  // no block-wide barrier below

    float acc[NMAT][NB];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) acc[m][nb] = 0.0f;

    constexpr int U = 8 / NMAT;
    for (int base = 0; base < in8; base += 32 * U) {
        uint4 wv[NMAT][U];
        weight_chunk_load<NMAT, U>(w0, NMAT == 2 ? w1 : w0, base, in8, wv);
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = base + u * 32 + lane;
            if (k < in8) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    const float4* xv = reinterpret_cast<const float4*>(xs + size_t(nb) * in) + 2 * k;
                    const float4 x0 = xv[0], x1 = xv[1];
#pragma unroll
                    for (int m = 0; m < NMAT; ++m) acc[m][nb] += dot8(wv[m][u], x0, x1);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) acc[m][nb] = warp_sum(acc[m][nb]);

    if (lane == 0) gemv_row_store<NB, NMAT>(a, row, acc);
}

// "rows2": gemv_vec_kernel<1, NMAT, false> with two output rows a warp (rows 2w, 2w + 1 of the
// block's 16). Chunks of half vec1's (a 1024-wide row of one matrix still whole) go into
// registers before the PDL wait, the rest into L2; at most 85 registers, so that two blocks an
// SM leave room for the next kernel's blocks. Each row accumulates its chunks per lane in vec1's
// order (ascending 16-byte columns), so every output has vec1's bits.
template <int NMAT>
__global__ void __launch_bounds__(GEMV_THREADS, 3) gemv_rows2_kernel(const GemvArgs a) {
    extern __shared__ float4 gemv_rows2_buf[];
    float* xs = reinterpret_cast<float*>(gemv_rows2_buf);  // [in]
    __shared__ float partial[GEMV_WARPS];
    constexpr int U = 4 / NMAT;   // 16-byte loads per lane per matrix per chunk (vec1: 8 / NMAT)
    constexpr int STEP = 32 * U;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = 2 * (blockIdx.x * GEMV_WARPS + warp);
    const int in = a.in, in8 = a.in >> 3;
    bool active[2];
    const uint4* w[2][NMAT];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        active[r] = row0 + r < a.out;
        const size_t at = size_t(active[r] ? row0 + r : 0) * in8;
        w[r][0] = reinterpret_cast<const uint4*>(a.w) + at;
        if (NMAT == 2) w[r][NMAT - 1] = reinterpret_cast<const uint4*>(a.w2) + at;
    }
    uint4 cur[2][NMAT][U];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (!active[r]) continue;
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = u * 32 + lane;
            if (k < in8) {
#pragma unroll
                for (int m = 0; m < NMAT; ++m) cur[r][m][u] = __ldg(w[r][m] + k);
            }
        }
        if (lane == 0 && in8 > STEP) {
#pragma unroll
            for (int m = 0; m < NMAT; ++m) prefetch_l2(w[r][m] + STEP, uint32_t(in8 - STEP) * 16u);
        }
    }
    pdl_wait();
    pdl_trigger();

    // The input row, staged (times norm_w) with vec1's sums.
    const bool norm = a.input == GemvInput::GEMV_INPUT_RMSNORM;
    const float inv = stage_input_row(a.x, norm ? a.norm_w : nullptr, in, a.eps, xs, partial);
    if (!active[0]) return;  // no block-wide barrier below

    float acc[2][NMAT];
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int m = 0; m < NMAT; ++m) acc[r][m] = 0.0f;
    for (int base = 0; base < in8; base += STEP) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = base + u * 32 + lane;
            if (k < in8) {
                const float4* xv = reinterpret_cast<const float4*>(xs) + 2 * k;
                const float4 x0 = xv[0], x1 = xv[1];
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int m = 0; m < NMAT; ++m) acc[r][m] += dot8(cur[r][m][u], x0, x1);
            }
        }
        if (base + STEP < in8) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = base + STEP + u * 32 + lane;
                if (k < in8) {
#pragma unroll
                    for (int r = 0; r < 2; ++r)
#pragma unroll
                        for (int m = 0; m < NMAT; ++m) cur[r][m][u] = __ldg(w[r][m] + k);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        float done[NMAT][1];
#pragma unroll
        for (int m = 0; m < NMAT; ++m) {
            done[m][0] = warp_sum(acc[r][m]);
            if (norm) done[m][0] *= inv;
        }
        if (lane == 0 && active[r]) gemv_row_store<1, NMAT>(a, row0 + r, done);
    }
}

// "turns": gemv_vec_kernel<1, NMAT, false> over a grid capped at TURNS_BLOCKS_PER_SM blocks an
// SM; warp w of block b takes rows 8b + w, then 8 gridDim.x further on, and so on. Before the
// wait: its first row's first chunk in registers (vec1's), and each lane asks L2 for lines of
// the rest of the warp's rows (plain prefetches: no copy unit). After the last chunk of a row
// the next row's first chunk is loaded before the row's reduction. Each row's arithmetic is
// vec1's, so are its bits.
constexpr int TURNS_BLOCKS_PER_SM = 2;

// Chunk `base` of row `row` (weight_chunk_load, lab_device.cuh).
template <int NMAT>
__device__ __forceinline__ void turns_chunk(const GemvArgs& a, int row, int base, int in8,
                                            uint4 (&cur)[NMAT][8 / NMAT]) {
    const uint4* w0 = reinterpret_cast<const uint4*>(a.w) + size_t(row) * in8;
    weight_chunk_load<NMAT, 8 / NMAT>(w0, NMAT == 2 ? reinterpret_cast<const uint4*>(a.w2) + size_t(row) * in8 : w0,
                                      base, in8, cur);
}

template <int NMAT>
__global__ void __launch_bounds__(GEMV_THREADS, 4) gemv_turns_kernel(const GemvArgs a) {
    extern __shared__ float4 gemv_turns_buf[];
    float* xs = reinterpret_cast<float*>(gemv_turns_buf);  // [in]
    __shared__ float partial[GEMV_WARPS];
    constexpr int U = 8 / NMAT;
    constexpr int STEP = 32 * U;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int in = a.in, in8 = a.in >> 3;
    const int stride = int(gridDim.x) * GEMV_WARPS;
    const int first = int(blockIdx.x) * GEMV_WARPS + warp;

    uint4 cur[NMAT][U];
    if (first < a.out) {
        turns_chunk<NMAT>(a, first, 0, in8, cur);
        // L2 lines of the rest: the first row past its first chunk, then the later rows whole.
        const size_t row_bytes = size_t(in) * 2;
        for (int row = first; row < a.out; row += stride) {
            const size_t skip = row == first ? size_t(STEP) * 16 : 0;
            for (size_t off = skip + size_t(lane) * 128; off < row_bytes; off += 32 * 128) {
                prefetch_line_l2(reinterpret_cast<const char*>(a.w) + size_t(row) * row_bytes + off);
                if (NMAT == 2) prefetch_line_l2(reinterpret_cast<const char*>(a.w2) + size_t(row) * row_bytes + off);
            }
        }
    }
    pdl_wait();
    pdl_trigger();

    const bool norm = a.input == GemvInput::GEMV_INPUT_RMSNORM;
    const float inv = stage_input_row(a.x, norm ? a.norm_w : nullptr, in, a.eps, xs, partial);
    for (int row = first; row < a.out; row += stride) {
        float acc[NMAT][1];
#pragma unroll
        for (int m = 0; m < NMAT; ++m) acc[m][0] = 0.0f;
        for (int base = 0; base < in8; base += STEP) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = base + u * 32 + lane;
                if (k < in8) {
                    const float4* xv = reinterpret_cast<const float4*>(xs) + 2 * k;
                    const float4 x0 = xv[0], x1 = xv[1];
#pragma unroll
                    for (int m = 0; m < NMAT; ++m) acc[m][0] += dot8(cur[m][u], x0, x1);
                }
            }
            if (base + STEP < in8)
                turns_chunk<NMAT>(a, row, base + STEP, in8, cur);
            else if (row + stride < a.out)
                turns_chunk<NMAT>(a, row + stride, 0, in8, cur);
        }
#pragma unroll
        for (int m = 0; m < NMAT; ++m) {
            acc[m][0] = warp_sum(acc[m][0]);
            if (norm) acc[m][0] *= inv;
        }
        if (lane == 0) gemv_row_store<1, NMAT>(a, row, acc);
    }
}

int turns_grid(int out) {
    static const int sms = [] {
        int device = 0, n = 0;
        KERNEL_CUDA_CHECK(cudaGetDevice(&device));
        KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
        return n;
    }();
    return std::min((out + GEMV_WARPS - 1) / GEMV_WARPS, TURNS_BLOCKS_PER_SM * sms);
}

template <int NB, int NMAT>
void variant_launch(GemvVariant variant, const GemvArgs& a, const Launch& l) {
    const dim3 grid((a.out + GEMV_WARPS - 1) / GEMV_WARPS);
    const size_t smem = size_t(NB) * size_t(a.in) * sizeof(float);
    if (gemv_variant_exact(variant) && (NB != 1 || a.in % 8 != 0 || !gemv_variant_supports(variant, a)))
        check_fail(gemv_variant_name(variant), "one input row (plain or normalised), in a multiple of 8", __func__,
                   __FILE__, __LINE__);
    switch (variant) {
        case GemvVariant::GEMV_VARIANT_SMEM: {
            static std::atomic<uint64_t> raised{0};
            smem_limit_raise(gemv_smem_kernel<NB, NMAT>, smem, raised);
            KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(GEMV_THREADS), smem, gemv_smem_kernel<NB, NMAT>, a));
            return;
        }
        case GemvVariant::GEMV_VARIANT_VEC: {
            static std::atomic<uint64_t> raised{0};
            smem_limit_raise(gemv_vec_kernel<NB, NMAT, true>, smem, raised);
            KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(GEMV_THREADS), smem, gemv_vec_kernel<NB, NMAT, true>, a,
                                              gemv_prefetches_rest<NMAT>(a)));
            return;
        }
        case GemvVariant::GEMV_VARIANT_ROWS2: {
            const dim3 grid2((a.out + 2 * GEMV_WARPS - 1) / (2 * GEMV_WARPS));
            static std::atomic<uint64_t> raised{0};
            smem_limit_raise(gemv_rows2_kernel<NMAT>, smem, raised);
            KERNEL_CUDA_CHECK(launch_kernel(l, grid2, dim3(GEMV_THREADS), smem, gemv_rows2_kernel<NMAT>, a));
            return;
        }
        case GemvVariant::GEMV_VARIANT_TURNS: {
            static std::atomic<uint64_t> raised{0};
            smem_limit_raise(gemv_turns_kernel<NMAT>, smem, raised);
            KERNEL_CUDA_CHECK(
                launch_kernel(l, dim3(turns_grid(a.out)), dim3(GEMV_THREADS), smem, gemv_turns_kernel<NMAT>, a));
            return;
        }
        case GemvVariant::GEMV_VARIANT_VEC1: gemv(a, l); return;
    }
}

template <int NMAT>
void variant_dispatch(GemvVariant variant, const GemvArgs& a, const Launch& l) {
    if (a.rows <= 1)
        variant_launch<1, NMAT>(variant, a, l);
    else if (a.rows <= 2)
        variant_launch<2, NMAT>(variant, a, l);
    else if (a.rows <= 4)
        variant_launch<4, NMAT>(variant, a, l);
    else
        variant_launch<8, NMAT>(variant, a, l);
}

}  // namespace

void gemv_variant(GemvVariant variant, const GemvArgs& a, const Launch& l) {
    if (variant == GemvVariant::GEMV_VARIANT_VEC1) return gemv(a, l);  // the shipped launcher checks the arguments
    if (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU)
        variant_dispatch<2>(variant, a, l);
    else
        variant_dispatch<1>(variant, a, l);
}

bool gemv_variant_supports(GemvVariant variant, const GemvArgs& a) {
    return !gemv_variant_exact(variant) || (a.rows == 1 && a.input != GemvInput::GEMV_INPUT_GATHER);
}

bool gemv_variant_exact(GemvVariant variant) {
    return variant == GemvVariant::GEMV_VARIANT_ROWS2 || variant == GemvVariant::GEMV_VARIANT_TURNS;
}

const char* gemv_variant_name(GemvVariant variant) {
    switch (variant) {
        case GemvVariant::GEMV_VARIANT_VEC1: return "vec1 (shipped)";
        case GemvVariant::GEMV_VARIANT_VEC: return "vec";
        case GemvVariant::GEMV_VARIANT_SMEM: return "smem";
        case GemvVariant::GEMV_VARIANT_ROWS2: return "rows2";
        case GemvVariant::GEMV_VARIANT_TURNS: return "turns";
    }
    return "?";
}

}  // namespace qtts::kernel_lab
