// Plain fp32 CPU reference ops. Activations are row-major: a sequence is [T, C] (time-major)
// unless a function says otherwise. Matrix products go through OpenBLAS; everything else is a
// straightforward loop, written to be obviously right rather than fast.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace qtts::cpu {

// y[T, out] = x[T, in] · W[out, in]ᵀ (+ b[out] when b is not null).
void linear(const float* x, int T, int in, const float* W, const float* b, int out, float* y);

// Per-row RMSNorm: y = x / sqrt(mean(x²) + eps) * w.   x, y: [T, C] (may alias)
void rms_norm(const float* x, int T, int C, const float* w, float eps, float* y);

// Per-row LayerNorm with affine weight and bias.   x, y: [T, C] (may alias)
void layer_norm(const float* x, int T, int C, const float* w, const float* b, float eps, float* y);

// Rotary embedding, rotate-half convention (pairs (i, i + d/2)), in place on
// x [T, n_heads * head_dim]; row t has position positions[t].
void rope_apply(float* x, int T, int n_heads, int head_dim, const int64_t* positions, double theta);

// Same rotation with an explicit frequency table inv_freq [head_dim / 2]: the angle of pair i at
// position p is p · inv_freq[i] (fp32), cos/sin in fp32.
void rope_apply_table(float* x, int T, int n_heads, int head_dim, const int64_t* positions, const float* inv_freq);

// Causal (optionally sliding-window) grouped-query attention.
//   q       [T, n_heads * head_dim]    queries at absolute positions q_pos[t]
//   k, v    [S, n_kv * head_dim]       keys/values; row s has absolute position k_pos0 + s
//   out     [T, n_heads * head_dim]
// Key s is visible to query t when k_pos <= q_pos and (window <= 0 or q_pos - k_pos < window).
// Softmax in fp32 with scale 1/sqrt(head_dim).
void attention(const float* q, int T, const int64_t* q_pos, const float* k, const float* v, int S, int64_t k_pos0,
               int n_heads, int n_kv, int head_dim, int window, float* out);

// out[i] = silu(gate[i]) * up[i]
void swiglu(const float* gate, const float* up, size_t n, float* out);
float silu(float x);
float gelu_erf(float x);

// y += x
void add_inplace(float* y, const float* x, size_t n);

// Transpose a [rows, cols] matrix into [cols, rows].
void transpose(const float* x, int rows, int cols, float* y);

}  // namespace qtts::cpu
