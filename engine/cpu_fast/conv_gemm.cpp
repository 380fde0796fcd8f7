#include "engine/cpu_fast/conv_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/common/error.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define QTTS_X86 1
#define QTTS_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace qtts::cpu_fast {

const char* conv_format_name(ConvFormat format) { return format == ConvFormat::CONV_FORMAT_BF16 ? "bf16" : "fp32"; }

ConvFormat conv_format_parse(const std::string& name) {
    if (name == "fp32") return ConvFormat::CONV_FORMAT_FP32;
    if (name == "bf16") return ConvFormat::CONV_FORMAT_BF16;
    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown decoder weight format '{}': use fp32 or bf16", name);
}

namespace {

// Time rows per register block: 6 rows × 2 vectors = 12 accumulators (+ 2 weights + 1 broadcast
// = 15 of the 16 ymm registers).
constexpr int BLOCK_ROWS = 6;
// Rows of one unit of parallel work (a panel's slice of time).
constexpr int TILE_ROWS = 8 * BLOCK_ROWS;
// Below this many multiply-adds a product stays on the calling thread.
constexpr size_t CONV_PARALLEL_MIN = size_t(1) << 18;

// Packs W given as a function (co, ci, k) -> value into panels [P][k][cin][16].
template <typename Get>
PackedConv pack_with(Get get, const float* bias, int cout, int cin, int k, int dilation, ConvFormat format) {
    if (cout < 1 || cin < 1 || k < 1 || dilation < 1)
        fail(ErrorCode::ERROR_SHAPE, "conv_pack: bad shape cout {} cin {} k {} dilation {}", cout, cin, k, dilation);
    PackedConv c;
    c.format = format;
    c.cout = cout;
    c.cin = cin;
    c.k = k;
    c.dilation = dilation;
    const size_t count = size_t(c.panels()) * size_t(k) * size_t(cin) * CONV_PANEL;
    const bool bf16 = format == ConvFormat::CONV_FORMAT_BF16;
    c.values.resize(count * (bf16 ? sizeof(uint16_t) : sizeof(float)));
    auto* f32 = reinterpret_cast<float*>(c.values.data.get());
    auto* b16 = reinterpret_cast<uint16_t*>(c.values.data.get());
    size_t i = 0;
    for (int p = 0; p < c.panels(); ++p)
        for (int kk = 0; kk < k; ++kk)
            for (int ci = 0; ci < cin; ++ci)
                for (int lane = 0; lane < CONV_PANEL; ++lane, ++i) {
                    const int co = p * CONV_PANEL + lane;
                    const float v = co < cout ? get(co, ci, kk) : 0.0f;
                    if (bf16) b16[i] = f32_to_bf16(v);
                    else f32[i] = v;
                }
    if (bias) {
        c.bias.resize(sizeof(float) * size_t(cout));
        std::memcpy(c.bias.data.get(), bias, sizeof(float) * size_t(cout));
    }
    return c;
}

inline float packed_value(const PackedConv& c, size_t i) {
    return c.format == ConvFormat::CONV_FORMAT_BF16 ? bf16_to_f32(reinterpret_cast<const uint16_t*>(c.values.data.get())[i])
                                                    : reinterpret_cast<const float*>(c.values.data.get())[i];
}

// Writes a block's results acc [rows][16] for output channels co0..co0+valid-1.
inline void block_store(const float* acc, int rows, float* y, size_t ldy, int co0, int valid, const float* bias,
                        bool accumulate) {
    for (int j = 0; j < rows; ++j) {
        float* yr = y + size_t(j) * ldy + co0;
        const float* a = acc + j * CONV_PANEL;
        for (int l = 0; l < valid; ++l) {
            const float v = a[l] + (bias ? bias[co0 + l] : 0.0f);
            yr[l] = accumulate ? yr[l] + v : v;
        }
    }
}

// One panel over rows t0..t0+rows-1 of the output, scalar.
void block_scalar(const PackedConv& c, int p, const float* x, size_t ldx, int t0, int rows, float* y, size_t ldy,
                  bool accumulate) {
    float acc[BLOCK_ROWS * CONV_PANEL];
    std::fill(acc, acc + BLOCK_ROWS * CONV_PANEL, 0.0f);
    const size_t panel0 = size_t(p) * size_t(c.k) * size_t(c.cin) * CONV_PANEL;
    for (int kk = 0; kk < c.k; ++kk)
        for (int j = 0; j < rows; ++j) {
            const float* xr = x + size_t(t0 + j + kk * c.dilation) * ldx;
            float* a = acc + j * CONV_PANEL;
            for (int ci = 0; ci < c.cin; ++ci) {
                const size_t w0 = panel0 + (size_t(kk) * c.cin + ci) * CONV_PANEL;
                for (int l = 0; l < CONV_PANEL; ++l) a[l] += packed_value(c, w0 + size_t(l)) * xr[ci];
            }
        }
    const int co0 = p * CONV_PANEL;
    block_store(acc, rows, y + size_t(t0) * ldy, ldy, co0, std::min(CONV_PANEL, c.cout - co0), c.bias_f32(), accumulate);
}

#ifdef QTTS_X86

template <bool BF16>
QTTS_AVX2 inline void weights_load(const uint8_t* w, size_t i, __m256& w0, __m256& w1) {
    if constexpr (BF16) {
        const auto* h = reinterpret_cast<const uint16_t*>(w) + i;
        const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
        const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + 8)));
        w0 = _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16));
        w1 = _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16));
    } else {
        const float* f = reinterpret_cast<const float*>(w) + i;
        w0 = _mm256_loadu_ps(f);
        w1 = _mm256_loadu_ps(f + 8);
    }
}

// One panel (16 output channels) over ROWS output rows starting at t0: 2·ROWS accumulators,
// named one by one (an array of them made GCC store every accumulator back to the stack on each
// step, halving the speed).
template <bool BF16, int ROWS>
QTTS_AVX2 void block_avx2(const PackedConv& c, int p, const float* x, size_t ldx, int t0, float* y, size_t ldy,
                          bool accumulate) {
    static_assert(ROWS >= 1 && ROWS <= BLOCK_ROWS, "block rows");
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00;
    __m256 a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
    const uint8_t* w = c.values.data.get();
    const size_t panel0 = size_t(p) * size_t(c.k) * size_t(c.cin) * CONV_PANEL;
    for (int kk = 0; kk < c.k; ++kk) {
        const float* x0 = x + size_t(t0 + kk * c.dilation) * ldx;
        const float* x1 = x0 + ldx;
        const float* x2 = x1 + ldx;
        const float* x3 = x2 + ldx;
        const float* x4 = x3 + ldx;
        const float* x5 = x4 + ldx;
        size_t wi = panel0 + size_t(kk) * size_t(c.cin) * CONV_PANEL;
        for (int ci = 0; ci < c.cin; ++ci, wi += CONV_PANEL) {
            __m256 w0, w1;
            weights_load<BF16>(w, wi, w0, w1);
            __m256 xv = _mm256_broadcast_ss(x0 + ci);
            a00 = _mm256_fmadd_ps(w0, xv, a00);
            a01 = _mm256_fmadd_ps(w1, xv, a01);
            if constexpr (ROWS > 1) {
                xv = _mm256_broadcast_ss(x1 + ci);
                a10 = _mm256_fmadd_ps(w0, xv, a10);
                a11 = _mm256_fmadd_ps(w1, xv, a11);
            }
            if constexpr (ROWS > 2) {
                xv = _mm256_broadcast_ss(x2 + ci);
                a20 = _mm256_fmadd_ps(w0, xv, a20);
                a21 = _mm256_fmadd_ps(w1, xv, a21);
            }
            if constexpr (ROWS > 3) {
                xv = _mm256_broadcast_ss(x3 + ci);
                a30 = _mm256_fmadd_ps(w0, xv, a30);
                a31 = _mm256_fmadd_ps(w1, xv, a31);
            }
            if constexpr (ROWS > 4) {
                xv = _mm256_broadcast_ss(x4 + ci);
                a40 = _mm256_fmadd_ps(w0, xv, a40);
                a41 = _mm256_fmadd_ps(w1, xv, a41);
            }
            if constexpr (ROWS > 5) {
                xv = _mm256_broadcast_ss(x5 + ci);
                a50 = _mm256_fmadd_ps(w0, xv, a50);
                a51 = _mm256_fmadd_ps(w1, xv, a51);
            }
        }
    }
    float acc[BLOCK_ROWS * CONV_PANEL];  // [rows][16]
    _mm256_storeu_ps(acc + 0, a00), _mm256_storeu_ps(acc + 8, a01);
    _mm256_storeu_ps(acc + 16, a10), _mm256_storeu_ps(acc + 24, a11);
    _mm256_storeu_ps(acc + 32, a20), _mm256_storeu_ps(acc + 40, a21);
    _mm256_storeu_ps(acc + 48, a30), _mm256_storeu_ps(acc + 56, a31);
    _mm256_storeu_ps(acc + 64, a40), _mm256_storeu_ps(acc + 72, a41);
    _mm256_storeu_ps(acc + 80, a50), _mm256_storeu_ps(acc + 88, a51);
    const int co0 = p * CONV_PANEL;
    const float* bias = c.bias_f32();
    if (co0 + CONV_PANEL > c.cout) {
        block_store(acc, ROWS, y + size_t(t0) * ldy, ldy, co0, c.cout - co0, bias, accumulate);
        return;
    }
    const __m256 b0 = bias ? _mm256_loadu_ps(bias + co0) : _mm256_setzero_ps();
    const __m256 b1 = bias ? _mm256_loadu_ps(bias + co0 + 8) : _mm256_setzero_ps();
    for (int j = 0; j < ROWS; ++j) {
        float* yr = y + size_t(t0 + j) * ldy + co0;
        __m256 v0 = _mm256_add_ps(_mm256_loadu_ps(acc + j * CONV_PANEL), b0);
        __m256 v1 = _mm256_add_ps(_mm256_loadu_ps(acc + j * CONV_PANEL + 8), b1);
        if (accumulate) {
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(yr));
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(yr + 8));
        }
        _mm256_storeu_ps(yr, v0);
        _mm256_storeu_ps(yr + 8, v1);
    }
}

template <bool BF16>
void rows_avx2(const PackedConv& c, int p, const float* x, size_t ldx, int t0, int t1, float* y, size_t ldy,
               bool accumulate) {
    int t = t0;
    for (; t + BLOCK_ROWS <= t1; t += BLOCK_ROWS) block_avx2<BF16, BLOCK_ROWS>(c, p, x, ldx, t, y, ldy, accumulate);
    switch (t1 - t) {
        case 5: block_avx2<BF16, 5>(c, p, x, ldx, t, y, ldy, accumulate); break;
        case 4: block_avx2<BF16, 4>(c, p, x, ldx, t, y, ldy, accumulate); break;
        case 3: block_avx2<BF16, 3>(c, p, x, ldx, t, y, ldy, accumulate); break;
        case 2: block_avx2<BF16, 2>(c, p, x, ldx, t, y, ldy, accumulate); break;
        case 1: block_avx2<BF16, 1>(c, p, x, ldx, t, y, ldy, accumulate); break;
        default: break;
    }
}

// sin²(z) for 8 lanes: z reduced by the nearest multiple of π (sin² has period π; three-part
// Cody-Waite constants keep the reduction exact for |z| up to ~1e5), then the odd Taylor
// polynomial of degree 11 on [-π/2, π/2] (truncation error below 6e-8).
QTTS_AVX2 inline __m256 sin_squared(__m256 z) {
    const __m256 k = _mm256_round_ps(_mm256_mul_ps(z, _mm256_set1_ps(0.318309886183790671f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(3.140625f), z);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(9.67502593994140625e-4f), r);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.509957990978376432e-7f), r);
    const __m256 r2 = _mm256_mul_ps(r, r);
    __m256 poly = _mm256_set1_ps(-2.5052108385441718775e-8f);                        // -1/11!
    poly = _mm256_fmadd_ps(poly, r2, _mm256_set1_ps(2.7557319223985890653e-6f));      //  1/9!
    poly = _mm256_fmadd_ps(poly, r2, _mm256_set1_ps(-1.9841269841269841270e-4f));     // -1/7!
    poly = _mm256_fmadd_ps(poly, r2, _mm256_set1_ps(8.3333333333333333333e-3f));      //  1/5!
    poly = _mm256_fmadd_ps(poly, r2, _mm256_set1_ps(-1.6666666666666666667e-1f));     // -1/3!
    const __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(poly, r2), r, r);
    return _mm256_mul_ps(s, s);
}

QTTS_AVX2 void snake_avx2(float* x, int T, int C, const float* alpha, const float* inv_beta) {
    for (int t = 0; t < T; ++t) {
        float* row = x + size_t(t) * C;
        int c = 0;
        for (; c + 8 <= C; c += 8) {
            const __m256 v = _mm256_loadu_ps(row + c);
            const __m256 s2 = sin_squared(_mm256_mul_ps(_mm256_loadu_ps(alpha + c), v));
            _mm256_storeu_ps(row + c, _mm256_fmadd_ps(_mm256_loadu_ps(inv_beta + c), s2, v));
        }
        for (; c < C; ++c) {
            const float s = std::sin(alpha[c] * row[c]);
            row[c] += inv_beta[c] * (s * s);
        }
    }
}

#endif  // QTTS_X86

// Output rows t0..t1-1 of panel p on the given path.
void panel_rows(MatvecIsa isa, const PackedConv& c, int p, const float* x, size_t ldx, int t0, int t1, float* y,
                size_t ldy, bool accumulate) {
#ifdef QTTS_X86
    if (isa != MatvecIsa::MATVEC_ISA_SCALAR) {
        if (c.format == ConvFormat::CONV_FORMAT_BF16) rows_avx2<true>(c, p, x, ldx, t0, t1, y, ldy, accumulate);
        else rows_avx2<false>(c, p, x, ldx, t0, t1, y, ldy, accumulate);
        return;
    }
#endif
    for (int t = t0; t < t1; t += BLOCK_ROWS)
        block_scalar(c, p, x, ldx, t, std::min(BLOCK_ROWS, t1 - t), y, ldy, accumulate);
}

// The conv paths this CPU can run, widest first: AVX-512 machines take the AVX2 block.
MatvecIsa conv_isa(MatvecIsa isa) {
    return isa == MatvecIsa::MATVEC_ISA_SCALAR ? isa : MatvecIsa::MATVEC_ISA_AVX2;
}

}  // namespace

PackedConv conv_pack(const float* w, const float* bias, int cout, int cin, int k, int dilation, ConvFormat format) {
    // w [cout, cin, k]
    return pack_with([&](int co, int ci, int kk) { return w[(size_t(co) * cin + ci) * k + kk]; }, bias, cout, cin, k,
                     dilation, format);
}

PackedConv linear_pack(const float* w, const float* bias, int out, int in, ConvFormat format) {
    return conv_pack(w, bias, out, in, 1, 1, format);
}

PackedConv trans_conv_pack(const float* w, int cin, int cout, int k, ConvFormat format) {
    // w [cin, cout, k] -> linear row j·cout + co, column ci
    return pack_with([&](int row, int ci, int) { return w[(size_t(ci) * cout + row % cout) * k + row / cout]; },
                     nullptr, k * cout, cin, 1, 1, format);
}

void conv_unpack(const PackedConv& c, float* w) {
    for (int co = 0; co < c.cout; ++co)
        for (int ci = 0; ci < c.cin; ++ci)
            for (int kk = 0; kk < c.k; ++kk) {
                const size_t i =
                    ((size_t(co / CONV_PANEL) * c.k + kk) * size_t(c.cin) + ci) * CONV_PANEL + size_t(co % CONV_PANEL);
                w[(size_t(co) * c.cin + ci) * c.k + kk] = packed_value(c, i);
            }
}

void conv_gemm_isa(MatvecIsa isa, const PackedConv& conv, const float* x, size_t ldx, int T_out, float* y, size_t ldy,
                   bool accumulate) {
    QTTS_ASSERT(matvec_isa_supported(isa) && T_out >= 0 && ldx >= size_t(conv.cin) && ldy >= size_t(conv.cout));
    for (int p = 0; p < conv.panels(); ++p) panel_rows(conv_isa(isa), conv, p, x, ldx, 0, T_out, y, ldy, accumulate);
}

void conv_gemm(ThreadPool& pool, const PackedConv& conv, const float* x, size_t ldx, int T_out, float* y, size_t ldy,
               bool accumulate) {
    QTTS_ASSERT(T_out >= 0 && ldx >= size_t(conv.cin) && ldy >= size_t(conv.cout));
    if (T_out == 0) return;
    const MatvecIsa isa = conv_isa(matvec_isa_best());
    const size_t macs = size_t(conv.cout) * size_t(conv.cin) * size_t(conv.k) * size_t(T_out);
    const int panels = conv.panels();
    const int tiles = (T_out + TILE_ROWS - 1) / TILE_ROWS;
    const int items = panels * tiles;  // panel-major: a part keeps its panels' weights in cache
    const int parts = macs >= CONV_PARALLEL_MIN ? std::min(pool.size(), items) : 1;
    const auto run_items = [&](int i0, int i1) {
        for (int i = i0; i < i1; ++i) {
            const int p = i / tiles, t0 = (i % tiles) * TILE_ROWS;
            panel_rows(isa, conv, p, x, ldx, t0, std::min(T_out, t0 + TILE_ROWS), y, ldy, accumulate);
        }
    };
    if (parts == 1) {
        run_items(0, items);
        return;
    }
    pool.run([&](int part, int) {
        if (part >= parts) return;
        run_items(int(int64_t(items) * part / parts), int(int64_t(items) * (part + 1) / parts));
    });
}

void snake_time_major(MatvecIsa isa, float* x, int T, int C, const float* alpha, const float* inv_beta) {
#ifdef QTTS_X86
    if (isa != MatvecIsa::MATVEC_ISA_SCALAR) {
        snake_avx2(x, T, C, alpha, inv_beta);
        return;
    }
#endif
    for (int t = 0; t < T; ++t) {
        float* row = x + size_t(t) * C;
        for (int c = 0; c < C; ++c) {
            const float s = std::sin(alpha[c] * row[c]);
            row[c] += inv_beta[c] * (s * s);
        }
    }
}

}  // namespace qtts::cpu_fast
