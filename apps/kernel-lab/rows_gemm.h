// The split path's GEMM for the batched step's shapes, written for them (kernel lab): y [n, out] =
// xb [n, in] · W[out, in]^T, W bf16 row-major, xb the step's bf16 rows (n = 2 x streams: the hi
// rows, then the lo rows), y fp32 row-major, as engine/cuda/gpu_lm_launch.h's split_gemm asks
// cublasGemmEx for.
//
// Why: at 24-64 streams the batched step runs its products on that path, and cuBLAS's kernels for
// these shapes (4-50 MB of weights, only 48-128 columns) take 6-22 us each, far from the ~1-3 us
// the weight bytes need: few CTAs for the narrow products, and a K loop whose loads wait on each
// other. Here every warp owns 16 features and 256 inputs of W and loads all of its weights into
// registers before the PDL wait (they are constant), so they arrive while the previous kernel
// finishes; the block then stages its slice of xb in shared memory (all copies in flight at once,
// rows padded so the fragment reads are conflict-free) and runs mma.sync m16n8k16 against it.
// A block is warps_m x 16 features by warps_k x 256 inputs; its warps along K add their sums
// through shared memory in warp order, and blocks along K (splits) write partial sums that the
// last block of a feature block to finish adds in split order: deterministic for a shape and
// configuration.
// Requirements: n a multiple of 8 (6, 8, 12 or 16 tiles of 8), out % (16 warps_m) == 0,
// in % (256 warps_k) == 0, W and xb rows 16-byte aligned, warps_m · warps_k <= 8.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common.cuh"

namespace qtts::kernel_lab {

struct RowsGemmConfig {
    int warps_m = 8;  // 16 features each
    int warps_k = 1;  // 256 inputs each
};

constexpr int ROWS_GEMM_WARP_K = 256;

bool rows_gemm_supported(int out, int in, int n, const RowsGemmConfig& c);
int rows_gemm_splits(int in, const RowsGemmConfig& c);
// Scratch of a launch with more than one split: partial sums (floats) and one counter per feature
// block (zero before the first launch; every launch leaves them zero).
size_t rows_gemm_partial_floats(int out, int in, int n, const RowsGemmConfig& c);
size_t rows_gemm_counter_count(int out, const RowsGemmConfig& c);
// Throws kernels::KernelError on unsupported arguments or a failed launch.
void rows_gemm(const kernels::bf16_t* w, int out, int in, const kernels::bf16_t* xb, int n, float* y,
               const RowsGemmConfig& c, float* partial, uint32_t* counters, const kernels::Launch& launch);

}  // namespace qtts::kernel_lab
