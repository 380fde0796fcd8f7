#include "engine/cuda/gpu_generator.h"

#include <algorithm>
#include <cstring>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

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
    if (lm_.weights().num_code_groups > MAX_CODE_GROUPS)
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
    stop_reason_ = StopReason::STOP_NONE;
    // The audio of emitted frames stays until taken (the next segment continues the stream).
    // Decoded frames that were never emitted only exist after a restart before DONE (chunks end at
    // the frame limit and only the frames before a stop are decoded): dropped.
    audio_.resize(audio_emitted_);
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

void GpuGenerator::decoder_attach(std::unique_ptr<GpuSpeechDecoder> decoder) {
    context_.guard().check("GpuGenerator::decoder_attach");
    if (!decoder) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "decoder_attach: no decoder");
    if (&decoder->context() != &context_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "decoder_attach: the decoder belongs to another GPU context");
    fused_.reset();
    decoder_ = std::move(decoder);
    audio_.clear();
    audio_emitted_ = 0;
    if (options_.fused_chunks && graphs_.enabled() && !fused_chunks_disabled_by_env())
        fused_ = std::make_unique<FusedChunkGraphs>(lm_, *decoder_, options_.graph_frames);
    else if (options_.fused_chunks && graphs_.enabled())
        QTTS_LOG_INFO("fused chunks disabled by QTTS_NO_FUSED_CHUNKS: LM and decoder replay separately");
}

void GpuGenerator::decoder_reset() {
    if (decoder_) decoder_->reset();
    audio_.clear();
    audio_emitted_ = 0;
}

std::vector<int> GpuGenerator::fused_sizes() const {
    std::vector<int> sizes;
    if (fused_)
        for (const GraphStats& s : fused_->stats()) sizes.push_back(s.frames);
    return sizes;
}

void GpuGenerator::audio_take(std::vector<float>* pcm) {
    if (!pcm) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "audio_take: pcm is null");
    pcm->insert(pcm->end(), audio_.begin(), audio_.begin() + long(audio_emitted_));
    audio_.erase(audio_.begin(), audio_.begin() + long(audio_emitted_));
    audio_emitted_ = 0;
}

void GpuGenerator::chunk_run(int frames) {
    const int first = computed_;
    const size_t rows = size_t(frames + 1) * k::SAMPLE_MAX_GROUPS;
    int32_t* dst = host_codes_.data() + size_t(first) * k::SAMPLE_MAX_GROUPS;
    if (fused_ && fused_->has(frames)) {
        // One replay, one sync: codes and (unless the chunk holds a stop) audio.
        const bool decoded = fused_->run(frames);
        std::memcpy(dst, fused_->codes(), rows * sizeof(int32_t));
        computed_ += frames;
        if (decoded)
            audio_.insert(audio_.end(), fused_->pcm(), fused_->pcm() + size_t(frames) * decoder_->samples_per_frame());
        else
            chunk_decode(first, frames);
        return;
    }
    graphs_.run(frames);
    // One copy per chunk: the chunk's frames and codebook 0 of the frame after it.
    lm_.codes_read_async(first, frames + 1, chunk_codes_.get());
    context_.synchronize();
    std::memcpy(dst, chunk_codes_.get(), rows * sizeof(int32_t));
    computed_ += frames;
    if (decoder_) chunk_decode(first, frames);
}

void GpuGenerator::chunk_decode(int first, int frames) {
    // Only the frames next_frame() will emit: those before an end-of-speech row. (A frame past
    // the frame limit is never computed: chunks stop at the limit.)
    const int nq = decoder_->config().num_quantizers;
    int valid = 0;
    while (valid < frames && host_codes_[size_t(first + valid) * k::SAMPLE_MAX_GROUPS] != eos_id_) ++valid;
    if (valid == 0) return;
    decode_codes_.resize(size_t(valid) * nq);
    for (int f = 0; f < valid; ++f)
        std::copy_n(host_codes_.data() + size_t(first + f) * k::SAMPLE_MAX_GROUPS, nq,
                    decode_codes_.begin() + long(f) * nq);
    decoder_->decode(decode_codes_.data(), valid, &audio_);
}

FrameStatus GpuGenerator::next_frame(FrameCodes& codes) {
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "next_frame before start()");
    if (done_) return FrameStatus::FRAME_STATUS_DONE;
    const int f = frames_;
    const int32_t* row = host_codes_.data() + size_t(f) * k::SAMPLE_MAX_GROUPS;
    if (row[0] == eos_id_) {
        done_ = true;
        stop_reason_ = StopReason::STOP_EOS;
        return FrameStatus::FRAME_STATUS_DONE;
    }
    if (f >= frame_limit_) {
        done_ = true;
        stop_reason_ = limit_is_explicit_ ? StopReason::STOP_MAX_FRAMES : StopReason::STOP_FRAME_BUDGET;
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
    if (decoder_) audio_emitted_ += size_t(decoder_->samples_per_frame());
    return FrameStatus::FRAME_STATUS_FRAME;
}

}  // namespace qtts::cuda
