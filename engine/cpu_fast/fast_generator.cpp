#include "engine/cpu_fast/fast_generator.h"

#include <memory>

#include "engine/common/error.h"

namespace qtts::cpu_fast {

namespace {

// The packed networks (fast_lm.h) as the frame loop's session.
class FastLmSession final : public cpu::LmSession {
public:
    explicit FastLmSession(FastLm lm) : lm_(std::move(lm)) {
        QTTS_ASSERT(lm_.weights && lm_.pool);
        fast_predictor_state_init(*lm_.weights, predictor_);
    }
    const EmbeddingTables& tables() const override { return *lm_.weights; }
    const ModelConfig& config() const override { return lm_.weights->config(); }
    int num_code_groups() const override { return lm_.weights->num_code_groups(); }
    int codec_vocab() const override { return lm_.weights->codec_vocab(); }
    int predictor_vocab() const override { return lm_.weights->predictor_vocab(); }

    void talker_prefill(const float* embeds, int L, int capacity) override {
        fast_talker_state_init(*lm_.weights, talker_, capacity);
        fast_talker_prefill(lm_, talker_, embeds, L);
    }
    void talker_step(const float* input) override { fast_talker_step(lm_, talker_, input); }
    const float* talker_hidden() const override { return talker_.hidden.data(); }
    const float* talker_logits() const override { return talker_.logits.data(); }
    int context_length() const override { return talker_.stack.length; }

    void predictor_prefill(const float* talker_hidden, int32_t code0) override {
        fast_predictor_prefill(lm_, predictor_, talker_hidden, code0);
    }
    void predictor_step(int group, int32_t previous_code) override {
        fast_predictor_step(lm_, predictor_, group, previous_code);
    }
    const float* predictor_logits() const override { return predictor_.logits.data(); }

private:
    FastLm lm_;
    FastTalkerState talker_;
    FastPredictorState predictor_;
};

}  // namespace

FastGenerator::FastGenerator(FastLm lm) : cpu::Generator(std::make_unique<FastLmSession>(std::move(lm))) {}

}  // namespace qtts::cpu_fast
