// Sampling processors and the seeded Philox RNG. Statistical checks use fixed seeds and
// thresholds far from the expected values, so they are deterministic and cannot flake.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "engine/common/error.h"
#include "engine/generation/sampling.h"
#include "test_support.h"

namespace {

constexpr float NEG_INF = -std::numeric_limits<float>::infinity();

qtts::SamplingParams sampling(float temperature, int top_k, float top_p) {
    qtts::SamplingParams p;
    p.greedy = false;
    p.temperature = temperature;
    p.top_k = top_k;
    p.top_p = top_p;
    p.repetition_penalty = 1.0f;
    return p;
}

// Draws `n` predictor tokens (frames 0..n-1 of codebook 1) and counts them.
std::map<int32_t, int> histogram(const std::vector<float>& logits, const qtts::SamplingParams& params, uint64_t seed,
                                 int n) {
    qtts::SamplingRng rng(seed);
    qtts::SamplerScratch scratch;
    std::map<int32_t, int> counts;
    for (int i = 0; i < n; ++i)
        ++counts[qtts::sample_predictor(logits.data(), int(logits.size()), params, 1, rng, uint64_t(i), scratch)];
    return counts;
}

double entropy(const std::map<int32_t, int>& counts, int n) {
    double h = 0.0;
    for (const auto& [id, c] : counts) {
        const double p = double(c) / n;
        h -= p * std::log(p);
    }
    return h;
}

}  // namespace

TEST_CASE("Philox4x32-10 reproduces the Random123 known-answer vectors", "[sampling]") {
    CHECK(qtts::philox4x32_10({0u, 0u, 0u, 0u}, {0u, 0u}) ==
          std::array<uint32_t, 4>{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
    CHECK(qtts::philox4x32_10({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}, {0xffffffffu, 0xffffffffu}) ==
          std::array<uint32_t, 4>{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
    CHECK(qtts::philox4x32_10({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}, {0xa4093822u, 0x299f31d0u}) ==
          std::array<uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("uniform numbers are addressed by (seed, stream, index) and look uniform", "[sampling]") {
    const qtts::SamplingRng a(42), b(42), c(43);
    CHECK(a.uniform(0, 7) == b.uniform(0, 7));
    CHECK(a.uniform(0, 7) != c.uniform(0, 7));
    CHECK(a.uniform(0, 7) != a.uniform(1, 7));
    CHECK(a.uniform(0, 7) != a.uniform(0, 8));
    double sum = 0.0;
    int low = 0;
    const int n = 20000;
    for (int i = 0; i < n; ++i) {
        const float u = a.uniform(3, uint64_t(i));
        REQUIRE(u >= 0.0f);
        REQUIRE(u < 1.0f);
        sum += u;
        low += u < 0.25f;
    }
    CHECK(std::fabs(sum / n - 0.5) < 0.02);
    CHECK(std::fabs(double(low) / n - 0.25) < 0.02);
}

TEST_CASE("a fixed seed reproduces the same draws; another seed does not", "[sampling]") {
    const std::vector<float> logits = qtts_test::random_floats(2048, 7, -3.0f, 3.0f);
    const auto params = sampling(0.9f, 50, 1.0f);
    qtts::SamplerScratch scratch;
    std::vector<int32_t> first, second, other;
    const qtts::SamplingRng rng(1234), same(1234), different(99);
    for (int i = 0; i < 200; ++i) {
        first.push_back(qtts::sample_predictor(logits.data(), 2048, params, 1, rng, uint64_t(i), scratch));
        second.push_back(qtts::sample_predictor(logits.data(), 2048, params, 1, same, uint64_t(i), scratch));
        other.push_back(qtts::sample_predictor(logits.data(), 2048, params, 1, different, uint64_t(i), scratch));
    }
    CHECK(first == second);
    CHECK(first != other);
}

TEST_CASE("top-k never draws outside the k best", "[sampling]") {
    const std::vector<float> logits = qtts_test::random_floats(512, 11, -2.0f, 2.0f);
    std::vector<float> sorted = logits;
    std::sort(sorted.begin(), sorted.end(), std::greater<float>());
    for (const int k : {1, 5, 50}) {
        const auto counts = histogram(logits, sampling(2.0f, k, 1.0f), 5, 3000);  // hot: spreads the draws
        for (const auto& [id, c] : counts) CHECK(logits[size_t(id)] >= sorted[size_t(k - 1)]);
        if (k == 1) CHECK(counts.size() == 1);
        if (k == 50) CHECK(counts.size() > 25);  // it does use more than a handful of the 50
    }
}

TEST_CASE("top-p 1.0 is a no-op; smaller top-p keeps the smallest set reaching p", "[sampling]") {
    const std::vector<float> logits = qtts_test::random_floats(300, 3, -2.0f, 2.0f);
    std::vector<float> a = logits, scratch(600);
    std::vector<int32_t> order(300);
    qtts::logits_apply_top_p(a.data(), 300, 1.0f, scratch.data(), order.data());
    CHECK(a == logits);
    // Same draws with top_p = 1 as without the warper at all.
    CHECK(histogram(logits, sampling(1.0f, 0, 1.0f), 9, 500) == histogram(logits, sampling(1.0f, 0, 0.999999f), 9, 500));

    // Hand-made distribution: probs 0.5, 0.3, 0.15, 0.05 → top_p 0.7 keeps the first two.
    std::vector<float> l = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
    qtts::logits_apply_top_p(l.data(), 4, 0.7f, scratch.data(), order.data());
    CHECK(l[1] == Approx(std::log(0.5f)));
    CHECK(l[3] == Approx(std::log(0.3f)));
    CHECK(l[0] == NEG_INF);
    CHECK(l[2] == NEG_INF);
    // A tiny top_p still keeps the most likely token.
    std::vector<float> m = {0.0f, 1.0f, 2.0f};
    qtts::logits_apply_top_p(m.data(), 3, 1e-6f, scratch.data(), order.data());
    CHECK(m[2] == 2.0f);
    CHECK(m[0] == NEG_INF);
    CHECK(m[1] == NEG_INF);
}

TEST_CASE("temperature moves the entropy in the right direction", "[sampling]") {
    const std::vector<float> logits = qtts_test::random_floats(64, 21, -2.0f, 2.0f);
    const int n = 4000;
    const double cold = entropy(histogram(logits, sampling(0.3f, 0, 1.0f), 1, n), n);
    const double warm = entropy(histogram(logits, sampling(1.0f, 0, 1.0f), 1, n), n);
    const double hot = entropy(histogram(logits, sampling(3.0f, 0, 1.0f), 1, n), n);
    CHECK(cold + 0.3 < warm);
    CHECK(warm + 0.2 < hot);
}

TEST_CASE("repetition penalty lowers the frequency of a repeated id (HF semantics)", "[sampling]") {
    // Processor arithmetic: positive logits are divided, negative ones multiplied.
    std::vector<float> l = {2.0f, -2.0f, 1.0f};
    qtts::logits_apply_repetition_penalty(l.data(), 3, {0, 1, 1}, 2.0f);
    CHECK(l[0] == 1.0f);
    CHECK(l[1] == -4.0f);  // applied once even when the id is listed twice
    CHECK(l[2] == 1.0f);

    // Statistics through the codebook-0 chain: id 5 was generated before.
    std::vector<float> logits(3072, NEG_INF);
    for (int i = 0; i < 8; ++i) logits[size_t(i)] = 1.0f;
    qtts::Codebook0Rules rules;
    rules.min_new_tokens = 0;
    qtts::TokenHistory none(3072), seen(3072);
    seen.add(5);
    qtts::SamplingParams params = sampling(1.0f, 0, 1.0f);
    params.repetition_penalty = 1.5f;
    const qtts::SamplingRng rng(77);
    qtts::SamplerScratch scratch;
    int with_penalty = 0, without = 0;
    const int n = 8000;
    for (int i = 0; i < n; ++i) {
        with_penalty += qtts::sample_codebook0(logits.data(), 3072, params, rules, seen, rng, uint64_t(i), scratch) == 5;
        without += qtts::sample_codebook0(logits.data(), 3072, params, rules, none, rng, uint64_t(i), scratch) == 5;
    }
    // Expected: 1/8 = 0.125 without; e^(1/1.5) / (7e + e^(2/3)) ≈ 0.094 with.
    CHECK(double(without) / n == Approx(0.125).margin(0.015));
    CHECK(double(with_penalty) / n == Approx(0.094).margin(0.015));
    CHECK(with_penalty < without);
}

TEST_CASE("codebook 0: EOS masked before min_new_tokens, control ids suppressed", "[sampling]") {
    std::vector<float> logits(3072, 0.0f);
    logits[2150] = 50.0f;  // EOS would win
    logits[2500] = 60.0f;  // a control id would win even more
    logits[17] = 5.0f;
    qtts::Codebook0Rules rules;  // eos 2150, suppress from 2048, min 2
    qtts::SamplingParams greedy;
    greedy.greedy = true;
    qtts::TokenHistory history(3072);
    const qtts::SamplingRng rng(1);
    qtts::SamplerScratch scratch;
    CHECK(qtts::sample_codebook0(logits.data(), 3072, greedy, rules, history, rng, 0, scratch) == 17);
    history.add(17);
    CHECK(qtts::sample_codebook0(logits.data(), 3072, greedy, rules, history, rng, 1, scratch) != 2150);
    history.add(3);
    CHECK(qtts::sample_codebook0(logits.data(), 3072, greedy, rules, history, rng, 2, scratch) == 2150);
    // Sampling never returns a suppressed id, whatever the draw.
    const qtts::SamplingParams hot = sampling(5.0f, 0, 1.0f);
    for (int i = 0; i < 500; ++i) {
        const int32_t id = qtts::sample_codebook0(logits.data(), 3072, hot, rules, history, rng, uint64_t(i), scratch);
        CHECK((id < 2048 || id == 2150));
    }
}

TEST_CASE("greedy picks the argmax (first on ties) and ignores the warpers", "[sampling]") {
    std::vector<float> logits = qtts_test::random_floats(2048, 5, -1.0f, 1.0f);
    logits[1234] = 3.0f;
    logits[1500] = 3.0f;
    qtts::SamplingParams greedy = sampling(0.1f, 1, 0.1f);
    greedy.greedy = true;
    const qtts::SamplingRng rng(3);
    qtts::SamplerScratch scratch;
    for (int i = 0; i < 10; ++i)
        CHECK(qtts::sample_predictor(logits.data(), 2048, greedy, 1 + i % 15, rng, uint64_t(i), scratch) == 1234);
    CHECK(qtts::logits_argmax(logits.data(), 2048) == 1234);
}

TEST_CASE("a draw picks the first index whose running sum passes u times the total", "[sampling]") {
    // probs_pick is the draw both backends make (the GPU's warp sums reproduce it bit for bit).
    // Sums in index order: 0, .25, .25, .75, 1, 1 (total 1), so the pick moves past each boundary
    // and never lands on a zero.
    const float probs[] = {0.0f, 0.25f, 0.0f, 0.5f, 0.25f, 0.0f};
    CHECK(qtts::probs_pick(probs, 6, 0.0f) == 1);           // the first nonzero
    CHECK(qtts::probs_pick(probs, 6, 0.2499f) == 1);
    CHECK(qtts::probs_pick(probs, 6, 0.25f) == 3);          // a sum equal to the target does not pass it
    CHECK(qtts::probs_pick(probs, 6, 0.7499f) == 3);
    CHECK(qtts::probs_pick(probs, 6, 0.75f) == 4);
    CHECK(qtts::probs_pick(probs, 6, 0.99999994f) == 4);    // the trailing zero is never picked
    const float zeros[] = {0.0f, 0.0f, 0.0f};
    CHECK(qtts::probs_pick(zeros, 3, 0.5f) == 0);
    // probs_draw is the softmax and then this pick.
    const std::vector<float> logits = qtts_test::random_floats(300, 11, -4.0f, 4.0f);
    std::vector<float> p1(300);
    for (const float u : {0.0f, 0.1f, 0.5f, 0.9f, 0.99999994f}) {
        const int32_t drawn = qtts::probs_draw(logits.data(), 300, u, p1.data());
        CHECK(qtts::probs_pick(p1.data(), 300, u) == drawn);
    }
}

TEST_CASE("parameter validation and the frame budget rule", "[sampling]") {
    CHECK_NOTHROW(qtts::sampling_params_validate(qtts::SamplingParams{}, "talker"));
    CHECK_THROWS_AS(qtts::sampling_params_validate(sampling(0.0f, 50, 1.0f), "talker"), qtts::Error);
    CHECK_THROWS_AS(qtts::sampling_params_validate(sampling(1.0f, -1, 1.0f), "talker"), qtts::Error);
    CHECK_THROWS_AS(qtts::sampling_params_validate(sampling(1.0f, 5, 0.0f), "talker"), qtts::Error);
    CHECK_THROWS_AS(qtts::sampling_params_validate(sampling(1.0f, 5, 1.5f), "talker"), qtts::Error);

    const qtts::FrameBudgetRule rule;  // 50 + 10 per token
    CHECK(qtts::frame_budget(rule, 0, 8192) == 50);
    CHECK(qtts::frame_budget(rule, 12, 8192) == 170);
    CHECK(qtts::frame_budget(rule, 10000, 8192) == 8191);  // max_new_tokens caps it (one token is never expanded)
    CHECK(qtts::frame_budget(rule, 5, 2) == 1);
}
