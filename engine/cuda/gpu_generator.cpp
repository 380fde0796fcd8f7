#include "cuda/gpu_generator.h"

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/log.h"

namespace qtts::cuda {

namespace k = ::qtts::kernels;
using cpu::FrameStatus;
using cpu::StopReason;

namespace {
GpuGenerationSetup setup_from(const GenerationParams& params, uint64_t seed) {
    GpuGenerationSetup s;
    s.seed = seed;
    s.talker = params.talker;
    s.predictor = params.predictor;
    s.min_new_tokens = params.min_new_tokens;
    return s;
}
}  // namespace

GpuGenerator::GpuGenerator(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context,
                           GpuGeneratorOptions options)
    : context_(context),
      options_(std::move(options)),
      lm_(std::move(weights), context, options_.lm),
      graphs_(lm_, options_.graphs) {
    if (lm_.weights().num_code_groups > cpu::MAX_CODE_GROUPS)
        fail(ErrorCode::ERROR_UNSUPPORTED, "num_code_groups {} is not supported", lm_.weights().num_code_groups);
    chunk_frames_set(options_.first_chunk_frames, options_.chunk_frames);
    host_codes_.assign(size_t(lm_.code_capacity()) * k::SAMPLE_MAX_GROUPS, -1);
    eos_id_ = lm_.weights().config().talker.codec_eos_id;
    // One eager step first: it warms up every kernel (and any lazy set-up) outside a capture;
    // the device state it leaves behind is reset by start().
    {
        OwnerGuard::Scope owner(context_.guard(), "warm-up frame step");
        lm_.frame_step_enqueue();
    }
    context_.synchronize();
    graphs_.capture(options_.graph_frames);
}

void GpuGenerator::chunk_frames_set(int first, int steady) {
    if (first < 1 || steady < 1)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "chunk sizes must be >= 1 frame (got {} and {})", first, steady);
    options_.first_chunk_frames = first;
    options_.chunk_frames = steady;
    const size_t largest = size_t(std::max(first, steady)) + 1;
    if (chunk_codes_.size() < largest * k::SAMPLE_MAX_GROUPS)
        chunk_codes_ = PinnedArray<int32_t>(largest * k::SAMPLE_MAX_GROUPS);
}

void GpuGenerator::begin(const GenerationParams& params, int L, int text_tokens, bool text_closed) {
    params_ = params;
    prompt_length_ = L;
    text_tokens_ = text_tokens;
    text_closed_ = text_closed;
    frames_ = 0;
    computed_ = 0;
    done_ = false;
    stop_reason_ = StopReason::STOP_REASON_NONE;
    frame_limit_update();
    started_ = true;
}

void GpuGenerator::start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
                         uint64_t seed, int text_tokens, bool text_closed) {
    generation_params_validate(params);
    lm_.generation_start(prefill, L, trailing, T, setup_from(params, seed));
    begin(params, L, text_tokens, text_closed);
    lm_.codes_read(0, 1, host_codes_.data());
}

void GpuGenerator::start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) {
    generation_params_validate(params);
    lm_.generation_start(prompt, setup_from(params, seed));
    begin(params, int(prompt.positions.size()), prompt.text_tokens, prompt.text_complete);
    lm_.codes_read(0, 1, host_codes_.data());
}

void GpuGenerator::frame_limit_update() {
    limit_is_explicit_ = params_.max_frames > 0;
    frame_limit_ = limit_is_explicit_ ? params_.max_frames
                                      : frame_budget(params_.budget, text_tokens_, params_.max_new_tokens);
    // The device buffers are sized once: prompt + frames must fit the context.
    const int capacity = std::min(lm_.max_context() - prompt_length_ - 1, lm_.code_capacity() - 2);
    if (frame_limit_ > capacity) {
        QTTS_LOG_WARN("frame limit {} exceeds the GPU context ({} positions, prompt {}): capped at {} frames",
                      frame_limit_, lm_.max_context(), prompt_length_, capacity);
        frame_limit_ = std::max(capacity, 0);
    }
}

void GpuGenerator::text_append(const int32_t* ids, size_t n) {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_append before start()");
    if (text_closed_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "text_append after the text was closed (or the utterance was started with complete text)");
    lm_.trailing_append(ids, n);
    text_tokens_ += int(n);
    frame_limit_update();
}

void GpuGenerator::text_close() {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_close before start()");
    if (text_closed_) return;
    const int32_t eos = lm_.weights().config().tts_eos_token_id;
    lm_.trailing_append(&eos, 1);
    text_closed_ = true;
}

void GpuGenerator::chunk_run(int frames) {
    graphs_.run(frames);
    // One copy per chunk: the chunk's frames and codebook 0 of the frame after it.
    lm_.codes_read_async(computed_, frames + 1, chunk_codes_.get());
    context_.synchronize();
    std::memcpy(host_codes_.data() + size_t(computed_) * k::SAMPLE_MAX_GROUPS, chunk_codes_.get(),
                size_t(frames + 1) * k::SAMPLE_MAX_GROUPS * sizeof(int32_t));
    computed_ += frames;
}

FrameStatus GpuGenerator::next_frame(cpu::FrameCodes& codes) {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "next_frame before start()");
    if (done_) return FrameStatus::FRAME_STATUS_DONE;
    const int f = frames_;
    const int32_t* row = host_codes_.data() + size_t(f) * k::SAMPLE_MAX_GROUPS;
    if (row[0] == eos_id_) {
        done_ = true;
        stop_reason_ = StopReason::STOP_REASON_EOS;
        return FrameStatus::FRAME_STATUS_DONE;
    }
    if (f >= frame_limit_) {
        done_ = true;
        stop_reason_ = limit_is_explicit_ ? StopReason::STOP_REASON_MAX_FRAMES : StopReason::STOP_REASON_FRAME_BUDGET;
        if (!limit_is_explicit_)
            QTTS_LOG_WARN("generation stopped by the frame budget after {} frames ({} text tokens): no end-of-speech",
                          f, text_tokens_);
        return FrameStatus::FRAME_STATUS_DONE;
    }
    if (f >= computed_) {
        int chunk = computed_ == 0 ? options_.first_chunk_frames : options_.chunk_frames;
        chunk = std::min(chunk, frame_limit_ - computed_);
        if (!text_closed_) {
            chunk = std::min(chunk, lm_.trailing_rows() - computed_);
            if (chunk <= 0) return FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT;
        }
        chunk_run(chunk);
    }
    const int groups = lm_.weights().num_code_groups;
    codes.fill(0);
    for (int g = 0; g < groups; ++g) codes[size_t(g)] = row[g];
    ++frames_;
    return FrameStatus::FRAME_STATUS_FRAME;
}

}  // namespace qtts::cuda
