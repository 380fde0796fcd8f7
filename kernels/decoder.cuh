// fp32 kernels of the speech-tokenizer decoder (codes -> 24 kHz audio) on the GPU
// (engine/cuda/gpu_speech_decoder.h uses them; the CPU twin is cpu/speech_decoder.cpp).
//
// Layouts follow the CPU reference: convolution signals are channel-major x[C, T] (row c is
// channel c over time), transformer activations are time-major h[T, D]. Dense convolutions are
// an im2col (this file) followed by a cuBLAS product (SGEMM, or the split-bf16 pair of GEMMs
// when the im2col writes bf16 hi/lo planes: engine/cuda/gpu_speech_decoder.h, DecoderMath); the
// im2col reads the carried causal tail directly (no concatenation copy), applies the SnakeBeta
// of the conv input on the fly (the activation costs nothing extra: it is computed where the
// values are loaded anyway), and appends a row of ones so that the bias rides along in the GEMM
// as an extra weight column.
//
// Every kernel starts with pdl_wait(), so all of them may be launched with programmatic
// dependent launch. Positions are read from device memory (graph replay).
//
// Several streams in one pass: a decoder chunk runs for S streams at once (S = 1 for a stream
// alone) with the streams side by side in every signal — channel-major x[C, S·T] (stream s owns
// columns s·T .. s·T + T - 1), time-major rows h[S·n, D] (stream s owns rows s·n ..) — so the
// products and the per-value kernels see one wider matrix. What a stream carries from chunk to
// chunk (position, chunk counter, conv tails, transposed-conv overlaps, K/V rings) is one block
// of device memory per stream, laid out the same way for every stream; the kernels that read or
// write carried state find stream s's block through a device table (DecoderStates) and the
// piece they want by its byte offset in the block.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/common.cuh"

namespace qtts::kernels {

struct DecoderStates {
    char* const* blocks = nullptr;  // device [count]: each stream's state block
    int count = 1;                  // S
};
// The block header: two int64 counters, then (from DECODER_STATE_HEADER_BYTES) the tails and rings.
constexpr size_t DECODER_STATE_POSITION_AT = 0;  // frames decoded (position of the next frame)
constexpr size_t DECODER_STATE_CHUNK_AT = 8;     // chunks decoded (its parity picks the tail slot)
constexpr size_t DECODER_STATE_HEADER_BYTES = 256;

// SnakeBeta parameters prepared on the host exactly as the CPU does:
//   alpha = exp(log_alpha), inv_beta = 1 / (exp(log_beta) + 1e-9);  y = x + inv_beta·sin²(alpha·x)
struct SnakeParams {
    const float* alpha = nullptr;     // [C]; null = no activation
    const float* inv_beta = nullptr;  // [C]
};

// RVQ gather: g[t] = [codebook_0[codes[t][0]] , Σ_{q≥1} codebook_q[codes[t][q]]]  -> g [n, 2·half]
// codebooks [nq, size, half] (already divided by the cluster usage).
void rvq_gather(const int32_t* codes, int n, int nq, const float* codebooks, int size, int half, float* g,
                const Launch& launch);

// im2col of a causal conv whose input is [tail | x] (tail [C, L] already activated, x [C, T]
// activated here with `snake` when set). L = (K-1)·dilation.
//   col [col_rows, T]: row c·K + k holds input column t + k·dilation, row C·K is all ones, rows
//   after it (padding of the weight rows to a multiple of 4 floats, col_rows > C·K + 1) are zeros.
//   col_rows = 0 means C·K + 1.
void conv_im2col(const float* tail, int L, const float* x, int C, int T, int K, int dilation, SnakeParams snake,
                 float* col, const Launch& launch, int col_rows = 0);
// The same columns as bf16 hi/lo pairs for a split-bf16 product: planes [3, col_rows, T], the
// hi plane (bf16(v)), the lo plane (bf16(v - hi)) and the hi plane again (the `b3` operand of
// split_gemm_row_major).
void conv_im2col_split(const float* tail, int L, const float* x, int C, int T, int K, int dilation,
                       SnakeParams snake, bf16_t* planes, const Launch& launch, int col_rows = 0);

// New tail = last L columns of [tail | snake(x)] (in place; L <= 1024).
void conv_tail_update(float* tail, int L, const float* x, int C, int T, SnakeParams snake, const Launch& launch);

// y [C, T] = snake(x [C, T]) (y may alias x).
void snake_apply(const float* x, int C, int T, SnakeParams snake, float* y, const Launch& launch);
// planes [3, C, T] = the bf16 hi, lo, hi planes of snake(x) (of x when snake.alpha is null).
void split_planes(const float* x, int C, int T, SnakeParams snake, bf16_t* planes, const Launch& launch);

// Overlap-add of a causal transposed conv (stride s, kernel K, K - s <= T·s), T frames per stream:
//   cols [Cout·K, S·T] (row co·K + k = contribution of input column t to output t·s + k),
//   y [Cout, S·T·s] = overlap-added columns + carried overlap (first K-s outputs) + bias;
//   each stream's overlap [Cout, K - s] (at overlap_at in its block) becomes this chunk's
//   spill-over into its next one.
void trans_conv_overlap_add(const float* cols, int Cout, int K, int stride, int T, const float* bias,
                            DecoderStates states, size_t overlap_at, float* y, const Launch& launch);

// Depthwise causal conv: y[c, t] = b[c] + Σ_k w[c, k]·[tail | x][c, t + k·dilation].
void depthwise_conv(const float* tail, int L, const float* x, int C, int T, int K, int dilation, const float* w,
                    const float* b, float* y, const Launch& launch);

// LayerNorm over channels of every time column: x [C, T] -> y [rows, T] (row C = ones, rows
// after it zeros; rows = 0 means C + 1).
void layer_norm_channels(const float* x, int C, int T, const float* w, const float* b, float eps, float* y,
                         const Launch& launch, int rows = 0);

// h [R, T] = gelu_erf(h) in place, row R set to ones (the bias row of the next GEMM) and rows
// R + 1 .. rows - 1 to zeros (rows = 0 means R + 1).
void gelu_ones(float* h, int R, int T, const Launch& launch, int rows = 0);

// x [C, T] += gamma[c] · y [C, T]
void scaled_add_channels(float* x, const float* y, const float* gamma, int C, int T, const Launch& launch);

// y[r, c] += bias[r] (per_row) or bias[c] (otherwise); y [rows, cols]
void bias_add(float* y, int rows, int cols, const float* bias, bool per_row, const Launch& launch);

// Per-row RMSNorm: y [T, C] = x / sqrt(mean(x²) + eps) · w
void rms_norm_rows(const float* x, int T, int C, const float* w, float eps, float* y, const Launch& launch);

// RoPE (rotate-half) on the q and k parts of qkv [S·n, (heads + 2 kv)·hd] in place, stream s's
// row t at its position + t, and stores the rotated keys and the values of every row in the
// stream's K/V rings [ring, kv·hd] (at k_at / v_at in its block) at slot position % ring.
void rope_kv_store(float* qkv, int n, int heads, int kv_heads, int head_dim, const float* inv_freq,
                   DecoderStates states, size_t k_at, size_t v_at, int ring, const Launch& launch);

// Sliding-window causal attention of each stream's n queries in qkv (positions position + t)
// over its own rings: query p sees keys max(0, p - window + 1) .. p.  out [S·n, heads·hd].
// window <= 1024.
void window_attention(const float* qkv, int n, int heads, int kv_heads, int head_dim, DecoderStates states,
                      size_t k_at, size_t v_at, int ring, int window, float* out, const Launch& launch);

// h [n, D] += scale[d] · y [n, D]   (LayerScale residual)
void scaled_residual_rows(float* h, const float* y, const float* scale, int n, int D, const Launch& launch);

// out [n, I] = silu(gu[:, :I]) · gu[:, I:]   (gu [n, 2I])
void swiglu_rows(const float* gu, int n, int I, float* out, const Launch& launch);

// y = min(1, max(-1, y))
void clamp_unit(float* y, int count, const Launch& launch);

// Every stream: position += n, chunk counter += 1.
void position_advance(DecoderStates states, int n, const Launch& launch);

// ---- streaming variants: the tail update fused into the consumer ----------------------------
// A carried tail lives in two slots, tails [2, C, L] (at tails_at in each stream's block); the
// kernel reads slot (chunk & 1) and writes the new tail (last L columns of [tail | input]) into
// the other slot, so no kernel ever reads what another block of the same launch writes. The
// chunk counter is advanced once per decoder chunk (position_advance), which flips the slots.
// x [C, S·T]: T columns per stream.

// conv_im2col + tail update in one launch; col [col_rows, S·T].
void conv_im2col_carry(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                       int dilation, SnakeParams snake, float* col, const Launch& launch, int col_rows = 0);
// The same with the columns as bf16 hi/lo pairs: planes [3, col_rows, S·T] (hi, lo, hi).
void conv_im2col_carry_split(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                             int dilation, SnakeParams snake, bf16_t* planes, const Launch& launch,
                             int col_rows = 0);
// depthwise_conv + tail update (no activation) in one launch; y [C, S·T].
void depthwise_conv_carry(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                          int dilation, const float* w, const float* b, float* y, const Launch& launch);
// The output conv (C -> 1 channel, SnakeBeta on its input, clamp to [-1, 1]) as a direct
// convolution: y[s, t] = clamp(w[C·K] + Σ_c,k w[c·K + k]·[tail | snake(x)][c, t + k·dilation]).
// w [C·K + 1] (bias last), y [S, T]. Needs C·(64 + L) <= 12288 (conv_out_direct_fits).
bool conv_out_direct_fits(int C, int L);
void conv_out_carry(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K, int dilation,
                    SnakeParams snake, const float* w, float* y, const Launch& launch);

// ---- small-n linear layers (transformer rows of short chunks) ---------------------------------
// y = epilogue(norm(x) · Wᵀ) for n <= SMALL_LINEAR_MAX_ROWS rows, one warp per output feature,
// the input rows staged in shared memory (n·in floats <= 12288, in % 4 == 0). One launch
// replaces RMSNorm + GEMM + epilogue kernels when cuBLAS would be launch-bound.
constexpr int SMALL_LINEAR_MAX_ROWS = 8;
enum class SmallLinearEpilogue {
    SMALL_LINEAR_STORE,       // y = acc (+ bias)
    SMALL_LINEAR_SCALED_ADD,  // y += scale[o] · acc                    (LayerScale residual)
    SMALL_LINEAR_SWIGLU,      // y = silu(acc_o) · acc_(out + o)        (W has 2·out rows: gate, up)
};
//   x        [n, in] time-major, or [in, n] when x_channel_major
//   norm_w   [in] RMSNorm weight applied to every x row first (null: none)
//   W        [out, in] ([2·out, in] for SWIGLU), bias [out] or null, scale [out] (SCALED_ADD)
//   y        [n, out] time-major, or [out, n] when y_channel_major
bool small_linear_fits(int n, int in);
void small_linear(const float* x, int n, int in, bool x_channel_major, const float* norm_w, float eps, const float* W,
                  int out, const float* bias, SmallLinearEpilogue epilogue, const float* scale, float* y,
                  bool y_channel_major, const Launch& launch);

}  // namespace qtts::kernels
