// Token sampling for the talker (codebook 0) and the code predictor (codebooks 1..15).
//
// The processor chain reproduces Hugging Face `generate` (transformers 4.57) as the reference
// calls it, in this order:
//   codebook 0:  repetition penalty over the distinct codebook-0 ids generated so far
//                → min-new-tokens EOS mask → suppression of control ids (2048..3071 except EOS)
//                → [sampling only] temperature → top-k → top-p → softmax → draw
//   codebooks 1..15 (predictor): [sampling only] temperature → top-k → top-p → softmax → draw
// Greedy decoding is the argmax of the logits after the first three steps (HF do_sample=False).
//
// Random numbers come from Philox4x32-10 (Salmon et al. 2011, the generator behind cuRAND's
// Philox), keyed by the 64-bit seed. Each draw is addressed by (stream, index) instead of by a
// running offset, so a GPU kernel that knows the frame number reproduces the same numbers
// without sharing sequential state: the talker's codebook-0 draw of frame k uses stream 0,
// index k; the predictor's codebook-g draw of frame k uses stream g, index k. This file is
// shared with the GPU path, so everything here is plain host C++ with no allocation per token.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace qtts {

struct GenerationConfig;

struct SamplingParams {
    bool greedy = false;              // argmax (HF do_sample=False); the warpers below are skipped
    float temperature = 0.9f;         // > 0; 1 = unchanged
    int top_k = 50;                   // 0 = disabled
    float top_p = 1.0f;               // in (0, 1]; 1 = disabled
    float repetition_penalty = 1.05f; // codebook 0 only; 1 = disabled; ignored by the predictor
};

// Checks ranges; throws qtts::Error (ERROR_INVALID_ARGUMENT) naming the field and what is accepted.
void sampling_params_validate(const SamplingParams& params, const char* which);

// The Philox4x32-10 block function: 4 words of counter, 2 words of key → 4 random words.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Counter-based uniform numbers: value(stream, index) is a pure function of (seed, stream, index).
class SamplingRng {
public:
    explicit SamplingRng(uint64_t seed = 0) : seed_(seed) {}
    uint64_t seed() const { return seed_; }
    // A float in [0, 1) with 24 random bits: counter = {index lo, index hi, stream, 0},
    // key = {seed lo, seed hi}; uses the first output word, u = (word >> 8) · 2^-24.
    float uniform(uint32_t stream, uint64_t index) const;

private:
    uint64_t seed_;
};

// Rules of the codebook-0 head (from the talker config).
struct Codebook0Rules {
    int32_t eos_id = 2150;
    int32_t suppress_begin = 2048;  // ids in [suppress_begin, vocab) other than eos_id are masked
    int min_new_tokens = 2;         // EOS is masked while fewer tokens than this were generated
};

// The distinct codebook-0 ids generated so far (the repetition-penalty set), O(1) insert.
class TokenHistory {
public:
    explicit TokenHistory(int vocab_size = 0) { reset(vocab_size); }
    void reset(int vocab_size);
    void add(int32_t id);
    const std::vector<int32_t>& distinct() const { return distinct_; }
    int count() const { return count_; }  // tokens added (with repeats)

private:
    std::vector<uint8_t> seen_;      // [vocab]
    std::vector<int32_t> distinct_;  // in first-seen order
    int count_ = 0;
};

// --- the individual processors (in place on logits[n]) --------------------------------------

// HF RepetitionPenaltyLogitsProcessor: for each id, logit < 0 ? logit·p : logit/p.
void logits_apply_repetition_penalty(float* logits, int n, const std::vector<int32_t>& ids, float penalty);
// Sets logits[id] = -inf.
void logits_mask_token(float* logits, int n, int32_t id);
// Sets every logit in [begin, n) to -inf except logits[keep].
void logits_suppress_from(float* logits, int n, int32_t begin, int32_t keep);
void logits_apply_temperature(float* logits, int n, float temperature);
// HF TopKLogitsWarper: removes logits strictly below the k-th largest (ties at the threshold stay).
// `scratch` needs n floats.
void logits_apply_top_k(float* logits, int n, int k, float* scratch);
// HF TopPLogitsWarper: sort ascending (stable), remove tokens whose cumulative probability is
// <= 1 - top_p, always keep the most likely one. `scratch` needs 2n floats, `order` n ints.
void logits_apply_top_p(float* logits, int n, float top_p, float* scratch, int32_t* order);

// Index of the largest logit; the first one on ties (as torch.argmax).
int32_t logits_argmax(const float* logits, int n);
// Softmax (fp32, max-subtracted) into probs, then probs_pick. u in [0, 1).
int32_t probs_draw(const float* logits, int n, float u, float* probs);
// The first index whose running sum (fp32, in index order) exceeds u · total, else the last
// nonzero index (rounding can leave u · total above every sum), else 0. The GPU draw makes the
// same sums in the same order (kernels/sampling.cu).
int32_t probs_pick(const float* probs, int n, float u);

// Working memory for the processors; sized once, reused for every token.
struct SamplerScratch {
    std::vector<float> logits;  // [n]
    std::vector<float> work;    // [2n]
    std::vector<int32_t> order; // [n]
    void reserve(int n);
};

// The codebook-0 chain. `logits` is not modified (it is copied into scratch).
int32_t sample_codebook0(const float* logits, int n, const SamplingParams& params, const Codebook0Rules& rules,
                         const TokenHistory& history, const SamplingRng& rng, uint64_t frame, SamplerScratch& scratch);
// The predictor chain for codebook `group` (1..15): no penalty, no suppression.
int32_t sample_predictor(const float* logits, int n, const SamplingParams& params, int group, const SamplingRng& rng,
                         uint64_t frame, SamplerScratch& scratch);

// Frame budget: the runaway guard of one utterance. See docs/generation.md for the rule.
struct FrameBudgetRule {
    int base_frames = 50;            // 4 s, room for short texts and trailing silence
    int frames_per_text_token = 10;  // 0.8 s per text token: ≈3× the normal speaking rate
};
// min(max_new_tokens - 1, base + per_token · text_tokens); never below 1.
int frame_budget(const FrameBudgetRule& rule, int text_tokens, int max_new_tokens);

// Everything the frame loop needs besides the prompt.
struct GenerationParams {
    SamplingParams talker;
    SamplingParams predictor{false, 0.9f, 50, 1.0f, 1.0f};
    int min_new_tokens = 2;
    int max_new_tokens = 8192;  // codebook-0 tokens sampled at most (HF semantics): frames ≤ this - 1
    int max_frames = 0;         // > 0: explicit cap on emitted frames, overrides the budget rule
    FrameBudgetRule budget;
};

// Checks both samplers and the frame limits (the checks every generator runs at start);
// throws qtts::Error (ERROR_INVALID_ARGUMENT) naming the field and what is accepted.
void generation_params_validate(const GenerationParams& params);

// The checkpoint's generation_config.json as GenerationParams.
GenerationParams generation_params_from_config(const GenerationConfig& config);
// Greedy talker and predictor with the reference's penalty (used by the golden tests).
GenerationParams generation_params_greedy(const GenerationConfig& config);

}  // namespace qtts
