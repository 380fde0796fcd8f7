// Products over a few rows on tensor cores, in one launch: y[r] = W · x[r] for 1..SKINNY_MAX_ROWS
// rows (the batched frame step's streams, engine/cuda/gpu_batch.h), W bf16 [out, in], x and y
// fp32, with gemv's input and output rules (kernels/gemv.cuh: RMSNorm on the fly, store / add /
// SwiGLU, bias).
//
// Why: a batched step of 4-32 streams ran each product as three launches (split the rows into
// bf16 hi/lo halves, one cuBLAS GEMM, add the halves with the output rule): ~1500 dependent
// launches per frame, bound by their latency rather than by the weight bytes. This kernel does
// the same arithmetic in one launch and without scratch memory:
//   * a block owns one 16-row tensor-core tile of W (16 output features; 8 gate + 8 up rows for
//     SwiGLU, so one lane holds both sums of a feature) and the whole input dimension, for every
//     row of x; its warps (8, or 16 when the product has fewer than 256 blocks: more loads in
//     flight per SM, half the steps per warp) take the 32-input steps in turn (warp w: steps w,
//     w + warps, ...), so a block reads its weight rows front to back together;
//   * each lane copies its pieces of the mma.sync A fragments (one 16-byte piece per fragment
//     row), the first steps before the PDL wait (while the previous kernel finishes), eight steps
//     ahead into its own slots of a shared-memory ring with cp.async, and reads them back when
//     their step comes (SKINNY_WEIGHTS_SHARED, the default; the kernel before it held four steps
//     in registers, SKINNY_WEIGHTS_REGISTERS: the registers also hold x, so twice the bytes in
//     flight needed another place; twelve steps were slower: the ring then left too little of
//     the SM's L1 for the x rows);
//   * nothing more is asked ahead: the block's whole rows prefetched into L2 before the wait
//     queued ahead of the previous kernel's own loads (a 4-row step 5% slower with them);
//   * x rows are read from global memory (L2) as float4 pairs, several steps' worth at once (a
//     warp waits for L2 once per group; the groups are as long as the registers allow: longer in
//     the kernel without an RMSNorm input, which holds no norm weights), and
//     split in registers into a bf16 hi/lo pair, so the fp32 activations keep ~16 bits of
//     mantissa against bf16 weights (as the split cuBLAS path and prefill do); the 1/rms of a row
//     (RMSNorm input) is applied to the finished sums, as gemv does;
//   * the warps' sums meet in shared memory and are added in warp order, so results are
//     deterministic, and a row's result does not depend on the other rows of the batch (the
//     block shape depends on W's shape only).
// Products with many tiles (the talker's qkv and gate/up, the predictor's qkv and gate/up, the
// codec head) take two tiles per block (32 features; 16 for SwiGLU): each warp splits an x piece
// once and multiplies it against both tiles, with twice the weight loads in flight, and half as
// many blocks read the x rows; 8-32% faster on those shapes, slower on the narrow ones (few
// blocks), measured in the kernel lab (docs/performance.md). Same bits as one tile per block (the
// same warps make each feature's sums in the same order).
// Within a 32-input step the inputs are taken in a permuted order (any order gives the same
// products as long as A and B agree): lane (g, q) holds inputs 8q .. 8q + 7 of its rows.
// Requirements: in % 8 == 0, x rows and weight rows 16-byte aligned (ldx % 4 == 0), GATHER input
// not supported (skinny_supported says; the caller keeps gemv or cuBLAS for those).
#pragma once

#include "kernels/gemv.cuh"

namespace qtts::kernels {

constexpr int SKINNY_MAX_ROWS = 32;

// Where a warp keeps the weight steps it has in flight (above). The same bits either way.
enum class SkinnyWeights {
    SKINNY_WEIGHTS_SHARED,     // a cp.async ring in shared memory, eight steps (the default)
    SKINNY_WEIGHTS_REGISTERS,  // registers, four steps
};

// Whether skinny_product takes these arguments (shape and input rules above).
bool skinny_supported(const GemvArgs& args);

// Throws kernels::KernelError (kernels/check.cuh) on a bad launch or unsupported arguments.
// `features`: output features per block, 16 (0: the default) or 8 (twice the blocks, half of each
// tensor-core tile idle; for products with few features: measured in the kernel lab). SwiGLU
// products always take 8 (gate and up rows fill the tile). `tiles`: tiles per block, 1 or 2 (0:
// the default for W's shape, above); `weights`: where the weight steps in flight are kept. Any
// choice gives the same bits.
void skinny_product(const GemvArgs& args, const Launch& launch, int features = 0, int tiles = 0,
                    SkinnyWeights weights = SkinnyWeights::SKINNY_WEIGHTS_SHARED);

}  // namespace qtts::kernels
