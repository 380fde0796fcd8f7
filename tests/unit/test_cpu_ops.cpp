// The fp32 CPU ops against naive double-precision loops on random inputs.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "engine/cpu/ops.h"
#include "engine/model/weight_prep.h"
#include "test_support.h"

namespace {

using qtts_test::random_floats;

double max_rel(const std::vector<float>& a, const std::vector<double>& b) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        num = std::max(num, std::fabs(double(a[i]) - b[i]));
        den = std::max(den, std::fabs(b[i]));
    }
    return num / std::max(den, 1e-30);
}

// Reference RoPE (rotate-half) on one [heads*dim] row at position pos.
void rope_naive(std::vector<double>& x, size_t offset, int heads, int dim, double pos, double theta) {
    for (int h = 0; h < heads; ++h)
        for (int i = 0; i < dim / 2; ++i) {
            const double angle = pos * std::pow(theta, -2.0 * i / dim);
            double& a = x[offset + size_t(h * dim + i)];
            double& b = x[offset + size_t(h * dim + i + dim / 2)];
            const double a0 = a, b0 = b;
            a = a0 * std::cos(angle) - b0 * std::sin(angle);
            b = b0 * std::cos(angle) + a0 * std::sin(angle);
        }
}

}  // namespace

TEST_CASE("linear matches a naive matrix product (gemv and gemm paths, with bias)", "[ops]") {
    const int in = 37, out = 29;
    const auto W = random_floats(size_t(in * out), 1);
    const auto b = random_floats(size_t(out), 2);
    for (const int T : {1, 5}) {
        const auto x = random_floats(size_t(T * in), 3 + T);
        for (const bool bias : {false, true}) {
            std::vector<float> y(size_t(T * out));
            qtts::cpu::linear(x.data(), T, in, W.data(), bias ? b.data() : nullptr, out, y.data());
            std::vector<double> ref(size_t(T * out));
            for (int t = 0; t < T; ++t)
                for (int o = 0; o < out; ++o) {
                    double s = bias ? b[size_t(o)] : 0.0;
                    for (int i = 0; i < in; ++i) s += double(x[size_t(t * in + i)]) * W[size_t(o * in + i)];
                    ref[size_t(t * out + o)] = s;
                }
            CHECK(max_rel(y, ref) < 1e-5);
        }
    }
}

TEST_CASE("rms_norm matches the formula, also in place", "[ops]") {
    const int T = 4, C = 33;
    const auto x = random_floats(size_t(T * C), 5, -3.0f, 3.0f);
    const auto w = random_floats(size_t(C), 6, 0.5f, 1.5f);
    std::vector<float> y(x.size());
    qtts::cpu::rms_norm(x.data(), T, C, w.data(), 1e-6f, y.data());
    std::vector<double> ref(x.size());
    for (int t = 0; t < T; ++t) {
        double ss = 0.0;
        for (int c = 0; c < C; ++c) ss += double(x[size_t(t * C + c)]) * x[size_t(t * C + c)];
        const double inv = 1.0 / std::sqrt(ss / C + 1e-6);
        for (int c = 0; c < C; ++c) ref[size_t(t * C + c)] = x[size_t(t * C + c)] * inv * w[size_t(c)];
    }
    CHECK(max_rel(y, ref) < 1e-6);
    std::vector<float> z = x;
    qtts::cpu::rms_norm(z.data(), T, C, w.data(), 1e-6f, z.data());
    CHECK(z == y);
}

TEST_CASE("rope_apply: rotate-half pairs (i, i + d/2), per-row positions, norm preserved", "[ops]") {
    const int T = 3, heads = 2, dim = 16;
    const auto x = random_floats(size_t(T * heads * dim), 8);
    const int64_t positions[T] = {0, 7, 1000};
    for (const double theta : {1e4, 1e6}) {
        std::vector<float> y = x;
        qtts::cpu::rope_apply(y.data(), T, heads, dim, positions, theta);
        std::vector<double> ref(x.begin(), x.end());
        for (int t = 0; t < T; ++t) rope_naive(ref, size_t(t * heads * dim), heads, dim, double(positions[t]), theta);
        CHECK(max_rel(y, ref) < 1e-5);
        // position 0 is the identity
        for (int i = 0; i < heads * dim; ++i) CHECK(y[size_t(i)] == x[size_t(i)]);
    }
    // A different head size right after (the op caches its tables per thread).
    std::vector<float> z = random_floats(24, 9);
    const int64_t p[1] = {3};
    std::vector<double> ref(z.begin(), z.end());
    rope_naive(ref, 0, 1, 24, 3.0, 1e6);
    qtts::cpu::rope_apply(z.data(), 1, 1, 24, p, 1e6);
    CHECK(max_rel(z, ref) < 1e-5);
}

TEST_CASE("rope_inv_freq is the textbook table; rope_apply_table with it equals rope_apply", "[ops]") {
    const std::vector<float> inv = qtts::rope_inv_freq(24, 1e6);
    REQUIRE(inv.size() == 12);
    for (size_t i = 0; i < inv.size(); ++i) CHECK(inv[i] == Approx(std::pow(1e6, -2.0 * double(i) / 24)).epsilon(1e-6));
    const auto x = random_floats(2 * 3 * 24, 15);
    const int64_t positions[2] = {5, 77};
    std::vector<float> a = x, b = x;
    qtts::cpu::rope_apply(a.data(), 2, 3, 24, positions, 1e6);
    qtts::cpu::rope_apply_table(b.data(), 2, 3, 24, positions, inv.data());
    CHECK(a == b);
    // Any table: pair i of position p turns by p · inv_freq[i].
    const std::vector<float> custom = {0.5f, -0.25f};
    std::vector<float> c = {1.0f, 0.0f, 0.0f, 1.0f};  // one head of dim 4: pairs (0,2) and (1,3)
    const int64_t p3[1] = {3};
    qtts::cpu::rope_apply_table(c.data(), 1, 1, 4, p3, custom.data());
    CHECK(c[0] == Approx(std::cos(1.5)));
    CHECK(c[2] == Approx(std::sin(1.5)));
    CHECK(c[1] == Approx(-std::sin(-0.75)));
    CHECK(c[3] == Approx(std::cos(-0.75)));
}

TEST_CASE("attention: GQA, causal, sliding window, absolute positions", "[ops]") {
    const int heads = 6, kv = 2, dim = 8, S = 9;
    const int group = heads / kv;
    const auto k = random_floats(size_t(S * kv * dim), 10, -2.0f, 2.0f);
    const auto v = random_floats(size_t(S * kv * dim), 11);
    const int64_t k_pos0 = 100;
    // Queries: the last 3 positions (a decode-style block) at absolute positions 106..108.
    const int T = 3;
    const auto q = random_floats(size_t(T * heads * dim), 12, -2.0f, 2.0f);
    const int64_t q_pos[T] = {106, 107, 108};
    for (const int window : {0, 4}) {
        std::vector<float> out(size_t(T * heads * dim));
        qtts::cpu::attention(q.data(), T, q_pos, k.data(), v.data(), S, k_pos0, heads, kv, dim, window, out.data());
        std::vector<double> ref(out.size(), 0.0);
        for (int t = 0; t < T; ++t)
            for (int h = 0; h < heads; ++h) {
                const int g = h / group;  // heads [g*group, (g+1)*group) share kv head g
                std::vector<double> score(size_t(S), -1e300);
                double mx = -1e300;
                for (int s = 0; s < S; ++s) {
                    const int64_t kp = k_pos0 + s;
                    if (kp > q_pos[t] || (window > 0 && q_pos[t] - kp >= window)) continue;
                    double d = 0.0;
                    for (int e = 0; e < dim; ++e)
                        d += double(q[size_t((t * heads + h) * dim + e)]) * k[size_t((s * kv + g) * dim + e)];
                    score[size_t(s)] = d / std::sqrt(double(dim));
                    mx = std::max(mx, score[size_t(s)]);
                }
                double den = 0.0;
                for (auto& sc : score) den += sc > -1e299 ? (sc = std::exp(sc - mx)) : (sc = 0.0);
                for (int s = 0; s < S; ++s)
                    for (int e = 0; e < dim; ++e)
                        ref[size_t((t * heads + h) * dim + e)] += score[size_t(s)] / den * v[size_t((s * kv + g) * dim + e)];
            }
        INFO("window " << window);
        CHECK(max_rel(out, ref) < 1e-5);
    }
}

TEST_CASE("swiglu and silu", "[ops]") {
    const auto g = random_floats(50, 13, -4.0f, 4.0f);
    const auto u = random_floats(50, 14);
    std::vector<float> y(50);
    qtts::cpu::swiglu(g.data(), u.data(), 50, y.data());
    for (size_t i = 0; i < 50; ++i) {
        const double ref = double(g[i]) / (1.0 + std::exp(-double(g[i]))) * u[i];
        CHECK(y[i] == Approx(ref).epsilon(1e-5).margin(1e-7));
    }
}
