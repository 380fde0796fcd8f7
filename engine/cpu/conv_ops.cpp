#include "engine/cpu/conv_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include <cblas.h>

#include "engine/common/error.h"
#include "engine/model/weight_prep.h"

namespace qtts::cpu {

namespace {

// Upper bound on the im2col / column-matrix scratch, in floats (16 MiB). Wide signals are
// processed in column tiles that fit; a tile is never narrower than kMinTile columns so the
// sgemm stays efficient even for Cin·K in the thousands.
constexpr size_t kScratchFloats = size_t(4) << 20;
constexpr int kMinTile = 256;

// Per-thread scratch, grown on demand and kept: no allocation per call in steady state.
float* scratch_get(size_t n) {
    thread_local std::vector<float> scratch;
    if (scratch.size() < n) scratch.resize(n);
    return scratch.data();
}

int tile_columns(size_t rows, int total) {
    const size_t fit = std::max<size_t>(1, kScratchFloats / std::max<size_t>(rows, 1));
    return std::min(total, std::max(kMinTile, int(std::min<size_t>(fit, size_t(total)))));
}

}  // namespace

int conv1d_out_len(int T, int K, int stride, int dilation) {
    const int span = dilation * (K - 1) + 1;
    return T < span ? 0 : (T - span) / stride + 1;
}

int conv_transpose1d_out_len(int T, int K, int stride) { return T <= 0 ? 0 : (T - 1) * stride + K; }

void conv1d(const float* x, int Cin, int T, const float* w, const float* b, int Cout, int K, int stride, int dilation,
            int groups, float* y) {
    QTTS_ASSERT(groups >= 1 && Cin % groups == 0 && Cout % groups == 0);
    QTTS_ASSERT(K >= 1 && stride >= 1 && dilation >= 1);
    const int Tout = conv1d_out_len(T, K, stride, dilation);
    if (Tout == 0) return;
    const int cin_g = Cin / groups, cout_g = Cout / groups;

    if (cin_g == 1 && cout_g == 1) {  // depthwise: a direct loop beats any gemm here
        for (int c = 0; c < Cout; ++c) {
            const float* xc = x + size_t(c) * T;
            const float* wc = w + size_t(c) * K;
            float* yc = y + size_t(c) * Tout;
            const float bias = b ? b[c] : 0.0f;
            for (int t = 0; t < Tout; ++t) {
                const float* xt = xc + size_t(t) * stride;
                float acc = 0.0f;
                for (int k = 0; k < K; ++k) acc += wc[k] * xt[size_t(k) * dilation];
                yc[t] = acc + bias;
            }
        }
        return;
    }

    if (K == 1 && stride == 1) {  // 1×1 conv: y_g [cout_g, T] = w_g [cout_g, cin_g] · x_g [cin_g, T]
        for (int g = 0; g < groups; ++g) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, cout_g, Tout, cin_g, 1.0f,
                        w + size_t(g) * cout_g * cin_g, cin_g, x + size_t(g) * cin_g * T, T, 0.0f,
                        y + size_t(g) * cout_g * Tout, Tout);
        }
    } else {
        // im2col per group and column tile: cols [cin_g*K, tile];
        // y_g[:, t0:t0+tile] = w_g [cout_g, cin_g*K] · cols.
        const size_t rows = size_t(cin_g) * K;
        const int tile = tile_columns(rows, Tout);
        float* cols = scratch_get(rows * size_t(tile));
        for (int g = 0; g < groups; ++g) {
            for (int t0 = 0; t0 < Tout; t0 += tile) {
                const int tn = std::min(tile, Tout - t0);
                for (int ci = 0; ci < cin_g; ++ci) {
                    const float* xc = x + size_t(g * cin_g + ci) * T;
                    for (int k = 0; k < K; ++k) {
                        float* row = cols + (size_t(ci) * K + k) * tn;
                        const float* src = xc + size_t(t0) * stride + size_t(k) * dilation;
                        if (stride == 1) {
                            std::memcpy(row, src, sizeof(float) * size_t(tn));
                        } else {
                            for (int t = 0; t < tn; ++t) row[t] = src[size_t(t) * stride];
                        }
                    }
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, cout_g, tn, int(rows), 1.0f,
                            w + size_t(g) * cout_g * rows, int(rows), cols, tn, 0.0f,
                            y + size_t(g) * cout_g * Tout + t0, Tout);
            }
        }
    }
    if (b) {
        for (int c = 0; c < Cout; ++c) {
            float* yc = y + size_t(c) * Tout;
            const float bias = b[c];
            for (int t = 0; t < Tout; ++t) yc[t] += bias;
        }
    }
}

void conv_transpose1d(const float* x, int Cin, int T, const float* w, const float* b, int Cout, int K, int stride,
                      float* y) {
    QTTS_ASSERT(K >= 1 && stride >= 1);
    const int Tout = conv_transpose1d_out_len(T, K, stride);
    if (Tout == 0) return;
    for (int c = 0; c < Cout; ++c) {
        float* yc = y + size_t(c) * Tout;
        std::fill(yc, yc + Tout, b ? b[c] : 0.0f);
    }
    // Per input tile: cols [Cout*K, tile] = wᵀ [Cout*K, Cin] · x[:, t0:t0+tile]; then
    // overlap-add: y[c, t*stride + k] += cols[c*K + k, t].
    const size_t rows = size_t(Cout) * K;
    const int tile = tile_columns(rows, T);
    float* cols = scratch_get(rows * size_t(tile));
    for (int t0 = 0; t0 < T; t0 += tile) {
        const int tn = std::min(tile, T - t0);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, int(rows), tn, Cin, 1.0f, w, int(rows), x + t0, T, 0.0f,
                    cols, tn);
        for (int c = 0; c < Cout; ++c) {
            float* yc = y + size_t(c) * Tout + size_t(t0) * stride;
            for (int k = 0; k < K; ++k) {
                const float* row = cols + (size_t(c) * K + k) * tn;
                for (int t = 0; t < tn; ++t) yc[size_t(t) * stride + k] += row[t];
            }
        }
    }
}

std::vector<float> pad1d(const float* x, int C, int T, int left, int right, PadMode mode) {
    if (left < 0 || right < 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "negative padding {}/{}", left, right);
    if (mode == PadMode::PAD_REFLECT && (left >= T || right >= T))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "reflect padding of {}/{} needs more than {} samples", left, right, T);
    if (mode == PadMode::PAD_REPLICATE && T == 0 && (left > 0 || right > 0))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "replicate padding of an empty signal");
    const int Tp = left + T + right;
    std::vector<float> out(size_t(C) * Tp, 0.0f);
    for (int c = 0; c < C; ++c) {
        const float* xc = x + size_t(c) * T;
        float* oc = out.data() + size_t(c) * Tp;
        if (T > 0) std::memcpy(oc + left, xc, sizeof(float) * size_t(T));
        if (mode == PadMode::PAD_ZERO) continue;
        for (int i = 0; i < left; ++i) oc[left - 1 - i] = mode == PadMode::PAD_REFLECT ? xc[i + 1] : xc[0];
        for (int i = 0; i < right; ++i) oc[left + T + i] = mode == PadMode::PAD_REFLECT ? xc[T - 2 - i] : xc[T - 1];
    }
    return out;
}

void snake_beta(float* x, int C, int T, const float* log_alpha, const float* log_beta) {
    for (int c = 0; c < C; ++c) {
        const float alpha = snake_alpha(log_alpha[c]);
        const float inv_beta = snake_inv_beta(log_beta[c]);
        float* xc = x + size_t(c) * T;
        for (int t = 0; t < T; ++t) {
            const float s = std::sin(alpha * xc[t]);
            xc[t] += inv_beta * (s * s);
        }
    }
}

void elu_inplace(float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) x[i] = x[i] > 0.0f ? x[i] : std::expm1(x[i]);
}

}  // namespace qtts::cpu
