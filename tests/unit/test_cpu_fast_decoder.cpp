// The fast CPU speech decoder (engine/cpu_fast/fast_speech_decoder.h) and its conv products
// (conv_gemm.h) against the fp32 reference: products against a plain loop on odd shapes, both
// instruction paths, one and two threads; SnakeBeta against the reference's; whole decodes
// against cpu::CpuSpeechDecoder on random-weight decoders (SNR printed per format), and exact
// streaming at any chunk size. Seeds are printed with every comparison.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/conv_ops.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/cpu_fast/conv_gemm.h"
#include "engine/cpu_fast/fast_speech_decoder.h"
#include "engine/model/weight_prep.h"
#include "engine/model/weights.h"
#include "test_support.h"

namespace cf = qtts::cpu_fast;

namespace {

// y[t, co] = bias[co] + Σ_k Σ_ci w[co, ci, k] · x[t + k·dil, ci], in double.
std::vector<float> conv_naive(const std::vector<float>& w, const std::vector<float>& bias, int cout, int cin, int k,
                              int dil, const std::vector<float>& x, int T) {
    std::vector<float> y(size_t(T) * cout);
    for (int t = 0; t < T; ++t)
        for (int co = 0; co < cout; ++co) {
            double acc = bias.empty() ? 0.0 : bias[size_t(co)];
            for (int kk = 0; kk < k; ++kk)
                for (int ci = 0; ci < cin; ++ci)
                    acc += double(w[(size_t(co) * cin + ci) * k + kk]) * x[size_t(t + kk * dil) * cin + ci];
            y[size_t(t) * cout + co] = float(acc);
        }
    return y;
}

double snr_db(const std::vector<float>& test, const std::vector<float>& ref) {
    const double e = qtts_test::rel_error(test.data(), ref.data(), ref.size());
    return e > 0 ? -20.0 * std::log10(e) : 999.0;
}

std::vector<int32_t> random_codes(int frames, int nq, int codebook_size, uint64_t seed) {
    const auto u = qtts_test::random_floats(size_t(frames) * nq, seed, 0.0f, 1.0f);
    std::vector<int32_t> codes(u.size());
    for (size_t i = 0; i < u.size(); ++i) codes[i] = std::min(codebook_size - 1, int(u[i] * float(codebook_size)));
    return codes;
}

struct Shape {
    int cout, cin, k, dil, T;
};

}  // namespace

TEST_CASE("conv_gemm equals a plain loop on odd shapes, every path, format and thread count", "[cpu_fast]") {
    const std::vector<Shape> shapes = {{37, 19, 3, 2, 13}, {16, 8, 1, 1, 1}, {1, 5, 7, 1, 20}, {48, 33, 7, 9, 50},
                                       {70, 64, 1, 1, 7}};
    cf::ThreadPool pool1(1), pool2(2);
    uint64_t seed = 100;
    for (const Shape& sh : shapes) {
        for (const auto format : {cf::ConvFormat::CONV_FORMAT_FP32, cf::ConvFormat::CONV_FORMAT_BF16}) {
            ++seed;
            const int rows_in = sh.T + (sh.k - 1) * sh.dil;
            const auto w = qtts_test::random_floats(size_t(sh.cout) * sh.cin * sh.k, seed);
            const auto bias = qtts_test::random_floats(size_t(sh.cout), seed + 1000);
            const auto x = qtts_test::random_floats(size_t(rows_in) * sh.cin, seed + 2000);
            const auto y0 = qtts_test::random_floats(size_t(sh.T) * sh.cout, seed + 3000);
            const cf::PackedConv conv = cf::conv_pack(w.data(), bias.data(), sh.cout, sh.cin, sh.k, sh.dil, format);
            std::vector<float> w_packed(w.size());
            cf::conv_unpack(conv, w_packed.data());
            if (format == cf::ConvFormat::CONV_FORMAT_FP32) REQUIRE(w_packed == w);
            // The reference of the packed weights: bf16 rounding is the format's, not the product's.
            const auto ref = conv_naive(w_packed, bias, sh.cout, sh.cin, sh.k, sh.dil, x, sh.T);
            std::vector<float> ref_acc(ref.size());
            for (size_t i = 0; i < ref.size(); ++i) ref_acc[i] = y0[i] + ref[i];
            for (const auto isa : {qtts::cpu_fast::MatvecIsa::MATVEC_ISA_SCALAR, qtts::cpu_fast::MatvecIsa::MATVEC_ISA_AVX2}) {
                if (!cf::matvec_isa_supported(isa)) continue;
                std::vector<float> y(ref.size(), 7.0f);
                cf::conv_gemm_isa(isa, conv, x.data(), size_t(sh.cin), sh.T, y.data(), size_t(sh.cout), false);
                INFO("seed " << seed << " shape " << sh.cout << "x" << sh.cin << "x" << sh.k << " dil " << sh.dil << " T "
                              << sh.T << " " << cf::conv_format_name(format) << " " << cf::matvec_isa_name(isa));
                CHECK(qtts_test::rel_error(y.data(), ref.data(), ref.size()) < 1e-6);
                std::vector<float> acc = y0;
                cf::conv_gemm_isa(isa, conv, x.data(), size_t(sh.cin), sh.T, acc.data(), size_t(sh.cout), true);
                CHECK(qtts_test::rel_error(acc.data(), ref_acc.data(), ref.size()) < 1e-6);
            }
            for (cf::ThreadPool* pool : {&pool1, &pool2}) {
                std::vector<float> y(ref.size(), 7.0f);
                cf::conv_gemm(*pool, conv, x.data(), size_t(sh.cin), sh.T, y.data(), size_t(sh.cout));
                INFO("seed " << seed << " threads " << pool->size());
                CHECK(qtts_test::rel_error(y.data(), ref.data(), ref.size()) < 1e-6);
            }
        }
    }
}

TEST_CASE("transposed-conv packing is the reference's transposed conv", "[cpu_fast]") {
    const int cin = 12, cout = 10, k = 6, stride = 3, T = 9;
    const uint64_t seed = 311;
    const auto w = qtts_test::random_floats(size_t(cin) * cout * k, seed);  // [cin, cout, k]
    const auto x = qtts_test::random_floats(size_t(T) * cin, seed + 1);      // [T, cin]
    std::vector<float> x_cm(x.size());                                        // [cin, T]
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < cin; ++c) x_cm[size_t(c) * T + t] = x[size_t(t) * cin + c];
    const int full = qtts::cpu::conv_transpose1d_out_len(T, k, stride);
    std::vector<float> ref(size_t(cout) * full);  // [cout, full]
    qtts::cpu::conv_transpose1d(x_cm.data(), cin, T, w.data(), nullptr, cout, k, stride, ref.data());

    cf::ThreadPool pool(1);
    const cf::PackedConv cols = cf::trans_conv_pack(w.data(), cin, cout, k, cf::ConvFormat::CONV_FORMAT_FP32);
    std::vector<float> c(size_t(T) * k * cout);  // [T, k·cout]
    cf::conv_gemm(pool, cols, x.data(), size_t(cin), T, c.data(), size_t(k) * cout);
    std::vector<float> y(size_t(full) * cout, 0.0f);  // [full, cout], overlap-added
    for (int t = 0; t < T; ++t)
        for (int j = 0; j < k; ++j)
            for (int co = 0; co < cout; ++co) y[size_t(t * stride + j) * cout + co] += c[(size_t(t) * k + j) * cout + co];
    double worst = 0.0;
    for (int m = 0; m < full; ++m)
        for (int co = 0; co < cout; ++co)
            worst = std::max(worst, double(std::fabs(y[size_t(m) * cout + co] - ref[size_t(co) * full + m])));
    INFO("seed " << seed);
    CHECK(worst < 1e-5);
}

TEST_CASE("time-major SnakeBeta equals the reference's on every path", "[cpu_fast]") {
    const int T = 37, C = 21;  // C not a multiple of 8: the scalar tail runs too
    const uint64_t seed = 411;
    const auto x = qtts_test::random_floats(size_t(T) * C, seed, -30.0f, 30.0f);  // [T, C]
    const auto log_alpha = qtts_test::random_floats(size_t(C), seed + 1, -1.0f, 1.5f);
    const auto log_beta = qtts_test::random_floats(size_t(C), seed + 2, -1.0f, 1.0f);
    std::vector<float> ref(x.size());  // [C, T]
    for (int t = 0; t < T; ++t)
        for (int c = 0; c < C; ++c) ref[size_t(c) * T + t] = x[size_t(t) * C + c];
    qtts::cpu::snake_beta(ref.data(), C, T, log_alpha.data(), log_beta.data());
    std::vector<float> alpha(static_cast<size_t>(C)), inv_beta(static_cast<size_t>(C));
    for (int c = 0; c < C; ++c) {
        alpha[size_t(c)] = qtts::snake_alpha(log_alpha[size_t(c)]);
        inv_beta[size_t(c)] = qtts::snake_inv_beta(log_beta[size_t(c)]);
    }
    for (const auto isa : {qtts::cpu_fast::MatvecIsa::MATVEC_ISA_SCALAR, qtts::cpu_fast::MatvecIsa::MATVEC_ISA_AVX2}) {
        if (!cf::matvec_isa_supported(isa)) continue;
        std::vector<float> y = x;
        cf::snake_time_major(isa, y.data(), T, C, alpha.data(), inv_beta.data());
        double worst = 0.0;
        for (int t = 0; t < T; ++t)
            for (int c = 0; c < C; ++c)
                worst = std::max(worst, double(std::fabs(y[size_t(t) * C + c] - ref[size_t(c) * T + t])) /
                                            std::max(1.0, double(std::fabs(ref[size_t(c) * T + t]))));
        INFO("seed " << seed << " " << cf::matvec_isa_name(isa));
        CHECK(worst < 2e-6);
    }
}

TEST_CASE("fast decoder against the fp32 reference decoder, and exact streaming", "[cpu_fast][decoder]") {
    const uint64_t weight_seed = 31, code_seed = 9;
    const auto ckpt = qtts_test::tiny_checkpoint_with_decoder("fast-decoder", nullptr, weight_seed);
    const qtts::cpu::CpuSpeechDecoder ref_dec(*ckpt);
    const int n = 80;  // past the 72-frame attention window
    const auto codes = random_codes(n, ref_dec.num_quantizers(), ref_dec.config().codebook_size, code_seed);
    const auto ref = ref_dec.decode_full(codes.data(), n);
    double ss = 0.0;
    for (float v : ref) ss += double(v) * v;
    REQUIRE(std::sqrt(ss / double(ref.size())) > 1e-3);  // not silence: the comparison means something

    for (const auto format : {cf::ConvFormat::CONV_FORMAT_FP32, cf::ConvFormat::CONV_FORMAT_BF16}) {
        for (int threads : {1, 2}) {
            const cf::FastSpeechDecoder dec(ckpt->speech_config.decoder, ckpt->decoder, format,
                                            std::make_shared<cf::ThreadPool>(threads));
            const auto full = dec.decode_full(codes.data(), n);
            REQUIRE(full.size() == ref.size());
            const double snr = snr_db(full, ref);
            std::printf("fast decoder (tiny, weights seed %llu, codes seed %llu) %s, %d thread(s): SNR vs fp32 %.1f dB\n",
                        (unsigned long long)weight_seed, (unsigned long long)code_seed, cf::conv_format_name(format),
                        threads, snr);
            INFO(cf::conv_format_name(format) << " threads " << threads << " SNR " << snr);
            // fp32 differs from the reference only in the order of sums and the sine (~117 dB here); bf16
            // rounds every weight once (~39 dB on this random model, below the 50 dB floor that
            // decides the default, docs/cpu-fast.md): the bound catches a broken packing, not a format.
            CHECK(snr >= (format == cf::ConvFormat::CONV_FORMAT_FP32 ? 100.0 : 30.0));
            for (const std::vector<int>& chunks : std::vector<std::vector<int>>{{1}, {3}, {1, 4, 16, 2}}) {
                cf::FastDecoderState state = dec.state_new();
                std::vector<float> pcm;
                for (size_t i = 0, done = 0; int(done) < n; ++i) {
                    const int m = std::min(chunks[i % chunks.size()], n - int(done));
                    dec.decode(state, codes.data() + done * size_t(ref_dec.num_quantizers()), m, &pcm);
                    done += size_t(m);
                }
                REQUIRE(pcm.size() == full.size());
                CAPTURE(chunks[0], chunks.size());
                CHECK(qtts_test::max_abs_error(pcm.data(), full.data(), full.size()) < 1e-5);
            }
        }
    }
}

TEST_CASE("fast decoder refuses bad codes and foreign states", "[cpu_fast][decoder]") {
    const auto ckpt = qtts_test::tiny_checkpoint_with_decoder("fast-decoder-validate", nullptr, 32);
    const cf::FastSpeechDecoder dec(ckpt->speech_config.decoder, ckpt->decoder, cf::ConvFormat::CONV_FORMAT_BF16,
                                    std::make_shared<cf::ThreadPool>(1));
    cf::FastDecoderState state = dec.state_new();
    std::vector<int32_t> codes(16, 0);
    codes[5] = dec.config().codebook_size;  // one past the last code
    std::vector<float> pcm;
    CHECK_THROWS_AS(dec.decode(state, codes.data(), 1, &pcm), qtts::Error);
    CHECK(pcm.empty());
    CHECK(state.frames_done == 0);
    cf::FastDecoderState foreign;
    codes[5] = 0;
    CHECK_THROWS_AS(dec.decode(foreign, codes.data(), 1, &pcm), qtts::Error);
    dec.decode(state, codes.data(), 1, &pcm);
    CHECK(pcm.size() == size_t(dec.samples_per_frame()));
    CHECK_THROWS_AS(cf::conv_format_parse("int4"), qtts::Error);
}

