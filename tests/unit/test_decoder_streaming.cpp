// Exact stateful streaming of the CPU speech decoder on random-weight decoders written by
// `model_write_random` (no reference data needed): decoding in chunks of any size must give
// the samples of one full decode, to float rounding.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/model/weights.h"
#include "test_support.h"

namespace {

using qtts::cpu::CpuSpeechDecoder;
using qtts::cpu::DecoderState;

using qtts_test::tiny_checkpoint_with_decoder;

std::vector<int32_t> random_codes(int frames, int nq, int codebook_size, uint64_t seed) {
    const auto u = qtts_test::random_floats(size_t(frames) * nq, seed, 0.0f, 1.0f);
    std::vector<int32_t> codes(u.size());
    for (size_t i = 0; i < u.size(); ++i) codes[i] = std::min(codebook_size - 1, int(u[i] * float(codebook_size)));
    return codes;
}

std::vector<float> stream_decode(const CpuSpeechDecoder& dec, const std::vector<int32_t>& codes, int n,
                                 const std::vector<int>& chunks) {
    DecoderState state = dec.state_new();
    std::vector<float> pcm;
    int done = 0;
    for (size_t i = 0; done < n; ++i) {
        const int m = std::min(chunks[i % chunks.size()], n - done);
        dec.decode(state, codes.data() + size_t(done) * dec.num_quantizers(), m, &pcm);
        done += m;
    }
    return pcm;
}

// The audio must carry signal (not silence, not saturated) or the comparisons prove nothing.
void require_informative(const std::vector<float>& pcm) {
    double ss = 0.0;
    size_t clamped = 0;
    for (float v : pcm) {
        ss += double(v) * v;
        clamped += std::fabs(v) >= 1.0f;
    }
    const double rms = std::sqrt(ss / double(pcm.size()));
    INFO("rms " << rms << ", clamped " << clamped << " of " << pcm.size());
    REQUIRE(rms > 1e-3);
    REQUIRE(clamped < pcm.size() / 2);
}

void edit_small_window(qtts::DecoderConfig* d) {
    d->sliding_window = 5;  // the KV window wraps after 4 frames
    d->num_layers = 3;
    d->num_kv_heads = 2;    // grouped-query attention (4 heads share 2 kv heads)
}

}  // namespace

TEST_CASE("streaming at any chunk size equals the full decode (real 72-frame window)", "[decoder]") {
    const auto ckpt = tiny_checkpoint_with_decoder("stream-default", nullptr, 11);
    const CpuSpeechDecoder dec(*ckpt);
    const int n = 90;  // > 72: the attention window slides during the test
    const auto codes = random_codes(n, dec.num_quantizers(), dec.config().codebook_size, 5);
    const auto full = dec.decode_full(codes.data(), n);
    REQUIRE(full.size() == size_t(n) * dec.samples_per_frame());
    require_informative(full);

    for (const std::vector<int>& chunks : std::vector<std::vector<int>>{{1}, {2}, {3}, {7}, {25}, {90}, {1, 4, 16, 2}}) {
        const auto pcm = stream_decode(dec, codes, n, chunks);
        REQUIRE(pcm.size() == full.size());
        const double err = qtts_test::max_abs_error(pcm.data(), full.data(), full.size());
        CAPTURE(chunks[0], chunks.size());
        CHECK(err <= 1e-5);
    }

    // A single pass without internal chunking agrees with the default (25-frame steps).
    qtts::cpu::CpuSpeechDecoderOptions one_pass;
    one_pass.max_chunk_frames = n;
    const CpuSpeechDecoder dec1(*ckpt, one_pass);
    const auto single = dec1.decode_full(codes.data(), n);
    CHECK(qtts_test::max_abs_error(single.data(), full.data(), full.size()) <= 1e-5);
}

TEST_CASE("streaming is exact with a small wrapping window, more layers and GQA", "[decoder]") {
    const auto ckpt = tiny_checkpoint_with_decoder("stream-small-window", edit_small_window, 12);
    const CpuSpeechDecoder dec(*ckpt);
    REQUIRE(dec.config().sliding_window == 5);
    const int n = 40;
    const auto codes = random_codes(n, dec.num_quantizers(), dec.config().codebook_size, 6);
    const auto full = dec.decode_full(codes.data(), n);
    require_informative(full);
    for (int chunk : {1, 2, 3, 4, 5, 6, 7, 13, 40}) {
        const auto pcm = stream_decode(dec, codes, n, {chunk});
        CAPTURE(chunk);
        CHECK(qtts_test::max_abs_error(pcm.data(), full.data(), full.size()) <= 1e-5);
    }
}

TEST_CASE("the carried state matters: restarting each chunk is not exact", "[decoder]") {
    // Guards the tests above against passing trivially: dropping the state must change the audio.
    const auto ckpt = tiny_checkpoint_with_decoder("stream-restart", edit_small_window, 13);
    const CpuSpeechDecoder dec(*ckpt);
    const int n = 12;
    const auto codes = random_codes(n, dec.num_quantizers(), dec.config().codebook_size, 7);
    const auto full = dec.decode_full(codes.data(), n);
    std::vector<float> restarted;
    for (int s = 0; s < n; s += 4) {
        DecoderState fresh = dec.state_new();
        dec.decode(fresh, codes.data() + size_t(s) * dec.num_quantizers(), 4, &restarted);
    }
    REQUIRE(restarted.size() == full.size());
    CHECK(qtts_test::max_abs_error(restarted.data(), full.data(), full.size()) > 1e-3);
    // ...while the first chunk (fresh state either way) is identical.
    CHECK(qtts_test::max_abs_error(restarted.data(), full.data(), size_t(4) * dec.samples_per_frame()) <= 1e-5);
}

TEST_CASE("decoder state bookkeeping and input validation", "[decoder]") {
    const auto ckpt = tiny_checkpoint_with_decoder("stream-validate", nullptr, 14);
    const CpuSpeechDecoder dec(*ckpt);
    const int nq = dec.num_quantizers();
    const int n = 6;
    auto codes = random_codes(n, nq, dec.config().codebook_size, 8);
    const auto full = dec.decode_full(codes.data(), n);

    DecoderState state = dec.state_new();
    CHECK(state.frames_done == 0);
    CHECK(state.carried_bytes() > 0);
    std::vector<float> pcm;
    dec.decode(state, codes.data(), 2, &pcm);
    CHECK(state.frames_done == 2);
    CHECK(state.attention[0].rows == 2);

    // A bad code is rejected before the state changes; decoding then continues exactly.
    std::vector<int32_t> bad(codes.begin() + 2 * nq, codes.begin() + 3 * nq);
    bad[5] = dec.config().codebook_size;  // one past the last valid code
    CHECK_THROWS_AS(dec.decode(state, bad.data(), 1, &pcm), qtts::Error);
    bad[5] = -1;
    CHECK_THROWS_AS(dec.decode(state, bad.data(), 1, &pcm), qtts::Error);
    try {
        dec.decode(state, bad.data(), 1, &pcm);
    } catch (const qtts::Error& e) {
        CHECK(e.code() == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find("0..2047") != std::string::npos);
    }
    CHECK(state.frames_done == 2);
    CHECK(pcm.size() == size_t(2) * dec.samples_per_frame());
    dec.decode(state, codes.data() + 2 * nq, n - 2, &pcm);
    CHECK(qtts_test::max_abs_error(pcm.data(), full.data(), full.size()) <= 1e-5);

    // Copying a state forks the stream: both copies continue exactly like the original.
    {
        DecoderState a = dec.state_new();
        std::vector<float> pa;
        dec.decode(a, codes.data(), 3, &pa);
        DecoderState b = a;
        std::vector<float> pb = pa;
        dec.decode(a, codes.data() + 3 * nq, n - 3, &pa);
        dec.decode(b, codes.data() + 3 * nq, n - 3, &pb);
        CHECK(qtts_test::max_abs_error(pa.data(), pb.data(), pa.size()) == 0.0);
        CHECK(qtts_test::max_abs_error(pa.data(), full.data(), full.size()) <= 1e-5);
    }

    // Zero frames: nothing happens.
    dec.decode(state, codes.data(), 0, &pcm);
    CHECK(pcm.size() == full.size());
    CHECK_THROWS_AS(dec.decode(state, codes.data(), -1, &pcm), qtts::Error);
    CHECK_THROWS_AS(dec.dequantize(bad.data(), 1), qtts::Error);

    // A state made by a differently shaped decoder is refused.
    const auto other_ckpt = tiny_checkpoint_with_decoder("stream-validate-other", edit_small_window, 15);
    const CpuSpeechDecoder other(*other_ckpt);
    DecoderState foreign = other.state_new();
    CHECK_THROWS_AS(dec.decode(foreign, codes.data(), 1, &pcm), qtts::Error);
}

TEST_CASE("dequantize is the sum of both projected codebook groups", "[decoder]") {
    const auto ckpt = tiny_checkpoint_with_decoder("stream-dequant", nullptr, 16);
    const CpuSpeechDecoder dec(*ckpt);
    const qtts::DecoderConfig& d = dec.config();
    const int nq = d.num_quantizers, half = d.codebook_dim / 2, cd = d.codebook_dim;
    const int n = 3;
    const auto codes = random_codes(n, nq, d.codebook_size, 9);
    const auto z = dec.dequantize(codes.data(), n);
    REQUIRE(z.size() == size_t(n) * cd);

    // Naive recomputation straight from the checkpoint tensors.
    const qtts::SpeechDecoderWeights& w = ckpt->decoder;
    auto book_row = [&](int q, int code) {
        const qtts::TensorView* sum = q == 0 ? w.rvq_first_embedding_sum : w.rvq_rest_embedding_sum[size_t(q - 1)];
        const qtts::TensorView* usage = q == 0 ? w.rvq_first_cluster_usage : w.rvq_rest_cluster_usage[size_t(q - 1)];
        const auto s = qtts::tensor_to_f32(*sum);
        const auto u = qtts::tensor_to_f32(*usage);
        std::vector<double> row(static_cast<size_t>(half));
        for (int j = 0; j < half; ++j) row[size_t(j)] = s[size_t(code) * half + j] / std::max(u[size_t(code)], 1e-5f);
        return row;
    };
    const auto first = qtts::tensor_to_f32(*w.rvq_first_output_proj);  // [cd, half, 1]
    const auto rest = qtts::tensor_to_f32(*w.rvq_rest_output_proj);
    for (int t = 0; t < n; ++t) {
        const auto sem = book_row(0, codes[size_t(t) * nq]);
        std::vector<double> ac(static_cast<size_t>(half), 0.0);
        for (int q = 1; q < nq; ++q) {
            const auto r = book_row(q, codes[size_t(t) * nq + q]);
            for (int j = 0; j < half; ++j) ac[size_t(j)] += r[size_t(j)];
        }
        for (int o = 0; o < cd; ++o) {
            double expect = 0.0;
            for (int j = 0; j < half; ++j)
                expect += first[size_t(o) * half + j] * sem[size_t(j)] + rest[size_t(o) * half + j] * ac[size_t(j)];
            CHECK(std::fabs(z[size_t(t) * cd + o] - expect) <= 1e-4 * std::max(1.0, std::fabs(expect)));
        }
    }
}
