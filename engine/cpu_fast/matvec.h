// Packed weight matrices and the matrix products of the fast CPU backend.
//
// A PackedMatrix holds W [rows, cols] (row-major, out × in as in the checkpoint) in bf16 or int8
// (one fp32 scale per row: w ≈ scale[r] · q[r][c], q in -127..127, scale = max|w[r]| / 127),
// converted once at load. Products read the packed bytes once and accumulate in fp32:
//
//   y[T, rows] = x[T, cols] · Wᵀ  (+ bias[rows])
//
// Three instruction paths with the same arithmetic: AVX-512F, AVX2 + FMA and portable scalar,
// compiled with per-function target attributes (the binary runs on any x86-64) and picked at run
// time from what the CPU supports (matvec_isa_best). Any shape works: columns past the last full
// vector and rows past the last group of four go through a scalar tail.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "engine/cpu_fast/thread_pool.h"

namespace qtts::cpu_fast {

enum class WeightFormat { WEIGHT_FORMAT_BF16, WEIGHT_FORMAT_INT8 };
const char* weight_format_name(WeightFormat format);  // "bf16", "int8"
// "bf16" or "int8"; anything else throws ERROR_INVALID_ARGUMENT listing the accepted names.
WeightFormat weight_format_parse(const std::string& name);

enum class MatvecIsa { MATVEC_ISA_SCALAR, MATVEC_ISA_AVX2, MATVEC_ISA_AVX512 };
const char* matvec_isa_name(MatvecIsa isa);  // "scalar", "avx2", "avx512"
bool matvec_isa_supported(MatvecIsa isa);    // can this CPU run it
MatvecIsa matvec_isa_best();                 // the widest supported path

// fp32 -> bf16, round to nearest even (NaN stays NaN); bf16 -> fp32 is exact.
inline uint16_t f32_to_bf16(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return uint16_t(bits >> 16);
}
inline float bf16_to_f32(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// 64-byte aligned bytes (whole cache lines for the streaming loads).
struct AlignedBytes {
    struct Free {
        void operator()(uint8_t* p) const;
    };
    std::unique_ptr<uint8_t[], Free> data;
    size_t size = 0;
    void resize(size_t n);  // contents undefined
};

struct PackedMatrix {
    WeightFormat format = WeightFormat::WEIGHT_FORMAT_BF16;
    int rows = 0;
    int cols = 0;
    AlignedBytes values;        // [rows, cols] bf16 (uint16) or int8
    AlignedBytes scales_bytes;  // int8: [rows] fp32 scales
    const uint16_t* bf16() const { return reinterpret_cast<const uint16_t*>(values.data.get()); }
    const int8_t* int8() const { return reinterpret_cast<const int8_t*>(values.data.get()); }
    const float* scales() const { return reinterpret_cast<const float*>(scales_bytes.data.get()); }
    size_t bytes() const { return values.size + scales_bytes.size; }  // read by one product
    bool empty() const { return rows == 0; }
};

// Packs an fp32 matrix W [rows, cols] (bf16: round to nearest even, exact for bf16 checkpoints).
PackedMatrix matrix_pack(const float* W, int rows, int cols, WeightFormat format);
// The fp32 matrix the packed one stands for (tests, error measurements).
void matrix_unpack(const PackedMatrix& m, float* W);

// Rows r0..r1-1 of y[T, ldy] = x[T, ldx] · Wᵀ (+ bias), on one thread with the given path (which
// must be supported). x rows hold at least W.cols values.
void matmul_rows(MatvecIsa isa, const PackedMatrix& W, const float* x, int T, size_t ldx, const float* bias, float* y,
                 size_t ldy, int r0, int r1);

// Below this many weights × rows a product runs on the calling thread alone: waking the workers
// costs more than it saves on small matrices (the tiny models; every matrix of the real ones is
// above it).
constexpr size_t MATMUL_PARALLEL_MIN = size_t(1) << 18;

// The whole product, the rows split across the pool's threads (whole cache lines per part) when
// W.rows · W.cols · T >= parallel_min, on the best supported path. y [T, W.rows], x [T, W.cols].
void matmul(ThreadPool& pool, const PackedMatrix& W, const float* x, int T, const float* bias, float* y,
            size_t parallel_min = MATMUL_PARALLEL_MIN);

}  // namespace qtts::cpu_fast
