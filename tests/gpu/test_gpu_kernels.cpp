// Every CUDA kernel family against the fp32 CPU reference ops, on fresh random inputs, with
// poisoned outputs (NaN) so that an unwritten element fails the comparison.
#include <catch2/catch.hpp>

// CPU-only builds compile this file to nothing (test_main skips the gpu label without a device).
#ifdef QTTS_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include <cublas_v2.h>

#include "engine/cpu/ops.h"
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "kernels/attention.cuh"
#include "kernels/batch.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemv.cuh"
#include "kernels/linear.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/rope.cuh"
#include "kernels/skinny.cuh"
#include "kernels/sampling.cuh"
#include "kernels/swiglu.cuh"
#include "kernels/timeline.cuh"
#include "engine/model/safetensors.h"
#include "engine/generation/sampling.h"
#include "test_support.h"

namespace k = qtts::kernels;
using qtts::cuda::DeviceArray;
using qtts_test::random_floats;
using qtts_test::rel_error;

namespace {

qtts::cuda::GpuContext& context() {
    static qtts::cuda::GpuContext ctx(0);
    return ctx;
}

template <typename T>
DeviceArray<T> upload(const std::vector<T>& v) {
    DeviceArray<T> d(std::max<size_t>(v.size(), 1));
    CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

template <typename T>
std::vector<T> download(const DeviceArray<T>& d, size_t n) {
    CUDA_CHECK(cudaStreamSynchronize(context().stream()));
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

// NaN-filled device buffer: elements a kernel fails to write stay NaN.
DeviceArray<float> poisoned(size_t n) {
    return upload(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}

bool all_finite(const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = qtts::f32_to_bf16(v[i]);
    return b;
}

std::vector<float> from_bf16(const std::vector<uint16_t>& b) {
    std::vector<float> v(b.size());
    for (size_t i = 0; i < b.size(); ++i) v[i] = qtts::bf16_to_f32(b[i]);
    return v;
}

uint64_t fresh_seed() {
    static std::random_device rd;
    return (uint64_t(rd()) << 32) ^ rd();
}

}  // namespace

// A product's random weights from one seed, on the host (bf16 bits and their fp32 values) and the
// device: W and W2 [out, in] in +-0.05 (seed, seed + 1), a bias [out] (seed + 3) and an RMSNorm
// weight [in] in 0.5..1.5 (seed + 4); x and the residual take seed + 2 and seed + 5.
struct RandomProduct {
    std::vector<uint16_t> w_bf, w2_bf;
    std::vector<float> w, w2, bias, norm_w;
    DeviceArray<uint16_t> d_w, d_w2;
    DeviceArray<float> d_bias, d_norm;
    RandomProduct(int out, int in, uint64_t seed)
        : w_bf(to_bf16(random_floats(size_t(out) * in, seed, -0.05f, 0.05f))),
          w2_bf(to_bf16(random_floats(size_t(out) * in, seed + 1, -0.05f, 0.05f))),
          w(from_bf16(w_bf)),
          w2(from_bf16(w2_bf)),
          bias(random_floats(size_t(out), seed + 3)),
          norm_w(random_floats(size_t(in), seed + 4, 0.5f, 1.5f)),
          d_w(upload(w_bf)),
          d_w2(upload(w2_bf)),
          d_bias(upload(bias)),
          d_norm(upload(norm_w)) {}
};

TEST_CASE("gemv matches the CPU linear in every input/output mode", "[gpu][gemv]") {
    struct Shape {
        int out, in, rows;
    };
    // Past 8 rows: groups of 8 on grid.y (the batched step, engine/cuda/gpu_batch.h).
    const Shape shapes[] = {{1024, 2048, 1}, {4096, 1024, 2}, {3072, 2048, 1}, {2048, 6144, 1},
                            {100, 96, 3},    {2048, 1024, 8}, {61, 64, 5},     {2048, 6144, 8},
                            {1024, 3072, 13}, {300, 2048, 40}, {61, 64, 130}, {1024, 3072, 4}};
    for (const Shape s : shapes) {
        const uint64_t seed = fresh_seed();
        INFO("out " << s.out << " in " << s.in << " rows " << s.rows << " seed " << seed);
        const RandomProduct p(s.out, s.in, seed);
        const auto x = random_floats(size_t(s.rows) * s.in, seed + 2, -2.0f, 2.0f);
        const auto residual = random_floats(size_t(s.rows) * s.out, seed + 5);
        auto d_x = upload(x);

        k::GemvArgs a = qtts::cuda::gemv_product(p.d_w.get(), s.out, s.in, s.rows, d_x.get(), nullptr);

        SECTION("plain input, store with bias") {
            auto d_y = poisoned(size_t(s.rows) * s.out);
            a.bias = p.d_bias.get();
            a.y = d_y.get();
            k::gemv(a, context().launch());
            const auto y = download(d_y, size_t(s.rows) * s.out);
            std::vector<float> ref(y.size());
            qtts::cpu::linear(x.data(), s.rows, s.in, p.w.data(), p.bias.data(), s.out, ref.data());
            REQUIRE(all_finite(y));
            CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-5);
        }
        SECTION("RMSNorm input, residual add") {
            auto d_y = upload(residual);
            a.input = k::GemvInput::GEMV_INPUT_RMSNORM;
            a.norm_w = p.d_norm.get();
            a.eps = 1e-6f;
            a.output = k::GemvOutput::GEMV_OUTPUT_ADD;
            a.y = d_y.get();
            k::gemv(a, context().launch());
            const auto y = download(d_y, size_t(s.rows) * s.out);
            std::vector<float> xn(x.size()), ref(y.size());
            qtts::cpu::rms_norm(x.data(), s.rows, s.in, p.norm_w.data(), 1e-6f, xn.data());
            qtts::cpu::linear(xn.data(), s.rows, s.in, p.w.data(), nullptr, s.out, ref.data());
            for (size_t i = 0; i < ref.size(); ++i) ref[i] += residual[i];
            REQUIRE(all_finite(y));
            CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-5);
        }
        SECTION("RMSNorm input, SwiGLU output") {
            auto d_y = poisoned(size_t(s.rows) * s.out);
            a.w2 = p.d_w2.get();
            a.input = k::GemvInput::GEMV_INPUT_RMSNORM;
            a.norm_w = p.d_norm.get();
            a.output = k::GemvOutput::GEMV_OUTPUT_SWIGLU;
            a.y = d_y.get();
            k::gemv(a, context().launch());
            const auto y = download(d_y, size_t(s.rows) * s.out);
            std::vector<float> xn(x.size()), g(y.size()), u(y.size()), ref(y.size());
            qtts::cpu::rms_norm(x.data(), s.rows, s.in, p.norm_w.data(), 1e-6f, xn.data());
            qtts::cpu::linear(xn.data(), s.rows, s.in, p.w.data(), nullptr, s.out, g.data());
            qtts::cpu::linear(xn.data(), s.rows, s.in, p.w2.data(), nullptr, s.out, u.data());
            qtts::cpu::swiglu(g.data(), u.data(), ref.size(), ref.data());
            REQUIRE(all_finite(y));
            CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-5);
        }
        SECTION("gathered bf16 input rows") {
            const int vocab = 50;
            const auto table_bf = to_bf16(random_floats(size_t(vocab) * s.in, seed + 6));
            const auto table = from_bf16(table_bf);
            std::vector<int32_t> ids(size_t(s.rows));
            for (int r = 0; r < s.rows; ++r) ids[size_t(r)] = int32_t((seed + 7 * r) % vocab);
            auto d_table = upload(table_bf);
            auto d_ids = upload(ids);
            auto d_y = poisoned(size_t(s.rows) * s.out);
            a.input = k::GemvInput::GEMV_INPUT_GATHER;
            a.table = d_table.get();
            a.index = d_ids.get();
            a.bias = p.d_bias.get();
            a.y = d_y.get();
            k::gemv(a, context().launch());
            const auto y = download(d_y, size_t(s.rows) * s.out);
            std::vector<float> xg(size_t(s.rows) * s.in), ref(y.size());
            for (int r = 0; r < s.rows; ++r)
                std::copy_n(table.begin() + long(ids[size_t(r)]) * s.in, s.in, xg.begin() + long(r) * s.in);
            qtts::cpu::linear(xg.data(), s.rows, s.in, p.w.data(), p.bias.data(), s.out, ref.data());
            REQUIRE(all_finite(y));
            CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-5);
        }
    }
}

TEST_CASE("skinny tensor-core products match the CPU linear in every input/output mode", "[gpu][skinny]") {
    struct Shape {
        int out, in, rows, ldx_pad, ldy_pad;
    };
    // The batched step's shapes (1.7B talker and predictor: 8 warps per block for 4096 features,
    // 16 for fewer), odd feature counts (a partial 16-feature tile), inputs that end inside a
    // warp's 32-input step (1096, 72, 200: some lanes past the end) or give some warps no step
    // at all (64, 72, 128), row counts that leave part of an 8-row tile empty (every n-tile
    // count 1..4: 1, 5, 17, 24, 25, 29, 31, 32), padded strides; 12 rows over 35 steps (16 warps:
    // two or three steps a warp, so the x groups of a product without RMSNorm — four steps at
    // 9-16 rows — end part-filled, the last step inside the input).
    const Shape shapes[] = {{4096, 2048, 16, 0, 0}, {2048, 6144, 8, 0, 0},  {3072, 2048, 4, 0, 0},
                            {1024, 1096, 12, 4, 2}, {1024, 3072, 24, 4, 3}, {61, 64, 5, 0, 0},
                            {2050, 1096, 31, 8, 1}, {33, 128, 17, 0, 7},    {100, 576, 1, 4, 0},
                            {1024, 1024, 32, 0, 0}, {77, 72, 25, 4, 2},     {4096, 1024, 32, 0, 0},
                            {40, 200, 29, 0, 0}};
    for (const Shape s : shapes) {
        const uint64_t seed = fresh_seed();
        INFO("out " << s.out << " in " << s.in << " rows " << s.rows << " ldx +" << s.ldx_pad << " ldy +" << s.ldy_pad
                    << " seed " << seed);
        const int ldx = s.in + s.ldx_pad, ldy = s.out + s.ldy_pad;
        const RandomProduct p(s.out, s.in, seed);
        const auto x_strided = random_floats(size_t(s.rows + 1) * ldx, seed + 2, -2.0f, 2.0f);  // one spare row
        std::vector<float> x(size_t(s.rows) * s.in);
        for (int r = 0; r < s.rows; ++r) std::copy_n(x_strided.begin() + long(r) * ldx, s.in, x.begin() + long(r) * s.in);
        const auto residual = random_floats(size_t(s.rows + 1) * ldy, seed + 5);
        auto d_x = upload(x_strided);

        k::GemvArgs a = qtts::cuda::gemv_product(p.d_w.get(), s.out, s.in, s.rows, d_x.get(), nullptr);
        a.ldx = ldx;
        a.ldy = ldy;
        // y as the kernel wrote it, rows [0, rows) x [0, out); everything else must be untouched.
        // `tiles`: tiles per block (0: the kernel's default for the rows); `weights`: where the
        // weight steps in flight are kept.
        const auto run = [&](DeviceArray<float>& d_y, const std::vector<float>& before, int tiles = 0,
                             k::SkinnyWeights weights = k::SkinnyWeights::SKINNY_WEIGHTS_SHARED) {
            a.y = d_y.get();
            REQUIRE(k::skinny_supported(a));
            k::skinny_product(a, context().launch(), 0, tiles, weights);
            const auto y_all = download(d_y, before.size());
            std::vector<float> y(size_t(s.rows) * s.out);
            for (size_t i = 0; i < y_all.size(); ++i) {
                const size_t r = i / size_t(ldy), c = i % size_t(ldy);
                if (r < size_t(s.rows) && c < size_t(s.out))
                    y[r * size_t(s.out) + c] = y_all[i];
                else if (std::memcmp(&y_all[i], &before[i], sizeof(float)) != 0)
                    FAIL("element " << i << " (row " << r << ", column " << c << ") outside the output was written");
            }
            return y;
        };
        const std::vector<float> nan_y(size_t(s.rows + 1) * ldy, std::numeric_limits<float>::quiet_NaN());
        // One and two tiles per block (the default is one of them), with the weight steps in
        // flight in the shared-memory ring (the default) or in registers, make every sum the same
        // way: the same bits, each checked against `y` from a fresh copy of `before`.
        const auto same_bits_any_tiles = [&](const std::vector<float>& y, const std::vector<float>& before) {
            for (const int tiles : {1, 2})
                for (const k::SkinnyWeights weights :
                     {k::SkinnyWeights::SKINNY_WEIGHTS_SHARED, k::SkinnyWeights::SKINNY_WEIGHTS_REGISTERS}) {
                    const bool ring = weights == k::SkinnyWeights::SKINNY_WEIGHTS_SHARED;
                    INFO("tiles per block " << tiles << ", weights in " << (ring ? "shared memory" : "registers"));
                    auto d_t = upload(before);
                    const auto yt = run(d_t, before, tiles, weights);
                    CHECK(std::memcmp(yt.data(), y.data(), y.size() * sizeof(float)) == 0);
                }
        };

        SECTION("plain input, store with bias; the same bits twice, and the last row's bits alone") {
            auto d_y = upload(nan_y);
            a.bias = p.d_bias.get();
            const auto y = run(d_y, nan_y);
            std::vector<float> ref(y.size());
            qtts::cpu::linear(x.data(), s.rows, s.in, p.w.data(), p.bias.data(), s.out, ref.data());
            REQUIRE(all_finite(y));
            CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-5);
            auto d_y2 = upload(nan_y);
            const auto again = run(d_y2, nan_y);
            CHECK(std::memcmp(again.data(), y.data(), y.size() * sizeof(float)) == 0);
            // A row's result does not depend on the other rows of the batch (a stream's codes
            // must not depend on who shares its step): the last row as a batch of one.
            k::GemvArgs alone = a;
            alone.x = d_x.get() + size_t(s.rows - 1) * ldx;
            alone.rows = 1;
            auto d_alone = poisoned(size_t(ldy));
            alone.y = d_alone.get();
            k::skinny_product(alone, context().launch());
            const auto last = download(d_alone, size_t(s.out));
            CHECK(std::memcmp(last.data(), y.data() + size_t(s.rows - 1) * s.out, size_t(s.out) * sizeof(float)) == 0);
            // 8 features per block (half tiles, twice the blocks): each feature's sums are made
            // the same way, so the same bits.
            for (const int tiles : {1, 2}) {
                INFO("8 features per tile, tiles per block " << tiles);
                auto d_half = upload(nan_y);
                a.y = d_half.get();
                k::skinny_product(a, context().launch(), 8, tiles);
                const auto half_all = download(d_half, nan_y.size());
                for (int r = 0; r < s.rows; ++r)
                    CHECK(std::memcmp(half_all.data() + size_t(r) * ldy, y.data() + size_t(r) * s.out,
                                      size_t(s.out) * sizeof(float)) == 0);
            }
            same_bits_any_tiles(y, nan_y);
        }
        SECTION("RMSNorm input, residual add with bias") {
            auto d_y = upload(residual);
            a.input = k::GemvInput::GEMV_INPUT_RMSNORM;
            a.norm_w = p.d_norm.get();
            a.eps = 1e-6f;
            a.bias = p.d_bias.get();
            a.output = k::GemvOutput::GEMV_OUTPUT_ADD;
            const auto y = run(d_y, residual);
            std::vector<float> xn(x.size()), ref(y.size());
            qtts::cpu::rms_norm(x.data(), s.rows, s.in, p.norm_w.data(), 1e-6f, xn.data());
            qtts::cpu::linear(xn.data(), s.rows, s.in, p.w.data(), p.bias.data(), s.out, ref.data());
            for (int r = 0; r < s.rows; ++r)
                for (int c = 0; c < s.out; ++c) ref[size_t(r) * s.out + c] += residual[size_t(r) * ldy + c];
            REQUIRE(all_finite(y));
            CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-5);
            same_bits_any_tiles(y, residual);
        }
        SECTION("RMSNorm input, SwiGLU output") {
            auto d_y = upload(nan_y);
            a.w2 = p.d_w2.get();
            a.input = k::GemvInput::GEMV_INPUT_RMSNORM;
            a.norm_w = p.d_norm.get();
            a.output = k::GemvOutput::GEMV_OUTPUT_SWIGLU;
            const auto y = run(d_y, nan_y);
            std::vector<float> xn(x.size()), g(y.size()), u(y.size()), ref(y.size());
            qtts::cpu::rms_norm(x.data(), s.rows, s.in, p.norm_w.data(), 1e-6f, xn.data());
            qtts::cpu::linear(xn.data(), s.rows, s.in, p.w.data(), nullptr, s.out, g.data());
            qtts::cpu::linear(xn.data(), s.rows, s.in, p.w2.data(), nullptr, s.out, u.data());
            qtts::cpu::swiglu(g.data(), u.data(), ref.size(), ref.data());
            REQUIRE(all_finite(y));
            CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-5);
            same_bits_any_tiles(y, nan_y);
        }
    }
}

TEST_CASE("skinny products refuse what they cannot take", "[gpu][skinny]") {
    auto d_w = upload(std::vector<uint16_t>(64 * 128, 0x3f80));
    auto d_x = upload(std::vector<float>(80 * 128, 1.0f));
    auto d_y = poisoned(80 * 64);
    k::GemvArgs a;
    a.w = d_w.get();
    a.out = 64;
    a.in = 128;
    a.rows = 8;
    a.x = d_x.get();
    a.ldx = 128;
    a.y = d_y.get();
    a.ldy = 64;
    CHECK(k::skinny_supported(a));
    k::GemvArgs bad = a;
    bad.rows = k::SKINNY_MAX_ROWS + 1;
    CHECK_FALSE(k::skinny_supported(bad));
    bad = a;
    bad.in = 100;  // not a multiple of 8
    bad.ldx = 100;
    CHECK_FALSE(k::skinny_supported(bad));
    bad = a;
    bad.ldx = 130;  // rows not 16-byte aligned
    CHECK_FALSE(k::skinny_supported(bad));
    bad = a;
    bad.input = k::GemvInput::GEMV_INPUT_GATHER;
    CHECK_FALSE(k::skinny_supported(bad));
    CHECK_THROWS_AS(k::skinny_product(bad, context().launch()), k::KernelError);
    CHECK_THROWS_AS(k::skinny_product(a, context().launch(), 12), k::KernelError);  // 8 or 16 features per block
    CHECK_THROWS_AS(k::skinny_product(a, context().launch(), 0, 3), k::KernelError);  // 1 or 2 tiles per block
}

TEST_CASE("gemv computes every row of a wide batch exactly as alone", "[gpu][gemv][batch]") {
    const int out = 257, in = 1024, rows = 21;
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    const auto w_bf = to_bf16(random_floats(size_t(out) * in, seed, -0.05f, 0.05f));
    const auto x = random_floats(size_t(rows) * in, seed + 1, -2.0f, 2.0f);
    const auto norm_w = random_floats(size_t(in), seed + 2, 0.5f, 1.5f);
    auto d_w = upload(w_bf);
    auto d_x = upload(x), d_norm = upload(norm_w);
    k::GemvArgs a;
    a.w = d_w.get();
    a.out = out;
    a.in = in;
    a.x = d_x.get();
    a.ldx = in;
    a.ldy = out;
    a.input = k::GemvInput::GEMV_INPUT_RMSNORM;
    a.norm_w = d_norm.get();
    auto d_all = poisoned(size_t(rows) * out);
    a.rows = rows;
    a.y = d_all.get();
    k::gemv(a, context().launch());
    const auto all = download(d_all, size_t(rows) * out);
    for (int r = 0; r < rows; ++r) {
        auto d_one = poisoned(size_t(out));
        k::GemvArgs one = a;
        one.rows = 1;
        one.x = d_x.get() + size_t(r) * in;
        one.y = d_one.get();
        k::gemv(one, context().launch());
        const auto y = download(d_one, size_t(out));
        INFO("row " << r);
        CHECK(std::memcmp(y.data(), all.data() + size_t(r) * out, size_t(out) * 4) == 0);
    }
}

TEST_CASE("rmsnorm, the bf16 hi/lo split and swiglu match the CPU", "[gpu][rmsnorm][swiglu]") {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    const int T = 7, C = 2048;
    const auto x = random_floats(size_t(T) * C, seed, -3.0f, 3.0f);
    const auto w = random_floats(size_t(C), seed + 1, 0.5f, 1.5f);
    auto d_x = upload(x), d_w = upload(w);
    auto d_y = poisoned(x.size());
    k::rmsnorm(d_x.get(), T, C, C, d_w.get(), 1e-6f, d_y.get(), C, context().launch());
    const auto y = download(d_y, x.size());
    std::vector<float> ref(x.size());
    qtts::cpu::rms_norm(x.data(), T, C, w.data(), 1e-6f, ref.data());
    REQUIRE(all_finite(y));
    CHECK(rel_error(y.data(), ref.data(), y.size()) < 1e-6);

    DeviceArray<uint16_t> d_split(2 * x.size());
    k::rmsnorm_split_bf16(d_x.get(), T, C, C, d_w.get(), 1e-6f, d_split.get(), context().launch());
    const auto split = download(d_split, 2 * x.size());
    std::vector<float> joined(x.size());
    for (size_t i = 0; i < x.size(); ++i)
        joined[i] = qtts::bf16_to_f32(split[i]) + qtts::bf16_to_f32(split[x.size() + i]);
    CHECK(rel_error(joined.data(), ref.data(), ref.size()) < 2e-5);

    const auto gate = random_floats(size_t(T) * C, seed + 2, -4.0f, 4.0f);
    const auto up = random_floats(size_t(T) * C, seed + 3);
    auto d_gate = upload(gate), d_up = upload(up);
    auto d_out = poisoned(gate.size());
    k::swiglu(d_gate.get(), C, d_up.get(), C, T, C, d_out.get(), C, context().launch());
    const auto out = download(d_out, gate.size());
    std::vector<float> sref(gate.size());
    qtts::cpu::swiglu(gate.data(), up.data(), gate.size(), sref.data());
    REQUIRE(all_finite(out));
    CHECK(rel_error(out.data(), sref.data(), out.size()) < 1e-6);
}

TEST_CASE("per-head RMSNorm + RoPE matches the CPU", "[gpu][rope]") {
    for (const int head_dim : {128, 16, 24}) {
        const uint64_t seed = fresh_seed();
        INFO("head_dim " << head_dim << " seed " << seed);
        const int T = 5, heads = 6, pos0 = 1234;
        const double theta = 1e6;
        auto x = random_floats(size_t(T) * heads * head_dim, seed, -2.0f, 2.0f);
        const auto w = random_floats(size_t(head_dim), seed + 1, 0.5f, 1.5f);
        std::vector<float> inv_freq(size_t(head_dim / 2));
        for (int i = 0; i < head_dim / 2; ++i)
            inv_freq[size_t(i)] = float(1.0 / std::pow(theta, double(2 * i) / head_dim));
        auto d_x = upload(x), d_w = upload(w), d_f = upload(inv_freq);
        k::head_norm_rope(d_x.get(), T, heads, head_dim, d_w.get(), 1e-6f, d_f.get(), nullptr, pos0,
                          context().launch());
        const auto y = download(d_x, x.size());
        std::vector<int64_t> pos(static_cast<size_t>(T));
        for (int t = 0; t < T; ++t) pos[size_t(t)] = pos0 + t;
        qtts::cpu::rms_norm(x.data(), T * heads, head_dim, w.data(), 1e-6f, x.data());
        qtts::cpu::rope_apply(x.data(), T, heads, head_dim, pos.data(), theta);
        REQUIRE(all_finite(y));
        // fp32 sin/cos of angles ~1e3 rad: CUDA's sincosf (2 ulp) vs glibc; seen 1.2e-5 at pos 1234.
        CHECK(rel_error(y.data(), x.data(), x.size()) < 5e-5);
    }
}

namespace {

// CPU model of one attention launch: normalises/rotates the new rows, appends them to a copy of
// the cache, attends. Cache layout [n_kv, max_ctx, hd].
struct AttentionCase {
    int T, n_heads, n_kv, hd, max_ctx, pos0;
};

// What every attention launch of these tests shares: head shapes, q/k norms (eps 1e-6), the RoPE
// table, the cache length and a dense output.
k::AttentionArgs attention_heads(int n_heads, int n_kv, int hd, int max_ctx, const float* q_norm, const float* k_norm,
                                 const float* inv_freq) {
    k::AttentionArgs a;
    a.ld_qkv = (n_heads + 2 * n_kv) * hd;
    a.n_heads = n_heads;
    a.n_kv = n_kv;
    a.head_dim = hd;
    a.q_norm = q_norm;
    a.k_norm = k_norm;
    a.eps = 1e-6f;
    a.inv_freq = inv_freq;
    a.max_ctx = max_ctx;
    a.ld_out = n_heads * hd;
    return a;
}

void attention_reference(const AttentionCase& c, const std::vector<float>& qkv, const std::vector<float>& qn,
                         const std::vector<float>& kn, const std::vector<float>& inv_freq,
                         std::vector<float>& k_cache, std::vector<float>& v_cache, std::vector<float>& out) {
    const int qd = c.n_heads * c.hd, kvd = c.n_kv * c.hd, ld = qd + 2 * kvd;
    std::vector<float> q(size_t(c.T) * qd), kk(size_t(c.T) * kvd), vv(size_t(c.T) * kvd);
    for (int t = 0; t < c.T; ++t) {
        std::copy_n(qkv.begin() + long(t) * ld, qd, q.begin() + long(t) * qd);
        std::copy_n(qkv.begin() + long(t) * ld + qd, kvd, kk.begin() + long(t) * kvd);
        std::copy_n(qkv.begin() + long(t) * ld + qd + kvd, kvd, vv.begin() + long(t) * kvd);
    }
    std::vector<int64_t> pos(static_cast<size_t>(c.T));
    for (int t = 0; t < c.T; ++t) pos[size_t(t)] = c.pos0 + t;
    qtts::cpu::rms_norm(q.data(), c.T * c.n_heads, c.hd, qn.data(), 1e-6f, q.data());
    qtts::cpu::rms_norm(kk.data(), c.T * c.n_kv, c.hd, kn.data(), 1e-6f, kk.data());
    // The engine's rotation (fp32 angle = position x inv_freq, as the official implementation and
    // cpu::Lm compute it): at position 4095 a double-precision angle differs by ~2e-4 rad.
    qtts::cpu::rope_apply_table(q.data(), c.T, c.n_heads, c.hd, pos.data(), inv_freq.data());
    qtts::cpu::rope_apply_table(kk.data(), c.T, c.n_kv, c.hd, pos.data(), inv_freq.data());
    for (int t = 0; t < c.T; ++t)
        for (int g = 0; g < c.n_kv; ++g)
            for (int d = 0; d < c.hd; ++d) {
                const size_t at = (size_t(g) * c.max_ctx + c.pos0 + t) * c.hd + d;
                k_cache[at] = kk[size_t(t) * kvd + size_t(g) * c.hd + d];
                v_cache[at] = vv[size_t(t) * kvd + size_t(g) * c.hd + d];
            }
    // Re-layout the cache to [S, n_kv * hd] for the CPU attention.
    const int S = c.pos0 + c.T;
    std::vector<float> ks(size_t(S) * kvd), vs(size_t(S) * kvd);
    for (int s = 0; s < S; ++s)
        for (int g = 0; g < c.n_kv; ++g)
            for (int d = 0; d < c.hd; ++d) {
                ks[size_t(s) * kvd + size_t(g) * c.hd + d] = k_cache[(size_t(g) * c.max_ctx + s) * c.hd + d];
                vs[size_t(s) * kvd + size_t(g) * c.hd + d] = v_cache[(size_t(g) * c.max_ctx + s) * c.hd + d];
            }
    out.assign(size_t(c.T) * qd, 0.0f);
    qtts::cpu::attention(q.data(), c.T, pos.data(), ks.data(), vs.data(), S, 0, c.n_heads, c.n_kv, c.hd, 0,
                         out.data());
}

}  // namespace

TEST_CASE("attention over a device-positioned KV cache matches the CPU", "[gpu][attention]") {
    struct Mode {
        AttentionCase c;
        bool fused_append;
        int splits;
        bool settled = false;  // pos_settled: slices past the context return before the wait
        int min_chunk = k::ATTN_MIN_CHUNK;
        int grid_splits = 0;  // blocks along the key axis (0: one per slice)
    };
    const Mode modes[] = {
        {{1, 16, 8, 128, 4096, 300}, true, 32},   // talker decode, split-K
        {{1, 16, 8, 128, 4096, 300}, true, 32, true},  // the same as the frame step launches it
        {{1, 16, 8, 128, 4096, 4095}, true, 32, true},  // every slice holds keys
        {{1, 4, 2, 24, 256, 40}, true, 4, true},  // tiny frame-step decode, 3 of 4 slices hold keys
        {{1, 16, 8, 128, 4096, 300}, true, 32, true, 128},  // a wide batch's long slices: 3 of 128 keys
        {{1, 16, 8, 128, 4096, 100}, true, 32, true, 128},  // ... one slice: the combine of one state
        {{1, 16, 8, 128, 4096, 1000}, true, 32, true, 128, 3},  // 8 slices taken by 3 blocks in turn
        {{1, 16, 8, 128, 4096, 4095}, true, 32, true, 16, 5},   // 32 slices, 5 blocks
        {{1, 4, 2, 24, 256, 200}, true, 4, false, 16, 1},       // one block takes all 4 slices
        {{1, 16, 8, 128, 4096, 0}, true, 32},     // first position
        {{1, 16, 8, 128, 512, 511}, true, 4},     // last position of the cache
        {{2, 16, 8, 128, 16, 0}, true, 1},        // predictor pass 0
        {{1, 16, 8, 128, 16, 9}, true, 1},        // predictor pass
        {{1, 4, 2, 16, 64, 20}, true, 1},         // tiny model decode
        {{1, 8, 4, 64, 256, 30}, true, 2},        // head_dim 64, split-K over two slices
        {{2, 4, 2, 18, 64, 20}, true, 1},         // head_dim 18: cached rows read in place, not staged
        {{37, 16, 8, 128, 4096, 5}, false, 1},    // prefill chunk (separate append)
        {{37, 4, 2, 24, 512, 100}, false, 2},     // prefill chunk after earlier chunks, split-K
        {{2, 4, 2, 24, 256, 16}, false, 2},       // a 2-row last prefill chunk (rows from kv_append)
        {{1, 4, 2, 24, 256, 18}, true, 2},        // tiny decode, staged slice, split-K
        {{2, 16, 8, 128, 4096, 40}, false, 32},   // 2-row prefill chunk, full-size heads
        {{128, 16, 8, 128, 4096, 122}, false, 32},  // a full 128-row prefill chunk after an earlier one
        {{20, 16, 4, 128, 1024, 50}, false, 8},   // 4 query heads per KV head (largest staging)
    };
    for (const Mode& m : modes) {
        const AttentionCase& c = m.c;
        const uint64_t seed = fresh_seed();
        INFO("T " << c.T << " heads " << c.n_heads << "/" << c.n_kv << " hd " << c.hd << " pos0 " << c.pos0
                  << " splits " << m.splits << " fused " << m.fused_append << " settled " << m.settled
                  << " min chunk " << m.min_chunk << " grid splits " << m.grid_splits << " seed " << seed);
        const int qd = c.n_heads * c.hd, kvd = c.n_kv * c.hd, ld = qd + 2 * kvd;
        const auto qkv = random_floats(size_t(c.T) * ld, seed, -2.0f, 2.0f);
        const auto qn = random_floats(size_t(c.hd), seed + 1, 0.5f, 1.5f);
        const auto kn = random_floats(size_t(c.hd), seed + 2, 0.5f, 1.5f);
        std::vector<float> inv_freq(size_t(c.hd / 2));
        for (int i = 0; i < c.hd / 2; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(1e6, double(2 * i) / c.hd));
        std::vector<float> k_cache = random_floats(size_t(c.n_kv) * c.max_ctx * c.hd, seed + 3);
        std::vector<float> v_cache = random_floats(size_t(c.n_kv) * c.max_ctx * c.hd, seed + 4);
        auto d_qkv = upload(qkv), d_qn = upload(qn), d_kn = upload(kn), d_f = upload(inv_freq);
        auto d_k = upload(k_cache), d_v = upload(v_cache);
        auto d_out = poisoned(size_t(c.T) * qd);
        const std::vector<int32_t> pos{c.pos0};
        auto d_pos = upload(pos);
        DeviceArray<float> d_partial(k::attention_partial_floats(c.n_heads, c.T, m.splits, c.hd));
        auto d_counters = upload(std::vector<uint32_t>(k::attention_counter_count(c.n_kv, c.T), 0u));

        k::AttentionArgs a;
        a.qkv = d_qkv.get();
        a.ld_qkv = ld;
        a.T = c.T;
        a.n_heads = c.n_heads;
        a.n_kv = c.n_kv;
        a.head_dim = c.hd;
        a.q_norm = d_qn.get();
        a.k_norm = d_kn.get();
        a.eps = 1e-6f;
        a.inv_freq = d_f.get();
        a.k_cache = d_k.get();
        a.v_cache = d_v.get();
        a.max_ctx = c.max_ctx;
        a.pos_dev = d_pos.get();  // the position comes from device memory, as in the graphs
        a.append = m.fused_append;
        a.pos_settled = m.settled;
        a.min_chunk = m.min_chunk;
        a.grid_splits = m.grid_splits;
        // Decode launches also write the output's bf16 hi/lo split (the o product's input).
        auto d_split = upload(std::vector<uint16_t>(size_t(2 * c.T) * qd, 0xffffu));
        if (m.fused_append) a.out_split = d_split.get();
        a.out = d_out.get();
        a.ld_out = qd;
        a.splits = m.splits;
        a.partial = d_partial.get();
        a.counters = d_counters.get();
        if (!m.fused_append) k::kv_append(a, context().launch());
        k::attention(a, context().launch());
        // Twice: the split-K counters must have been left at zero by the first launch.
        k::attention(a, context().launch());
        const auto out = download(d_out, size_t(c.T) * qd);
        const auto k_gpu = download(d_k, k_cache.size());
        const auto v_gpu = download(d_v, v_cache.size());
        const auto counters = download(d_counters, k::attention_counter_count(c.n_kv, c.T));

        std::vector<float> ref;
        attention_reference(c, qkv, qn, kn, inv_freq, k_cache, v_cache, ref);
        REQUIRE(all_finite(out));
        CHECK(rel_error(out.data(), ref.data(), ref.size()) < 1e-5);
        CHECK(rel_error(k_gpu.data(), k_cache.data(), k_cache.size()) < 1e-6);
        CHECK(rel_error(v_gpu.data(), v_cache.data(), v_cache.size()) == 0.0);
        CHECK(std::all_of(counters.begin(), counters.end(), [](uint32_t v) { return v == 0u; }));
        if (m.fused_append) {  // the split: the bits rmsnorm_split_bf16 gives from the output
            DeviceArray<uint16_t> d_want(size_t(2 * c.T) * qd);
            k::rmsnorm_split_bf16(d_out.get(), c.T, qd, qd, nullptr, 0.0f, d_want.get(), context().launch());
            CHECK(download(d_split, size_t(2 * c.T) * qd) == download(d_want, size_t(2 * c.T) * qd));
        } else {  // prefill launches cannot write it
            k::AttentionArgs with_split = a;
            with_split.out_split = d_split.get();
            CHECK_THROWS_AS(k::attention(with_split, context().launch()), k::KernelError);
        }
        if (m.grid_splits > 0) {  // blocks that take several slices give the bits of one block per slice
            auto d_one = poisoned(size_t(c.T) * qd);
            k::AttentionArgs one = a;
            one.grid_splits = 0;
            one.out = d_one.get();
            k::attention(one, context().launch());
            CHECK(download(d_one, size_t(c.T) * qd) == out);
        }
        // A shortest slice outside 1..ATTN_KEYS_PER_SPLIT keys is refused before any launch.
        a.min_chunk = 0;
        CHECK_THROWS_AS(k::attention(a, context().launch()), k::KernelError);
        a.min_chunk = k::ATTN_KEYS_PER_SPLIT + 1;
        CHECK_THROWS_AS(k::attention(a, context().launch()), k::KernelError);
        a.min_chunk = k::ATTN_MIN_CHUNK;
        a.grid_splits = m.splits + 1;  // more blocks than slices
        CHECK_THROWS_AS(k::attention(a, context().launch()), k::KernelError);
    }
}

TEST_CASE("batched attention gives each sequence what it gets alone, bitwise", "[gpu][attention][batch]") {
    // Sequences of a batched step (engine/cuda/gpu_batch.h): each its own cache and position (or
    // the launch's pos_host), one idle (no cache), one stopped (flag set: nothing written).
    struct Mode {
        int T, n_heads, n_kv, hd, max_ctx, splits;
        bool device_pos;
        std::vector<int> pos;  // per sequence
        bool settled = false;  // the batched launch sets pos_settled, as the frame step does
        int min_chunk = k::ATTN_MIN_CHUNK;
        int grid_splits = 0;
    };
    const Mode modes[] = {
        {1, 16, 8, 128, 1024, 8, true, {300, 0, 17, 1000, 128}},  // talker: split-K, own positions
        {1, 16, 8, 128, 1024, 8, true, {300, 0, 17, 1000, 128}, true},  // ... slices past each context leave early
        {1, 16, 8, 128, 1024, 8, true, {300, 0, 17, 1000, 128}, true, 128},  // ... long slices (wide batches)
        {1, 16, 8, 128, 1024, 8, true, {300, 0, 17, 1000, 128}, true, 128, 2},  // ... 2 blocks per stream, KV head
        {2, 16, 8, 128, 16, 1, false, {0, 0, 0, 0, 0}},          // predictor pass 1
        {1, 4, 2, 16, 16, 1, false, {9, 9, 9, 9, 9}},            // predictor pass, tiny heads
    };
    constexpr int B = 5, IDLE = 2, STOPPED = 3;
    for (const Mode& m : modes) {
        const uint64_t seed = fresh_seed();
        INFO("T " << m.T << " heads " << m.n_heads << "/" << m.n_kv << " hd " << m.hd << " splits " << m.splits
                  << " settled " << m.settled << " min chunk " << m.min_chunk << " grid splits " << m.grid_splits
                  << " seed " << seed);
        const int qd = m.n_heads * m.hd, kvd = m.n_kv * m.hd, ld = qd + 2 * kvd;
        const size_t cache = size_t(m.n_kv) * m.max_ctx * m.hd;
        const auto qkv = random_floats(size_t(B) * m.T * ld, seed, -2.0f, 2.0f);
        const auto qn = random_floats(size_t(m.hd), seed + 1, 0.5f, 1.5f);
        const auto kn = random_floats(size_t(m.hd), seed + 2, 0.5f, 1.5f);
        std::vector<float> inv_freq(size_t(m.hd / 2));
        for (int i = 0; i < m.hd / 2; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(1e6, double(2 * i) / m.hd));
        const auto caches = random_floats(2 * B * cache, seed + 3);  // [B][k | v]
        auto d_qn = upload(qn), d_kn = upload(kn), d_f = upload(inv_freq);
        std::vector<int32_t> pos(m.pos.begin(), m.pos.end());
        std::vector<int32_t> stopped(B, 0);
        stopped[STOPPED] = 1;
        auto d_pos = upload(pos), d_stopped = upload(stopped);

        auto base_args = [&](int T) {
            k::AttentionArgs a = attention_heads(m.n_heads, m.n_kv, m.hd, m.max_ctx, d_qn.get(), d_kn.get(), d_f.get());
            a.T = T;
            a.splits = m.splits;
            a.min_chunk = m.min_chunk;
            a.grid_splits = m.grid_splits;
            return a;
        };
        // Alone: one launch per sequence on its own copy of the cache.
        std::vector<std::vector<float>> alone_out(B), alone_k(B), alone_v(B);
        for (int s = 0; s < B; ++s) {
            if (s == IDLE || s == STOPPED) continue;
            auto d_qkv = upload(std::vector<float>(qkv.begin() + long(s) * m.T * ld, qkv.begin() + long(s + 1) * m.T * ld));
            auto d_k = upload(std::vector<float>(caches.begin() + long(2 * s) * cache, caches.begin() + long(2 * s + 1) * cache));
            auto d_v = upload(std::vector<float>(caches.begin() + long(2 * s + 1) * cache, caches.begin() + long(2 * s + 2) * cache));
            auto d_out = poisoned(size_t(m.T) * qd);
            DeviceArray<float> d_partial(k::attention_partial_floats(m.n_heads, m.T, m.splits, m.hd));
            auto d_counters = upload(std::vector<uint32_t>(k::attention_counter_count(m.n_kv, m.T), 0u));
            k::AttentionArgs a = base_args(m.T);
            a.qkv = d_qkv.get();
            a.k_cache = d_k.get();
            a.v_cache = d_v.get();
            if (m.device_pos)
                a.pos_dev = d_pos.get() + s;
            else
                a.pos_host = m.pos[size_t(s)];
            a.out = d_out.get();
            a.partial = d_partial.get();
            a.counters = d_counters.get();
            k::attention(a, context().launch());
            alone_out[size_t(s)] = download(d_out, size_t(m.T) * qd);
            alone_k[size_t(s)] = download(d_k, cache);
            alone_v[size_t(s)] = download(d_v, cache);
        }
        // Batched: one launch, twice (counters left at zero).
        auto d_qkv = upload(qkv);
        auto d_caches = upload(caches);
        auto d_out = poisoned(size_t(B) * m.T * qd);
        DeviceArray<float> d_partial(B * k::attention_partial_floats(m.n_heads, m.T, m.splits, m.hd));
        auto d_counters = upload(std::vector<uint32_t>(B * k::attention_counter_count(m.n_kv, m.T), 0u));
        std::vector<k::AttentionSeq> seqs(B);
        for (int s = 0; s < B; ++s) {
            if (s == IDLE) continue;
            seqs[size_t(s)].k_cache = d_caches.get() + size_t(2 * s) * cache;
            seqs[size_t(s)].v_cache = d_caches.get() + size_t(2 * s + 1) * cache;
            seqs[size_t(s)].pos = m.device_pos ? d_pos.get() + s : nullptr;
            seqs[size_t(s)].stopped = d_stopped.get() + s;
        }
        auto d_seqs = upload(seqs);
        k::AttentionArgs a = base_args(m.T);
        a.qkv = d_qkv.get();
        a.pos_host = m.pos[0];
        a.out = d_out.get();
        a.partial = d_partial.get();
        a.counters = d_counters.get();
        a.seqs = d_seqs.get();
        a.batch = B;
        a.pos_settled = m.settled;
        auto d_split = upload(std::vector<uint16_t>(size_t(2 * B * m.T) * qd, 0xffffu));
        a.out_split = d_split.get();  // rows seq * T + t, as the split pass reads them
        // Out-of-batch launch argument the kernel must not use in batched mode.
        a.k_cache = nullptr;
        k::attention(a, context().launch());
        k::attention(a, context().launch());
        const auto out = download(d_out, size_t(B) * m.T * qd);
        const auto caches_after = download(d_caches, 2 * B * cache);
        const auto counters = download(d_counters, B * k::attention_counter_count(m.n_kv, m.T));
        CHECK(std::all_of(counters.begin(), counters.end(), [](uint32_t v) { return v == 0u; }));
        // The split of every written row: the bits rmsnorm_split_bf16 gives from the output.
        const size_t rows = size_t(B) * m.T;
        DeviceArray<uint16_t> d_want(2 * rows * qd);
        k::rmsnorm_split_bf16(d_out.get(), int(rows), qd, qd, nullptr, 0.0f, d_want.get(), context().launch());
        const auto split = download(d_split, 2 * rows * qd), want = download(d_want, 2 * rows * qd);
        for (int s = 0; s < B; ++s) {
            if (s == IDLE || s == STOPPED) continue;  // not written (the step discards those rows)
            for (const size_t half : {size_t(0), rows}) {
                const size_t at = (half + size_t(s) * m.T) * qd;
                INFO("sequence " << s << (half ? " lo" : " hi"));
                CHECK(std::equal(split.begin() + long(at), split.begin() + long(at + size_t(m.T) * qd),
                                 want.begin() + long(at)));
            }
        }
        for (int s = 0; s < B; ++s) {
            INFO("sequence " << s);
            const float* o = out.data() + size_t(s) * m.T * qd;
            const float* kc = caches_after.data() + size_t(2 * s) * cache;
            const float* vc = kc + cache;
            if (s == IDLE || s == STOPPED) {  // nothing written: output poisoned, caches as they were
                CHECK(std::all_of(o, o + size_t(m.T) * qd, [](float v) { return std::isnan(v); }));
                CHECK(std::equal(kc, kc + 2 * cache, caches.begin() + long(2 * s) * cache));
                continue;
            }
            CHECK(std::memcmp(o, alone_out[size_t(s)].data(), size_t(m.T) * qd * 4) == 0);
            CHECK(std::memcmp(kc, alone_k[size_t(s)].data(), cache * 4) == 0);
            CHECK(std::memcmp(vc, alone_v[size_t(s)].data(), cache * 4) == 0);
        }
    }
}

TEST_CASE("attention reading a split GEMM's halves gives the bits of reading their combine", "[gpu][attention]") {
    // The batched step's split passes hand the decode attention the qkv GEMM's hi and lo rows
    // (AttentionArgs::qkv_lo) instead of combining them first: every output, cache row and output
    // split must be those of the launch on the combined rows (hi + lo, as the combine adds them).
    struct Mode {
        int T, n_heads, n_kv, hd, max_ctx, splits, batch;  // batch 0: one sequence without a table
        std::vector<int> pos;
        int min_chunk, grid_splits;
    };
    const Mode modes[] = {
        {1, 16, 8, 128, 4096, 32, 0, {300}, k::ATTN_MIN_CHUNK, 0},         // talker decode, split-K
        {2, 16, 8, 128, 16, 1, 0, {0}, k::ATTN_MIN_CHUNK, 0},              // predictor pass 1
        {1, 16, 8, 128, 1024, 8, 3, {700, 5, 129}, 128, 2},                // wide batch: long slices
        {2, 4, 2, 24, 16, 1, 4, {0, 0, 0, 0}, k::ATTN_MIN_CHUNK, 0},       // tiny predictor pass 1, batched
    };
    for (const Mode& m : modes) {
        const uint64_t seed = fresh_seed();
        const int seqs = std::max(1, m.batch), rows = seqs * m.T;
        INFO("T " << m.T << " heads " << m.n_heads << "/" << m.n_kv << " hd " << m.hd << " splits " << m.splits
                  << " batch " << m.batch << " seed " << seed);
        const int qd = m.n_heads * m.hd, ld = qd + 2 * m.n_kv * m.hd;
        const size_t cache = size_t(m.n_kv) * m.max_ctx * m.hd;
        const auto hi = random_floats(size_t(rows) * ld, seed, -2.0f, 2.0f);
        const auto lo = random_floats(size_t(rows) * ld, seed + 1, -1e-2f, 1e-2f);
        std::vector<float> sum(hi.size());
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = hi[i] + lo[i] + 0.0f;  // linear_split_combine's store
        const auto qn = random_floats(size_t(m.hd), seed + 2, 0.5f, 1.5f);
        const auto kn = random_floats(size_t(m.hd), seed + 3, 0.5f, 1.5f);
        std::vector<float> inv_freq(size_t(m.hd / 2));
        for (int i = 0; i < m.hd / 2; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(1e6, double(2 * i) / m.hd));
        const auto caches = random_floats(2 * size_t(seqs) * cache, seed + 4);  // [seq][k | v]
        auto d_qn = upload(qn), d_kn = upload(kn), d_f = upload(inv_freq);
        std::vector<int32_t> pos(m.pos.begin(), m.pos.end());
        auto d_pos = upload(pos);

        struct Result {
            std::vector<float> out, caches;
            std::vector<uint16_t> split;
        };
        auto run = [&](bool halves) {
            auto d_hi = upload(halves ? hi : sum), d_lo = upload(lo), d_caches = upload(caches);
            auto d_out = poisoned(size_t(rows) * qd);
            auto d_split = upload(std::vector<uint16_t>(2 * size_t(rows) * qd, 0xffffu));
            DeviceArray<float> d_partial(size_t(seqs) * k::attention_partial_floats(m.n_heads, m.T, m.splits, m.hd));
            auto d_counters = upload(std::vector<uint32_t>(seqs * k::attention_counter_count(m.n_kv, m.T), 0u));
            std::vector<k::AttentionSeq> table(static_cast<size_t>(seqs));
            for (int q = 0; q < seqs; ++q) {
                table[size_t(q)].k_cache = d_caches.get() + size_t(2 * q) * cache;
                table[size_t(q)].v_cache = d_caches.get() + size_t(2 * q + 1) * cache;
                table[size_t(q)].pos = d_pos.get() + q;
            }
            auto d_table = upload(table);
            k::AttentionArgs a = attention_heads(m.n_heads, m.n_kv, m.hd, m.max_ctx, d_qn.get(), d_kn.get(), d_f.get());
            a.T = m.T;
            a.splits = m.splits;
            a.min_chunk = m.min_chunk;
            a.grid_splits = m.grid_splits;
            a.qkv = d_hi.get();
            a.qkv_lo = halves ? d_lo.get() : nullptr;
            a.out = d_out.get();
            a.out_split = d_split.get();
            a.partial = d_partial.get();
            a.counters = d_counters.get();
            if (m.batch > 0) {
                a.seqs = d_table.get();
                a.batch = m.batch;
                a.pos_settled = true;
            } else {
                a.k_cache = table[0].k_cache;
                a.v_cache = table[0].v_cache;
                a.pos_dev = d_pos.get();
            }
            k::attention(a, context().launch());
            return Result{download(d_out, size_t(rows) * qd), download(d_caches, caches.size()),
                          download(d_split, 2 * size_t(rows) * qd)};
        };
        const Result combined = run(false), from_halves = run(true);
        REQUIRE(all_finite(combined.out));
        CHECK(std::memcmp(from_halves.out.data(), combined.out.data(), combined.out.size() * 4) == 0);
        CHECK(std::memcmp(from_halves.caches.data(), combined.caches.data(), combined.caches.size() * 4) == 0);
        CHECK(from_halves.split == combined.split);
        CHECK(combined.caches != caches);  // the new keys and values were appended
    }
}

TEST_CASE("a batched prefill gives each sequence what its own prefill launch gives, bitwise",
          "[gpu][attention][batch][prefill]") {
    // Prompts of several streams in one kv_append + one attention launch (engine/cuda/
    // gpu_prefill_batch.h): different lengths (1 to 128 rows, tiles cut short), positions (a
    // first chunk, later chunks with split-K over 2-3 slices) and caches, at the second layer of
    // each cache (seq_layer_offset). Alone: the same rows as that stream's own launches.
    struct Mode {
        int n_heads, n_kv, hd, max_ctx;
        std::vector<int> T, pos0;
    };
    const Mode modes[] = {
        {16, 8, 128, 512, {37, 1, 9, 128, 20}, {0, 40, 130, 0, 250}},  // 1.7B talker heads
        {4, 2, 24, 384, {5, 64, 2}, {0, 64, 300}},                      // tiny model heads
    };
    constexpr int LAYERS = 2, LAYER = 1;
    for (const Mode& m : modes) {
        const uint64_t seed = fresh_seed();
        const int S = int(m.T.size());
        INFO("heads " << m.n_heads << "/" << m.n_kv << " hd " << m.hd << " sequences " << S << " seed " << seed);
        const int qd = m.n_heads * m.hd, kvd = m.n_kv * m.hd, ld = qd + 2 * kvd;
        const size_t layer_floats = size_t(m.n_kv) * m.max_ctx * m.hd, cache = LAYERS * layer_floats;
        std::vector<int> row0(size_t(S), 0), splits(size_t(S), 1);
        int rows = 0, tiles = 0, longest = 0, most_splits = 1;
        for (int s = 0; s < S; ++s) {
            row0[size_t(s)] = rows;
            rows += m.T[size_t(s)];
            tiles += (m.T[size_t(s)] + k::ATTN_TILE - 1) / k::ATTN_TILE;
            longest = std::max(longest, m.T[size_t(s)]);
            splits[size_t(s)] = k::attention_splits(m.pos0[size_t(s)] + m.T[size_t(s)]);
            most_splits = std::max(most_splits, splits[size_t(s)]);
        }
        REQUIRE(most_splits >= 2);  // some sequence combines slices
        const auto qkv = random_floats(size_t(rows) * ld, seed, -2.0f, 2.0f);
        const auto qn = random_floats(size_t(m.hd), seed + 1, 0.5f, 1.5f);
        const auto kn = random_floats(size_t(m.hd), seed + 2, 0.5f, 1.5f);
        std::vector<float> inv_freq(size_t(m.hd / 2));
        for (int i = 0; i < m.hd / 2; ++i) inv_freq[size_t(i)] = float(1.0 / std::pow(1e6, double(2 * i) / m.hd));
        const auto caches = random_floats(2 * size_t(S) * cache, seed + 3);  // [S][k | v], LAYERS each
        auto d_qn = upload(qn), d_kn = upload(kn), d_f = upload(inv_freq);
        auto base_args = [&]() {
            k::AttentionArgs a = attention_heads(m.n_heads, m.n_kv, m.hd, m.max_ctx, d_qn.get(), d_kn.get(), d_f.get());
            a.append = false;
            return a;
        };
        const auto k_of = [&](int s) { return caches.begin() + long(2 * s) * long(cache); };
        // Alone: each sequence's own kv_append + attention on its own copy of its cache.
        const size_t count = static_cast<size_t>(S);
        std::vector<std::vector<float>> alone_out(count), alone_k(count), alone_v(count);
        for (int s = 0; s < S; ++s) {
            const int T = m.T[size_t(s)];
            auto d_qkv = upload(std::vector<float>(qkv.begin() + long(row0[size_t(s)]) * ld,
                                                   qkv.begin() + long(row0[size_t(s)] + T) * ld));
            auto d_k = upload(std::vector<float>(k_of(s), k_of(s) + long(cache)));
            auto d_v = upload(std::vector<float>(k_of(s) + long(cache), k_of(s) + 2 * long(cache)));
            auto d_out = poisoned(size_t(T) * qd);
            DeviceArray<float> d_partial(k::attention_partial_floats(m.n_heads, T, splits[size_t(s)], m.hd));
            auto d_counters = upload(std::vector<uint32_t>(k::attention_counter_count(m.n_kv, T), 0u));
            k::AttentionArgs a = base_args();
            a.qkv = d_qkv.get();
            a.T = T;
            a.k_cache = d_k.get() + LAYER * layer_floats;
            a.v_cache = d_v.get() + LAYER * layer_floats;
            a.pos_host = m.pos0[size_t(s)];
            a.out = d_out.get();
            a.splits = splits[size_t(s)];
            a.partial = d_partial.get();
            a.counters = d_counters.get();
            k::kv_append(a, context().launch());
            k::attention(a, context().launch());
            alone_out[size_t(s)] = download(d_out, size_t(T) * qd);
            alone_k[size_t(s)] = download(d_k, cache);
            alone_v[size_t(s)] = download(d_v, cache);
        }
        // Batched: one table, one kv_append and one attention; the attention twice (the split-K
        // counters must be left at zero).
        auto d_qkv = upload(qkv);
        auto d_caches = upload(caches);
        auto d_out = poisoned(size_t(rows) * qd);
        std::vector<DeviceArray<float>> partials;
        std::vector<DeviceArray<uint32_t>> counters;
        std::vector<k::AttentionPrefillSeq> table(count);
        for (int s = 0; s < S; ++s) {
            const int T = m.T[size_t(s)];
            partials.emplace_back(k::attention_partial_floats(m.n_heads, T, splits[size_t(s)], m.hd));
            counters.push_back(upload(std::vector<uint32_t>(k::attention_counter_count(m.n_kv, T), 0u)));
            k::AttentionPrefillSeq& q = table[size_t(s)];
            q.k_cache = d_caches.get() + size_t(2 * s) * cache;
            q.v_cache = d_caches.get() + size_t(2 * s + 1) * cache;
            q.row0 = row0[size_t(s)];
            q.T = T;
            q.pos0 = m.pos0[size_t(s)];
            q.splits = splits[size_t(s)];
            q.partial = partials.back().get();
            q.counters = counters.back().get();
        }
        auto d_table = upload(table);
        k::AttentionArgs a = base_args();
        a.qkv = d_qkv.get();
        a.T = longest;
        a.splits = most_splits;
        a.seq_layer_offset = LAYER * layer_floats;
        a.out = d_out.get();
        a.prefill_seqs = d_table.get();
        a.batch = S;
        a.prefill_rows = rows;
        a.prefill_tiles = tiles;
        k::kv_append(a, context().launch());
        k::attention(a, context().launch());
        k::attention(a, context().launch());
        const auto out = download(d_out, size_t(rows) * qd);
        const auto caches_gpu = download(d_caches, caches.size());
        REQUIRE(all_finite(out));
        for (int s = 0; s < S; ++s) {
            INFO("sequence " << s << ": T " << m.T[size_t(s)] << " pos0 " << m.pos0[size_t(s)] << " splits "
                             << splits[size_t(s)]);
            const auto& want = alone_out[size_t(s)];
            CHECK(std::equal(want.begin(), want.end(), out.begin() + long(row0[size_t(s)]) * qd));
            CHECK(std::equal(alone_k[size_t(s)].begin(), alone_k[size_t(s)].end(),
                             caches_gpu.begin() + long(2 * s) * long(cache)));
            CHECK(std::equal(alone_v[size_t(s)].begin(), alone_v[size_t(s)].end(),
                             caches_gpu.begin() + long(2 * s + 1) * long(cache)));
            const auto left = download(counters[size_t(s)], k::attention_counter_count(m.n_kv, m.T[size_t(s)]));
            CHECK(std::all_of(left.begin(), left.end(), [](uint32_t v) { return v == 0u; }));
        }
        // Arguments without a table's totals are refused.
        a.prefill_tiles = 0;
        CHECK_THROWS(k::attention(a, context().launch()));
    }
}

TEST_CASE("split-bf16 cuBLAS products with their epilogues match the CPU linear", "[gpu][linear]") {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    const int T = 19, in = 1024, out = 768;
    const auto x = random_floats(size_t(T) * in, seed, -2.0f, 2.0f);
    const auto w_bf = to_bf16(random_floats(size_t(2 * out) * in, seed + 1, -0.05f, 0.05f));
    const auto w = from_bf16(w_bf);
    const auto bias = random_floats(size_t(2 * out), seed + 2);
    const auto residual = random_floats(size_t(T) * out, seed + 3);
    auto d_x = upload(x);
    auto d_w = upload(w_bf);
    auto d_bias = upload(bias);
    DeviceArray<uint16_t> d_xb(2 * x.size());
    DeviceArray<float> d_y2(size_t(2 * T) * 2 * out);
    k::rmsnorm_split_bf16(d_x.get(), T, in, in, nullptr, 0.0f, d_xb.get(), context().launch());
    const float alpha = 1.0f, beta = 0.0f;
    // y2 [2T, 2 out] = xb [2T, in] · W[2 out, in]^T
    CUBLAS_CHECK(cublasGemmEx(context().cublas(), CUBLAS_OP_T, CUBLAS_OP_N, 2 * out, 2 * T, in, &alpha, d_w.get(),
                              CUDA_R_16BF, in, d_xb.get(), CUDA_R_16BF, in, &beta, d_y2.get(), CUDA_R_32F, 2 * out,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    std::vector<float> full(size_t(T) * 2 * out);
    qtts::cpu::linear(x.data(), T, in, w.data(), nullptr, 2 * out, full.data());

    auto d_store = poisoned(size_t(T) * 2 * out);
    k::linear_split_combine(d_y2.get(), 2 * out, T, 2 * out, d_bias.get(), k::LinearEpilogue::LINEAR_EPILOGUE_STORE,
                            d_store.get(), 2 * out, context().launch());
    auto d_add = upload(residual);
    k::linear_split_combine(d_y2.get(), 2 * out, T, out, nullptr, k::LinearEpilogue::LINEAR_EPILOGUE_ADD, d_add.get(),
                            out, context().launch());
    auto d_swiglu = poisoned(size_t(T) * out);
    k::linear_split_combine(d_y2.get(), 2 * out, T, out, nullptr, k::LinearEpilogue::LINEAR_EPILOGUE_SWIGLU,
                            d_swiglu.get(), out, context().launch());
    auto d_silu = poisoned(size_t(T) * out);
    k::linear_split_combine(d_y2.get(), 2 * out, T, out, d_bias.get(), k::LinearEpilogue::LINEAR_EPILOGUE_SILU_BIAS,
                            d_silu.get(), out, context().launch());

    std::vector<float> r_store(full.size()), r_add(residual), r_swiglu(size_t(T) * out), r_silu(size_t(T) * out);
    for (int t = 0; t < T; ++t)
        for (int o = 0; o < 2 * out; ++o) {
            const float v = full[size_t(t) * 2 * out + o];
            r_store[size_t(t) * 2 * out + o] = v + bias[size_t(o)];
            if (o < out) {
                r_add[size_t(t) * out + o] += v;
                r_swiglu[size_t(t) * out + o] = qtts::cpu::silu(v) * full[size_t(t) * 2 * out + out + o];
                r_silu[size_t(t) * out + o] = qtts::cpu::silu(v + bias[size_t(o)]);
            }
        }
    const auto store = download(d_store, r_store.size());
    const auto add = download(d_add, r_add.size());
    const auto swig = download(d_swiglu, r_swiglu.size());
    const auto silu = download(d_silu, r_silu.size());
    REQUIRE(all_finite(store));
    REQUIRE(all_finite(swig));
    REQUIRE(all_finite(silu));
    // Split bf16 keeps ~16 mantissa bits of the activations: far below the 1e-2 budget of the LM.
    CHECK(rel_error(store.data(), r_store.data(), store.size()) < 1e-4);
    CHECK(rel_error(add.data(), r_add.data(), add.size()) < 1e-4);
    CHECK(rel_error(swig.data(), r_swiglu.data(), swig.size()) < 1e-4);
    CHECK(rel_error(silu.data(), r_silu.data(), silu.size()) < 1e-4);
}

TEST_CASE("a residual combine fused with the next product's split gives the bits of the two launches",
          "[gpu][linear][rmsnorm]") {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    struct Case {
        const char* name;
        bool norm;
        int T, n, ld_y2;
    };
    // Odd widths (not a multiple of the 256 threads), one row and many, a padded y2 row.
    const Case cases[] = {{"then RMSNorm", true, 7, 1000, 1003},
                          {"then RMSNorm, one row", true, 1, 2048, 2048},
                          {"then RMSNorm, a 6144-wide row", true, 3, 6144, 6144},
                          {"then a plain split", false, 5, 300, 777}};
    for (const Case& c : cases) {
        SECTION(c.name) {
            const auto y2 = random_floats(size_t(2 * c.T) * c.ld_y2, seed, -3.0f, 3.0f);
            const auto old = random_floats(size_t(c.T) * c.n, seed + 1, -2.0f, 2.0f);
            const auto norm_w = random_floats(size_t(c.n), seed + 2, 0.5f, 1.5f);
            auto d_y2 = upload(y2);
            auto d_norm = upload(norm_w);
            const float* w = c.norm ? d_norm.get() : nullptr;
            const float eps = 1e-6f;
            // Two launches: the combine, then the split of its output.
            auto d_y_two = upload(old);
            DeviceArray<uint16_t> d_xb_two(size_t(2 * c.T) * c.n);
            k::linear_split_combine(d_y2.get(), c.ld_y2, c.T, c.n, nullptr, k::LinearEpilogue::LINEAR_EPILOGUE_ADD,
                                    d_y_two.get(), c.n, context().launch());
            k::rmsnorm_split_bf16(d_y_two.get(), c.T, c.n, c.n, w, eps, d_xb_two.get(), context().launch());
            // One launch, into a poisoned split (NaN bf16 pairs).
            auto d_y_one = upload(old);
            auto d_xb_one = upload(std::vector<uint16_t>(size_t(2 * c.T) * c.n, 0xffffu));
            k::combine_add_rmsnorm_split_bf16(d_y2.get(), c.ld_y2, c.T, c.n, d_y_one.get(), c.n, w, eps,
                                              d_xb_one.get(), context().launch());
            const auto y_two = download(d_y_two, old.size()), y_one = download(d_y_one, old.size());
            const auto xb_two = download(d_xb_two, size_t(2 * c.T) * c.n),
                       xb_one = download(d_xb_one, size_t(2 * c.T) * c.n);
            REQUIRE(all_finite(y_one));
            REQUIRE(std::memcmp(y_one.data(), y_two.data(), y_one.size() * sizeof(float)) == 0);
            REQUIRE(xb_one == xb_two);
            // And against the CPU: y = old + hi + lo; hi + lo of each split value = rmsnorm(y) (~16 bits).
            std::vector<float> want_y(old), want(old.size()), got(old.size());
            for (int t = 0; t < c.T; ++t) {
                float* row = want_y.data() + size_t(t) * c.n;
                for (int i = 0; i < c.n; ++i)
                    row[i] += y2[size_t(t) * c.ld_y2 + i] + y2[size_t(c.T + t) * c.ld_y2 + i];
                if (c.norm)
                    qtts::cpu::rms_norm(row, 1, c.n, norm_w.data(), eps, want.data() + size_t(t) * c.n);
                else
                    std::copy(row, row + c.n, want.data() + size_t(t) * c.n);
                for (int i = 0; i < c.n; ++i)
                    got[size_t(t) * c.n + i] = qtts::bf16_to_f32(xb_one[size_t(t) * c.n + i]) +
                                               qtts::bf16_to_f32(xb_one[size_t(c.T + t) * c.n + i]);
            }
            CHECK(rel_error(y_one.data(), want_y.data(), want_y.size()) < 1e-6);
            REQUIRE(all_finite(got));
            CHECK(rel_error(got.data(), want.data(), got.size()) < 2e-5);
        }
    }
    // Refused: a y2 row narrower than the output, a row wider than the kernel holds.
    DeviceArray<float> y2(64), y(64);
    DeviceArray<uint16_t> xb(64);
    REQUIRE_THROWS(k::combine_add_rmsnorm_split_bf16(y2.get(), 4, 2, 8, y.get(), 8, nullptr, 0.0f, xb.get(),
                                                     context().launch()));
    REQUIRE_THROWS(k::combine_add_rmsnorm_split_bf16(y2.get(), 9000, 1, 9000, y.get(), 9000, nullptr, 0.0f, xb.get(),
                                                     context().launch()));
}

TEST_CASE("a SwiGLU or store combine that writes its split gives the bits of the combine and the split",
          "[gpu][linear]") {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    using E = k::LinearEpilogue;
    struct Case {
        const char* name;
        E epilogue;
        int T, n, ld_y2;
        bool keep_y;  // also the fp32 rows
    };
    // SwiGLU reads 2n columns of y2; odd widths, one row and many, padded y2 rows.
    const Case cases[] = {{"SwiGLU, the talker's width", E::LINEAR_EPILOGUE_SWIGLU, 6, 6144, 2 * 6144, false},
                          {"SwiGLU, odd width, one row, fp32 rows too", E::LINEAR_EPILOGUE_SWIGLU, 1, 1001, 2011, true},
                          {"store with a bias", E::LINEAR_EPILOGUE_STORE, 9, 300, 307, true}};
    for (const Case& c : cases) {
        SECTION(c.name) {
            const int cols = c.epilogue == E::LINEAR_EPILOGUE_SWIGLU ? 2 * c.n : c.n;
            REQUIRE(cols <= c.ld_y2);
            const auto y2 = random_floats(size_t(2 * c.T) * c.ld_y2, seed, -3.0f, 3.0f);
            const auto bias = random_floats(size_t(c.n), seed + 1, -1.0f, 1.0f);
            auto d_y2 = upload(y2), d_bias = upload(bias);
            const float* b = c.epilogue == E::LINEAR_EPILOGUE_STORE ? d_bias.get() : nullptr;
            // Two launches.
            auto d_y_two = poisoned(size_t(c.T) * c.n);
            DeviceArray<uint16_t> d_xb_two(size_t(2 * c.T) * c.n);
            k::linear_split_combine(d_y2.get(), c.ld_y2, c.T, c.n, b, c.epilogue, d_y_two.get(), c.n, context().launch());
            k::rmsnorm_split_bf16(d_y_two.get(), c.T, c.n, c.n, nullptr, 0.0f, d_xb_two.get(), context().launch());
            // One, into poisoned outputs.
            auto d_y_one = poisoned(size_t(c.T) * c.n);
            auto d_xb_one = upload(std::vector<uint16_t>(size_t(2 * c.T) * c.n, 0xffffu));
            k::linear_split_combine_split_bf16(d_y2.get(), c.ld_y2, c.T, c.n, b, c.epilogue,
                                               c.keep_y ? d_y_one.get() : nullptr, c.n, d_xb_one.get(),
                                               context().launch());
            const auto y_two = download(d_y_two, size_t(c.T) * c.n), y_one = download(d_y_one, size_t(c.T) * c.n);
            const auto xb_two = download(d_xb_two, size_t(2 * c.T) * c.n),
                       xb_one = download(d_xb_one, size_t(2 * c.T) * c.n);
            REQUIRE(all_finite(y_two));
            REQUIRE(xb_one == xb_two);
            if (c.keep_y) REQUIRE(std::memcmp(y_one.data(), y_two.data(), y_one.size() * sizeof(float)) == 0);
            else REQUIRE(std::all_of(y_one.begin(), y_one.end(), [](float v) { return std::isnan(v); }));  // untouched
        }
    }
    // Refused: the residual add (combine_add_rmsnorm_split_bf16's job), no split output.
    DeviceArray<float> y2(64), y(64);
    DeviceArray<uint16_t> xb(64);
    REQUIRE_THROWS(k::linear_split_combine_split_bf16(y2.get(), 8, 2, 8, nullptr, E::LINEAR_EPILOGUE_ADD, y.get(), 8,
                                                      xb.get(), context().launch()));
    REQUIRE_THROWS(k::linear_split_combine_split_bf16(y2.get(), 8, 2, 8, nullptr, E::LINEAR_EPILOGUE_STORE, y.get(), 8,
                                                      nullptr, context().launch()));
}

TEST_CASE("embedding gathers, the frame sum and row scatter match the CPU", "[gpu][embedding]") {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    const int G = 16, V = 300, H = 256;
    std::vector<std::vector<uint16_t>> tables_bf;
    std::vector<DeviceArray<uint16_t>> d_tables;
    for (int g = 0; g < G; ++g) {
        tables_bf.push_back(to_bf16(random_floats(size_t(V) * H, seed + uint64_t(g))));
        d_tables.push_back(upload(tables_bf.back()));
    }
    std::mt19937 rng{uint32_t(seed)};
    std::vector<int32_t> codes(size_t(3) * G);
    for (auto& c : codes) c = int32_t(rng() % V);
    auto d_codes = upload(codes);

    // Gather (rows 0..2 of codebook 0's table).
    auto d_gather = poisoned(size_t(3) * H);
    std::vector<int32_t> ids{codes[0], codes[size_t(G)], codes[size_t(2 * G)]};
    auto d_ids = upload(ids);
    k::embedding_gather(d_tables[0].get(), H, d_ids.get(), 3, d_gather.get(), H, false, context().launch());
    const auto gathered = download(d_gather, size_t(3) * H);
    for (int r = 0; r < 3; ++r)
        for (int i = 0; i < H; ++i)
            REQUIRE(gathered[size_t(r) * H + i] == qtts::bf16_to_f32(tables_bf[0][size_t(ids[size_t(r)]) * H + i]));

    // Frame sums with the text track: row index 1 of 2 trailing rows, then past the end -> pad.
    const auto trailing = random_floats(size_t(2) * H, seed + 100);
    const auto pad = random_floats(size_t(H), seed + 101);
    auto d_trailing = upload(trailing), d_pad = upload(pad);
    for (const int index : {1, 2}) {
        std::vector<int32_t> scalars{2, index};  // trailing rows, text index
        auto d_scalars = upload(scalars);
        k::FrameEmbedArgs f;
        for (int g = 0; g < G; ++g) f.tables[g] = d_tables[size_t(g)].get();
        f.groups = G;
        f.dim = H;
        f.codes = d_codes.get();
        f.code_stride = G;
        f.rows = 1;
        f.trailing = d_trailing.get();
        f.trailing_rows = d_scalars.get();
        f.text_index = d_scalars.get() + 1;
        f.pad = d_pad.get();
        auto d_out = poisoned(size_t(H));
        f.out = d_out.get();
        f.ldo = H;
        k::frame_embed(f, context().launch());
        const auto out = download(d_out, size_t(H));
        for (int i = 0; i < H; ++i) {
            float sum = qtts::bf16_to_f32(tables_bf[0][size_t(codes[0]) * H + i]);
            for (int g = 1; g < G; ++g) sum += qtts::bf16_to_f32(tables_bf[size_t(g)][size_t(codes[size_t(g)]) * H + i]);
            sum += index < 2 ? trailing[size_t(index) * H + i] : pad[size_t(i)];
            REQUIRE(out[size_t(i)] == sum);  // same order of additions: bitwise equal
        }
    }

    // rows_add: scatter rows 0,1,2 of `gathered` to rows 4,0,2 of a 5-row buffer.
    const auto base = random_floats(size_t(5) * H, seed + 200);
    auto d_base = upload(base);
    const std::vector<int32_t> dst_rows{4, 0, 2};
    auto d_dst_rows = upload(dst_rows);
    k::rows_add(d_gather.get(), H, nullptr, 3, H, d_dst_rows.get(), d_base.get(), H, context().launch());
    const auto scattered = download(d_base, base.size());
    for (int r = 0; r < 5; ++r)
        for (int i = 0; i < H; ++i) {
            float expect = base[size_t(r) * H + i];
            for (int s = 0; s < 3; ++s)
                if (dst_rows[size_t(s)] == r) expect += gathered[size_t(s) * H + i];
            REQUIRE(scattered[size_t(r) * H + i] == expect);
        }
}

TEST_CASE("the top-k threshold is the k-th largest value, bucketed or by radix passes", "[gpu][sampling]") {
    // A draw finds the k-th largest logit by a bracket of buckets below the max when it can and
    // by radix passes otherwise (kernels/sampling.cu). Both must give exactly what the CPU's
    // nth_element gives, ties and -inf entries included; the bracket must be what typical logits
    // take, and decline (NaN) where the values are all equal.
    struct Shape {
        const char* name;
        int kind;  // 0 uniform, 1 bell-shaped, 2 few distinct values, 3 a third -inf, 4 all equal, 5 one far outlier
    };
    const Shape shapes[] = {{"uniform", 0}, {"bell", 1}, {"ties", 2}, {"-inf third", 3}, {"all equal", 4},
                            {"outlier", 5}};
    DeviceArray<float> d_out(3);
    int bracketed = 0, declined_equal = 0, runs = 0;
    for (const Shape& sh : shapes) {
        for (const int n : {2048, 3072}) {
            for (const int k : {1, 5, 50, 200, n - 1}) {
                const uint64_t seed = fresh_seed();
                INFO(sh.name << " n " << n << " k " << k << " seed " << seed);
                std::mt19937_64 rng(seed);
                std::vector<float> v(static_cast<size_t>(n));
                std::uniform_real_distribution<float> uni(-6.0f, 6.0f);
                std::normal_distribution<float> bell(0.0f, 2.0f);
                for (int i = 0; i < n; ++i) {
                    float x = 0.0f;
                    switch (sh.kind) {
                        case 0: x = uni(rng); break;
                        case 1: x = bell(rng); break;
                        case 2: x = float(int(rng() % 7)) * 0.5f - 1.0f; break;
                        case 3: x = i % 3 == 0 ? -INFINITY : uni(rng); break;
                        case 4: x = 1.25f; break;
                        default: x = i == 17 ? 1000.0f : bell(rng); break;
                    }
                    v[size_t(i)] = x;
                }
                std::vector<float> sorted = v;
                std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
                const float want = sorted[size_t(k - 1)];
                const float want_max = *std::max_element(v.begin(), v.end());
                auto d_v = upload(v);
                CUDA_CHECK(cudaMemset(d_out.get(), 0xff, 3 * sizeof(float)));  // NaN-poisoned
                k::top_k_threshold_probe(d_v.get(), n, k, d_out.get(), context().launch());
                const auto out = download(d_out, 3);
                ++runs;
                CHECK(out[1] == want);  // the radix passes
                if ((sh.kind == 0 || sh.kind == 1) && k <= 200)
                    CHECK(out[0] == out[0]);  // typical logits: the bracket takes them (tens of candidates)
                if (out[0] == out[0]) {  // the bracket took it
                    ++bracketed;
                    CHECK(out[0] == want);
                    CHECK(out[2] == want_max);
                } else if (sh.kind == 4) {
                    ++declined_equal;
                }
            }
        }
    }
    INFO(bracketed << " of " << runs << " thresholds by the bracket");
    CHECK(bracketed >= 16);
    CHECK(declined_equal == 10);  // all-equal values always go to the radix passes
}

TEST_CASE("a draw picks what probs_pick picks, running sums bit for bit", "[gpu][sampling]") {
    // The device draw makes its running sums with one warp, 32 at a time (kernels/sampling.cu,
    // warp_draw); they must be the serial loop's sums to the bit, so the pick must be the CPU's
    // for any probabilities, zeros and absorbed tiny values included, at any count up to the
    // largest vocabulary (rounds of 32, a partial last round).
    struct Shape {
        const char* name;
        int kind;  // 0 uniform, 1 a third zero, 2 zeros around one block, 3 tiny beside large, 4 one nonzero
    };
    const Shape shapes[] = {{"uniform", 0}, {"a third zero", 1}, {"zeros around a block", 2},
                            {"tiny beside large", 3}, {"one nonzero", 4}};
    DeviceArray<int> d_out(1);
    int runs = 0;
    for (const Shape& sh : shapes) {
        for (const int count : {1, 2, 31, 32, 33, 50, 97, 2048, 3073, k::SAMPLE_MAX_VOCAB}) {
            const uint64_t seed = fresh_seed();
            std::mt19937_64 rng(seed);
            std::uniform_real_distribution<float> uni(0.0f, 1.0f);
            std::vector<float> probs(static_cast<size_t>(count));
            const int lone = int(rng() % uint64_t(count));
            for (int i = 0; i < count; ++i) {
                float p = uni(rng);
                switch (sh.kind) {
                    case 1: p = i % 3 == 1 ? 0.0f : p; break;
                    case 2: p = (i < count / 4 || i > count / 2) ? 0.0f : p; break;
                    case 3: p = i % 2 == 0 ? p * 1e-9f : p * 1e3f; break;
                    case 4: p = i == lone ? p + 0.5f : 0.0f; break;
                    default: break;
                }
                probs[size_t(i)] = p;
            }
            auto d_probs = upload(probs);
            for (const float u : {0.0f, uni(rng), uni(rng), uni(rng), 0.5f, 0.99999994f}) {
                INFO(sh.name << " count " << count << " u " << u << " seed " << seed);
                const int want = qtts::probs_pick(probs.data(), count, u);
                CUDA_CHECK(cudaMemset(d_out.get(), 0xff, sizeof(int)));  // -1: poisoned
                k::draw_probe(d_probs.get(), count, u, d_out.get(), context().launch());
                REQUIRE(download(d_out, 1)[0] == want);
                ++runs;
            }
        }
    }
    CHECK(runs == 5 * 10 * 6);
    CHECK_THROWS_AS(k::draw_probe(nullptr, 4, 0.5f, d_out.get(), context().launch()), k::KernelError);
}

TEST_CASE("on-device sampling reproduces the CPU sampler and its random stream", "[gpu][sampling]") {
    // Philox: the host mirror of the device generator equals the CPU RNG exactly.
    const qtts::SamplingRng rng(0x1234abcd5678ef01ull);
    for (uint32_t stream = 0; stream < 16; ++stream)
        for (uint64_t index : {0ull, 1ull, 77ull, 1ull << 33})
            REQUIRE(k::philox_uniform_host(rng.seed(), stream, index) == rng.uniform(stream, index));

    struct Case {
        const char* name;
        bool greedy;
        float temperature;
        int top_k;
        float top_p;
        int n;
        int group;
    };
    const Case cases[] = {
        {"codebook 0 greedy", true, 1.0f, 0, 1.0f, 3072, 0},
        {"codebook 0 reference sampling", false, 0.9f, 50, 1.0f, 3072, 0},
        {"codebook 0 top-p", false, 0.8f, 0, 0.7f, 3072, 0},
        {"predictor greedy", true, 1.0f, 0, 1.0f, 2048, 5},
        {"predictor reference sampling", false, 0.9f, 50, 1.0f, 2048, 7},
        {"predictor top-k + top-p", false, 1.3f, 200, 0.9f, 2048, 15},
        {"predictor whole vocabulary", false, 1.0f, 0, 1.0f, 2048, 9},
        {"codebook 0 whole vocabulary", false, 1.0f, 0, 1.0f, 3072, 0},
    };
    qtts::cuda::GpuContext& ctx = context();
    DeviceArray<k::GenerationDeviceState> d_state(1);
    DeviceArray<int32_t> d_codes(size_t(64) * k::SAMPLE_MAX_GROUPS);
    for (const Case& c : cases) {
        int mismatches = 0;
        const int trials = 60;
        for (int trial = 0; trial < trials; ++trial) {
            const uint64_t seed = fresh_seed();
            INFO(c.name << " trial " << trial << " seed " << seed);
            const auto logits = random_floats(size_t(c.n), seed, -6.0f, 6.0f);
            const int frame = int(seed % 40);
            qtts::TokenHistory history(c.n);
            std::vector<int32_t> seen(size_t(c.n), 0);
            const int history_tokens = int(seed % 5);  // < 2 keeps EOS masked
            for (int i = 0; i < history_tokens; ++i) {
                const int32_t id = int32_t((seed >> (8 * i)) % 2048);
                history.add(id);
                seen[size_t(id)] = 1;
            }
            qtts::SamplingParams params;
            params.greedy = c.greedy;
            params.temperature = c.temperature;
            params.top_k = c.top_k;
            params.top_p = c.top_p;
            params.repetition_penalty = 1.05f;
            qtts::Codebook0Rules rules;
            rules.suppress_begin = c.n - 1024;
            qtts::SamplerScratch scratch;
            const qtts::SamplingRng r(seed);
            const int32_t expect =
                c.group == 0 ? qtts::sample_codebook0(logits.data(), c.n, params, rules, history, r, uint64_t(frame), scratch)
                             : qtts::sample_predictor(logits.data(), c.n, params, c.group, r, uint64_t(frame), scratch);

            k::GenerationDeviceState st;
            st.seed = seed;
            st.frame = frame - 1;  // frame_offset 1 below: the draw belongs to `frame`
            st.history_count = history.count();
            st.min_new_tokens = 2;
            st.code_capacity = 64;
            k::SamplingDeviceParams dp;
            dp.greedy = c.greedy;
            dp.temperature = c.temperature;
            dp.top_k = c.top_k;
            dp.top_p = c.top_p;
            dp.repetition_penalty = 1.05f;
            st.talker = dp;
            st.predictor = dp;
            st.predictor.repetition_penalty = 1.0f;
            CUDA_CHECK(cudaMemcpy(d_state.get(), &st, sizeof(st), cudaMemcpyHostToDevice));
            auto d_logits = upload(logits);
            auto d_seen = upload(seen);
            k::SampleArgs a;
            a.logits = d_logits.get();
            a.n = c.n;
            a.state = d_state.get();
            a.group = c.group;
            a.frame_offset = 1;
            a.advance = true;
            a.eos_id = 2150;
            a.suppress_begin = c.n - 1024;
            a.seen = d_seen.get();
            a.codes = d_codes.get();
            k::sample(a, ctx.launch());
            CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
            k::GenerationDeviceState after;
            CUDA_CHECK(cudaMemcpy(&after, d_state.get(), sizeof(after), cudaMemcpyDeviceToHost));
            int32_t stored = -1;
            CUDA_CHECK(cudaMemcpy(&stored, d_codes.get() + size_t(frame) * k::SAMPLE_MAX_GROUPS + c.group, 4,
                                  cudaMemcpyDeviceToHost));
            const int32_t got = after.current[c.group];
            REQUIRE(got == stored);
            REQUIRE(after.frame == frame);       // advanced by one
            REQUIRE(after.position == 1);
            if (c.group == 0) {
                REQUIRE(after.history_count == history.count() + 1);
                REQUIRE((got < 2048 || (got == 2150 && history.count() >= 2)));  // suppression, EOS mask
            }
            if (c.greedy) {
                REQUIRE(got == expect);
            } else if (got != expect) {
                ++mismatches;
            }
        }
        INFO(c.name << ": " << mismatches << " of " << trials << " draws differ from the CPU");
        // Only a last-ulp difference in a softmax sum can separate them: allow one in the batch.
        CHECK(mismatches <= 1);
    }
}

TEST_CASE("a draw writes each row's input for the next predictor pass", "[gpu][sampling][batch]") {
    const uint64_t seed = fresh_seed();
    INFO("seed " << seed);
    // Rows: greedy, sampled, stopped, idle (no state), greedy. The input row is narrower than its
    // stride; the padding between rows is poisoned and must stay so. The rows come from a bf16
    // embedding (widened) or from fp32 rows (the projected embedding, copied as they are).
    const int rows = 5, n = 2048, dim = 200, ld = 256, group = 6;
    const auto logits = random_floats(size_t(rows) * n, seed, -6.0f, 6.0f);
    const auto table_bf = to_bf16(random_floats(size_t(n) * dim, seed + 1));
    const auto table_f32 = random_floats(size_t(n) * dim, seed + 2, -3.0f, 3.0f);
    const bool greedy[rows] = {true, false, false, false, true};
    const int32_t held[rows] = {11, 22, 1234, 777, 44};  // batch_codes[r, group] before the draw
    auto d_logits = upload(logits);
    auto d_table = upload(table_bf);
    auto d_rows = upload(table_f32);
    for (const bool projected : {false, true}) {
        INFO((projected ? "fp32 rows" : "bf16 embedding"));
        std::vector<DeviceArray<k::GenerationDeviceState>> states;
        std::vector<DeviceArray<int32_t>> codes, seen;
        std::vector<k::StreamSlot> slots(rows);
        for (int r = 0; r < rows; ++r) {
            if (r == 3) continue;  // idle
            k::GenerationDeviceState st;
            st.seed = seed + uint64_t(r);
            st.frame = 3;
            st.code_capacity = 8;
            st.stopped = r == 2 ? 1 : 0;
            st.predictor.greedy = greedy[r] ? 1 : 0;
            st.predictor.temperature = 0.9f;
            st.predictor.top_k = 50;
            st.current[group] = held[r];
            states.push_back(upload(std::vector<k::GenerationDeviceState>{st}));
            codes.push_back(upload(std::vector<int32_t>(size_t(8) * k::SAMPLE_MAX_GROUPS, -1)));
            seen.push_back(upload(std::vector<int32_t>(size_t(n), 0)));
            slots[size_t(r)].state = states.back().get();
            slots[size_t(r)].codes = codes.back().get();
            slots[size_t(r)].seen = seen.back().get();
        }
        std::vector<int32_t> batch_codes(size_t(rows) * k::SAMPLE_MAX_GROUPS, 0);
        for (int r = 0; r < rows; ++r) batch_codes[size_t(r) * k::SAMPLE_MAX_GROUPS + group] = held[r];
        auto d_slots = upload(slots);
        auto d_batch_codes = upload(batch_codes);
        auto d_out = poisoned(size_t(rows) * ld);
        // Row `code`'s input as the next pass would read it.
        auto expected = [&](int32_t code, int i) {
            return projected ? table_f32[size_t(code) * dim + i] : qtts::bf16_to_f32(table_bf[size_t(code) * dim + i]);
        };

        k::SampleArgs a;
        a.logits = d_logits.get();
        a.n = n;
        a.group = group;
        a.slots = d_slots.get();
        a.rows = rows;
        a.ld_logits = n;
        a.batch_codes = d_batch_codes.get();
        if (projected)
            a.embed_rows = d_rows.get();
        else
            a.embed_table = d_table.get();
        a.embed_dim = dim;
        a.embed_out = d_out.get();
        a.embed_ld = ld;
        k::sample(a, context().launch());
        const auto out = download(d_out, size_t(rows) * ld);
        const auto drawn = download(d_batch_codes, batch_codes.size());

        for (int r = 0; r < rows; ++r) {
            INFO("row " << r);
            const int32_t code = drawn[size_t(r) * k::SAMPLE_MAX_GROUPS + group];
            REQUIRE(code >= 0);
            REQUIRE(code < n);
            if (r == 2 || r == 3) REQUIRE(code == held[r]);  // stopped, idle: nothing drawn
            if (greedy[r]) {
                const float* row = logits.data() + size_t(r) * n;
                REQUIRE(code == int32_t(std::max_element(row, row + n) - row));
            }
            for (int i = 0; i < dim; ++i) REQUIRE(out[size_t(r) * ld + i] == expected(code, i));
            for (int i = dim; i < ld; ++i) REQUIRE(std::isnan(out[size_t(r) * ld + i]));
        }
        // A drawn row's code went to its stream as well.
        for (const int r : {0, 1, 4}) {
            const size_t s = size_t(r < 3 ? r : r - 1);
            const auto st = download(states[s], 1);
            REQUIRE(st[0].current[group] == drawn[size_t(r) * k::SAMPLE_MAX_GROUPS + group]);
        }

        // A single sequence's draw (row 1's stream, sampled, at the next frame) writes row 0.
        auto d_single = poisoned(size_t(ld));
        k::SampleArgs single;
        single.logits = d_logits.get() + n;
        single.n = n;
        single.state = states[1].get();
        single.group = group;
        single.frame_offset = 1;
        single.codes = codes[1].get();
        single.embed_table = a.embed_table;
        single.embed_rows = a.embed_rows;
        single.embed_dim = dim;
        single.embed_out = d_single.get();
        single.embed_ld = ld;
        k::sample(single, context().launch());
        const auto one = download(d_single, size_t(ld));
        const int32_t code = download(states[1], 1)[0].current[group];
        REQUIRE(code >= 0);
        REQUIRE(code < n);
        REQUIRE(download(codes[1], size_t(8) * k::SAMPLE_MAX_GROUPS)[size_t(4) * k::SAMPLE_MAX_GROUPS + group] == code);
        for (int i = 0; i < dim; ++i) REQUIRE(one[size_t(i)] == expected(code, i));
        for (int i = dim; i < ld; ++i) REQUIRE(std::isnan(one[size_t(i)]));

        // One source, never both or neither.
        k::SampleArgs both = single;
        both.embed_table = d_table.get();
        both.embed_rows = d_rows.get();
        REQUIRE_THROWS(k::sample(both, context().launch()));
        both.embed_table = nullptr;
        both.embed_rows = nullptr;
        REQUIRE_THROWS(k::sample(both, context().launch()));
    }
}

#endif  // QTTS_HAVE_CUDA

TEST_CASE("the kernel timeline is a profiling build's alone", "[gpu][timeline]") {
    // The record's file id: the name after the last '/', whatever the path before it.
    STATIC_REQUIRE(k::timeline_file_id("/work/main/kernels/attention.cu") == k::timeline_file_id("attention.cu"));
    STATIC_REQUIRE(k::timeline_file_id("kernels/attention.cu") != k::timeline_file_id("kernels/sampling.cu"));
    if (k::timeline_built()) {
        // A ring needs its counter and a capacity; the default ring detaches.
        CHECK_THROWS_AS(k::timeline_attach(k::TimelineRing{reinterpret_cast<k::TimelineRecord*>(16), nullptr, 4}),
                        k::KernelError);
        k::TimelineRing blocks_without_counter;
        blocks_without_counter.blocks = reinterpret_cast<k::TimelineBlockRecord*>(64);
        blocks_without_counter.block_capacity = 4;
        CHECK_THROWS_AS(k::timeline_attach(blocks_without_counter), k::KernelError);
        CHECK_NOTHROW(k::timeline_attach(k::TimelineRing{}));
    } else {
        // An ordinary build records nothing and says so, before any device work.
        CHECK_THROWS_AS(k::timeline_attach(k::TimelineRing{}), k::KernelError);
    }
}
