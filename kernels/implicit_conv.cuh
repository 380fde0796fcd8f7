// The speech decoder's causal convolutions as one tensor-core launch each, without an im2col
// ("implicit GEMM"): y [M, S·T] (= or +=) bias + conv(snake(x)) over each stream's carried tail,
// with the decoder's split-bf16 arithmetic (engine/cuda/gpu_speech_decoder.h, DECODER_MATH_BF16X3):
// W_hi·x_hi + W_hi·x_lo + W_lo·x_hi on m16n8k16 tensor cores with fp32 accumulation.
//
// Why: over many columns (a batched pass of several streams, or long chunks) the decoder's
// residual-unit convolutions went through an im2col that wrote every input K times as three bf16
// planes (hi, lo, hi again: 42 bytes per input value of a 7-tap conv) for cuBLAS to read back:
// ~1.0 of a 3.3 ms pass at 10 streams x 4 frames, 2.8 of 8.3 at 32 x 4 (docs/performance.md).
// Here a block stages each input window once in shared memory, as bf16 hi/lo pairs, and every tap
// reads it at its own shift.
//
// Shapes and layout:
//   x     [C, S·T] fp32 channel-major, stream s owns columns s·T .. s·T + T - 1 (the decoder's
//         signal layout, kernels/decoder.cuh); SnakeBeta (snake) applied to it as it is staged.
//   tail  each stream's carried input [C, L] (L = (K - 1)·dilation, already activated), in two
//         slots at tails_at in its state block (kernels/decoder.cuh): read from slot (chunk & 1),
//         the next tail (the last L columns of [tail | snake(x)]) written into the other, exactly
//         as conv_im2col_carry does. L = 0: no state is read (K = 1).
//   W     W(o, j, c) = weight of output o, tap j, input channel c, as bf16 pairs at
//         hi[j·tap_stride + o·ld + c] and lo[...] (the upload's tap-major planes; a 1-tap conv
//         can use its [hi | hi | lo] rows directly: kernels/few_columns.cuh split_rows).
//   bias  [M] fp32 (null: none).
//   y     [M, S·T]; must not overlap x.
// Tiles: a block computes 64 outputs x 128 columns of one stream over all C·K inputs, 16 input
// channels at a time (all K taps of them), with 4 warps of 64 x 32; the weight tiles of the next
// 16 channels stream in by cp.async and the next input window is loaded into registers while
// the current one is multiplied. Partial tiles (M or T not multiples of 64 / 128) are masked.
// The sums of an output do not depend on S or on the other streams: a stream decoded in a batch
// gets the bits it gets alone.
// Requirements (implicit_conv_supported): C % 16 == 0, 1 <= K <= IMPLICIT_CONV_MAX_TAPS,
// L <= IMPLICIT_CONV_MAX_TAIL, ld and tap_stride multiples of 8, hi and lo 16-byte aligned.
// Device code runs on sm_80+ (mma.sync bf16, cp.async, ldmatrix).
#pragma once

#include <cstddef>

#include "kernels/common.cuh"
#include "kernels/decoder.cuh"

namespace qtts::kernels {

constexpr int IMPLICIT_CONV_MAX_TAPS = 7;
constexpr int IMPLICIT_CONV_MAX_TAIL = 64;
constexpr int IMPLICIT_CONV_TILE_COLUMNS = 128;  // columns of one stream per block
constexpr int IMPLICIT_CONV_TILE_OUTPUTS = 64;   // outputs per block

struct ImplicitConvWeights {
    const bf16_t* hi = nullptr;
    const bf16_t* lo = nullptr;
    size_t tap_stride = 0;  // elements from tap j to tap j + 1
    int ld = 0;             // elements between consecutive outputs
    const float* bias = nullptr;
};

struct ImplicitConvShape {
    int C = 0;         // input channels
    int M = 0;         // outputs
    int T = 0;         // columns per stream
    int K = 1;         // taps
    int dilation = 1;
    constexpr int tail() const { return (K - 1) * dilation; }
};

bool implicit_conv_supported(const ImplicitConvWeights& w, const ImplicitConvShape& shape);

// y = (y +) bias + conv. states: the streams (their count is S; their blocks are read only when
// the conv has a tail). Throws kernels::KernelError on unsupported arguments or a bad launch.
void implicit_conv(DecoderStates states, size_t tails_at, const ImplicitConvShape& shape, const float* x,
                   SnakeParams snake, const ImplicitConvWeights& w, bool accumulate, float* y, const Launch& launch);

}  // namespace qtts::kernels
