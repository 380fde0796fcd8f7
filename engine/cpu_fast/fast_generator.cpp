#include "engine/cpu_fast/fast_generator.h"

#include <algorithm>
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
    bool prefill_slices() const override { return true; }
    void talker_prefill_more(const float* embeds, int T) override { fast_talker_extend(lm_, talker_, embeds, T); }
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

    // FastBatchStep's access to the states it steps together.
    const FastLm& lm() const { return lm_; }
    FastTalkerState& talker() { return talker_; }
    FastPredictorState& predictor() { return predictor_; }

private:
    FastLm lm_;
    FastTalkerState talker_;
    FastPredictorState predictor_;
};

}  // namespace

FastGenerator::FastGenerator(FastLm lm) : cpu::Generator(std::make_unique<FastLmSession>(std::move(lm))) {}

void FastBatchStep::run(const std::vector<FastGenerator*>& generators, int frames,
                        std::vector<std::vector<FrameCodes>>& codes) {
    const size_t n = generators.size();
    QTTS_ASSERT(n >= 1 && frames >= 1);
    const auto session = [&generators](size_t i) -> FastLmSession& {
        return static_cast<FastLmSession&>(generators[i]->session());
    };
    const FastLm& lm = session(0).lm();
    const size_t H = size_t(lm.weights->talker.hidden);
    const int groups = lm.weights->num_code_groups();
    codes.resize(n);
    frame_.resize(n);
    live_.clear();
    for (size_t i = 0; i < n; ++i) {
        QTTS_ASSERT(session(i).lm().weights == lm.weights && generators[i]->batch_ready(frames));
        codes[i].clear();
        live_.push_back(i);
    }
    for (int f = 0; f < frames && !live_.empty(); ++f) {
        // The talker steps of the generators past their first frame, then every codebook 0.
        stepping_.clear();
        for (size_t i : live_)
            if (generators[i]->step_pending()) stepping_.push_back(i);
        if (!stepping_.empty()) {
            inputs_.resize(stepping_.size() * H);
            talkers_.clear();
            for (size_t j = 0; j < stepping_.size(); ++j) {
                const float* input = generators[stepping_[j]]->step_input_make();
                std::copy_n(input, H, inputs_.data() + j * H);
                talkers_.push_back(&session(stepping_[j]).talker());
            }
            fast_talker_step_batch(lm, talkers_.data(), int(talkers_.size()), inputs_.data(), scratch_);
            for (size_t i : stepping_) generators[i]->talker_stepped();
        }
        size_t kept = 0;
        for (size_t i : live_) {
            frame_[i].fill(0);
            if (generators[i]->code0_draw(&frame_[i][0])) live_[kept++] = i;
        }
        live_.resize(kept);
        if (live_.empty()) break;

        // The code predictor's passes for every frame that goes on, a draw after each.
        predictors_.clear();
        hidden_.clear();
        previous_.clear();
        for (size_t i : live_) {
            predictors_.push_back(&session(i).predictor());
            hidden_.push_back(session(i).talker_hidden());
            previous_.push_back(frame_[i][0]);
        }
        const int m = int(live_.size());
        for (int g = 1; g < groups; ++g) {
            if (g == 1)
                fast_predictor_prefill_batch(lm, predictors_.data(), m, hidden_.data(), previous_.data(), scratch_);
            else
                fast_predictor_step_batch(lm, predictors_.data(), m, g, previous_.data(), scratch_);
            for (size_t j = 0; j < live_.size(); ++j) {
                generators[live_[j]]->group_draw(g, frame_[live_[j]]);
                previous_[j] = frame_[live_[j]][size_t(g)];
            }
        }
        for (size_t i : live_) {
            generators[i]->frame_close(frame_[i]);
            codes[i].push_back(frame_[i]);
        }
    }
}

}  // namespace qtts::cpu_fast
