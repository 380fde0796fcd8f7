#include "engine/cpu_fast/fast_generator.h"

#include <algorithm>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cpu_fast {

FastGenerator::FastGenerator(FastLm lm) : lm_(std::move(lm)) {
    QTTS_ASSERT(lm_.weights && lm_.pool);
    if (lm_.weights->num_code_groups() > MAX_CODE_GROUPS || lm_.weights->num_code_groups() < 2)
        fail(ErrorCode::ERROR_UNSUPPORTED, "num_code_groups {} is not supported (2..{})", lm_.weights->num_code_groups(),
             MAX_CODE_GROUPS);
    const size_t H = size_t(lm_.weights->hidden_size());
    pad_vector_.resize(H);
    step_input_.resize(H);
    frame_sum_.resize(H);
    row_.resize(H);
    lm_.weights->text_vector(lm_.weights->config().tts_pad_token_id, pad_vector_.data());
    fast_predictor_state_init(*lm_.weights, predictor_);
    scratch_.reserve(std::max(lm_.weights->codec_vocab(), lm_.weights->predictor_vocab()));
}

void FastGenerator::start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
                      uint64_t seed, int text_tokens, bool text_closed) {
    generation_params_validate(params);
    if (L <= 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the prefill is empty");
    if (T < 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "negative trailing text length {}", T);

    const FastLmWeights& w = *lm_.weights;
    const size_t H = size_t(w.hidden_size());
    const TalkerConfig& tc = w.config().talker;
    params_ = params;
    rules_.eos_id = tc.codec_eos_id;
    rules_.suppress_begin = w.codec_vocab() - 1024;  // the reference masks the top 1024 control ids
    rules_.min_new_tokens = params.min_new_tokens;
    rng_ = SamplingRng(seed);
    history_.reset(w.codec_vocab());

    trailing_.assign(trailing, trailing + size_t(T) * H);
    trailing_rows_ = T;
    text_closed_ = text_closed;
    text_tokens_ = text_tokens;
    frames_ = 0;
    step_pending_ = false;
    done_ = false;
    stop_reason_ = StopReason::STOP_NONE;
    frame_limit_update();

    // Room for a typical utterance up front (≤ 512 frames ≈ 41 s); longer ones grow the cache by
    // doubling. A reused generator keeps its buffers, so later utterances allocate nothing.
    fast_talker_state_init(w, talker_, L + std::min(frame_limit_, 512) + 1);
    fast_talker_prefill(lm_, talker_, prefill, L);
    started_ = true;
    if (hooks_.on_talker_row) hooks_.on_talker_row(0, talker_.hidden.data(), talker_.logits.data());
}

void FastGenerator::start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) {
    const int H = lm_.weights->hidden_size();
    const std::vector<float> prefill = prompt_embed(prompt, *lm_.weights, lm_.weights->num_code_groups());
    const std::vector<float> trailing = prompt_embed_trailing(prompt, *lm_.weights);
    start(prefill.data(), int(prefill.size() / size_t(H)), trailing.data(), int(trailing.size() / size_t(H)), params,
          seed, prompt.text_tokens, prompt.text_complete);
}

void FastGenerator::frame_limit_update() {
    limit_is_explicit_ = params_.max_frames > 0;
    frame_limit_ = limit_is_explicit_ ? params_.max_frames
                                      : frame_budget(params_.budget, text_tokens_, params_.max_new_tokens);
}

void FastGenerator::text_append(const int32_t* ids, size_t n) {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_append before start()");
    if (text_closed_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "text_append after the text was closed (or the utterance was started with complete text)");
    const size_t H = size_t(lm_.weights->hidden_size());
    trailing_.resize((size_t(trailing_rows_) + n) * H);
    for (size_t i = 0; i < n; ++i) lm_.weights->text_vector(ids[i], trailing_.data() + (size_t(trailing_rows_) + i) * H);
    trailing_rows_ += int(n);
    text_tokens_ += int(n);
    frame_limit_update();
}

void FastGenerator::text_close() {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_close before start()");
    if (text_closed_) return;
    const size_t H = size_t(lm_.weights->hidden_size());
    trailing_.resize((size_t(trailing_rows_) + 1) * H);
    lm_.weights->text_vector(lm_.weights->config().tts_eos_token_id, trailing_.data() + size_t(trailing_rows_) * H);
    ++trailing_rows_;
    text_closed_ = true;
}

void FastGenerator::talker_advance() {
    const FastLmWeights& w = *lm_.weights;
    const int H = w.hidden_size();
    const int step = frames_ - 1;  // decode step k feeds frame k and the k-th text-track row
    const float* track = step < trailing_rows_ ? trailing_.data() + size_t(step) * size_t(H) : pad_vector_.data();
    // Sum of the frame's codebook embeddings (as frame_vector(), without its scratch allocation).
    w.codec_vector(0, pending_[0], frame_sum_.data());
    for (int g = 1; g < w.num_code_groups(); ++g) {
        w.codec_vector(g, pending_[size_t(g)], row_.data());
        for (int i = 0; i < H; ++i) frame_sum_[size_t(i)] += row_[size_t(i)];
    }
    for (int i = 0; i < H; ++i) step_input_[size_t(i)] = frame_sum_[size_t(i)] + track[i];
    if (hooks_.on_step_input) hooks_.on_step_input(step, step_input_.data());
    fast_talker_step(lm_, talker_, step_input_.data());
    step_pending_ = false;
    if (hooks_.on_talker_row) hooks_.on_talker_row(frames_, talker_.hidden.data(), talker_.logits.data());
}

void FastGenerator::frame_predict(int32_t code0, FrameCodes& codes) {
    const FastLmWeights& w = *lm_.weights;
    const int groups = w.num_code_groups(), vocab = w.predictor_vocab();
    codes.fill(0);
    codes[0] = code0;
    for (int g = 1; g < groups; ++g) {
        if (g == 1)
            fast_predictor_prefill(lm_, predictor_, talker_.hidden.data(), code0);
        else
            fast_predictor_step(lm_, predictor_, g, codes[size_t(g - 1)]);
        if (hooks_.on_predictor_logits) hooks_.on_predictor_logits(frames_, g, predictor_.logits.data());
        codes[size_t(g)] =
            sample_predictor(predictor_.logits.data(), vocab, params_.predictor, g, rng_, uint64_t(frames_), scratch_);
    }
}

FrameStatus FastGenerator::next_frame(FrameCodes& codes) {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "next_frame before start()");
    if (done_) return FrameStatus::FRAME_STATUS_DONE;

    if (step_pending_) {
        if (frames_ - 1 >= trailing_rows_ && !text_closed_) return FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT;
        talker_advance();
    }

    // Row `frames_` of talker logits → codebook 0 of frame `frames_`.
    const int32_t code0 = sample_codebook0(talker_.logits.data(), lm_.weights->codec_vocab(), params_.talker, rules_,
                                           history_, rng_, uint64_t(frames_), scratch_);
    history_.add(code0);
    if (code0 == rules_.eos_id) {
        done_ = true;
        stop_reason_ = StopReason::STOP_EOS;
        return FrameStatus::FRAME_STATUS_DONE;
    }
    if (frames_ >= frame_limit_) {
        done_ = true;
        stop_reason_ = limit_is_explicit_ ? StopReason::STOP_MAX_FRAMES : StopReason::STOP_FRAME_BUDGET;
        if (!limit_is_explicit_)
            QTTS_LOG_WARN("generation stopped by the frame budget after {} frames ({} text tokens): no end-of-speech",
                          frames_, text_tokens_);
        return FrameStatus::FRAME_STATUS_DONE;
    }

    frame_predict(code0, codes);
    pending_ = codes;
    step_pending_ = true;
    ++frames_;
    return FrameStatus::FRAME_STATUS_FRAME;
}

}  // namespace qtts::cpu_fast
