#include "engine/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <cblas.h>

#include "engine/model/weight_prep.h"

namespace qtts::cpu {

void linear(const float* x, int T, int in, const float* W, const float* b, int out, float* y) {
    if (T == 1) {
        cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, W, in, x, 1, 0.0f, y, 1);
    } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, in, W, in, 0.0f, y, out);
    }
    if (b) {
        for (int t = 0; t < T; ++t) {
            float* row = y + size_t(t) * out;
            for (int o = 0; o < out; ++o) row[o] += b[o];
        }
    }
}

void rms_norm(const float* x, int T, int C, const float* w, float eps, float* y) {
    for (int t = 0; t < T; ++t) {
        const float* xr = x + size_t(t) * C;
        float* yr = y + size_t(t) * C;
        double ss = 0.0;
        for (int c = 0; c < C; ++c) ss += double(xr[c]) * xr[c];
        const float inv = 1.0f / std::sqrt(float(ss / C) + eps);
        for (int c = 0; c < C; ++c) yr[c] = (xr[c] * inv) * w[c];
    }
}

void layer_norm(const float* x, int T, int C, const float* w, const float* b, float eps, float* y) {
    for (int t = 0; t < T; ++t) {
        const float* xr = x + size_t(t) * C;
        float* yr = y + size_t(t) * C;
        double mean = 0.0;
        for (int c = 0; c < C; ++c) mean += xr[c];
        mean /= C;
        double var = 0.0;
        for (int c = 0; c < C; ++c) var += (xr[c] - mean) * (xr[c] - mean);
        var /= C;
        const float inv = 1.0f / std::sqrt(float(var) + eps);
        for (int c = 0; c < C; ++c) yr[c] = float(xr[c] - mean) * inv * w[c] + (b ? b[c] : 0.0f);
    }
}

void rope_apply_table(float* x, int T, int n_heads, int head_dim, const int64_t* positions, const float* inv_freq) {
    const int half = head_dim / 2;
    thread_local std::vector<float> cos_v, sin_v;  // reused: no allocation per decode step
    if (cos_v.size() < size_t(half)) {
        cos_v.resize(size_t(half));
        sin_v.resize(size_t(half));
    }
    for (int t = 0; t < T; ++t) {
        const float pos = float(positions[t]);
        for (int i = 0; i < half; ++i) {
            const float angle = pos * inv_freq[i];
            cos_v[size_t(i)] = std::cos(angle);
            sin_v[size_t(i)] = std::sin(angle);
        }
        for (int h = 0; h < n_heads; ++h) {
            float* v = x + (size_t(t) * n_heads + h) * head_dim;
            for (int i = 0; i < half; ++i) {
                const float a = v[i], b = v[i + half];
                v[i] = a * cos_v[size_t(i)] - b * sin_v[size_t(i)];
                v[i + half] = b * cos_v[size_t(i)] + a * sin_v[size_t(i)];
            }
        }
    }
}

void rope_apply(float* x, int T, int n_heads, int head_dim, const int64_t* positions, double theta) {
    // The frequency table is cached per thread so that a decode step does not allocate.
    thread_local std::vector<float> inv_freq;
    thread_local int cached_dim = -1;
    thread_local double cached_theta = 0.0;
    if (cached_dim != head_dim || cached_theta != theta) {
        inv_freq = rope_inv_freq(head_dim, theta);
        cached_dim = head_dim;
        cached_theta = theta;
    }
    rope_apply_table(x, T, n_heads, head_dim, positions, inv_freq.data());
}

void attention(const float* q, int T, const int64_t* q_pos, const float* k, const float* v, int S, int64_t k_pos0,
               int n_heads, int n_kv, int head_dim, int window, float* out) {
    const int group = n_heads / n_kv;
    const float scale = 1.0f / std::sqrt(float(head_dim));
    const int q_stride = n_heads * head_dim, kv_stride = n_kv * head_dim;
    thread_local std::vector<float> scores;  // reused: no allocation per decode step
    if (scores.size() < size_t(std::max(S, 1))) scores.resize(size_t(std::max(S, 1)));
    for (int t = 0; t < T; ++t) {
        for (int h = 0; h < n_heads; ++h) {
            const int kvh = h / group;
            const float* qv = q + size_t(t) * q_stride + size_t(h) * head_dim;
            float* o = out + size_t(t) * q_stride + size_t(h) * head_dim;
            float max_s = -INFINITY;
            for (int s = 0; s < S; ++s) {
                const int64_t kp = k_pos0 + s;
                const bool visible = kp <= q_pos[t] && (window <= 0 || q_pos[t] - kp < window);
                if (!visible) {
                    scores[size_t(s)] = -INFINITY;
                    continue;
                }
                const float* kv = k + size_t(s) * kv_stride + size_t(kvh) * head_dim;
                float dot = 0.0f;
                for (int d = 0; d < head_dim; ++d) dot += qv[d] * kv[d];
                scores[size_t(s)] = dot * scale;
                max_s = std::max(max_s, scores[size_t(s)]);
            }
            std::fill(o, o + head_dim, 0.0f);
            if (max_s == -INFINITY) continue;  // nothing visible (cannot happen for causal self-attention)
            float denom = 0.0f;
            for (int s = 0; s < S; ++s) {
                const float e = scores[size_t(s)] == -INFINITY ? 0.0f : std::exp(scores[size_t(s)] - max_s);
                scores[size_t(s)] = e;
                denom += e;
            }
            const float inv = 1.0f / denom;
            for (int s = 0; s < S; ++s) {
                const float p = scores[size_t(s)] * inv;
                if (p == 0.0f) continue;
                const float* vv = v + size_t(s) * kv_stride + size_t(kvh) * head_dim;
                for (int d = 0; d < head_dim; ++d) o[d] += p * vv[d];
            }
        }
    }
}

float silu(float x) { return x / (1.0f + std::exp(-x)); }

float gelu_erf(float x) { return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f)); }

void swiglu(const float* gate, const float* up, size_t n, float* out) {
    for (size_t i = 0; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

void add_inplace(float* y, const float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) y[i] += x[i];
}

void transpose(const float* x, int rows, int cols, float* y) {
    for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) y[size_t(c) * rows + r] = x[size_t(r) * cols + c];
}

}  // namespace qtts::cpu
