// conv_ops against naive loops written straight from the definitions (PyTorch semantics),
// on random inputs, including sizes that make the im2col / column tiling kick in.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/conv_ops.h"
#include "test_support.h"

namespace {

using qtts::cpu::PadMode;

// y[o, t] = b[o] + Σ_{i in group(o)} Σ_k w[o, i - g*cin_g, k] · x[i, t*stride + k*dilation]
std::vector<float> conv1d_naive(const std::vector<float>& x, int Cin, int T, const std::vector<float>& w,
                                const std::vector<float>* b, int Cout, int K, int stride, int dilation, int groups) {
    const int Tout = qtts::cpu::conv1d_out_len(T, K, stride, dilation);
    const int cin_g = Cin / groups, cout_g = Cout / groups;
    std::vector<float> y(size_t(Cout) * Tout);
    for (int o = 0; o < Cout; ++o) {
        const int g = o / cout_g;
        for (int t = 0; t < Tout; ++t) {
            double acc = b ? (*b)[size_t(o)] : 0.0;
            for (int i = 0; i < cin_g; ++i)
                for (int k = 0; k < K; ++k)
                    acc += double(w[(size_t(o) * cin_g + i) * K + k]) *
                           x[size_t(g * cin_g + i) * T + size_t(t) * stride + size_t(k) * dilation];
            y[size_t(o) * Tout + t] = float(acc);
        }
    }
    return y;
}

// y[o, t*stride + k] += w[i, o, k] · x[i, t]  (+ b[o]), no trimming
std::vector<float> conv_transpose1d_naive(const std::vector<float>& x, int Cin, int T, const std::vector<float>& w,
                                          const std::vector<float>* b, int Cout, int K, int stride) {
    const int Tout = (T - 1) * stride + K;
    std::vector<double> acc(size_t(Cout) * Tout, 0.0);
    for (int o = 0; o < Cout; ++o)
        for (int m = 0; m < Tout; ++m) acc[size_t(o) * Tout + m] = b ? (*b)[size_t(o)] : 0.0;
    for (int i = 0; i < Cin; ++i)
        for (int o = 0; o < Cout; ++o)
            for (int k = 0; k < K; ++k)
                for (int t = 0; t < T; ++t)
                    acc[size_t(o) * Tout + size_t(t) * stride + k] +=
                        double(w[(size_t(i) * Cout + o) * K + k]) * x[size_t(i) * T + t];
    return std::vector<float>(acc.begin(), acc.end());
}

double max_abs(const std::vector<float>& v) {
    double m = 0.0;
    for (float f : v) m = std::max(m, double(std::fabs(f)));
    return m;
}

struct ConvCase {
    int Cin, Cout, K, stride, dilation, groups, T;
    bool bias;
};

}  // namespace

TEST_CASE("conv1d matches the naive definition", "[conv_ops]") {
    const ConvCase cases[] = {
        {4, 6, 3, 1, 1, 1, 20, true},      // plain causal-style conv
        {6, 4, 7, 2, 3, 2, 50, true},      // stride + dilation + groups
        {5, 5, 7, 1, 1, 5, 30, true},      // depthwise (direct loop)
        {5, 5, 7, 3, 2, 5, 41, false},     // depthwise, strided and dilated, no bias
        {3, 6, 3, 1, 2, 3, 17, true},      // groups with channel multiplier 2
        {8, 5, 1, 1, 1, 1, 33, true},      // 1×1 (straight sgemm)
        {8, 6, 1, 1, 1, 2, 33, false},     // grouped 1×1
        {8, 5, 1, 2, 1, 1, 33, true},      // strided 1×1 (im2col path)
        {64, 8, 7, 1, 2, 1, 20000, true},  // long: several im2col column tiles
        {16, 16, 7, 1, 9, 1, 60, true},    // dilation 9 as in the decoder's residual units
    };
    uint64_t seed = 1;
    for (const ConvCase& c : cases) {
        CAPTURE(c.Cin, c.Cout, c.K, c.stride, c.dilation, c.groups, c.T, c.bias);
        const auto x = qtts_test::random_floats(size_t(c.Cin) * c.T, seed++);
        const auto w = qtts_test::random_floats(size_t(c.Cout) * (c.Cin / c.groups) * c.K, seed++);
        const auto b = qtts_test::random_floats(size_t(c.Cout), seed++);
        const int Tout = qtts::cpu::conv1d_out_len(c.T, c.K, c.stride, c.dilation);
        REQUIRE(Tout == (c.T - c.dilation * (c.K - 1) - 1) / c.stride + 1);
        std::vector<float> y(size_t(c.Cout) * Tout, -777.0f);
        qtts::cpu::conv1d(x.data(), c.Cin, c.T, w.data(), c.bias ? b.data() : nullptr, c.Cout, c.K, c.stride, c.dilation,
                          c.groups, y.data());
        const auto ref = conv1d_naive(x, c.Cin, c.T, w, c.bias ? &b : nullptr, c.Cout, c.K, c.stride, c.dilation, c.groups);
        REQUIRE(max_abs(ref) > 0.1);
        const double err = qtts_test::max_abs_error(y.data(), ref.data(), ref.size());
        CHECK(err < 1e-5 * std::max(1.0, max_abs(ref)));
    }
}

TEST_CASE("conv1d on a too-short signal writes nothing", "[conv_ops]") {
    const auto x = qtts_test::random_floats(3 * 4, 7);
    const auto w = qtts_test::random_floats(2 * 3 * 3, 8);
    REQUIRE(qtts::cpu::conv1d_out_len(4, 3, 1, 2) == 0);
    std::vector<float> y(4, 123.0f);
    qtts::cpu::conv1d(x.data(), 3, 4, w.data(), nullptr, 2, 3, 1, 2, 1, y.data());
    for (float v : y) CHECK(v == 123.0f);
}

TEST_CASE("conv_transpose1d matches the naive definition (untrimmed)", "[conv_ops]") {
    struct Case {
        int Cin, Cout, K, stride, T;
        bool bias;
    };
    const Case cases[] = {
        {4, 3, 4, 2, 10, true},       // k = 2s (decoder blocks)
        {5, 6, 10, 5, 7, true},       // k = 2s, r = 5
        {3, 3, 2, 2, 9, true},        // k = s (decoder upsample stages)
        {3, 2, 2, 3, 5, false},       // k < s: gaps stay at the bias (zero)
        {2, 4, 7, 2, 1, true},        // a single input step
        {16, 64, 16, 8, 10000, true}, // long: several column tiles
    };
    uint64_t seed = 100;
    for (const Case& c : cases) {
        CAPTURE(c.Cin, c.Cout, c.K, c.stride, c.T, c.bias);
        const auto x = qtts_test::random_floats(size_t(c.Cin) * c.T, seed++);
        const auto w = qtts_test::random_floats(size_t(c.Cin) * c.Cout * c.K, seed++);
        const auto b = qtts_test::random_floats(size_t(c.Cout), seed++);
        const int Tout = qtts::cpu::conv_transpose1d_out_len(c.T, c.K, c.stride);
        REQUIRE(Tout == (c.T - 1) * c.stride + c.K);
        std::vector<float> y(size_t(c.Cout) * Tout, -777.0f);
        qtts::cpu::conv_transpose1d(x.data(), c.Cin, c.T, w.data(), c.bias ? b.data() : nullptr, c.Cout, c.K, c.stride,
                                    y.data());
        const auto ref = conv_transpose1d_naive(x, c.Cin, c.T, w, c.bias ? &b : nullptr, c.Cout, c.K, c.stride);
        REQUIRE(max_abs(ref) > 0.1);
        CHECK(qtts_test::max_abs_error(y.data(), ref.data(), ref.size()) < 1e-5 * std::max(1.0, max_abs(ref)));
    }
}

TEST_CASE("pad1d zero / reflect / replicate", "[conv_ops]") {
    const int C = 3, T = 6, left = 4, right = 5;
    const auto x = qtts_test::random_floats(size_t(C) * T, 55);
    for (PadMode mode : {PadMode::PAD_ZERO, PadMode::PAD_REFLECT, PadMode::PAD_REPLICATE}) {
        const auto y = qtts::cpu::pad1d(x.data(), C, T, left, right, mode);
        REQUIRE(y.size() == size_t(C) * (left + T + right));
        for (int c = 0; c < C; ++c) {
            for (int j = 0; j < left + T + right; ++j) {
                const int i = j - left;  // source index before clamping/reflecting
                float expect;
                if (i >= 0 && i < T) {
                    expect = x[size_t(c) * T + i];
                } else if (mode == PadMode::PAD_ZERO) {
                    expect = 0.0f;
                } else if (mode == PadMode::PAD_REPLICATE) {
                    expect = x[size_t(c) * T + (i < 0 ? 0 : T - 1)];
                } else {
                    const int r = i < 0 ? -i : 2 * (T - 1) - i;  // reflect without repeating the edge
                    expect = x[size_t(c) * T + r];
                }
                CAPTURE(int(mode), c, j);
                CHECK(y[size_t(c) * (left + T + right) + j] == expect);
            }
        }
    }
    CHECK_THROWS_AS(qtts::cpu::pad1d(x.data(), C, T, T, 0, PadMode::PAD_REFLECT), qtts::Error);
    CHECK_THROWS_AS(qtts::cpu::pad1d(x.data(), C, T, 0, -1, PadMode::PAD_ZERO), qtts::Error);
}

TEST_CASE("snake_beta with log-scale alpha and beta", "[conv_ops]") {
    const int C = 5, T = 37;
    auto x = qtts_test::random_floats(size_t(C) * T, 9, -3.0f, 3.0f);
    const auto log_alpha = qtts_test::random_floats(size_t(C), 10, -0.5f, 0.5f);
    const auto log_beta = qtts_test::random_floats(size_t(C), 11, -0.5f, 0.5f);
    const auto x0 = x;
    qtts::cpu::snake_beta(x.data(), C, T, log_alpha.data(), log_beta.data());
    for (int c = 0; c < C; ++c) {
        const double a = std::exp(double(log_alpha[size_t(c)])), b = std::exp(double(log_beta[size_t(c)]));
        for (int t = 0; t < T; ++t) {
            const double v = x0[size_t(c) * T + t];
            const double s = std::sin(a * v);
            const double expect = v + s * s / (b + 1e-9);
            CHECK(std::fabs(x[size_t(c) * T + t] - expect) < 2e-6 * std::max(1.0, std::fabs(expect)));
        }
    }
    // Zero stays zero: causal zero padding may be applied before or after the activation.
    std::vector<float> zeros(size_t(C) * 3, 0.0f);
    qtts::cpu::snake_beta(zeros.data(), C, 3, log_alpha.data(), log_beta.data());
    for (float v : zeros) CHECK(v == 0.0f);
}

TEST_CASE("elu_inplace", "[conv_ops]") {
    auto x = qtts_test::random_floats(64, 12, -4.0f, 4.0f);
    const auto x0 = x;
    qtts::cpu::elu_inplace(x.data(), x.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const double expect = x0[i] > 0 ? x0[i] : std::expm1(double(x0[i]));
        CHECK(std::fabs(x[i] - expect) < 1e-6);
    }
}
