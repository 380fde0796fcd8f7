// fp32 CPU convolution ops on channel-major signals: x[C, T] (row c holds channel c over time).
// Padding is the caller's job (causal, reflect, replicate...), done with the pad helpers, so
// each conv runs on exactly the samples it needs — which is also what streaming needs.
//
// Every dense conv is an im2col + OpenBLAS sgemm (1×1 convs go straight to sgemm); the im2col
// matrix is built in column tiles of bounded size in a per-thread scratch buffer, so long
// signals neither allocate per call nor need memory proportional to T·Cin·K.
// Thread safety: every function may run concurrently on different outputs.
#pragma once

#include <cstddef>
#include <vector>

namespace qtts::cpu {

// Valid (unpadded) 1-D convolution.
//   x [Cin, T], w [Cout, Cin/groups, K], b [Cout] or null  ->  y [Cout, T_out],
//   T_out = (T - dilation*(K-1) - 1) / stride + 1  (0 when T is too short).
// y must not alias x.
int conv1d_out_len(int T, int K, int stride, int dilation);
void conv1d(const float* x, int Cin, int T, const float* w, const float* b, int Cout, int K, int stride, int dilation,
            int groups, float* y);

// Transposed 1-D convolution without any trimming.
//   x [Cin, T], w [Cin, Cout, K], b [Cout] or null  ->  y [Cout, (T-1)*stride + K]
// y must not alias x.
int conv_transpose1d_out_len(int T, int K, int stride);
void conv_transpose1d(const float* x, int Cin, int T, const float* w, const float* b, int Cout, int K, int stride,
                      float* y);

enum class PadMode { PAD_ZERO, PAD_REFLECT, PAD_REPLICATE };

// Pads every channel of x [C, T] with `left` and `right` samples -> [C, left + T + right].
// Reflect padding needs left < T and right < T (as torch's F.pad).
std::vector<float> pad1d(const float* x, int C, int T, int left, int right, PadMode mode);

// SnakeBeta on x [C, T] in place: x + sin²(exp(alpha_c)·x) / (exp(beta_c) + 1e-9).
// alpha/beta are stored as logs, as in the checkpoint.
void snake_beta(float* x, int C, int T, const float* log_alpha, const float* log_beta);

// ELU (alpha = 1) in place.
void elu_inplace(float* x, size_t n);

}  // namespace qtts::cpu
