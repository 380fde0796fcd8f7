#include "engine/cpu/generator.h"

#include <algorithm>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cpu {

namespace {

// The fp32 reference networks (lm.h) as a session.
class ReferenceLmSession final : public LmSession {
public:
    explicit ReferenceLmSession(std::shared_ptr<const LmWeights> weights) : w_(std::move(weights)) {
        QTTS_ASSERT(w_);
        predictor_state_init(*w_, predictor_);
    }
    const EmbeddingTables& tables() const override { return *w_; }
    const ModelConfig& config() const override { return w_->config(); }
    int num_code_groups() const override { return w_->num_code_groups(); }
    int codec_vocab() const override { return w_->codec_vocab(); }
    int predictor_vocab() const override { return w_->predictor_vocab(); }

    void talker_prefill(const float* embeds, int L, int capacity) override {
        talker_state_init(*w_, talker_, capacity);
        cpu::talker_prefill(*w_, talker_, embeds, L);
    }
    void talker_step(const float* input) override { cpu::talker_step(*w_, talker_, input); }
    const float* talker_hidden() const override { return talker_.hidden.data(); }
    const float* talker_logits() const override { return talker_.logits.data(); }
    int context_length() const override { return talker_.stack.length; }

    void predictor_prefill(const float* talker_hidden, int32_t code0) override {
        cpu::predictor_prefill(*w_, predictor_, talker_hidden, code0);
    }
    void predictor_step(int group, int32_t previous_code) override {
        cpu::predictor_step(*w_, predictor_, group, previous_code);
    }
    const float* predictor_logits() const override { return predictor_.logits.data(); }

private:
    std::shared_ptr<const LmWeights> w_;
    TalkerState talker_;
    PredictorState predictor_;
};

}  // namespace

Generator::Generator(std::shared_ptr<const LmWeights> weights)
    : Generator(std::make_unique<ReferenceLmSession>(std::move(weights))) {}

Generator::Generator(std::unique_ptr<LmSession> lm) : lm_(std::move(lm)) {
    QTTS_ASSERT(lm_);
    if (lm_->num_code_groups() > MAX_CODE_GROUPS || lm_->num_code_groups() < 2)
        fail(ErrorCode::ERROR_UNSUPPORTED, "num_code_groups {} is not supported (2..{})", lm_->num_code_groups(),
             MAX_CODE_GROUPS);
    const size_t H = size_t(lm_->tables().hidden_size());
    pad_vector_.resize(H);
    step_input_.resize(H);
    frame_sum_.resize(H);
    row_.resize(H);
    lm_->tables().text_vector(lm_->config().tts_pad_token_id, pad_vector_.data());
    scratch_.reserve(std::max(lm_->codec_vocab(), lm_->predictor_vocab()));
}

int Generator::start_reset(int L, const float* trailing, int T, const GenerationParams& params, uint64_t seed,
                           int text_tokens, bool text_closed) {
    generation_params_validate(params);
    if (L <= 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the prefill is empty");
    if (T < 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "negative trailing text length {}", T);

    LmSession& lm = *lm_;
    const size_t H = size_t(lm.tables().hidden_size());
    const TalkerConfig& tc = lm.config().talker;
    params_ = params;
    rules_.eos_id = tc.codec_eos_id;
    rules_.suppress_begin = lm.codec_vocab() - 1024;  // the reference masks the top 1024 control ids
    rules_.min_new_tokens = params.min_new_tokens;
    rng_ = SamplingRng(seed);
    history_.reset(lm.codec_vocab());

    trailing_.assign(trailing, trailing + size_t(T) * H);
    trailing_rows_ = T;
    text_closed_ = text_closed;
    text_tokens_ = text_tokens;
    frames_ = 0;
    step_pending_ = false;
    done_ = false;
    started_ = false;
    open_rows_ = open_done_ = 0;
    stop_reason_ = StopReason::STOP_NONE;
    frame_limit_update();
    // Room for a typical utterance up front (≤ 512 frames ≈ 41 s); longer ones grow the cache by
    // doubling. A reused generator keeps its buffers, so later utterances allocate nothing.
    return L + std::min(frame_limit_, 512) + 1;
}

void Generator::start_done() {
    started_ = true;
    if (hooks_.on_talker_row) hooks_.on_talker_row(0, lm_->talker_hidden(), lm_->talker_logits());
}

void Generator::start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
                      uint64_t seed, int text_tokens, bool text_closed) {
    const int capacity = start_reset(L, trailing, T, params, seed, text_tokens, text_closed);
    lm_->talker_prefill(prefill, L, capacity);
    start_done();
}

int Generator::start_open(const Prompt& prompt, const GenerationParams& params, uint64_t seed) {
    QTTS_ASSERT(lm_->prefill_slices());
    const EmbeddingTables& tables = lm_->tables();
    const int H = tables.hidden_size();
    open_prefill_ = prompt_embed(prompt, tables, lm_->num_code_groups());
    const std::vector<float> trailing = prompt_embed_trailing(prompt, tables);
    const int L = int(open_prefill_.size() / size_t(H));
    open_capacity_ = start_reset(L, trailing.data(), int(trailing.size() / size_t(H)), params, seed,
                                 prompt.text_tokens, prompt.text_complete);
    open_rows_ = L;
    return L;
}

int Generator::start_advance(int rows) {
    QTTS_ASSERT(rows > 0 && open_done_ < open_rows_);
    const int n = std::min(rows, open_rows_ - open_done_);
    const float* embeds = open_prefill_.data() + size_t(open_done_) * size_t(lm_->tables().hidden_size());
    if (open_done_ == 0) lm_->talker_prefill(embeds, n, open_capacity_);
    else lm_->talker_prefill_more(embeds, n);
    open_done_ += n;
    if (open_done_ < open_rows_) return open_rows_ - open_done_;
    open_rows_ = open_done_ = 0;
    start_done();
    return 0;
}

void Generator::start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) {
    const EmbeddingTables& tables = lm_->tables();
    const int H = tables.hidden_size();
    const std::vector<float> prefill = prompt_embed(prompt, tables, lm_->num_code_groups());
    const std::vector<float> trailing = prompt_embed_trailing(prompt, tables);
    start(prefill.data(), int(prefill.size() / size_t(H)), trailing.data(), int(trailing.size() / size_t(H)), params,
          seed, prompt.text_tokens, prompt.text_complete);
}

void Generator::frame_limit_update() {
    limit_is_explicit_ = params_.max_frames > 0;
    frame_limit_ = limit_is_explicit_ ? params_.max_frames
                                      : frame_budget(params_.budget, text_tokens_, params_.max_new_tokens);
}

void Generator::text_append(const int32_t* ids, size_t n) {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_append before start()");
    if (text_closed_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "text_append after the text was closed (or the utterance was started with complete text)");
    const EmbeddingTables& tables = lm_->tables();
    const size_t H = size_t(tables.hidden_size());
    trailing_.resize((size_t(trailing_rows_) + n) * H);
    for (size_t i = 0; i < n; ++i) tables.text_vector(ids[i], trailing_.data() + (size_t(trailing_rows_) + i) * H);
    trailing_rows_ += int(n);
    text_tokens_ += int(n);
    frame_limit_update();
}

void Generator::text_close() {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_close before start()");
    if (text_closed_) return;
    const size_t H = size_t(lm_->tables().hidden_size());
    trailing_.resize((size_t(trailing_rows_) + 1) * H);
    lm_->tables().text_vector(lm_->config().tts_eos_token_id, trailing_.data() + size_t(trailing_rows_) * H);
    ++trailing_rows_;
    text_closed_ = true;
}

const float* Generator::step_input_make() {
    QTTS_ASSERT(step_pending_ && !step_waits());
    const EmbeddingTables& w = lm_->tables();
    const int H = w.hidden_size();
    const int step = frames_ - 1;  // decode step k feeds frame k and the k-th text-track row
    const float* track = step < trailing_rows_ ? trailing_.data() + size_t(step) * size_t(H) : pad_vector_.data();
    // Sum of the frame's codebook embeddings (as frame_vector(), without its scratch allocation).
    w.codec_vector(0, pending_[0], frame_sum_.data());
    for (int g = 1; g < lm_->num_code_groups(); ++g) {
        w.codec_vector(g, pending_[size_t(g)], row_.data());
        for (int i = 0; i < H; ++i) frame_sum_[size_t(i)] += row_[size_t(i)];
    }
    for (int i = 0; i < H; ++i) step_input_[size_t(i)] = frame_sum_[size_t(i)] + track[i];
    if (hooks_.on_step_input) hooks_.on_step_input(step, step_input_.data());
    return step_input_.data();
}

void Generator::talker_stepped() {
    step_pending_ = false;
    if (hooks_.on_talker_row) hooks_.on_talker_row(frames_, lm_->talker_hidden(), lm_->talker_logits());
}

bool Generator::code0_draw(int32_t* code0) {
    QTTS_ASSERT(started_ && !done_ && !step_pending_);
    // Row `frames_` of talker logits → codebook 0 of frame `frames_`.
    *code0 = sample_codebook0(lm_->talker_logits(), lm_->codec_vocab(), params_.talker, rules_, history_, rng_,
                              uint64_t(frames_), scratch_);
    history_.add(*code0);
    if (*code0 == rules_.eos_id) {
        done_ = true;
        stop_reason_ = StopReason::STOP_EOS;
        return false;
    }
    if (frames_ >= frame_limit_) {
        done_ = true;
        stop_reason_ = limit_is_explicit_ ? StopReason::STOP_MAX_FRAMES : StopReason::STOP_FRAME_BUDGET;
        if (!limit_is_explicit_)
            QTTS_LOG_WARN("generation stopped by the frame budget after {} frames ({} text tokens): no end-of-speech",
                          frames_, text_tokens_);
        return false;
    }
    return true;
}

void Generator::group_draw(int group, FrameCodes& codes) {
    if (hooks_.on_predictor_logits) hooks_.on_predictor_logits(frames_, group, lm_->predictor_logits());
    codes[size_t(group)] = sample_predictor(lm_->predictor_logits(), lm_->predictor_vocab(), params_.predictor, group,
                                            rng_, uint64_t(frames_), scratch_);
}

void Generator::frame_close(const FrameCodes& codes) {
    pending_ = codes;
    step_pending_ = true;
    ++frames_;
}

bool Generator::batch_ready(int frames) const {
    if (!started_ || done_ || frames_ >= frame_limit_) return false;
    // The talker steps of the next `frames` frames read text-track rows up to frames_ + frames - 2.
    return text_closed_ || frames_ + frames - 1 <= trailing_rows_;
}

FrameStatus Generator::next_frame(FrameCodes& codes) {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "next_frame before start()");
    if (done_) return FrameStatus::FRAME_STATUS_DONE;

    if (step_pending_) {
        if (step_waits()) return FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT;
        lm_->talker_step(step_input_make());
        talker_stepped();
    }
    int32_t code0 = 0;
    if (!code0_draw(&code0)) return FrameStatus::FRAME_STATUS_DONE;

    codes.fill(0);
    codes[0] = code0;
    for (int g = 1; g < lm_->num_code_groups(); ++g) {
        if (g == 1)
            lm_->predictor_prefill(lm_->talker_hidden(), code0);
        else
            lm_->predictor_step(g, codes[size_t(g - 1)]);
        group_draw(g, codes);
    }
    frame_close(codes);
    return FrameStatus::FRAME_STATUS_FRAME;
}

}  // namespace qtts::cpu
