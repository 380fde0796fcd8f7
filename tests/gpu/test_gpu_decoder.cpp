// The GPU speech decoder (cuda/gpu_speech_decoder.h) against the CPU reference decoder:
//   * kernels: causal conv with carried tail + SnakeBeta (im2col + SGEMM), the split-bf16
//     products (bf16 hi/lo planes written by the im2col and split_planes, split_gemm_row_major),
//     transposed conv with carried overlap, depthwise conv, channel LayerNorm, RMSNorm, RoPE +
//     sliding-window attention over the K/V ring — each against the CPU ops on random non-zero
//     inputs;
//   * the tiny reference speech tokenizer, golden scenario decoder_long: GPU streaming at chunk
//     sizes 1, 2, 4, 25 equals the CPU full decode and the golden audio_full (1e-3 absolute and
//     60 dB with the default bf16x3 products, 1e-5 with fp32 products);
//   * graph replay vs eager: bitwise identical samples; invalid codes leave the state alone;
//   * a release-size random speech tokenizer: GPU streaming vs CPU full decode, SNR >= 60 dB.
#include <catch2/catch.hpp>

#ifdef QTTS_HAVE_CUDA

#include <algorithm>
#include <map>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/conv_ops.h"
#include "engine/cpu/ops.h"
#include "engine/model/weight_prep.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/cuda/gpu_batch_decoder.h"
#include "engine/cuda/gpu_speech_decoder.h"
#include "kernels/decoder.cuh"
#include "kernels/few_columns.cuh"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "test_support.h"

namespace qc = qtts::cuda;
namespace qk = qtts::kernels;

namespace {

qc::GpuContext& context() {
    static qc::GpuContext ctx(0);
    return ctx;
}

qc::DeviceArray<float> to_device(const std::vector<float>& v) {
    qc::DeviceArray<float> d(v.size());
    CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice));
    return d;
}

std::vector<float> to_host(const float* d, size_t n) {
    CUDA_CHECK(cudaStreamSynchronize(context().stream()));
    std::vector<float> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return v;
}

// State blocks for the kernels that read carried state (kernels/decoder.cuh DecoderStates): one
// block per stream with the header (position, chunk counter) and the given float pieces at
// 256-byte aligned offsets, and the device table of the blocks.
struct StateBlocks {
    std::vector<qc::DeviceBuffer> blocks;
    std::vector<size_t> at;  // piece offsets (the same in every block)
    qc::DeviceArray<char*> table;

    // pieces[stream][piece]
    StateBlocks(const std::vector<std::vector<std::vector<float>>>& pieces, const std::vector<int64_t>& positions,
                const std::vector<int64_t>& chunks) {
        size_t offset = qk::DECODER_STATE_HEADER_BYTES;
        for (const auto& piece : pieces.front()) {
            at.push_back(offset);
            offset += (piece.size() * sizeof(float) + 255) / 256 * 256;
        }
        std::vector<char*> pointers;
        for (size_t s = 0; s < pieces.size(); ++s) {
            blocks.emplace_back(offset);
            char* base = static_cast<char*>(blocks.back().get());
            const int64_t header[2] = {positions[s], chunks[s]};
            CUDA_CHECK(cudaMemcpy(base, header, sizeof(header), cudaMemcpyHostToDevice));
            for (size_t i = 0; i < pieces[s].size(); ++i)
                CUDA_CHECK(cudaMemcpy(base + at[i], pieces[s][i].data(), pieces[s][i].size() * sizeof(float),
                                      cudaMemcpyHostToDevice));
            pointers.push_back(base);
        }
        table = qc::DeviceArray<char*>(pointers.size());
        CUDA_CHECK(cudaMemcpy(table.get(), pointers.data(), pointers.size() * sizeof(char*), cudaMemcpyHostToDevice));
    }
    qk::DecoderStates states() const { return {table.get(), int(blocks.size())}; }
    std::vector<float> piece(size_t stream, size_t i, size_t floats) const {
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<float> v(floats);
        CUDA_CHECK(cudaMemcpy(v.data(), static_cast<const char*>(blocks[stream].get()) + at[i], floats * sizeof(float),
                              cudaMemcpyDeviceToHost));
        return v;
    }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// 10·log10(‖ref‖² / ‖ref − x‖²)
double snr_db(const std::vector<float>& x, const std::vector<float>& ref) {
    double s = 0.0, e = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
        s += double(ref[i]) * ref[i];
        const double d = double(x[i]) - ref[i];
        e += d * d;
    }
    return e == 0.0 ? 300.0 : 10.0 * std::log10(s / e);
}

std::vector<float> concat_columns(const std::vector<float>& tail, int L, const std::vector<float>& x, int C, int T) {
    std::vector<float> out(size_t(C) * (L + T));
    for (int c = 0; c < C; ++c) {
        std::copy_n(tail.begin() + ptrdiff_t(c) * L, L, out.begin() + ptrdiff_t(c) * (L + T));
        std::copy_n(x.begin() + ptrdiff_t(c) * T, T, out.begin() + ptrdiff_t(c) * (L + T) + L);
    }
    return out;
}

std::vector<float> positive(size_t n, uint64_t seed) { return qtts_test::random_floats(n, seed, 0.2f, 1.5f); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

TEST_CASE("gpu decoder kernels: causal conv with tail and SnakeBeta", "[gpu][decoder]") {
    // T = 301: im2col tiles of 128 columns, one per thread, the last partial; T = 1300: four
    // columns per thread (T a multiple of 4), tiles of 512, the last partial; T = 2600: eight
    // columns per thread (a long multiple of 8), tiles of 1024, the last partial.
    for (const int T : {301, 1300, 2600}) {
        CAPTURE(T);
        const int C = 24, Cout = 20, K = 7, d = 3, L = (K - 1) * d;
        const qk::Launch l = context().launch();
        auto x = qtts_test::random_floats(size_t(C) * T, 1);
        auto tail = qtts_test::random_floats(size_t(C) * L, 2);
        auto w = qtts_test::random_floats(size_t(Cout) * C * K, 3, -0.2f, 0.2f);
        auto b = qtts_test::random_floats(size_t(Cout), 4);
        auto log_alpha = qtts_test::random_floats(size_t(C), 5, -0.5f, 0.5f);
        auto log_beta = qtts_test::random_floats(size_t(C), 6, -0.5f, 0.5f);
        std::vector<float> alpha(static_cast<size_t>(C)), inv_beta(static_cast<size_t>(C));
        for (int c = 0; c < C; ++c) {
            alpha[size_t(c)] = qtts::snake_alpha(log_alpha[size_t(c)]);
            inv_beta[size_t(c)] = qtts::snake_inv_beta(log_beta[size_t(c)]);
        }
        // CPU: conv over [tail | snake(x)]
        std::vector<float> xs = x;
        qtts::cpu::snake_beta(xs.data(), C, T, log_alpha.data(), log_beta.data());
        const auto cat = concat_columns(tail, L, xs, C, T);
        std::vector<float> expect(size_t(Cout) * T);
        qtts::cpu::conv1d(cat.data(), C, L + T, w.data(), b.data(), Cout, K, 1, d, 1, expect.data());
        std::vector<float> expect_tail(size_t(C) * L);
        for (int c = 0; c < C; ++c)
            std::copy_n(cat.begin() + ptrdiff_t(c) * (L + T) + T, L, expect_tail.begin() + ptrdiff_t(c) * L);

        // GPU: im2col (+ ones row), tail update, SGEMM with the bias column.
        std::vector<float> wp(size_t(Cout) * (C * K + 1));
        for (int o = 0; o < Cout; ++o) {
            std::copy_n(w.begin() + ptrdiff_t(o) * C * K, C * K, wp.begin() + ptrdiff_t(o) * (C * K + 1));
            wp[size_t(o) * (C * K + 1) + C * K] = b[size_t(o)];
        }
        auto dx = to_device(x), dtail = to_device(tail), dw = to_device(wp), da = to_device(alpha), db = to_device(inv_beta);
        qc::DeviceArray<float> col(size_t(C * K + 1) * T), y(size_t(Cout) * T);
        qk::SnakeParams snake{da.get(), db.get()};
        qk::conv_im2col(dtail.get(), L, dx.get(), C, T, K, d, snake, col.get(), l);
        qk::conv_tail_update(dtail.get(), L, dx.get(), C, T, snake, l);
        qc::sgemm_row_major(context(), false, false, Cout, T, C * K + 1, dw.get(), C * K + 1, col.get(), T, 0.0f, y.get(),
                            T);
        const auto got = to_host(y.get(), y.size());
        const auto got_tail = to_host(dtail.get(), dtail.size());
        const double err = qtts_test::max_abs_error(got.data(), expect.data(), expect.size());
        const double tail_err = qtts_test::max_abs_error(got_tail.data(), expect_tail.data(), expect_tail.size());
        std::printf("causal conv k7 d3: max abs %.3g, tail %.3g\n", err, tail_err);
        CHECK(err < 1e-4);
        CHECK(tail_err < 1e-5);

        // T shorter than the tail: the new tail mixes old tail and new input.
        const int T2 = 5;
        auto x2 = qtts_test::random_floats(size_t(C) * T2, 7);
        auto dx2 = to_device(x2);
        qk::conv_tail_update(dtail.get(), L, dx2.get(), C, T2, {}, l);
        const auto cat2 = concat_columns(expect_tail, L, x2, C, T2);
        std::vector<float> expect_tail2(size_t(C) * L);
        for (int c = 0; c < C; ++c)
            std::copy_n(cat2.begin() + ptrdiff_t(c) * (L + T2) + T2, L, expect_tail2.begin() + ptrdiff_t(c) * L);
        const auto got_tail2 = to_host(dtail.get(), dtail.size());
        CHECK(qtts_test::max_abs_error(got_tail2.data(), expect_tail2.data(), expect_tail2.size()) < 1e-5);

        // Fused variant: tails in two slots chosen by the chunk counter's parity (0: read slot 0,
        // write slot 1), same im2col.
        std::vector<float> tails2(size_t(2) * C * L, 0.0f);
        std::copy(tail.begin(), tail.end(), tails2.begin());
        const StateBlocks block({{tails2}}, {0}, {0});
        qc::DeviceArray<float> col2(col.size());
        qk::conv_im2col_carry(block.states(), block.at[0], L, dx.get(), C, T, K, d, snake, col2.get(), l);
        qc::sgemm_row_major(context(), false, false, Cout, T, C * K + 1, dw.get(), C * K + 1, col2.get(), T, 0.0f, y.get(),
                            T);
        const auto got2 = to_host(y.get(), y.size());
        const auto got_tails2 = block.piece(0, 0, tails2.size());
        CHECK(qtts_test::max_abs_error(got2.data(), expect.data(), expect.size()) < 1e-4);
        CHECK(qtts_test::max_abs_error(got_tails2.data() + size_t(C) * L, expect_tail.data(), expect_tail.size()) < 1e-5);
        CHECK(qtts_test::max_abs_error(got_tails2.data(), tail.data(), tail.size()) == 0.0);  // read slot untouched
    }
}

namespace {

// The bf16 pair of v as the split kernels make it (round to nearest even, twice).
std::pair<uint16_t, uint16_t> bf16_pair(float v) {
    const uint16_t hi = qtts::f32_to_bf16(v);
    return {hi, qtts::f32_to_bf16(v - qtts::bf16_to_f32(hi))};
}

// Mismatches between planes [3, count] (hi, lo, hi again) and the bf16 pairs of `values` [count].
size_t pair_mismatches(const qc::DeviceArray<uint16_t>& planes, const std::vector<float>& values) {
    CUDA_CHECK(cudaStreamSynchronize(context().stream()));
    std::vector<uint16_t> got(3 * values.size());
    CUDA_CHECK(cudaMemcpy(got.data(), planes.get(), got.size() * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (size_t i = 0; i < values.size(); ++i) {
        const auto [hi, lo] = bf16_pair(values[i]);
        bad += got[i] != hi || got[values.size() + i] != lo || got[2 * values.size() + i] != hi;
    }
    return bad;
}

// A three times along K as bf16 pairs: rows [hi | hi | lo] ([M, 3K]), or stacked hi; hi; lo
// ([3K, M] from A stored [K, M]) — the `a3` operand of split_gemm_row_major, built on the host.
qc::DeviceArray<uint16_t> a3_device(const std::vector<float>& a, size_t rows, size_t cols, bool stacked) {
    std::vector<uint16_t> out(3 * a.size());
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) {
            const auto [hi, lo] = bf16_pair(a[r * cols + c]);
            const size_t at = stacked ? r * cols + c : r * 3 * cols + c, step = stacked ? rows * cols : cols;
            out[at] = hi;
            out[at + step] = hi;
            out[at + 2 * step] = lo;
        }
    qc::DeviceArray<uint16_t> d(out.size());
    CUDA_CHECK(cudaMemcpy(d.get(), out.data(), out.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    return d;
}

// C [M, N] = op(A) [M, K] · B [K, N] in double sums of the fp32 operands (A [M, K], or [K, M]
// with trans_a).
std::vector<float> product_reference(const std::vector<float>& a, bool trans_a, const std::vector<float>& b, int M,
                                     int N, int K) {
    std::vector<float> c(size_t(M) * N);
    for (int m = 0; m < M; ++m)
        for (int n = 0; n < N; ++n) {
            double sum = 0.0;
            for (int k = 0; k < K; ++k)
                sum += double(trans_a ? a[size_t(k) * M + m] : a[size_t(m) * K + k]) * b[size_t(k) * N + n];
            c[size_t(m) * N + n] = float(sum);
        }
    return c;
}

}  // namespace

TEST_CASE("gpu decoder kernels: split-bf16 products (im2col planes, split_planes, split GEMMs) match the CPU",
          "[gpu][decoder]") {
    // Odd sizes (T a multiple of 4: the im2col stores four columns at a time, over three tiles);
    // the weight rows padded to a multiple of 8 as the bf16x3 upload does.
    const int C = 13, Cout = 11, K = 7, d = 2, T = 1300, L = (K - 1) * d, rows = (C * K + 1 + 7) / 8 * 8;
    const uint64_t seed = 4711;
    std::printf("split-bf16 products: seed %llu, C %d, Cout %d, K %d, T %d, rows %d\n", (unsigned long long)seed, C,
                Cout, K, T, rows);
    const qk::Launch l = context().launch();
    auto x = qtts_test::random_floats(size_t(C) * T, seed);
    auto tail = qtts_test::random_floats(size_t(C) * L, seed + 1);
    auto w = qtts_test::random_floats(size_t(Cout) * rows, seed + 2, -0.3f, 0.3f);  // bias in column C·K
    for (int o = 0; o < Cout; ++o)
        for (int j = C * K + 1; j < rows; ++j) w[size_t(o) * rows + j] = 0.0f;
    auto log_alpha = qtts_test::random_floats(size_t(C), seed + 3, -0.5f, 0.5f);
    auto log_beta = qtts_test::random_floats(size_t(C), seed + 4, -0.5f, 0.5f);
    std::vector<float> alpha(static_cast<size_t>(C)), inv_beta(static_cast<size_t>(C));
    for (int c = 0; c < C; ++c) {
        alpha[size_t(c)] = qtts::snake_alpha(log_alpha[size_t(c)]);
        inv_beta[size_t(c)] = qtts::snake_inv_beta(log_beta[size_t(c)]);
    }
    auto dx = to_device(x), dtail = to_device(tail), da = to_device(alpha), db = to_device(inv_beta);
    const qk::SnakeParams snake{da.get(), db.get()};

    // The fp32 columns, and the same columns as planes (poisoned first): exactly their bf16 pairs.
    qc::DeviceArray<float> col(size_t(rows) * T);
    qk::conv_im2col(dtail.get(), L, dx.get(), C, T, K, d, snake, col.get(), l, rows);
    const auto cols = to_host(col.get(), col.size());
    qc::DeviceArray<uint16_t> planes(3 * cols.size());
    CUDA_CHECK(cudaMemset(planes.get(), 0xff, planes.bytes()));
    qk::conv_im2col_split(dtail.get(), L, dx.get(), C, T, K, d, snake, planes.get(), l, rows);
    CHECK(pair_mismatches(planes, cols) == 0);

    // The product against the CPU (double sums of the fp32 operands), then accumulated (beta 1).
    const std::vector<float> expect = product_reference(w, false, cols, Cout, T, rows);
    const auto dw3 = a3_device(w, size_t(Cout), size_t(rows), false);
    qc::DeviceArray<float> y(expect.size());
    const std::vector<float> nan(expect.size(), std::nanf(""));
    CUDA_CHECK(cudaMemcpy(y.get(), nan.data(), y.bytes(), cudaMemcpyHostToDevice));  // beta 0 must not read it
    qc::split_gemm_row_major(context(), false, Cout, T, rows, dw3.get(), 3 * rows, planes.get(), 0.0f, y.get(), T);
    auto got = to_host(y.get(), y.size());
    const double err = qtts_test::rel_error(got.data(), expect.data(), expect.size());
    qc::split_gemm_row_major(context(), false, Cout, T, rows, dw3.get(), 3 * rows, planes.get(), 1.0f, y.get(), T);
    got = to_host(y.get(), y.size());
    std::vector<float> twice(expect);
    for (float& v : twice) v *= 2.0f;
    const double err_acc = qtts_test::rel_error(got.data(), twice.data(), twice.size());
    // What one bf16 operand alone would give (the bar the split must clear by far): ~1e-3.
    std::printf("  conv product: relative error %.3g (accumulated %.3g)\n", err, err_acc);
    CHECK(err < 2e-5);
    CHECK(err_acc < 2e-5);

    // The streaming im2col (tail slots) writes the planes of its fp32 twin's columns.
    std::vector<float> tails2(size_t(2) * C * L, 0.0f);
    std::copy(tail.begin(), tail.end(), tails2.begin());
    const StateBlocks block_f32({{tails2}}, {0}, {0}), block_split({{tails2}}, {0}, {0});
    qk::conv_im2col_carry(block_f32.states(), block_f32.at[0], L, dx.get(), C, T, K, d, snake, col.get(), l, rows);
    CUDA_CHECK(cudaMemset(planes.get(), 0xff, planes.bytes()));
    qk::conv_im2col_carry_split(block_split.states(), block_split.at[0], L, dx.get(), C, T, K, d, snake, planes.get(),
                                l, rows);
    CHECK(pair_mismatches(planes, to_host(col.get(), col.size())) == 0);
    const auto new_tail_f32 = block_f32.piece(0, 0, tails2.size()), new_tail_split = block_split.piece(0, 0, tails2.size());
    CHECK(std::memcmp(new_tail_f32.data(), new_tail_split.data(), tails2.size() * sizeof(float)) == 0);
    {
        // Eight columns per thread (a long multiple of 8: 16-byte plane stores), plain and carried.
        const int T8 = 2056;
        auto x8 = qtts_test::random_floats(size_t(C) * T8, seed + 6);
        auto dx8 = to_device(x8);
        qc::DeviceArray<float> col8(size_t(rows) * T8);
        qc::DeviceArray<uint16_t> planes8(3 * col8.size());
        qk::conv_im2col(dtail.get(), L, dx8.get(), C, T8, K, d, snake, col8.get(), l, rows);
        CUDA_CHECK(cudaMemset(planes8.get(), 0xff, planes8.bytes()));
        qk::conv_im2col_split(dtail.get(), L, dx8.get(), C, T8, K, d, snake, planes8.get(), l, rows);
        CHECK(pair_mismatches(planes8, to_host(col8.get(), col8.size())) == 0);
        const StateBlocks carried_f32({{tails2}}, {0}, {0}), carried_split({{tails2}}, {0}, {0});
        qk::conv_im2col_carry(carried_f32.states(), carried_f32.at[0], L, dx8.get(), C, T8, K, d, snake, col8.get(), l,
                              rows);
        CUDA_CHECK(cudaMemset(planes8.get(), 0xff, planes8.bytes()));
        qk::conv_im2col_carry_split(carried_split.states(), carried_split.at[0], L, dx8.get(), C, T8, K, d, snake,
                                    planes8.get(), l, rows);
        CHECK(pair_mismatches(planes8, to_host(col8.get(), col8.size())) == 0);
    }

    // A transposed conv's product: W [Cin, Cout·Kt] transposed, its input snake(x) as planes.
    const int Cin = C, cols_t = Cout * 6, N = T;
    auto wt = qtts_test::random_floats(size_t(Cin) * cols_t, seed + 5, -0.3f, 0.3f);
    qc::DeviceArray<float> act(size_t(Cin) * N);
    qk::snake_apply(dx.get(), Cin, N, snake, act.get(), l);
    const auto acts = to_host(act.get(), act.size());
    qc::DeviceArray<uint16_t> planes_t(3 * acts.size());
    CUDA_CHECK(cudaMemset(planes_t.get(), 0xff, planes_t.bytes()));
    qk::split_planes(dx.get(), Cin, N, snake, planes_t.get(), l);
    CHECK(pair_mismatches(planes_t, acts) == 0);
    const std::vector<float> expect_t = product_reference(wt, true, acts, cols_t, N, Cin);
    const auto dwt3 = a3_device(wt, size_t(Cin), size_t(cols_t), true);
    qc::DeviceArray<float> yt(expect_t.size());
    qc::split_gemm_row_major(context(), true, cols_t, N, Cin, dwt3.get(), cols_t, planes_t.get(), 0.0f, yt.get(), N);
    const auto got_t = to_host(yt.get(), yt.size());
    const double err_t = qtts_test::rel_error(got_t.data(), expect_t.data(), expect_t.size());
    std::printf("  transposed product: relative error %.3g\n", err_t);
    CHECK(err_t < 2e-5);
    // No activation: the planes of x itself.
    qk::split_planes(dx.get(), Cin, N, {}, planes_t.get(), l);
    CHECK(pair_mismatches(planes_t, x) == 0);
}

TEST_CASE("gpu decoder kernels: few-column products (weight rows and stacked weights) match the CPU",
          "[gpu][decoder]") {
    // Odd sizes: a partial last block of rows / outputs, K not a multiple of the warps' steps,
    // column counts that fill no tile.
    const uint64_t seed = 9173;
    const int M_rows = 37, K_rows = 8 * 611, M_stacked = 4 * 67, K_stacked = 1001;
    std::printf("few-column products: seed %llu, rows %dx%d, stacked %dx%d\n", (unsigned long long)seed, M_rows,
                K_rows, M_stacked, K_stacked);
    const qk::Launch l = context().launch();
    // With a workspace these few tiles split K into slices (several blocks per tile, the last one
    // adding their sums); without, one block per tile.
    qc::DeviceArray<float> partials(qk::FEW_COLUMNS_PARTIAL_FLOATS);
    qc::DeviceArray<uint32_t> tickets(static_cast<size_t>(qk::FEW_COLUMNS_TICKETS));
    CUDA_CHECK(cudaMemset(tickets.get(), 0, tickets.bytes()));
    const qk::FewColumnsWorkspace sliced{partials.get(), partials.size(), tickets.get(), int(tickets.size())};
    for (const bool stacked : {false, true}) {
        const int M = stacked ? M_stacked : M_rows, K = stacked ? K_stacked : K_rows;
        // W [M, K] rows, or stacked [K, M]; its planes as the bf16x3 upload lays them out.
        const auto w = qtts_test::random_floats(size_t(M) * K, seed + (stacked ? 1 : 0), -0.3f, 0.3f);
        const auto planes = stacked ? a3_device(w, size_t(K), size_t(M), true) : a3_device(w, size_t(M), size_t(K), false);
        const qk::SplitWeights split =
            stacked ? qk::split_stacked(planes.get(), K, M) : qk::split_rows(planes.get(), K, 3 * K);
        for (const int N : {1, 2, 3, 4, 7, 8, 13, 16, 25, 32}) {
            INFO((stacked ? "stacked" : "rows") << ", N " << N);
            if (N > qk::FEW_COLUMNS_MAX || (stacked && N > 8)) {  // stacked: 4 x N sums per lane, up to 8 columns
                CHECK_FALSE(qk::few_columns_supported(split, M, N, K));
                continue;
            }
            REQUIRE(qk::few_columns_supported(split, M, N, K));
            const auto x = qtts_test::random_floats(size_t(K) * N, seed + 10 + uint64_t(N));
            const std::vector<float> expect = product_reference(w, stacked, x, M, N, K);
            const auto dx = to_device(x);
            qc::DeviceArray<float> y(expect.size());
            const std::vector<float> nan(expect.size(), std::nanf(""));
            CUDA_CHECK(cudaMemcpy(y.get(), nan.data(), y.bytes(), cudaMemcpyHostToDevice));  // not read unless accumulating
            qk::few_columns_product(split, M, N, K, dx.get(), false, y.get(), sliced, l);
            const auto got = to_host(y.get(), y.size());
            const double err = qtts_test::rel_error(got.data(), expect.data(), expect.size());
            CHECK(err < 2e-5);
            // One block per tile (no workspace): within the same bound; again with slices: the same bits.
            CUDA_CHECK(cudaMemcpy(y.get(), nan.data(), y.bytes(), cudaMemcpyHostToDevice));
            qk::few_columns_product(split, M, N, K, dx.get(), false, y.get(), {}, l);
            const auto got_one = to_host(y.get(), y.size());
            const double err_one = qtts_test::rel_error(got_one.data(), expect.data(), expect.size());
            CHECK(err_one < 2e-5);
            qk::few_columns_product(split, M, N, K, dx.get(), false, y.get(), sliced, l);
            const auto again = to_host(y.get(), y.size());
            CHECK(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)) == 0);
            // Accumulated onto random values.
            const auto base = qtts_test::random_floats(expect.size(), seed + 100 + uint64_t(N));
            CUDA_CHECK(cudaMemcpy(y.get(), base.data(), y.bytes(), cudaMemcpyHostToDevice));
            qk::few_columns_product(split, M, N, K, dx.get(), true, y.get(), sliced, l);
            const auto got_acc = to_host(y.get(), y.size());
            std::vector<float> expect_acc(expect);
            for (size_t i = 0; i < expect_acc.size(); ++i) expect_acc[i] += base[i];
            const double err_acc = qtts_test::rel_error(got_acc.data(), expect_acc.data(), expect_acc.size());
            CHECK(err_acc < 2e-5);
            std::printf("  %s N %2d: relative error %.3g (accumulated %.3g, one block per tile %.3g)\n",
                        stacked ? "stacked" : "rows   ", N, err, err_acc, err_one);
            // Column 0 with x's first column alone: an output does not depend on the other columns.
            std::vector<float> x0(static_cast<size_t>(K));
            for (int k = 0; k < K; ++k) x0[size_t(k)] = x[size_t(k) * N];
            const auto dx0 = to_device(x0);
            qc::DeviceArray<float> dy0(static_cast<size_t>(M));
            qk::few_columns_product(split, M, 1, K, dx0.get(), false, dy0.get(), sliced, l);
            const auto first_column = to_host(dy0.get(), dy0.size());  // the same bits at any N
            size_t differ = 0;
            for (int m = 0; m < M; ++m)
                differ += std::memcmp(&first_column[size_t(m)], &got[size_t(m) * N], sizeof(float)) != 0;
            CHECK(differ == 0);
        }
        // What the kernels do not take: more columns than FEW_COLUMNS_MAX, rows of K % 8 != 0,
        // stacked outputs not a multiple of 4; the launcher refuses them.
        CHECK_FALSE(qk::few_columns_supported(split, M, qk::FEW_COLUMNS_MAX + 1, K));
        CHECK_FALSE(qk::few_columns_supported(split, M, 0, K));
        qc::DeviceArray<float> y(size_t(M) * (qk::FEW_COLUMNS_MAX + 1)), xb(size_t(K) * (qk::FEW_COLUMNS_MAX + 1));
        CHECK_THROWS_AS(
            qk::few_columns_product(split, M, qk::FEW_COLUMNS_MAX + 1, K, xb.get(), false, y.get(), sliced, l),
            qk::KernelError);
        if (stacked)
            CHECK_FALSE(qk::few_columns_supported(split, M - 2, 4, K));
        else
            CHECK_FALSE(qk::few_columns_supported(qk::SplitWeights{split.hi, split.lo, split.ld, false}, M, 4, K - 4));
    }
    // Every launch left the tickets at zero (the next one, or a graph replay, starts from there).
    std::vector<uint32_t> left(tickets.size());
    CUDA_CHECK(cudaMemcpy(left.data(), tickets.get(), tickets.bytes(), cudaMemcpyDeviceToHost));
    CHECK(std::count(left.begin(), left.end(), 0u) == std::ptrdiff_t(left.size()));
}

TEST_CASE("gpu decoder kernels: fused output conv (SnakeBeta, tail slots, clamp)", "[gpu][decoder]") {
    const int C = 20, K = 7, L = K - 1, T = 150;
    const qk::Launch l = context().launch();
    auto x = qtts_test::random_floats(size_t(C) * T, 41);
    auto tail = qtts_test::random_floats(size_t(C) * L, 42);
    auto w = qtts_test::random_floats(size_t(C) * K, 43, -0.3f, 0.3f);
    const float bias = 0.05f;
    auto la = qtts_test::random_floats(size_t(C), 44, -0.5f, 0.5f), lb = qtts_test::random_floats(size_t(C), 45);
    std::vector<float> alpha(static_cast<size_t>(C)), inv_beta(static_cast<size_t>(C));
    for (int c = 0; c < C; ++c) {
        alpha[size_t(c)] = qtts::snake_alpha(la[size_t(c)]);
        inv_beta[size_t(c)] = qtts::snake_inv_beta(lb[size_t(c)]);
    }
    std::vector<float> xs = x;
    qtts::cpu::snake_beta(xs.data(), C, T, la.data(), lb.data());
    const auto cat = concat_columns(tail, L, xs, C, T);
    std::vector<float> expect(static_cast<size_t>(T));
    qtts::cpu::conv1d(cat.data(), C, L + T, w.data(), &bias, 1, K, 1, 1, 1, expect.data());
    int clamped = 0;
    for (float& v : expect) {
        clamped += std::fabs(v) > 1.0f;
        v = std::min(1.0f, std::max(-1.0f, v));
    }
    std::vector<float> wb = w;
    wb.push_back(bias);
    std::vector<float> tails(size_t(2) * C * L, 0.0f);
    std::copy(tail.begin(), tail.end(), tails.begin() + ptrdiff_t(C) * L);  // counter 1: read slot 1
    auto dx = to_device(x), dw = to_device(wb), da = to_device(alpha), db = to_device(inv_beta);
    const StateBlocks block({{tails}}, {0}, {1});
    qc::DeviceArray<float> y(static_cast<size_t>(T));
    qk::conv_out_carry(block.states(), block.at[0], L, dx.get(), C, T, K, 1, {da.get(), db.get()}, dw.get(), y.get(), l);
    const auto got = to_host(y.get(), y.size());
    const auto got_tails = block.piece(0, 0, tails.size());
    std::vector<float> expect_tail(size_t(C) * L);
    for (int c = 0; c < C; ++c)
        std::copy_n(cat.begin() + ptrdiff_t(c) * (L + T) + T, L, expect_tail.begin() + ptrdiff_t(c) * L);
    const double err = qtts_test::max_abs_error(got.data(), expect.data(), expect.size());
    std::printf("output conv direct: max abs %.3g (%d of %d samples clamped)\n", err, clamped, T);
    CHECK(err < 1e-5);
    CHECK(qtts_test::max_abs_error(got_tails.data(), expect_tail.data(), expect_tail.size()) < 1e-5);
}

TEST_CASE("gpu decoder kernels: small-row linear with RMSNorm prologue and epilogues", "[gpu][decoder]") {
    const qk::Launch l = context().launch();
    using E = qk::SmallLinearEpilogue;
    for (const int n : {1, 3, 8}) {
        CAPTURE(n);
        const int in = 64, out = 40;
        auto x = qtts_test::random_floats(size_t(n) * in, 51);
        auto nw = qtts_test::random_floats(size_t(in), 52);
        auto W = qtts_test::random_floats(size_t(2) * out * in, 53, -0.2f, 0.2f);
        auto b = qtts_test::random_floats(size_t(out), 54);
        auto scale = qtts_test::random_floats(size_t(out), 55);
        auto h0 = qtts_test::random_floats(size_t(n) * out, 56);
        std::vector<float> xn(x.size()), lin(size_t(n) * out), up(size_t(n) * out);
        qtts::cpu::rms_norm(x.data(), n, in, nw.data(), 1e-5f, xn.data());
        auto dx = to_device(x), dnw = to_device(nw), dW = to_device(W), db = to_device(b), ds = to_device(scale);
        qc::DeviceArray<float> y(size_t(n) * out);

        // STORE with norm and bias.
        qtts::cpu::linear(xn.data(), n, in, W.data(), b.data(), out, lin.data());
        qk::small_linear(dx.get(), n, in, false, dnw.get(), 1e-5f, dW.get(), out, db.get(), E::SMALL_LINEAR_STORE,
                         nullptr, y.get(), false, l);
        auto got = to_host(y.get(), y.size());
        CHECK(qtts_test::max_abs_error(got.data(), lin.data(), lin.size()) < 1e-5);

        // SCALED_ADD without norm: h += scale ⊙ (x Wᵀ).
        qtts::cpu::linear(x.data(), n, in, W.data(), nullptr, out, lin.data());
        std::vector<float> h = h0;
        for (int t = 0; t < n; ++t)
            for (int o = 0; o < out; ++o) h[size_t(t) * out + o] += scale[size_t(o)] * lin[size_t(t) * out + o];
        auto dh = to_device(h0);
        qk::small_linear(dx.get(), n, in, false, nullptr, 0.0f, dW.get(), out, nullptr, E::SMALL_LINEAR_SCALED_ADD,
                         ds.get(), dh.get(), false, l);
        got = to_host(dh.get(), dh.size());
        CHECK(qtts_test::max_abs_error(got.data(), h.data(), h.size()) < 1e-5);

        // SWIGLU with norm: silu(xn W_gateᵀ) · (xn W_upᵀ).
        qtts::cpu::linear(xn.data(), n, in, W.data(), nullptr, out, lin.data());
        qtts::cpu::linear(xn.data(), n, in, W.data() + size_t(out) * in, nullptr, out, up.data());
        std::vector<float> sw(lin.size());
        qtts::cpu::swiglu(lin.data(), up.data(), lin.size(), sw.data());
        qk::small_linear(dx.get(), n, in, false, dnw.get(), 1e-5f, dW.get(), out, nullptr, E::SMALL_LINEAR_SWIGLU,
                         nullptr, y.get(), false, l);
        got = to_host(y.get(), y.size());
        CHECK(qtts_test::max_abs_error(got.data(), sw.data(), sw.size()) < 1e-5);

        // Channel-major input and output.
        std::vector<float> xc(x.size()), lin_c(lin.size());
        qtts::cpu::transpose(x.data(), n, in, xc.data());
        qtts::cpu::linear(x.data(), n, in, W.data(), b.data(), out, lin.data());
        qtts::cpu::transpose(lin.data(), n, out, lin_c.data());
        auto dxc = to_device(xc);
        qk::small_linear(dxc.get(), n, in, true, nullptr, 0.0f, dW.get(), out, db.get(), E::SMALL_LINEAR_STORE, nullptr,
                         y.get(), true, l);
        got = to_host(y.get(), y.size());
        CHECK(qtts_test::max_abs_error(got.data(), lin_c.data(), lin_c.size()) < 1e-5);
    }
}

TEST_CASE("gpu decoder kernels: transposed conv with carried overlap, streamed", "[gpu][decoder]") {
    const int Cin = 12, Cout = 10, s = 5, K = 2 * s, O = K - s;
    const int T1 = 3, T2 = 4, T = T1 + T2;
    const qk::Launch l = context().launch();
    auto x = qtts_test::random_floats(size_t(Cin) * T, 11);
    auto w = qtts_test::random_floats(size_t(Cin) * Cout * K, 12, -0.3f, 0.3f);
    auto b = qtts_test::random_floats(size_t(Cout), 13);
    // CPU full: untrimmed transposed conv, first T·s samples (+ bias).
    std::vector<float> full(size_t(Cout) * ((T - 1) * s + K));
    qtts::cpu::conv_transpose1d(x.data(), Cin, T, w.data(), b.data(), Cout, K, s, full.data());
    const int full_len = (T - 1) * s + K;

    auto dw = to_device(w), db = to_device(b);
    const StateBlocks block({{std::vector<float>(size_t(Cout) * O, 0.0f)}}, {0}, {0});
    qc::DeviceArray<float> cols(size_t(Cout) * K * T), y(size_t(Cout) * T * s);
    std::vector<float> got(size_t(Cout) * T * s);
    int t0 = 0;
    for (const int n : {T1, T2}) {
        std::vector<float> xc(size_t(Cin) * n);
        for (int c = 0; c < Cin; ++c) std::copy_n(x.begin() + ptrdiff_t(c) * T + t0, n, xc.begin() + ptrdiff_t(c) * n);
        auto dx = to_device(xc);
        qc::sgemm_row_major(context(), true, false, Cout * K, n, Cin, dw.get(), Cout * K, dx.get(), n, 0.0f, cols.get(),
                            n);
        qk::trans_conv_overlap_add(cols.get(), Cout, K, s, n, db.get(), block.states(), block.at[0], y.get(), l);
        const auto part = to_host(y.get(), size_t(Cout) * n * s);
        for (int c = 0; c < Cout; ++c)
            std::copy_n(part.begin() + ptrdiff_t(c) * n * s, n * s, got.begin() + ptrdiff_t(c) * T * s + t0 * s);
        t0 += n;
    }
    double err = 0.0;
    for (int c = 0; c < Cout; ++c)
        for (int m = 0; m < T * s; ++m)
            err = std::max(err, double(std::fabs(got[size_t(c) * T * s + m] - full[size_t(c) * full_len + m])));
    // The carried overlap is the rest of the untrimmed output (without the bias).
    const auto ov = block.piece(0, 0, size_t(Cout) * O);
    double ov_err = 0.0;
    for (int c = 0; c < Cout; ++c)
        for (int j = 0; j < O; ++j)
            ov_err = std::max(ov_err, double(std::fabs(ov[size_t(c) * O + j] + b[size_t(c)] -
                                                       full[size_t(c) * full_len + T * s + j])));
    std::printf("transposed conv x%d streamed: max abs %.3g, overlap %.3g\n", s, err, ov_err);
    CHECK(err < 1e-5);
    CHECK(ov_err < 1e-5);
}

TEST_CASE("gpu decoder kernels: depthwise conv, LayerNorm over channels, RMSNorm, SnakeBeta", "[gpu][decoder]") {
    const qk::Launch l = context().launch();
    const int C = 40, T = 9, K = 7, L = K - 1;
    auto x = qtts_test::random_floats(size_t(C) * T, 21);
    auto tail = qtts_test::random_floats(size_t(C) * L, 22);
    auto w = qtts_test::random_floats(size_t(C) * K, 23);
    auto b = qtts_test::random_floats(size_t(C), 24);
    const auto cat = concat_columns(tail, L, x, C, T);
    std::vector<float> expect(size_t(C) * T);
    qtts::cpu::conv1d(cat.data(), C, L + T, w.data(), b.data(), C, K, 1, 1, C, expect.data());
    auto dx = to_device(x), dtail = to_device(tail), dw = to_device(w), db = to_device(b);
    qc::DeviceArray<float> y(size_t(C) * T);
    qk::depthwise_conv(dtail.get(), L, dx.get(), C, T, K, 1, dw.get(), db.get(), y.get(), l);
    auto got = to_host(y.get(), y.size());
    CHECK(qtts_test::max_abs_error(got.data(), expect.data(), expect.size()) < 1e-5);

    // LayerNorm over channels (channel-major in, channel-major + ones row out).
    auto nw = qtts_test::random_floats(size_t(C), 25), nb = qtts_test::random_floats(size_t(C), 26);
    std::vector<float> xt(size_t(T) * C), lt(size_t(T) * C);
    qtts::cpu::transpose(x.data(), C, T, xt.data());
    qtts::cpu::layer_norm(xt.data(), T, C, nw.data(), nb.data(), 1e-6f, lt.data());
    auto dnw = to_device(nw), dnb = to_device(nb);
    qc::DeviceArray<float> ln(size_t(C + 1) * T);
    qk::layer_norm_channels(dx.get(), C, T, dnw.get(), dnb.get(), 1e-6f, ln.get(), l);
    got = to_host(ln.get(), ln.size());
    double ln_err = 0.0;
    for (int c = 0; c < C; ++c)
        for (int t = 0; t < T; ++t)
            ln_err = std::max(ln_err, double(std::fabs(got[size_t(c) * T + t] - lt[size_t(t) * C + c])));
    CHECK(ln_err < 1e-5);
    for (int t = 0; t < T; ++t) CHECK(got[size_t(C) * T + t] == 1.0f);

    // RMSNorm rows.
    std::vector<float> rn(size_t(T) * C);
    qtts::cpu::rms_norm(xt.data(), T, C, nw.data(), 1e-5f, rn.data());
    auto dxt = to_device(xt);
    qc::DeviceArray<float> drn(size_t(T) * C);
    qk::rms_norm_rows(dxt.get(), T, C, dnw.get(), 1e-5f, drn.get(), l);
    got = to_host(drn.get(), drn.size());
    CHECK(qtts_test::max_abs_error(got.data(), rn.data(), rn.size()) < 1e-5);

    // SnakeBeta.
    auto la = qtts_test::random_floats(size_t(C), 27, -0.5f, 0.5f), lb = qtts_test::random_floats(size_t(C), 28);
    std::vector<float> alpha(static_cast<size_t>(C)), inv_beta(static_cast<size_t>(C));
    for (int c = 0; c < C; ++c) {
        alpha[size_t(c)] = qtts::snake_alpha(la[size_t(c)]);
        inv_beta[size_t(c)] = qtts::snake_inv_beta(lb[size_t(c)]);
    }
    std::vector<float> sx = x;
    qtts::cpu::snake_beta(sx.data(), C, T, la.data(), lb.data());
    auto da = to_device(alpha), dib = to_device(inv_beta);
    qk::snake_apply(dx.get(), C, T, {da.get(), dib.get()}, y.get(), l);
    got = to_host(y.get(), y.size());
    CHECK(qtts_test::max_abs_error(got.data(), sx.data(), sx.size()) < 1e-5);
}

TEST_CASE("gpu decoder kernels: RoPE + sliding-window attention over the K/V ring", "[gpu][decoder]") {
    const qk::Launch l = context().launch();
    // Windows whose keys fit in shared memory run the grouped kernel (a block per group of up to 8
    // query rows: one group of 5, the release decoder's window 72 with 4 rows, and 11 rows = groups
    // of 8 and 3, starting inside the first window); window 200 / head_dim 64 is too large for it
    // and runs the direct one. The staged rows wrap around the ring (window 12: slots 3 .. 18 of a
    // 16-row ring); head_dim 6 stages value by value (not whole 16-byte pieces).
    struct Shape {
        int hd, window, n;
        int64_t p0;  // position of the first new row
    };
    for (const Shape shape : {Shape{16, 12, 5, 30}, Shape{64, 72, 4, 90}, Shape{16, 12, 11, 3}, Shape{64, 200, 5, 218},
                              Shape{6, 12, 5, 30}}) {
    const int heads = 4, kv = 2, hd = shape.hd, window = shape.window, n = shape.n, ring = window - 1 + n;
    CAPTURE(hd, window, n, shape.p0);
    const int qd = heads * hd, kvd = kv * hd, stride = qd + 2 * kvd;
    const int64_t p0 = shape.p0;  // past positions max(0, p0-window+1) .. p0-1 are in the ring
    const int past = int(std::min<int64_t>(window - 1, p0));
    auto qkv = qtts_test::random_floats(size_t(n) * stride, 31);
    auto past_k = qtts_test::random_floats(size_t(past) * kvd, 32);  // already rotated
    auto past_v = qtts_test::random_floats(size_t(past) * kvd, 33);
    const auto inv_freq = qtts::rope_inv_freq(hd, 10000.0);

    // CPU: rotate q and k of the new rows, attend over [past | new].
    std::vector<float> q(size_t(n) * qd), k(size_t(n) * kvd), v(size_t(n) * kvd);
    for (int t = 0; t < n; ++t) {
        std::copy_n(qkv.begin() + ptrdiff_t(t) * stride, qd, q.begin() + ptrdiff_t(t) * qd);
        std::copy_n(qkv.begin() + ptrdiff_t(t) * stride + qd, kvd, k.begin() + ptrdiff_t(t) * kvd);
        std::copy_n(qkv.begin() + ptrdiff_t(t) * stride + qd + kvd, kvd, v.begin() + ptrdiff_t(t) * kvd);
    }
    std::vector<int64_t> pos(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) pos[size_t(t)] = p0 + t;
    qtts::cpu::rope_apply_table(q.data(), n, heads, hd, pos.data(), inv_freq.data());
    qtts::cpu::rope_apply_table(k.data(), n, kv, hd, pos.data(), inv_freq.data());
    std::vector<float> kb = past_k, vb = past_v;
    kb.insert(kb.end(), k.begin(), k.end());
    vb.insert(vb.end(), v.begin(), v.end());
    std::vector<float> expect(size_t(n) * qd);
    qtts::cpu::attention(q.data(), n, pos.data(), kb.data(), vb.data(), past + n, p0 - past, heads, kv, hd, window,
                         expect.data());

    // GPU: ring slots hold position % ring.
    std::vector<float> k_ring(size_t(ring) * kvd, 0.0f), v_ring(size_t(ring) * kvd, 0.0f);
    for (int j = 0; j < past; ++j) {
        const int slot = int((p0 - past + j) % ring);
        std::copy_n(past_k.begin() + ptrdiff_t(j) * kvd, kvd, k_ring.begin() + ptrdiff_t(slot) * kvd);
        std::copy_n(past_v.begin() + ptrdiff_t(j) * kvd, kvd, v_ring.begin() + ptrdiff_t(slot) * kvd);
    }
    auto dqkv = to_device(qkv), dfreq = to_device(inv_freq);
    const StateBlocks block({{k_ring, v_ring}}, {p0}, {0});
    qc::DeviceArray<float> out(size_t(n) * qd);
    qk::rope_kv_store(dqkv.get(), n, heads, kv, hd, dfreq.get(), block.states(), block.at[0], block.at[1], ring, l);
    qk::window_attention(dqkv.get(), n, heads, kv, hd, block.states(), block.at[0], block.at[1], ring, window,
                         out.get(), l);
    const auto got = to_host(out.get(), out.size());
    const auto got_qkv = to_host(dqkv.get(), dqkv.size());
    double q_err = 0.0;
    for (int t = 0; t < n; ++t)
        for (int j = 0; j < qd; ++j)
            q_err = std::max(q_err, double(std::fabs(got_qkv[size_t(t) * stride + j] - q[size_t(t) * qd + j])));
    const double err = qtts_test::max_abs_error(got.data(), expect.data(), expect.size());
    std::printf("rope q max abs %.3g; window %d attention max abs %.3g\n", q_err, window, err);
    CHECK(q_err < 1e-5);
    CHECK(err < 1e-5);
    }
}

// ---------------------------------------------------------------------------------------------
// The tiny reference speech tokenizer (golden decoder_long)
// ---------------------------------------------------------------------------------------------

namespace {

struct TinyDecoder {
    std::shared_ptr<const qtts::Checkpoint> ckpt;
    std::unique_ptr<qtts::cpu::CpuSpeechDecoder> cpu;
    std::shared_ptr<const qc::GpuSpeechDecoderWeights> gpu;
    std::shared_ptr<const qc::GpuSpeechDecoderWeights> gpu_unpadded;  // pad_rows = false
    std::shared_ptr<const qc::GpuSpeechDecoderWeights> gpu_fp32;      // SGEMM products
    std::vector<int32_t> codes;
    std::vector<float> audio_full;  // golden
    int n = 0;
};

TinyDecoder* tiny_decoder() {
    static std::unique_ptr<TinyDecoder> td;
    if (td) return td.get();
    const std::string golden = qtts_test::golden_path("tiny-customvoice", "decoder_long");
    if (!qtts_test::reference_available() || !std::ifstream(golden).good()) return nullptr;
    td = std::make_unique<TinyDecoder>();
    td->ckpt = qtts::checkpoint_load(qtts_test::reference_model_dir("tiny-customvoice"));
    td->cpu = std::make_unique<qtts::cpu::CpuSpeechDecoder>(*td->ckpt);
    qc::GpuSpeechDecoderWeightOptions gpu_options;
    td->gpu = qc::GpuSpeechDecoderWeights::upload(*td->ckpt, context().device(), gpu_options);
    gpu_options.pad_rows = false;
    td->gpu_unpadded = qc::GpuSpeechDecoderWeights::upload(*td->ckpt, context().device(), gpu_options);
    gpu_options.pad_rows = true;
    gpu_options.math = qc::DecoderMath::DECODER_MATH_FP32;
    td->gpu_fp32 = qc::GpuSpeechDecoderWeights::upload(*td->ckpt, context().device(), gpu_options);
    const auto file = qtts::SafetensorsFile::open(golden);
    const qtts::TensorView& ct = file->get("codes");
    td->n = int(ct.shape[0]);
    const auto c64 = qtts::tensor_to_i64(ct);
    td->codes.assign(c64.begin(), c64.end());
    td->audio_full = qtts::tensor_to_f32(file->get("audio_full"));
    return td.get();
}

std::vector<float> gpu_stream(qc::GpuSpeechDecoder& dec, const std::vector<int32_t>& codes, int n,
                              const std::vector<int>& chunks) {
    std::vector<float> pcm;
    const int nq = dec.config().num_quantizers;
    size_t i = 0;
    for (int s = 0; s < n; ++i) {
        const int m = std::min(chunks[i % chunks.size()], n - s);
        dec.decode(codes.data() + size_t(s) * nq, m, &pcm);
        s += m;
    }
    return pcm;
}

}  // namespace

TEST_CASE("gpu decoder: tiny reference tokenizer streams exactly at chunk sizes 1, 2, 4, 25", "[gpu][decoder]") {
    TinyDecoder* td = tiny_decoder();
    if (!td) {
        WARN("reference golden decoder_long not available: skipped");
        return;
    }
    const auto cpu_full = td->cpu->decode_full(td->codes.data(), td->n);
    REQUIRE(cpu_full.size() == td->audio_full.size());
    qc::GpuSpeechDecoder dec(td->gpu, context());
    REQUIRE(dec.samples_per_frame() == 1920);
    REQUIRE(td->gpu->math() == qc::DecoderMath::DECODER_MATH_BF16X3);  // the default
    // The non-default paths: small-row transformer kernels, unpadded weight rows, fp32 products
    // (SGEMM: the CPU's arithmetic, so within float rounding of it).
    qc::GpuSpeechDecoderOptions small_options;
    small_options.small_kernels = true;
    qc::GpuSpeechDecoder dec_small(td->gpu, context(), small_options);
    qc::GpuSpeechDecoder dec_unpadded(td->gpu_unpadded, context());
    qc::GpuSpeechDecoder dec_fp32(td->gpu_fp32, context());
    for (const int chunk : {1, 2, 4, 25}) {
        for (qc::GpuSpeechDecoder* other : {&dec_small, &dec_unpadded, &dec_fp32}) {
            other->reset();
            const auto pcm_other = gpu_stream(*other, td->codes, td->n, {chunk});
            const double err = qtts_test::max_abs_error(pcm_other.data(), cpu_full.data(), pcm_other.size());
            std::printf("  %s chunk %2d: max abs %.3g vs CPU\n",
                        other == &dec_small ? "small-row" : other == &dec_unpadded ? "unpadded" : "fp32 products", chunk,
                        err);
            CHECK(err <= (other == &dec_fp32 ? 1e-5 : 1e-3));
        }
        dec.reset();
        const auto t0 = std::chrono::steady_clock::now();
        const auto pcm = gpu_stream(dec, td->codes, td->n, {chunk});
        const double s = seconds_since(t0);
        REQUIRE(pcm.size() == cpu_full.size());
        const double err_cpu = qtts_test::max_abs_error(pcm.data(), cpu_full.data(), pcm.size());
        const double err_golden = qtts_test::max_abs_error(pcm.data(), td->audio_full.data(), pcm.size());
        std::printf("tiny decoder_long (%d frames) GPU chunk %2d: max abs %.3g vs CPU decode_full, %.3g vs golden "
                    "audio_full; %.3f ms/frame wall (graph: %s)\n",
                    td->n, chunk, err_cpu, err_golden, s * 1e3 / td->n, dec.has_graph(chunk) ? "yes" : "no");
        CAPTURE(chunk);
        CHECK(err_cpu <= 1e-3);
        CHECK(err_golden <= 1e-3);
        CHECK(snr_db(pcm, cpu_full) >= 60.0);
    }
    // Irregular chunks too.
    dec.reset();
    const auto pcm = gpu_stream(dec, td->codes, td->n, {3, 1, 7, 2, 4, 1, 25});
    CHECK(qtts_test::max_abs_error(pcm.data(), cpu_full.data(), pcm.size()) <= 1e-3);
}

TEST_CASE("gpu decoder: graph replay and eager give bitwise identical samples", "[gpu][decoder]") {
    TinyDecoder* td = tiny_decoder();
    if (!td) {
        WARN("reference golden decoder_long not available: skipped");
        return;
    }
    qc::GpuSpeechDecoderOptions eager_options;
    eager_options.cuda_graphs = false;
    qc::GpuSpeechDecoder graphed(td->gpu, context());
    qc::GpuSpeechDecoder eager(td->gpu, context(), eager_options);
    if (!graphed.graphs_enabled()) WARN("graphs disabled by the environment: both sides eager");
    for (const int s : {1, 2, 4}) CHECK(graphed.has_graph(s) == graphed.graphs_enabled());
    CHECK_FALSE(eager.has_graph(1));
    CHECK(graphed.graph_stats().size() == (graphed.graphs_enabled() ? 3u : 0u));
    const std::vector<int> chunks{1, 2, 4, 1, 1, 4, 2, 3};
    const auto a = gpu_stream(graphed, td->codes, td->n, chunks);
    const auto b = gpu_stream(eager, td->codes, td->n, chunks);
    REQUIRE(a.size() == b.size());
    size_t differing = 0;
    for (size_t i = 0; i < a.size(); ++i) differing += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    std::printf("graph vs eager: %zu of %zu samples differ\n", differing, a.size());
    CHECK(differing == 0);
    CHECK(graphed.frames_done() == td->n);
}

TEST_CASE("gpu decoder: decoders sharing one scratch interleave chunks with their own samples", "[gpu][decoder]") {
    TinyDecoder* td = tiny_decoder();
    if (!td) {
        WARN("reference golden decoder_long not available: skipped");
        return;
    }
    qc::GpuSpeechDecoderOptions options;
    options.max_chunk_frames = 8;
    auto pass = std::make_shared<qc::DecoderPass>(td->gpu, context(), qc::DecoderStateLayout::make(*td->gpu, 8), 8,
                                                  options);
    qc::GpuSpeechDecoder a(td->gpu, context(), options, pass), b(td->gpu, context(), options, pass);
    qc::GpuSpeechDecoder alone_a(td->gpu, context(), options), alone_b(td->gpu, context(), options);
    const int nq = 16;
    std::vector<float> pa, pb, qa, qb;
    // a decodes from frame 0, b from frame 50, in alternating chunks (graphs for 1, 2, 4; 3 eager).
    int fa = 0, fb = 50;
    for (const int n : {4, 1, 3, 2, 4, 4}) {
        a.decode(td->codes.data() + size_t(fa) * nq, n, &pa);
        b.decode(td->codes.data() + size_t(fb) * nq, n, &pb);
        alone_b.decode(td->codes.data() + size_t(fb) * nq, n, &qb);
        alone_a.decode(td->codes.data() + size_t(fa) * nq, n, &qa);
        fa += n;
        fb += n;
    }
    REQUIRE(pa.size() == qa.size());
    REQUIRE(pb.size() == qb.size());
    CHECK(std::memcmp(pa.data(), qa.data(), pa.size() * sizeof(float)) == 0);
    CHECK(std::memcmp(pb.data(), qb.data(), pb.size() * sizeof(float)) == 0);
    // A pass made for another chunk size or other weights is refused.
    qc::GpuSpeechDecoderOptions bigger = options;
    bigger.max_chunk_frames = 16;
    CHECK_THROWS_AS(qc::GpuSpeechDecoder(td->gpu, context(), bigger, pass), qtts::Error);
    CHECK_THROWS_AS(qc::GpuSpeechDecoder(td->gpu_unpadded, context(), options, pass), qtts::Error);
}

TEST_CASE("gpu decoder: invalid codes are refused before the state changes; reset restarts", "[gpu][decoder]") {
    TinyDecoder* td = tiny_decoder();
    if (!td) {
        WARN("reference golden decoder_long not available: skipped");
        return;
    }
    const int nq = 16, n = 12;
    qc::GpuSpeechDecoder dec(td->gpu, context());
    std::vector<float> first;
    dec.decode(td->codes.data(), 4, &first);
    std::vector<int32_t> bad(td->codes.begin() + 4 * nq, td->codes.begin() + 6 * nq);
    bad[size_t(nq) + 3] = 2048;  // frame 1 codebook 3: out of range
    std::vector<float> junk;
    CHECK_THROWS_AS(dec.decode(bad.data(), 2, &junk), qtts::Error);
    bad[size_t(nq) + 3] = -1;
    CHECK_THROWS_AS(dec.decode(bad.data(), 2, &junk), qtts::Error);
    CHECK(junk.empty());
    CHECK(dec.frames_done() == 4);
    dec.decode(td->codes.data() + 4 * nq, n - 4, &first);
    const auto expect = td->cpu->decode_full(td->codes.data(), n);
    CHECK(qtts_test::max_abs_error(first.data(), expect.data(), expect.size()) <= 1e-3);
    // After reset() the same chunking (4, then 8) gives the same samples bit for bit.
    dec.reset();
    CHECK(dec.frames_done() == 0);
    std::vector<float> again;
    dec.decode(td->codes.data(), 4, &again);
    dec.decode(td->codes.data() + 4 * nq, n - 4, &again);
    REQUIRE(again.size() == first.size());
    CHECK(std::memcmp(again.data(), first.data(), again.size() * sizeof(float)) == 0);
}

// ---------------------------------------------------------------------------------------------
// Batched passes (cuda/gpu_batch_decoder.h)
// ---------------------------------------------------------------------------------------------

namespace {

// Streams decoded in batched passes against twins decoded alone: `twins[i]` gets exactly the
// frames `streams[i]` gets, one chunk at a time. Returns the largest absolute sample difference.
struct BatchTwins {
    std::vector<std::unique_ptr<qc::GpuSpeechDecoder>> batched, alone;
    std::vector<int> next;  // next frame of each stream's code sequence
};

double batch_round(qc::GpuBatchDecoder& batch, BatchTwins& t, const std::vector<int>& members,
                   const std::vector<int32_t>& codes, int total, int n) {
    const int nq = 16, spf = t.alone.front()->samples_per_frame();
    std::vector<qc::GpuSpeechDecoder*> decoders;
    std::vector<int32_t> chunk;
    for (const int m : members) {
        decoders.push_back(t.batched[size_t(m)].get());
        for (int f = 0; f < n; ++f) {
            const int frame = (t.next[size_t(m)] + f) % total;
            chunk.insert(chunk.end(), codes.begin() + ptrdiff_t(frame) * nq, codes.begin() + ptrdiff_t(frame + 1) * nq);
        }
    }
    std::vector<float> pcm(members.size() * size_t(n) * spf, NAN);
    batch.decode(decoders, chunk.data(), n, pcm.data());
    double worst = 0.0;
    for (size_t i = 0; i < members.size(); ++i) {
        std::vector<float> expect;
        t.alone[size_t(members[i])]->decode(chunk.data() + i * n * nq, n, &expect);
        worst = std::max(worst, qtts_test::max_abs_error(pcm.data() + i * n * spf, expect.data(), expect.size()));
        t.next[size_t(members[i])] = (t.next[size_t(members[i])] + n) % total;
    }
    return worst;
}

BatchTwins batch_twins(const std::shared_ptr<const qc::GpuSpeechDecoderWeights>& w, int streams,
                       const std::vector<int32_t>& codes, int total) {
    BatchTwins t;
    for (int i = 0; i < streams; ++i) {
        t.batched.push_back(std::make_unique<qc::GpuSpeechDecoder>(w, context()));
        t.alone.push_back(std::make_unique<qc::GpuSpeechDecoder>(w, context()));
        // Different starting points in the code sequence, then i + 1 frames decoded alone by both
        // twins: every stream at its own position and tail-slot parity.
        t.next.push_back((i * 7) % total);
        const int primed = i + 1;
        std::vector<int32_t> first;
        for (int f = 0; f < primed; ++f) {
            const int frame = (t.next.back() + f) % total;
            first.insert(first.end(), codes.begin() + ptrdiff_t(frame) * 16, codes.begin() + ptrdiff_t(frame + 1) * 16);
        }
        std::vector<float> a, b;
        t.batched.back()->decode(first.data(), primed, &a);
        t.alone.back()->decode(first.data(), primed, &b);
        t.next.back() = (t.next.back() + primed) % total;
    }
    return t;
}

}  // namespace

TEST_CASE("gpu batched decoder: streams at different positions get their samples alone", "[gpu][decoder]") {
    TinyDecoder* td = tiny_decoder();
    if (!td) {
        WARN("reference golden decoder_long not available: skipped");
        return;
    }
    const int S = 5;
    // fp32 products: batched = alone up to float rounding; the default (bf16x3) products up to
    // the split's re-rounding (GPU_SPLIT_DECODER_TOLERANCE). The checks below on the default.
    BatchTwins t;
    for (const auto& weights : {td->gpu_fp32, td->gpu}) {
        const bool fp32 = weights->math() == qc::DecoderMath::DECODER_MATH_FP32;
        t = batch_twins(weights, S, td->codes, td->n);
        qc::GpuBatchDecoderOptions options;
        options.max_streams = 6;
        options.chunk_frames = {1, 2, 4};
        options.buckets = {2, 4, 6};  // 5 streams run in bucket 6, 3 in bucket 4: rows left idle
        qc::GpuBatchDecoder graphed(weights, context(), t.batched.front()->layout(), options);
        options.cuda_graphs = false;
        qc::GpuBatchDecoder eager(weights, context(), t.batched.front()->layout(), options);
        CHECK(graphed.has_graph(6, 4) == t.batched.front()->graphs_enabled());
        CHECK_FALSE(eager.has_graph(6, 4));

        struct Round {
            std::vector<int> members;
            int n;
            bool use_eager;
        };
        const std::vector<Round> rounds{
            {{0, 1, 2, 3, 4}, 4, false}, {{4, 0, 2}, 1, false}, {{3, 1}, 2, false}, {{0, 1, 2, 3, 4}, 3, false},
            {{2, 3, 4, 0, 1}, 4, true},  {{1, 4}, 4, false},    {{0, 1, 2, 3, 4}, 2, false}, {{3, 2, 1}, 4, true},
        };
        double worst = 0.0;
        for (const Round& r : rounds) {
            const double err = batch_round(r.use_eager ? eager : graphed, t, r.members, td->codes, td->n, r.n);
            std::printf("batched decoder (%s products): %zu streams x %d frames (%s): max abs %.3g vs alone\n",
                        qc::decoder_math_name(weights->math()), r.members.size(), r.n, r.use_eager ? "eager" : "graph",
                        err);
            worst = std::max(worst, err);
        }
        CHECK(worst <= (fp32 ? 1e-5 : qtts_test::GPU_SPLIT_DECODER_TOLERANCE));
    }
    qc::GpuBatchDecoderOptions options;
    options.max_streams = 6;
    options.chunk_frames = {1, 2, 4};
    options.buckets = {2, 4, 6};
    qc::GpuBatchDecoder graphed(td->gpu, context(), t.batched.front()->layout(), options);
    for (int i = 0; i < S; ++i) CHECK(t.batched[size_t(i)]->frames_done() == t.alone[size_t(i)]->frames_done());

    // Refusals leave every state as it was: bad codes, a stream twice, too many frames, a
    // decoder with another layout.
    std::vector<int32_t> bad(size_t(2) * 16, 5);
    bad[20] = 4096;
    std::vector<float> pcm(size_t(2) * 1920);
    const int64_t done0 = t.batched[0]->frames_done();
    CHECK_THROWS_AS(graphed.decode({t.batched[0].get(), t.batched[1].get()}, bad.data(), 1, pcm.data()), qtts::Error);
    bad[20] = 5;
    CHECK_THROWS_AS(graphed.decode({t.batched[0].get(), t.batched[0].get()}, bad.data(), 1, pcm.data()), qtts::Error);
    CHECK_THROWS_AS(graphed.decode({t.batched[0].get()}, bad.data(), 5, pcm.data()), qtts::Error);
    qc::GpuSpeechDecoderOptions other_options;
    other_options.max_chunk_frames = 8;
    qc::GpuSpeechDecoder other(td->gpu, context(), other_options);
    CHECK_THROWS_AS(graphed.decode({t.batched[0].get(), &other}, bad.data(), 1, pcm.data()), qtts::Error);
    CHECK(t.batched[0]->frames_done() == done0);
    CHECK_THROWS_AS(graphed.decode({t.batched[0].get()}, bad.data(), 1, nullptr), qtts::Error);
    CHECK_THROWS_AS(graphed.decode_profile({t.batched[0].get(), t.batched[0].get()}, bad.data(), 1), qtts::Error);
    CHECK(t.batched[0]->frames_done() == done0);
    // ... and the streams go on exactly.
    CHECK(batch_round(graphed, t, {0, 1, 2, 3, 4}, td->codes, td->n, 4) <= qtts_test::GPU_SPLIT_DECODER_TOLERANCE);

    // A profiled pass (benchmarks: eager, events between stages) names the pass's stages with
    // their times and advances its streams like decode(); so does each stream's twin alone.
    const auto pieces = graphed.decode_profile({t.batched[0].get(), t.batched[1].get()}, bad.data(), 1);
    for (const int i : {0, 1}) {
        std::vector<float> alone_pcm;
        t.alone[size_t(i)]->decode(bad.data() + size_t(i) * 16, 1, &alone_pcm);
    }
    std::map<std::string, double> by_name;
    for (const auto& [name, ms] : pieces) {
        CHECK(ms >= 0.0f);
        by_name[name] += ms;
    }
    for (const char* stage : {"rvq", "transformer", "convnext", "conv im2col", "conv products", "output conv"})
        CHECK(by_name.count(stage) == 1);
    CHECK(t.batched[0]->frames_done() == t.alone[0]->frames_done());
    CHECK(batch_round(graphed, t, {0, 1}, td->codes, td->n, 2) <= qtts_test::GPU_SPLIT_DECODER_TOLERANCE);
}

// ---------------------------------------------------------------------------------------------
// Release size
// ---------------------------------------------------------------------------------------------

TEST_CASE("gpu decoder: release-size random tokenizer streams with SNR >= 60 dB vs the CPU", "[gpu][decoder]") {
    const char* env = std::getenv("QTTS_TEST_DECODER_FRAMES");
    const int n = env ? std::max(1, std::atoi(env)) : 300;
    auto t0 = std::chrono::steady_clock::now();
    const auto ckpt = qtts_test::tiny_checkpoint_with_decoder("full-decoder", qtts_test::decoder_release_size, 21);
    std::printf("full-size decoder: written and loaded in %.1f s\n", seconds_since(t0));
    const int nq = 16;
    const auto u = qtts_test::random_floats(size_t(n) * nq, 77, 0.0f, 1.0f);
    std::vector<int32_t> codes(u.size());
    for (size_t i = 0; i < u.size(); ++i) codes[i] = std::min(2047, int(u[i] * 2048.0f));

    t0 = std::chrono::steady_clock::now();
    const auto gpu_w = qc::GpuSpeechDecoderWeights::upload(*ckpt, context().device());
    qc::GpuSpeechDecoder dec(gpu_w, context());
    std::printf("full-size decoder: GPU upload + graph capture %.2f s\n", seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    const auto pcm = gpu_stream(dec, codes, n, {1, 2, 4, 1, 25, 3});
    std::printf("full-size decoder: GPU streaming %d frames in %.3f s\n", n, seconds_since(t0));

    t0 = std::chrono::steady_clock::now();
    const qtts::cpu::CpuSpeechDecoder cpu(*ckpt);
    const auto ref = cpu.decode_full(codes.data(), n);
    std::printf("full-size decoder: CPU decode_full %d frames in %.1f s\n", n, seconds_since(t0));
    REQUIRE(pcm.size() == ref.size());
    double ss = 0.0;
    for (float v : ref) ss += double(v) * v;
    const double rms = std::sqrt(ss / double(ref.size()));
    const double snr = snr_db(pcm, ref);
    const double err = qtts_test::max_abs_error(pcm.data(), ref.data(), ref.size());
    std::printf("full-size decoder: %d frames, rms %.4f, GPU vs CPU SNR %.1f dB, max abs %.3g\n", n, rms, snr, err);
    REQUIRE(rms > 1e-3);
    CHECK(snr >= 60.0);

    // Batched passes at release size: 4 streams (graphs, then eager for an odd chunk) against
    // their twins decoded alone.
    BatchTwins t = batch_twins(gpu_w, 4, codes, n);
    qc::GpuBatchDecoderOptions options;
    options.max_streams = 4;
    options.chunk_frames = {4};
    qc::GpuBatchDecoder batch(gpu_w, context(), t.batched.front()->layout(), options);
    double worst = 0.0;
    for (int r = 0; r < 4; ++r) worst = std::max(worst, batch_round(batch, t, {0, 1, 2, 3}, codes, n, 4));
    worst = std::max(worst, batch_round(batch, t, {3, 1, 2}, codes, n, 3));
    std::printf("full-size decoder: batched passes vs alone: max abs %.3g\n", worst);
    CHECK(worst <= qtts_test::GPU_SPLIT_DECODER_TOLERANCE);
}

#endif  // QTTS_HAVE_CUDA
