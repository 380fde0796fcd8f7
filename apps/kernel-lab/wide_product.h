// A one-launch tensor-core product for 24-64 rows, kept in the kernel lab for measurement against
// the split path (rmsnorm_split_bf16 + cuBLAS GEMM + combine) that the batched step runs there.
//
// Why: the shipped one-launch kernel (kernels/skinny.cu) splits the inputs over the warps of a
// block, so every warp reads its own x pieces from L2 and a block reads all x rows once per 16-32
// features: at 64 rows that is 2-4x the weight bytes of L2 traffic, and past 24 rows the split
// path wins. Here the warps of a block split the *features* (16 each, 128 a block; 8 gate + 8 up
// rows for SwiGLU) and share the inputs: the block stages its x rows 64 inputs at a time, read
// into registers a chunk ahead, normalised (RMSNorm input) and split into bf16 hi + lo once, into
// double-buffered shared memory (rows padded for conflict-free 16-byte fragment reads); each warp
// streams its own weight rows from memory (4 steps of 32 inputs in flight in registers) and runs
// mma.sync m16n8k16 (kernels/mma.cuh) against the staged fragments. So x is read from L2 once per
// 128 features and split once per block. Few feature blocks (o, down: 16) would leave SMs idle, so
// the inputs are split over blocks too (split-K, gridDim.y): each block writes its partial sums
// (and its rows' sums of squares, for RMSNorm input) and the last block of a column to finish adds
// them in slice order and applies the output rule, so results are deterministic for a given
// slice count (which depends on the shape only).
// Requirements: rows 1..64, in a multiple of 64, PLAIN or RMSNORM input, 16-byte aligned x rows
// (ldx % 4 == 0), weights and norm weights.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/gemv.cuh"

namespace qtts::kernel_lab {

constexpr int WIDE_MAX_ROWS = 64;

bool wide_supported(const kernels::GemvArgs& args);
// Input slices for the shape: the fewest (a power of two, each slice at least 64 inputs) that
// give about two blocks per SM.
int wide_splits(const kernels::GemvArgs& args, int sms);
// Scratch of a launch with `splits` > 1: partial sums (floats) and one counter per feature block
// (zero before the first launch; every launch leaves them zero).
size_t wide_partial_floats(const kernels::GemvArgs& args, int splits);
size_t wide_counter_count(const kernels::GemvArgs& args);
// Same results as kernels::gemv within fp32 reordering; throws kernels::KernelError.
void wide_product(const kernels::GemvArgs& args, int splits, float* partial, uint32_t* counters,
                  const kernels::Launch& launch);

}  // namespace qtts::kernel_lab
