// The fast CPU backend's packed products (engine/cpu_fast/matvec.h) against the fp32 reference
// product (cpu::linear) on random inputs: every instruction path this CPU can run, both weight
// formats, odd shapes (column and row tails), one and several activation rows, with bias; the
// threaded split against the one-thread product; the packing error bounds of each format; the
// thread pool's sections. Seeds are printed with each case.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/ops.h"
#include "engine/cpu_fast/matvec.h"
#include "engine/cpu_fast/thread_pool.h"
#include "test_support.h"

using namespace qtts::cpu_fast;
using qtts_test::random_floats;

namespace {

const MatvecIsa ALL_ISAS[] = {MatvecIsa::MATVEC_ISA_SCALAR, MatvecIsa::MATVEC_ISA_AVX2, MatvecIsa::MATVEC_ISA_AVX512};
const WeightFormat ALL_FORMATS[] = {WeightFormat::WEIGHT_FORMAT_BF16, WeightFormat::WEIGHT_FORMAT_INT8};

// max |a - b| / max |b|
double max_rel(const float* a, const float* b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
        den = std::max(den, std::fabs(double(b[i])));
    }
    return num / std::max(den, 1e-30);
}

}  // namespace

TEST_CASE("packed products match the fp32 reference product on every path this CPU runs", "[cpu_fast][matvec]") {
    int paths = 0;
    for (const MatvecIsa isa : ALL_ISAS) {
        if (!matvec_isa_supported(isa)) {
            std::printf("  %-7s not supported by this CPU: not tested here\n", matvec_isa_name(isa));
            continue;
        }
        ++paths;
        for (const WeightFormat format : ALL_FORMATS) {
            for (const int rows : {1, 3, 4, 5, 17, 64}) {
                for (const int cols : {1, 7, 8, 15, 16, 17, 31, 33, 100, 257}) {
                    for (const int T : {1, 3}) {
                        const uint64_t seed = uint64_t(rows) * 100003u + uint64_t(cols) * 101u + uint64_t(T);
                        INFO(matvec_isa_name(isa) << " " << weight_format_name(format) << " rows " << rows << " cols "
                                                  << cols << " T " << T << " seed " << seed);
                        const auto W = random_floats(size_t(rows) * size_t(cols), seed);
                        const auto x = random_floats(size_t(T) * size_t(cols), seed + 1);
                        const auto bias = random_floats(size_t(rows), seed + 2);
                        const PackedMatrix packed = matrix_pack(W.data(), rows, cols, format);
                        std::vector<float> unpacked(W.size());
                        matrix_unpack(packed, unpacked.data());
                        for (const bool with_bias : {false, true}) {
                            const float* b = with_bias ? bias.data() : nullptr;
                            // The reference product of the matrix the packed one stands for.
                            std::vector<float> ref(size_t(T) * size_t(rows));
                            qtts::cpu::linear(x.data(), T, cols, unpacked.data(), b, rows, ref.data());
                            // Output rows written with a stride wider than the matrix, and untouched
                            // outside r0..r1: a split product writes only its own rows.
                            const size_t ldy = size_t(rows) + 3;
                            std::vector<float> y(size_t(T) * ldy, -777.0f);
                            const int r0 = rows > 4 ? 1 : 0;
                            matmul_rows(isa, packed, x.data(), T, size_t(cols), b, y.data(), ldy, r0, rows);
                            double worst = 0.0, scale = 0.0;
                            for (int t = 0; t < T; ++t) {
                                for (int r = 0; r < r0; ++r) CHECK(y[size_t(t) * ldy + size_t(r)] == -777.0f);
                                for (size_t r = size_t(rows); r < ldy; ++r) CHECK(y[size_t(t) * ldy + r] == -777.0f);
                                for (int r = r0; r < rows; ++r) {
                                    const double d = std::fabs(double(y[size_t(t) * ldy + size_t(r)]) -
                                                               ref[size_t(t) * size_t(rows) + size_t(r)]);
                                    worst = std::max(worst, d);
                                }
                            }
                            for (const float v : ref) scale = std::max(scale, double(std::fabs(v)));
                            // fp32 accumulation in a different order: a few ulps of the row sums.
                            CHECK(worst <= 1e-5 * std::max(1.0, scale) * std::sqrt(double(cols)));
                        }
                    }
                }
            }
        }
    }
    CHECK(paths >= 1);
}

TEST_CASE("each row of a several-row product is bitwise that row's one-row product", "[cpu_fast][matvec][batch]") {
    // The batched steps (FastBatchStep) rely on it: a stream's row in a step of n streams must
    // come out as in its own step. T covers the several-row blocks of each path (AVX-512: 3 and
    // 2; AVX2: 2) and their remainders; the shapes have row and column tails.
    for (const MatvecIsa isa : ALL_ISAS) {
        if (!matvec_isa_supported(isa)) continue;
        for (const WeightFormat format : ALL_FORMATS) {
            for (const int rows : {5, 17, 40}) {
                for (const int cols : {7, 33, 100, 257}) {
                    const uint64_t seed = uint64_t(rows) * 7919u + uint64_t(cols);
                    INFO(matvec_isa_name(isa) << " " << weight_format_name(format) << " rows " << rows << " cols "
                                              << cols << " seed " << seed);
                    const auto W = random_floats(size_t(rows) * size_t(cols), seed);
                    const auto bias = random_floats(size_t(rows), seed + 1);
                    const PackedMatrix packed = matrix_pack(W.data(), rows, cols, format);
                    const int max_t = 8;
                    const auto x = random_floats(size_t(max_t) * size_t(cols), seed + 2);
                    std::vector<float> one(size_t(max_t) * size_t(rows), -777.0f);
                    for (int t = 0; t < max_t; ++t)
                        matmul_rows(isa, packed, x.data() + size_t(t) * size_t(cols), 1, size_t(cols), bias.data(),
                                    one.data() + size_t(t) * size_t(rows), size_t(rows), 0, rows);
                    for (int T = 2; T <= max_t; ++T) {
                        std::vector<float> many(size_t(T) * size_t(rows), -777.0f);
                        matmul_rows(isa, packed, x.data(), T, size_t(cols), bias.data(), many.data(), size_t(rows), 0,
                                    rows);
                        INFO("T " << T);
                        CHECK(std::equal(many.begin(), many.end(), one.begin()));
                    }
                }
            }
        }
    }
}

TEST_CASE("packing error stays within each format's bound", "[cpu_fast][matvec]") {
    const int rows = 37, cols = 129;
    const uint64_t seed = 4242;
    INFO("seed " << seed);
    auto W = random_floats(size_t(rows) * size_t(cols), seed, -3.0f, 3.0f);
    W[5] = 0.0f;                                     // exact zeros survive
    for (int c = 0; c < cols; ++c) W[size_t(2 * cols + c)] = 0.0f;  // an all-zero row (scale guard)
    for (const WeightFormat format : ALL_FORMATS) {
        INFO(weight_format_name(format));
        const PackedMatrix p = matrix_pack(W.data(), rows, cols, format);
        CHECK(p.rows == rows);
        CHECK(p.cols == cols);
        std::vector<float> back(W.size());
        matrix_unpack(p, back.data());
        CHECK(back[5] == 0.0f);
        for (int r = 0; r < rows; ++r) {
            float amax = 0.0f;
            for (int c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(W[size_t(r * cols + c)]));
            for (int c = 0; c < cols; ++c) {
                const size_t i = size_t(r * cols + c);
                const double err = std::fabs(double(back[i]) - W[i]);
                if (format == WeightFormat::WEIGHT_FORMAT_BF16)
                    CHECK(err <= std::fabs(W[i]) * (1.0 / 256.0));  // 8 significant bits, rounded
                else
                    CHECK(err <= amax / 254.0 * (1.0 + 1e-5));      // half a step of max|w| / 127
            }
        }
        const size_t expect = format == WeightFormat::WEIGHT_FORMAT_BF16
                                  ? size_t(rows) * size_t(cols) * 2
                                  : size_t(rows) * size_t(cols) + size_t(rows) * sizeof(float);
        CHECK(p.bytes() == expect);
    }
}

TEST_CASE("threaded products equal the one-thread product", "[cpu_fast][matvec][threads]") {
    const int cols = 96;
    for (const int threads : {1, 2, 3, 5}) {
        ThreadPool pool(threads);
        CHECK(pool.size() == threads);
        for (const WeightFormat format : ALL_FORMATS) {
            for (const int rows : {7, 16, 100, 333}) {
                for (const int T : {1, 2}) {
                    const uint64_t seed = uint64_t(threads * 1000 + rows * 10 + T);
                    INFO("threads " << threads << " " << weight_format_name(format) << " rows " << rows << " T " << T
                                    << " seed " << seed);
                    const auto W = random_floats(size_t(rows) * cols, seed);
                    const auto x = random_floats(size_t(T) * cols, seed + 7);
                    const PackedMatrix p = matrix_pack(W.data(), rows, cols, format);
                    std::vector<float> one(size_t(T) * size_t(rows)), many(one.size(), -1.0f);
                    matmul_rows(matvec_isa_best(), p, x.data(), T, cols, nullptr, one.data(), size_t(rows), 0, rows);
                    matmul(pool, p, x.data(), T, nullptr, many.data(), /*parallel_min=*/0);
                    CHECK(max_rel(many.data(), one.data(), one.size()) == 0.0);  // same rows, same arithmetic
                }
            }
        }
    }
}

TEST_CASE("the thread pool runs every part of every section exactly once", "[cpu_fast][threads]") {
    for (const int threads : {1, 2, 4}) {
        ThreadPool pool(threads);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(threads));
        for (auto& h : hits) h = 0;
        const int sections = 2000;
        for (int s = 0; s < sections; ++s)
            pool.run([&](int part, int parts) {
                REQUIRE(parts == threads);
                hits[size_t(part)].fetch_add(1);
            });
        for (int p = 0; p < threads; ++p) CHECK(hits[size_t(p)].load() == sections);
    }
    CHECK(ThreadPool(0).size() == ThreadPool::default_threads());
}

TEST_CASE("weight format names: known ones parse, others are a clear error", "[cpu_fast]") {
    CHECK(weight_format_parse("bf16") == WeightFormat::WEIGHT_FORMAT_BF16);
    CHECK(weight_format_parse("int8") == WeightFormat::WEIGHT_FORMAT_INT8);
    try {
        weight_format_parse("fp4");
        FAIL("fp4 must be refused");
    } catch (const qtts::Error& e) {
        CHECK(e.code() == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find("use bf16 or int8") != std::string::npos);
    }
    CHECK(matvec_isa_supported(matvec_isa_best()));
}
