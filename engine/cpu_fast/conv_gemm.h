// Time-major convolutions as register-blocked products, for the fast CPU speech decoder.
//
// The reference decoder (engine/cpu/conv_ops.h) runs channel-major signals through im2col +
// OpenBLAS. Here every signal is time-major, x[T, C] (row t holds every channel at time t), so a
// causal conv needs no im2col: tap k of output row t reads input row t + k·dilation, and the
// product
//
//   y[t, co] = bias[co] + Σ_k Σ_ci W[co, ci, k] · x[t + k·dilation, ci]      (y [T_out, Cout])
//
// runs as 16 output channels × up to 6 time steps per register block (12 AVX2 accumulators:
// two 8-lane weight vectors times six broadcast inputs per step). A linear (1×1 conv) and a
// transposed conv (a linear to K·Cout columns, then overlap-add) are the same product.
//
// Weights are packed once at load in fp32 or bf16 (round to nearest even) as panels of 16 output
// channels, [Cout/16][K][Cin][16], zero-padded past Cout; accumulation is fp32 either way. The
// work (panels × time blocks) is split across the thread pool.
//
// Paths: AVX2 + FMA (picked at run time when the CPU has it) and portable scalar, summing each
// output in the same order (taps, then input channels; the scalar path without fused FMAs). No AVX-512 or NEON path: the decoder is compute-bound and
// the AVX2 block already keeps both FMA ports busy on the machines measured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/cpu_fast/matvec.h"
#include "engine/cpu_fast/thread_pool.h"

namespace qtts::cpu_fast {

enum class ConvFormat { CONV_FORMAT_FP32, CONV_FORMAT_BF16 };
const char* conv_format_name(ConvFormat format);  // "fp32", "bf16"
// "fp32" or "bf16"; anything else throws ERROR_INVALID_ARGUMENT listing the accepted names.
ConvFormat conv_format_parse(const std::string& name);

constexpr int CONV_PANEL = 16;  // output channels per packed panel

struct PackedConv {
    ConvFormat format = ConvFormat::CONV_FORMAT_FP32;
    int cout = 0, cin = 0, k = 1, dilation = 1;
    AlignedBytes values;  // [ceil(cout / 16)][k][cin][16] fp32 or bf16 (uint16)
    AlignedBytes bias;    // [cout] fp32, empty (size 0) when the conv has none
    int panels() const { return (cout + CONV_PANEL - 1) / CONV_PANEL; }
    const float* bias_f32() const { return bias.size ? reinterpret_cast<const float*>(bias.data.get()) : nullptr; }
    size_t bytes() const { return values.size + bias.size; }
};

// Packs a conv weight w [cout, cin, k] (PyTorch Conv1d layout) with optional bias [cout].
PackedConv conv_pack(const float* w, const float* bias, int cout, int cin, int k, int dilation, ConvFormat format);
// Packs a linear W [out, in] (+ bias [out]) as a 1×1 conv.
PackedConv linear_pack(const float* w, const float* bias, int out, int in, ConvFormat format);
// Packs a transposed conv w [cin, cout, k] (PyTorch ConvTranspose1d layout) as the linear
// cols[t, j·cout + co] = Σ_ci w[ci, co, j] · x[t, ci]; the bias is not packed (added after the
// overlap-add).
PackedConv trans_conv_pack(const float* w, int cin, int cout, int k, ConvFormat format);

// The fp32 weights the packed ones stand for, w [cout, cin, k] (tests, error measurements).
void conv_unpack(const PackedConv& conv, float* w);

// y[t, co] (+)= bias[co] + Σ_k Σ_ci W[co, ci, k] · x[t + k·dilation, ci] for t in 0..T_out-1.
// x rows are ldx floats apart and at least cin wide; x must hold T_out + (k-1)·dilation rows.
// y rows are ldy floats apart; with accumulate the result is added to y (a residual), else y is
// overwritten. y must not alias x. Runs on the pool when the product is large enough.
void conv_gemm(ThreadPool& pool, const PackedConv& conv, const float* x, size_t ldx, int T_out, float* y, size_t ldy,
               bool accumulate = false);

// The same on one thread with a given path (tests compare the paths).
void conv_gemm_isa(MatvecIsa isa, const PackedConv& conv, const float* x, size_t ldx, int T_out, float* y, size_t ldy,
                   bool accumulate);

// SnakeBeta on x [T, C] in place (time-major): x += inv_beta[c] · sin²(alpha[c] · x), with
// alpha = exp(log_alpha) and inv_beta = 1 / (exp(log_beta) + 1e-9) precomputed. The AVX2 path's
// sine is a degree-11 polynomial after reduction by π (sin² has period π), within ~1e-7 of sinf.
void snake_time_major(MatvecIsa isa, float* x, int T, int C, const float* alpha, const float* inv_beta);

}  // namespace qtts::cpu_fast
