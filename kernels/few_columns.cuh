// The speech decoder's weight products over a few columns, in one launch: y [M, N] (= or +=)
// W · x for N <= FEW_COLUMNS_MAX, W the decoder's split-bf16 weights (bf16 hi and lo planes,
// engine/cuda/gpu_speech_decoder.h: DECODER_MATH_BF16X3), x fp32 [K, N] row-major.
//
// Why: a decoder chunk of one frame for one stream (the chunk every request starts with) runs
// its first convolutions over 1-4 columns, and there cuBLAS's GEMMs read the bf16x3 weights
// (rows hi | hi | lo: 6 bytes a weight) at ~1-1.5 TB/s plus a split-K reduction launch, and the
// ConvNeXt products needed their input split into planes by a launch of its own. These kernels
// read each weight's hi and lo once (4 bytes) and take x in fp32. Over more than 16 columns
// cuBLAS stays faster (the 32-column residual convs: 33 µs here against ~11 µs, ncu), so the
// decoder keeps it there (FEW_COLUMNS_MAX); docs/performance.md has the per-product table.
//   * W rows [M, K] (convs, ConvNeXt pointwise layers; hi at hi[m·ld + k], lo at lo[m·ld + k]),
//     up to 16 columns: a block owns 16 rows (one m16n8k16 tile) and K (or a slice of it,
//     below); its warps take the 32-input steps in
//     turn; lane (g, q) loads inputs 8q .. 8q + 7 of rows g and g + 8 (16 bytes per half), the
//     same permutation as kernels/skinny.cu, and reads x's matching rows for its column g of each
//     8-column tile, split in registers into bf16 hi/lo pairs; W_hi·x_hi + W_hi·x_lo + W_lo·x_hi
//     on tensor cores with fp32 accumulation (the arithmetic of the GEMM path);
//   * W stacked [K, M] (transposed convs; hi at hi[k·ld + m]), up to 8 columns: a lane owns four
//     consecutive outputs, reads their hi and lo (a warp reads 256 contiguous bytes per half and
//     input, four inputs at a time) and multiplies w = hi + lo (exact in fp32) by x's fp32 values
//     on CUDA cores (every lane reads the same x row: one broadcast load); warps take the inputs
//     in turn.
// Products with few tiles (fewer than ~2 blocks per SM) split K into slices over more blocks;
// the last block of a tile adds the slices' partial sums (FewColumnsWorkspace) in slice order.
// The warps' sums meet in shared memory and are added in warp order: the results are
// deterministic and an output does not depend on N or on the other columns (a stream decoded in
// a batch of few columns gets the bits it gets alone: the slicing depends on M and K, and on N
// only when the workspace cannot hold the partial sums).
// Requirements (few_columns_supported): 1 <= N <= FEW_COLUMNS_MAX; rows: K and ld multiples of 8,
// hi and lo 16-byte aligned; stacked: N <= 8, M and ld multiples of 4, hi and lo 8-byte aligned.
// Device code runs on sm_80+ (mma.sync bf16).
#pragma once

#include "kernels/common.cuh"

namespace qtts::kernels {

constexpr int FEW_COLUMNS_MAX = 16;

// The weight planes of one product. `stacked`: W stored [K, M] (output index fastest), else
// [M, K] rows. ld: elements between consecutive rows of the storage.
struct SplitWeights {
    const bf16_t* hi = nullptr;
    const bf16_t* lo = nullptr;
    int ld = 0;
    bool stacked = false;
};

// The decoder's bf16x3 weights (engine/cuda/gpu_speech_decoder.h) hold W three times along K,
// hi, hi again, lo: rows [M, 3K] with `ld` >= 3K (split_rows), or blocks stacked [3K, M]
// (split_stacked). These kernels read the first hi and the lo.
inline SplitWeights split_rows(const bf16_t* a3, int K, int ld) { return {a3, a3 + 2 * size_t(K), ld, false}; }
inline SplitWeights split_stacked(const bf16_t* a3, int K, int M) {
    return {a3, a3 + 2 * size_t(K) * size_t(M), M, true};
}

bool few_columns_supported(const SplitWeights& w, int M, int N, int K);

// Device memory for products with few blocks, which split K into slices: the slices' partial
// sums and one ticket per tile (zeroed once when allocated; every launch leaves them zero). Owned
// by the caller's single stream of work (launches sharing it must not overlap). Empty: no slices
// (correct, slower for products of few rows).
struct FewColumnsWorkspace {
    float* partials = nullptr;
    size_t partial_floats = 0;
    uint32_t* tickets = nullptr;
    int ticket_count = 0;
};
constexpr size_t FEW_COLUMNS_PARTIAL_FLOATS = size_t(1) << 19;  // 2 MiB: slices x M x N of every decoder product
constexpr int FEW_COLUMNS_TICKETS = 1024;

// y [M, N] = W · x [K, N] (accumulate: y += W · x; otherwise y is not read). Throws
// kernels::KernelError (kernels/check.cuh) on unsupported arguments or a bad launch.
void few_columns_product(const SplitWeights& w, int M, int N, int K, const float* x, bool accumulate, float* y,
                         const FewColumnsWorkspace& workspace, const Launch& launch);

}  // namespace qtts::kernels
