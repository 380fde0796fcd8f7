#include "engine/cpu_fast/matvec.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "engine/common/error.h"

#if defined(__x86_64__)
// GCC 12 reports its own AVX-512 intrinsics (the _mm512_undefined_* placeholders) as
// uninitialised once inlined into a target("avx512f") function; the warning points into the
// header, so it is silenced for this file, whose own variables are all initialised.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define QTTS_X86 1
#define QTTS_AVX2 __attribute__((target("avx2,fma")))
#define QTTS_AVX512 __attribute__((target("avx512f")))
#endif

namespace qtts::cpu_fast {

const char* weight_format_name(WeightFormat format) {
    return format == WeightFormat::WEIGHT_FORMAT_INT8 ? "int8" : "bf16";
}

WeightFormat weight_format_parse(const std::string& name) {
    if (name == "bf16") return WeightFormat::WEIGHT_FORMAT_BF16;
    if (name == "int8") return WeightFormat::WEIGHT_FORMAT_INT8;
    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown CPU weight format '{}': use bf16 or int8", name);
}

const char* matvec_isa_name(MatvecIsa isa) {
    switch (isa) {
        case MatvecIsa::MATVEC_ISA_SCALAR: return "scalar";
        case MatvecIsa::MATVEC_ISA_AVX2: return "avx2";
        case MatvecIsa::MATVEC_ISA_AVX512: return "avx512";
    }
    return "?";
}

bool matvec_isa_supported(MatvecIsa isa) {
    switch (isa) {
        case MatvecIsa::MATVEC_ISA_SCALAR: return true;
#ifdef QTTS_X86
        case MatvecIsa::MATVEC_ISA_AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
        case MatvecIsa::MATVEC_ISA_AVX512: return __builtin_cpu_supports("avx512f");
#else
        default: return false;
#endif
    }
    return false;
}

MatvecIsa matvec_isa_best() {
    static const MatvecIsa best = [] {
        if (matvec_isa_supported(MatvecIsa::MATVEC_ISA_AVX512)) return MatvecIsa::MATVEC_ISA_AVX512;
        if (matvec_isa_supported(MatvecIsa::MATVEC_ISA_AVX2)) return MatvecIsa::MATVEC_ISA_AVX2;
        return MatvecIsa::MATVEC_ISA_SCALAR;
    }();
    return best;
}

void AlignedBytes::Free::operator()(uint8_t* p) const { std::free(p); }

void AlignedBytes::resize(size_t n) {
    const size_t rounded = std::max<size_t>(64, (n + 63) / 64 * 64);
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, rounded));
    if (!p) fail(ErrorCode::ERROR_INTERNAL, "out of memory packing {} bytes of weights", n);
    data.reset(p);
    size = n;
}

namespace {

// ---- value loaders: one weight as fp32 (scalar), eight (AVX2) or sixteen (AVX-512) ----------

struct Bf16 {
    using Value = uint16_t;
    static const Value* base(const PackedMatrix& m) { return m.bf16(); }
    static float one(const Value* p) { return bf16_to_f32(*p); }
#ifdef QTTS_X86
    QTTS_AVX2 static inline __m256 eight(const Value* p) {
        const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    QTTS_AVX512 static inline __m512 sixteen(const Value* p) {
        const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
#endif
};

struct Int8 {
    using Value = int8_t;
    static const Value* base(const PackedMatrix& m) { return m.int8(); }
    static float one(const Value* p) { return float(*p); }
#ifdef QTTS_X86
    QTTS_AVX2 static inline __m256 eight(const Value* p) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
    QTTS_AVX512 static inline __m512 sixteen(const Value* p) {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    }
#endif
};

// ---- dot products of R weight rows with TT activation rows: dots[t·R + k] = Σ_c w[k][c] · x_t[c] ----
// x_t = x + t·ldx. Each weight vector is converted once and meets every activation row: over
// several rows (a batched step's) the conversions, not the memory, bound a product. Every dot
// has two accumulators over the same columns in the same order whatever R and TT, so it is
// bitwise the dot a single row gets (a batched step's rows equal each stream alone).

template <typename L, int R, int TT>
void dots_scalar(const typename L::Value* const* w, const float* x, size_t ldx, int C, float* dots) {
    for (int t = 0; t < TT; ++t)
        for (int k = 0; k < R; ++k) {
            const float* xt = x + size_t(t) * ldx;
            float acc = 0.0f;
            for (int c = 0; c < C; ++c) acc += L::one(w[k] + c) * xt[c];
            dots[t * R + k] = acc;
        }
}

#ifdef QTTS_X86
QTTS_AVX2 inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// Two accumulators per dot (16 columns per step) keep 2·R·TT independent FMA chains in flight.
// `ahead` (may be null): the next rows' bytes, prefetched at the rate these rows are consumed, so
// a group of rows is in flight while the previous one is multiplied (one thread alone does not
// keep enough cache-line requests outstanding to stream at the memory's bandwidth).
template <typename L, int R, int TT>
QTTS_AVX2 void dots_avx2(const typename L::Value* const* w, const float* x, size_t ldx, int C, float* dots,
                         const char* ahead) {
    __m256 a[TT][R], b[TT][R];
    for (int t = 0; t < TT; ++t)
        for (int k = 0; k < R; ++k) a[t][k] = b[t][k] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 16 <= C; c += 16) {
        if (ahead) {
            const char* p = ahead + size_t(c) * R * sizeof(typename L::Value);
            for (size_t line = 0; line < R * 16 * sizeof(typename L::Value); line += 64)
                _mm_prefetch(p + line, _MM_HINT_T0);
        }
        for (int k = 0; k < R; ++k) {
            const __m256 w0 = L::eight(w[k] + c), w1 = L::eight(w[k] + c + 8);
            for (int t = 0; t < TT; ++t) {
                const float* xt = x + size_t(t) * ldx + c;
                a[t][k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xt), a[t][k]);
                b[t][k] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xt + 8), b[t][k]);
            }
        }
    }
    for (; c + 8 <= C; c += 8)
        for (int k = 0; k < R; ++k) {
            const __m256 w0 = L::eight(w[k] + c);
            for (int t = 0; t < TT; ++t) a[t][k] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + size_t(t) * ldx + c), a[t][k]);
        }
    for (int t = 0; t < TT; ++t)
        for (int k = 0; k < R; ++k) {
            const float* xt = x + size_t(t) * ldx;
            float acc = hsum8(_mm256_add_ps(a[t][k], b[t][k]));
            for (int j = c; j < C; ++j) acc += L::one(w[k] + j) * xt[j];
            dots[t * R + k] = acc;
        }
}

template <typename L, int R, int TT>
QTTS_AVX512 void dots_avx512(const typename L::Value* const* w, const float* x, size_t ldx, int C, float* dots,
                             const char* ahead) {
    __m512 a[TT][R], b[TT][R];
    for (int t = 0; t < TT; ++t)
        for (int k = 0; k < R; ++k) a[t][k] = b[t][k] = _mm512_setzero_ps();
    int c = 0;
    for (; c + 32 <= C; c += 32) {
        if (ahead) {
            const char* p = ahead + size_t(c) * R * sizeof(typename L::Value);
            for (size_t line = 0; line < R * 32 * sizeof(typename L::Value); line += 64)
                _mm_prefetch(p + line, _MM_HINT_T0);
        }
        for (int k = 0; k < R; ++k) {
            const __m512 w0 = L::sixteen(w[k] + c), w1 = L::sixteen(w[k] + c + 16);
            for (int t = 0; t < TT; ++t) {
                const float* xt = x + size_t(t) * ldx + c;
                a[t][k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(xt), a[t][k]);
                b[t][k] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xt + 16), b[t][k]);
            }
        }
    }
    for (; c + 16 <= C; c += 16)
        for (int k = 0; k < R; ++k) {
            const __m512 w0 = L::sixteen(w[k] + c);
            for (int t = 0; t < TT; ++t) a[t][k] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + size_t(t) * ldx + c), a[t][k]);
        }
    for (int t = 0; t < TT; ++t)
        for (int k = 0; k < R; ++k) {
            const float* xt = x + size_t(t) * ldx;
            float acc = _mm512_reduce_add_ps(_mm512_add_ps(a[t][k], b[t][k]));
            for (int j = c; j < C; ++j) acc += L::one(w[k] + j) * xt[j];
            dots[t * R + k] = acc;
        }
}
#endif

template <typename L, int R, int TT = 1>
void dots(MatvecIsa isa, const typename L::Value* const* w, const float* x, size_t ldx, int C, float* out,
          const char* ahead = nullptr) {
#ifdef QTTS_X86
    if (isa == MatvecIsa::MATVEC_ISA_AVX512) return dots_avx512<L, R, TT>(w, x, ldx, C, out, ahead);
    if (isa == MatvecIsa::MATVEC_ISA_AVX2) return dots_avx2<L, R, TT>(w, x, ldx, C, out, ahead);
#else
    (void)ahead;
#endif
    dots_scalar<L, R, TT>(w, x, ldx, C, out);
}

// Groups of four rows: each weight row is read from memory once and stays in L1 while it meets
// the T activation rows, several at a time where the registers hold their accumulators
// (AVX-512: three rows with the four weight rows; AVX2: two, with two weight rows at a time).
template <typename L>
void rows_product(MatvecIsa isa, const PackedMatrix& W, const float* x, int T, size_t ldx, const float* bias,
                  float* y, size_t ldy, int r0, int r1) {
    const size_t C = size_t(W.cols);
    const typename L::Value* base = L::base(W);
    const float* scales = W.format == WeightFormat::WEIGHT_FORMAT_INT8 ? W.scales() : nullptr;
    float d[12];  // [TT, R] dots of one call
    // Output row t, weight rows r..r+n-1 from d[t0·R + k] (R = stride).
    const auto finish = [&](int t, int r, int n, const float* dt) {
        for (int k = 0; k < n; ++k) {
            float v = dt[k];
            if (scales) v *= scales[r + k];
            if (bias) v += bias[r + k];
            y[size_t(t) * ldy + size_t(r + k)] = v;
        }
    };
    const int C_ = int(C);
    int r = r0;
    for (; r + 4 <= r1; r += 4) {
        const typename L::Value* w[4] = {base + size_t(r) * C, base + size_t(r + 1) * C, base + size_t(r + 2) * C,
                                         base + size_t(r + 3) * C};
        // The next group of four rows (contiguous after these), prefetched during the first pass.
        const char* ahead = r + 8 <= r1 ? reinterpret_cast<const char*>(base + size_t(r + 4) * C) : nullptr;
        int t = 0;
        if (isa == MatvecIsa::MATVEC_ISA_AVX512) {
            for (; t + 3 <= T; t += 3) {
                dots<L, 4, 3>(isa, w, x + size_t(t) * ldx, ldx, C_, d, t == 0 ? ahead : nullptr);
                for (int i = 0; i < 3; ++i) finish(t + i, r, 4, d + 4 * i);
            }
            if (t + 2 == T) {
                dots<L, 4, 2>(isa, w, x + size_t(t) * ldx, ldx, C_, d, t == 0 ? ahead : nullptr);
                for (int i = 0; i < 2; ++i) finish(t + i, r, 4, d + 4 * i);
                t += 2;
            }
        } else if (isa == MatvecIsa::MATVEC_ISA_AVX2) {
            for (; t + 2 <= T; t += 2) {
                // Each half prefetches half of the next group.
                const char* half = ahead ? ahead + 2 * C * sizeof(typename L::Value) : nullptr;
                dots<L, 2, 2>(isa, w, x + size_t(t) * ldx, ldx, C_, d, t == 0 ? ahead : nullptr);
                dots<L, 2, 2>(isa, w + 2, x + size_t(t) * ldx, ldx, C_, d + 4, t == 0 ? half : nullptr);
                for (int i = 0; i < 2; ++i) {
                    finish(t + i, r, 2, d + 2 * i);
                    finish(t + i, r + 2, 2, d + 4 + 2 * i);
                }
            }
        }
        for (; t < T; ++t) {
            dots<L, 4>(isa, w, x + size_t(t) * ldx, ldx, C_, d, t == 0 ? ahead : nullptr);
            finish(t, r, 4, d);
        }
    }
    for (; r < r1; ++r) {
        const typename L::Value* w[1] = {base + size_t(r) * C};
        for (int t = 0; t < T; ++t) {
            dots<L, 1>(isa, w, x + size_t(t) * ldx, ldx, C_, d);
            finish(t, r, 1, d);
        }
    }
}

}  // namespace

PackedMatrix matrix_pack(const float* W, int rows, int cols, WeightFormat format) {
    QTTS_ASSERT(rows > 0 && cols > 0);
    PackedMatrix m;
    m.format = format;
    m.rows = rows;
    m.cols = cols;
    const size_t n = size_t(rows) * size_t(cols);
    if (format == WeightFormat::WEIGHT_FORMAT_BF16) {
        m.values.resize(n * sizeof(uint16_t));
        auto* out = reinterpret_cast<uint16_t*>(m.values.data.get());
        for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(W[i]);
        return m;
    }
    m.values.resize(n);
    m.scales_bytes.resize(size_t(rows) * sizeof(float));
    auto* q = reinterpret_cast<int8_t*>(m.values.data.get());
    auto* scales = reinterpret_cast<float*>(m.scales_bytes.data.get());
    for (int r = 0; r < rows; ++r) {
        const float* row = W + size_t(r) * size_t(cols);
        float amax = 0.0f;
        for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(row[c]));
        const float scale = amax > 0.0f ? amax / 127.0f : 1.0f;
        scales[r] = scale;
        const float inv = 1.0f / scale;
        for (int c = 0; c < cols; ++c) {
            const float v = std::nearbyint(row[c] * inv);
            q[size_t(r) * size_t(cols) + size_t(c)] = int8_t(std::clamp(v, -127.0f, 127.0f));
        }
    }
    return m;
}

void matrix_unpack(const PackedMatrix& m, float* W) {
    const size_t C = size_t(m.cols);
    for (int r = 0; r < m.rows; ++r)
        for (size_t c = 0; c < C; ++c) {
            const size_t i = size_t(r) * C + c;
            W[i] = m.format == WeightFormat::WEIGHT_FORMAT_BF16 ? bf16_to_f32(m.bf16()[i])
                                                                : float(m.int8()[i]) * m.scales()[r];
        }
}

void matmul_rows(MatvecIsa isa, const PackedMatrix& W, const float* x, int T, size_t ldx, const float* bias, float* y,
                 size_t ldy, int r0, int r1) {
    QTTS_ASSERT(matvec_isa_supported(isa));
    QTTS_ASSERT(r0 >= 0 && r0 <= r1 && r1 <= W.rows && T >= 0);
    if (W.format == WeightFormat::WEIGHT_FORMAT_BF16)
        rows_product<Bf16>(isa, W, x, T, ldx, bias, y, ldy, r0, r1);
    else
        rows_product<Int8>(isa, W, x, T, ldx, bias, y, ldy, r0, r1);
}

void matmul(ThreadPool& pool, const PackedMatrix& W, const float* x, int T, const float* bias, float* y,
            size_t parallel_min) {
    const MatvecIsa isa = matvec_isa_best();
    const int rows = W.rows;
    // Parts start on a multiple of 16 rows: the parts' outputs never share a cache line.
    const bool big = size_t(rows) * size_t(W.cols) * size_t(T) >= parallel_min;
    const int parts = big ? std::min(pool.size(), std::max(1, rows / 16)) : 1;
    if (parts == 1) {
        matmul_rows(isa, W, x, T, size_t(W.cols), bias, y, size_t(rows), 0, rows);
        return;
    }
    pool.run([&](int part, int) {
        if (part >= parts) return;
        const int r0 = part == 0 ? 0 : int(int64_t(rows) * part / parts) / 16 * 16;
        const int r1 = part + 1 == parts ? rows : int(int64_t(rows) * (part + 1) / parts) / 16 * 16;
        matmul_rows(isa, W, x, T, size_t(W.cols), bias, y, size_t(rows), r0, r1);
    });
}

}  // namespace qtts::cpu_fast
