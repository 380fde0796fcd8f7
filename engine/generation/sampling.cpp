#include "engine/generation/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/common/error.h"
#include "engine/model/config.h"

namespace qtts {

namespace {
constexpr float NEG_INF = -std::numeric_limits<float>::infinity();
}

void sampling_params_validate(const SamplingParams& params, const char* which) {
    if (!(params.temperature > 0.0f) || !std::isfinite(params.temperature))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{} temperature {} is invalid: it must be a finite number > 0", which,
             params.temperature);
    if (params.top_k < 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{} top_k {} is invalid: use 0 (disabled) or a positive count", which,
             params.top_k);
    if (!(params.top_p > 0.0f && params.top_p <= 1.0f))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{} top_p {} is invalid: it must lie in (0, 1]", which, params.top_p);
    if (!(params.repetition_penalty > 0.0f) || !std::isfinite(params.repetition_penalty))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "{} repetition_penalty {} is invalid: it must be a finite number > 0 (1 = off)", which,
             params.repetition_penalty);
}

void generation_params_validate(const GenerationParams& params) {
    sampling_params_validate(params.talker, "talker");
    sampling_params_validate(params.predictor, "code predictor");
    if (params.max_new_tokens < 2)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "max_new_tokens {} leaves no frame (at least 2 are needed)",
             params.max_new_tokens);
    if (params.max_frames < 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "max_frames {} is negative (0 = use the frame budget)", params.max_frames);
}

// ---------------------------------------------------------------------------------------------
// Philox4x32-10
// ---------------------------------------------------------------------------------------------

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
    constexpr uint32_t MUL0 = 0xD2511F53u, MUL1 = 0xCD9E8D57u;
    constexpr uint32_t WEYL0 = 0x9E3779B9u, WEYL1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        const uint64_t prod0 = uint64_t(MUL0) * ctr[0];
        const uint64_t prod1 = uint64_t(MUL1) * ctr[2];
        const uint32_t hi0 = uint32_t(prod0 >> 32), lo0 = uint32_t(prod0);
        const uint32_t hi1 = uint32_t(prod1 >> 32), lo1 = uint32_t(prod1);
        ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
        key[0] += WEYL0;
        key[1] += WEYL1;
    }
    return ctr;
}

float SamplingRng::uniform(uint32_t stream, uint64_t index) const {
    const std::array<uint32_t, 4> counter = {uint32_t(index), uint32_t(index >> 32), stream, 0u};
    const std::array<uint32_t, 2> key = {uint32_t(seed_), uint32_t(seed_ >> 32)};
    const uint32_t word = philox4x32_10(counter, key)[0];
    return float(word >> 8) * (1.0f / 16777216.0f);
}

// ---------------------------------------------------------------------------------------------
// History
// ---------------------------------------------------------------------------------------------

void TokenHistory::reset(int vocab_size) {
    seen_.assign(size_t(std::max(vocab_size, 0)), 0);
    distinct_.clear();
    distinct_.reserve(seen_.size());
    count_ = 0;
}

void TokenHistory::add(int32_t id) {
    QTTS_ASSERT(id >= 0 && size_t(id) < seen_.size());
    ++count_;
    if (seen_[size_t(id)]) return;
    seen_[size_t(id)] = 1;
    distinct_.push_back(id);
}

// ---------------------------------------------------------------------------------------------
// Processors
// ---------------------------------------------------------------------------------------------

void logits_apply_repetition_penalty(float* logits, int n, const std::vector<int32_t>& ids, float penalty) {
    if (penalty == 1.0f) return;
    // Gather, then scatter (as HF does): an id listed twice is still penalised once.
    thread_local std::vector<float> gathered;
    gathered.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) gathered[i] = ids[i] >= 0 && ids[i] < n ? logits[ids[i]] : 0.0f;
    for (size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= n) continue;
        const float v = gathered[i];
        logits[ids[i]] = v < 0.0f ? v * penalty : v / penalty;
    }
}

void logits_mask_token(float* logits, int n, int32_t id) {
    if (id >= 0 && id < n) logits[id] = NEG_INF;
}

void logits_suppress_from(float* logits, int n, int32_t begin, int32_t keep) {
    for (int32_t i = std::max(begin, 0); i < n; ++i)
        if (i != keep) logits[i] = NEG_INF;
}

void logits_apply_temperature(float* logits, int n, float temperature) {
    if (temperature == 1.0f) return;
    for (int i = 0; i < n; ++i) logits[i] /= temperature;
}

void logits_apply_top_k(float* logits, int n, int k, float* scratch) {
    if (k <= 0 || k >= n) return;
    std::copy(logits, logits + n, scratch);
    std::nth_element(scratch, scratch + (k - 1), scratch + n, std::greater<float>());
    const float threshold = scratch[k - 1];
    for (int i = 0; i < n; ++i)
        if (logits[i] < threshold) logits[i] = NEG_INF;
}

void logits_apply_top_p(float* logits, int n, float top_p, float* scratch, int32_t* order) {
    if (top_p >= 1.0f || n <= 1) return;
    for (int i = 0; i < n; ++i) order[i] = i;
    std::stable_sort(order, order + n, [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
    // Softmax over the ascending order, then the running sum from the least likely token.
    const float max_v = logits[order[n - 1]];
    float* probs = scratch;
    float total = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float v = logits[order[i]];
        probs[i] = v == NEG_INF ? 0.0f : std::exp(v - max_v);
        total += probs[i];
    }
    const float limit = 1.0f - top_p;
    float cumulative = 0.0f;
    // The last (most likely) token is always kept (min_tokens_to_keep = 1).
    for (int i = 0; i < n - 1; ++i) {
        cumulative += probs[i] / total;
        if (cumulative <= limit) logits[order[i]] = NEG_INF;
    }
}

int32_t logits_argmax(const float* logits, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; ++i)
        if (logits[i] > logits[best]) best = i;
    return best;
}

int32_t probs_pick(const float* probs, int n, float u) {
    float total = 0.0f;
    for (int i = 0; i < n; ++i) total += probs[i];
    const float target = u * total;
    float cumulative = 0.0f;
    int32_t last_nonzero = 0;
    for (int i = 0; i < n; ++i) {
        if (probs[i] == 0.0f) continue;
        cumulative += probs[i];
        last_nonzero = i;
        if (cumulative > target) return i;
    }
    return last_nonzero;  // rounding left target just above the running sum
}

int32_t probs_draw(const float* logits, int n, float u, float* probs) {
    const int32_t top = logits_argmax(logits, n);
    const float max_v = logits[top];
    if (max_v == NEG_INF) fail(ErrorCode::ERROR_INTERNAL, "sampling: every logit is -inf");
    for (int i = 0; i < n; ++i) probs[i] = logits[i] == NEG_INF ? 0.0f : std::exp(logits[i] - max_v);
    return probs_pick(probs, n, u);  // probs[top] = 1: never the all-zero case
}

void SamplerScratch::reserve(int n) {
    if (logits.size() < size_t(n)) {
        logits.resize(size_t(n));
        work.resize(2 * size_t(n));
        order.resize(size_t(n));
    }
}

namespace {
int32_t warp_and_draw(float* logits, int n, const SamplingParams& params, float u, SamplerScratch& scratch) {
    logits_apply_temperature(logits, n, params.temperature);
    logits_apply_top_k(logits, n, params.top_k, scratch.work.data());
    logits_apply_top_p(logits, n, params.top_p, scratch.work.data(), scratch.order.data());
    return probs_draw(logits, n, u, scratch.work.data());
}
}  // namespace

int32_t sample_codebook0(const float* logits, int n, const SamplingParams& params, const Codebook0Rules& rules,
                         const TokenHistory& history, const SamplingRng& rng, uint64_t frame, SamplerScratch& scratch) {
    scratch.reserve(n);
    float* work = scratch.logits.data();
    std::copy(logits, logits + n, work);
    logits_apply_repetition_penalty(work, n, history.distinct(), params.repetition_penalty);
    if (history.count() < rules.min_new_tokens) logits_mask_token(work, n, rules.eos_id);
    logits_suppress_from(work, n, rules.suppress_begin, rules.eos_id);
    if (params.greedy) return logits_argmax(work, n);
    return warp_and_draw(work, n, params, rng.uniform(0, frame), scratch);
}

int32_t sample_predictor(const float* logits, int n, const SamplingParams& params, int group, const SamplingRng& rng,
                         uint64_t frame, SamplerScratch& scratch) {
    scratch.reserve(n);
    float* work = scratch.logits.data();
    std::copy(logits, logits + n, work);
    if (params.greedy) return logits_argmax(work, n);
    return warp_and_draw(work, n, params, rng.uniform(uint32_t(group), frame), scratch);
}

int frame_budget(const FrameBudgetRule& rule, int text_tokens, int max_new_tokens) {
    const int64_t by_text = int64_t(rule.base_frames) + int64_t(rule.frames_per_text_token) * std::max(text_tokens, 0);
    const int64_t by_tokens = int64_t(max_new_tokens) - 1;
    return int(std::max<int64_t>(1, std::min(by_text, by_tokens)));
}

GenerationParams generation_params_from_config(const GenerationConfig& config) {
    GenerationParams p;
    p.talker.greedy = !config.do_sample;
    p.talker.temperature = config.temperature;
    p.talker.top_k = config.top_k;
    p.talker.top_p = config.top_p;
    p.talker.repetition_penalty = config.repetition_penalty;
    p.predictor.greedy = !config.subtalker_do_sample;
    p.predictor.temperature = config.subtalker_temperature;
    p.predictor.top_k = config.subtalker_top_k;
    p.predictor.top_p = config.subtalker_top_p;
    p.predictor.repetition_penalty = 1.0f;
    p.max_new_tokens = config.max_new_tokens;
    return p;
}

GenerationParams generation_params_greedy(const GenerationConfig& config) {
    GenerationParams p = generation_params_from_config(config);
    p.talker.greedy = true;
    p.predictor.greedy = true;
    return p;
}

}  // namespace qtts
