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

GpuLmOptions gpu_lm_options(const BackendOptions& options) {
    GpuLmOptions lm;
    lm.max_context = options.max_context;
    if (options.prefill_chunk > 0) lm.prefill_chunk = options.prefill_chunk;
    return lm;
}

GpuGenerator::GpuGenerator(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context,
                           const BackendOptions& options)
    : context_(context),
      chunk_sizes_(options.chunk_sizes),
      fused_chunks_(options.fused_chunks),
      lm_(std::move(weights), context, gpu_lm_options(options)),
      graphs_(lm_, options.cuda_graphs) {
    QTTS_ASSERT(!chunk_sizes_.empty());
    if (lm_.weights().num_code_groups > MAX_CODE_GROUPS)
        fail(ErrorCode::ERROR_UNSUPPORTED, "num_code_groups {} is not supported", lm_.weights().num_code_groups);
    host_codes_.assign(size_t(lm_.code_capacity()) * k::SAMPLE_MAX_GROUPS, -1);
    // Pinned room for the largest configured chunk (+ the row after it); a larger one grows it.
    const int largest = *std::max_element(chunk_sizes_.begin(), chunk_sizes_.end());
    chunk_codes_ = PinnedArray<int32_t>(size_t(largest + 1) * k::SAMPLE_MAX_GROUPS);
    eos_id_ = lm_.weights().config().talker.codec_eos_id;
    // One eager step first: it warms up every kernel (and any lazy set-up) outside a capture;
    // the device state it leaves behind is reset by start().
    {
        OwnerGuard::Scope owner(context_.guard(), "warm-up frame step");
        lm_.frame_step_enqueue();
    }
    context_.synchronize();
    graphs_.capture(chunk_sizes_);
}

void GpuGenerator::begin(const GenerationParams& params, int L, int text_tokens, bool text_closed) {
    params_ = params;
    prompt_length_ = L;
    text_tokens_ = text_tokens;
    text_closed_ = text_closed;
    frames_ = 0;
    computed_ = 0;
    precomputed_ = 0;
    batch_codes_landed_ = false;
    batch_pcm_ready_ = false;
    start_landed_ = true;  // start_finish() clears it until start_land()
    done_ = false;
    stop_reason_ = StopReason::STOP_NONE;
    frame_limit_update();
    started_ = true;
}

void GpuGenerator::start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
                         uint64_t seed, int text_tokens, bool text_closed) {
    tail_land();
    generation_params_validate(params);
    lm_.generation_start(prefill, L, trailing, T, setup_from(params, seed));
    begin(params, L, text_tokens, text_closed);
    lm_.codes_read(0, 1, host_codes_.data());
}

void GpuGenerator::start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) {
    tail_land();
    generation_params_validate(params);
    lm_.generation_start(prompt, setup_from(params, seed));
    begin(params, int(prompt.positions.size()), prompt.text_tokens, prompt.text_complete);
    lm_.codes_read(0, 1, host_codes_.data());
}

GpuLm::PromptRows GpuGenerator::start_load(const Prompt& prompt, const GenerationParams& params) {
    tail_land();
    generation_params_validate(params);
    return lm_.prompt_load(prompt);
}

void GpuGenerator::start_finish(const Prompt& prompt, const GpuLm::PromptRows& rows, const GenerationParams& params,
                                uint64_t seed) {
    tail_land();
    lm_.generation_begin(rows, setup_from(params, seed));
    begin(params, rows.positions, prompt.text_tokens, prompt.text_complete);
    lm_.codes_read_async(0, 1, chunk_codes_.get());  // the constructor sized it for a chunk's rows
    start_landed_ = false;
}

void GpuGenerator::start_land() {
    QTTS_ASSERT(started_ && !start_landed_);
    std::memcpy(host_codes_.data(), chunk_codes_.get(), k::SAMPLE_MAX_GROUPS * sizeof(int32_t));
    start_landed_ = true;
}

void GpuGenerator::frame_limit_update() {
    limit_is_explicit_ = params_.max_frames > 0;
    frame_limit_ = limit_is_explicit_ ? params_.max_frames
                                      : frame_budget(params_.budget, text_tokens_, params_.max_new_tokens);
    // The device buffers are sized once: prompt + frames must fit the context.
    frame_room_ = std::max(std::min(lm_.max_context() - prompt_length_ - 1, lm_.code_capacity() - 2), 0);
    if (frame_limit_ > frame_room_) {
        QTTS_LOG_WARN("frame limit {} exceeds the GPU context ({} positions, prompt {}): capped at {} frames",
                      frame_limit_, lm_.max_context(), prompt_length_, frame_room_);
        frame_limit_ = frame_room_;
    }
}

void GpuGenerator::text_append(const int32_t* ids, size_t n) {
    tail_land();
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_append before start()");
    if (text_closed_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "text_append after the text was closed (or the utterance was started with complete text)");
    lm_.trailing_append(ids, n);
    text_tokens_ += int(n);
    frame_limit_update();
}

void GpuGenerator::text_close() {
    tail_land();
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_close before start()");
    if (text_closed_) return;
    const int32_t eos = lm_.weights().config().tts_eos_token_id;
    lm_.trailing_append(&eos, 1);
    text_closed_ = true;
}

void GpuGenerator::decoder_attach(std::unique_ptr<GpuSpeechDecoder> decoder) {
    tail_land();
    context_.guard().check("GpuGenerator::decoder_attach");
    QTTS_ASSERT(decoder && &decoder->context() == &context_);
    fused_.reset();
    decoder_ = std::move(decoder);
    // The first size is a stream's first chunk (BackendOptions::chunk_sizes): its audio starts
    // playback, so its graph hands the audio over before the talker step after it.
    if (fused_chunks_ && graphs_.enabled())
        fused_ = std::make_unique<FusedChunkGraphs>(lm_, *decoder_, chunk_sizes_, std::vector<int>{chunk_sizes_.front()});
}

void GpuGenerator::decoder_reset() {
    tail_land();
    if (decoder_) decoder_->reset();
}

std::vector<int> GpuGenerator::fused_sizes() const {
    std::vector<int> sizes;
    if (fused_)
        for (const GraphStats& s : fused_->stats()) sizes.push_back(s.frames);
    return sizes;
}

bool GpuGenerator::batch_ready(int frames) {
    tail_land();
    QTTS_ASSERT(start_landed_);
    if (!started_ || done_ || precomputed_ > 0 || frames_ != computed_ || frames < 1) return false;
    if (host_codes_[size_t(frames_) * k::SAMPLE_MAX_GROUPS] == eos_id_) return false;  // stop_check's rules
    if (computed_ >= frame_limit_) return false;      // the next chunk() ends the segment
    if (frame_room_ - computed_ < frames) return false;  // frames past the limit are made and dropped
    return text_closed_ || lm_.trailing_rows() - computed_ >= frames;
}

void GpuGenerator::batch_computed(int frames) {
    QTTS_ASSERT(batch_ready(frames));  // (no tail pending after it)
    precomputed_ = frames;
}

void GpuGenerator::batch_codes_enqueue(int frames) {
    QTTS_ASSERT(precomputed_ == frames && !batch_codes_landed_);
    const size_t rows = size_t(frames + 1) * k::SAMPLE_MAX_GROUPS;
    chunk_codes_.ensure(rows);
    lm_.codes_read_async(computed_, frames + 1, chunk_codes_.get());
}

int GpuGenerator::batch_codes_land(int frames) {
    QTTS_ASSERT(precomputed_ == frames && !batch_codes_landed_);
    const size_t rows = size_t(frames + 1) * k::SAMPLE_MAX_GROUPS;
    std::memcpy(host_codes_.data() + size_t(computed_) * k::SAMPLE_MAX_GROUPS, chunk_codes_.get(),
                rows * sizeof(int32_t));
    batch_codes_landed_ = true;
    const int kept = std::min(frames, frame_limit_ - computed_);
    int valid = 0;
    while (valid < kept && host_codes_[size_t(computed_ + valid) * k::SAMPLE_MAX_GROUPS] != eos_id_) ++valid;
    return valid;
}

void GpuGenerator::batch_decode_codes(int kept, int32_t* out) const {
    QTTS_ASSERT(batch_codes_landed_ && kept >= 1 && kept <= precomputed_ && decoder_);
    const int nq = decoder_->config().num_quantizers;
    for (int f = 0; f < kept; ++f)
        std::copy_n(host_codes_.data() + size_t(computed_ + f) * k::SAMPLE_MAX_GROUPS, nq, out + size_t(f) * nq);
}

void GpuGenerator::batch_pcm_set(const float* pcm, int kept) {
    QTTS_ASSERT(batch_codes_landed_ && kept >= 1 && kept <= precomputed_ && decoder_ && !batch_pcm_ready_);
    batch_pcm_.assign(pcm, pcm + size_t(kept) * decoder_->samples_per_frame());
    batch_pcm_ready_ = true;
}

void GpuGenerator::batch_pcm_defer(int kept) {
    QTTS_ASSERT(batch_codes_landed_ && kept >= 1 && kept <= precomputed_ && decoder_ && !batch_pcm_ready_ &&
                batch_pcm_deferred_ == 0);
    batch_pcm_deferred_ = kept;
}

void GpuGenerator::audio_deliver(const float* pcm, int frames) {
    QTTS_ASSERT(frames >= 1 && !audio_delivered() && (frames == audio_owed_ || frames == batch_pcm_deferred_));
    owed_pcm_.assign(pcm, pcm + size_t(frames) * decoder_->samples_per_frame());
}

void GpuGenerator::audio_take(std::vector<float>* pcm) {
    QTTS_ASSERT(audio_owed_ > 0 && owed_pcm_.size() == size_t(audio_owed_) * decoder_->samples_per_frame());
    pcm->insert(pcm->end(), owed_pcm_.begin(), owed_pcm_.end());
    audio_owed_ = 0;
    owed_pcm_.clear();
}

void GpuGenerator::audio_clear() {
    batch_pcm_deferred_ = 0;
    audio_owed_ = 0;
    owed_pcm_.clear();
}

int GpuGenerator::chunk_compute(int frames, std::vector<float>* pcm) {
    const int first = computed_;
    const size_t rows = size_t(frames + 1) * k::SAMPLE_MAX_GROUPS;
    int32_t* dst = host_codes_.data() + size_t(first) * k::SAMPLE_MAX_GROUPS;
    int made = frames;  // computed by this chunk: more than it keeps when a batched step ran past the limit
    if (precomputed_ > 0) {
        // A batched step made these frames already: their codes are read below unless the step
        // brought them over (and perhaps decoded them) itself.
        QTTS_ASSERT(precomputed_ >= frames);
        made = precomputed_;
        precomputed_ = 0;
        if (batch_codes_landed_) {
            batch_codes_landed_ = false;
            computed_ += made;
            if (batch_pcm_deferred_ > 0) {  // decoded beside the next step: the samples come later
                audio_owed_ = batch_pcm_deferred_;
                batch_pcm_deferred_ = 0;
                return audio_owed_;
            }
            if (!batch_pcm_ready_) return 0;
            batch_pcm_ready_ = false;
            pcm->insert(pcm->end(), batch_pcm_.begin(), batch_pcm_.end());
            return int(batch_pcm_.size()) / decoder_->samples_per_frame();  // the kept frames (checked in chunk())
        }
    } else if (fused_ && fused_->has(frames)) {
        // One replay: codes and (unless the chunk holds a stop) audio. After an early-audio graph
        // its tail (the talker step after the chunk) runs on: the row after lands at the next entry.
        const bool decoded = fused_->run(frames);
        const size_t landed = fused_->pending() ? size_t(frames) * k::SAMPLE_MAX_GROUPS : rows;
        std::memcpy(dst, fused_->codes(), landed * sizeof(int32_t));
        computed_ += frames;
        if (!decoded) return 0;
        pcm->insert(pcm->end(), fused_->pcm(), fused_->pcm() + size_t(frames) * decoder_->samples_per_frame());
        return frames;
    } else {
        graphs_.run(frames);
    }
    // One copy per chunk: the chunk's frames and codebook 0 of the frame after it. A size larger
    // than any configured one (a caller off the engine's sizes) grows the pinned buffer once.
    chunk_codes_.ensure(rows);
    lm_.codes_read_async(first, frames + 1, chunk_codes_.get());
    context_.synchronize();
    std::memcpy(dst, chunk_codes_.get(), rows * sizeof(int32_t));
    computed_ += made;
    return 0;
}

void GpuGenerator::tail_land() {
    if (!fused_) return;
    if (const int32_t* row = fused_->land())
        std::memcpy(host_codes_.data() + size_t(computed_) * k::SAMPLE_MAX_GROUPS, row,
                    k::SAMPLE_MAX_GROUPS * sizeof(int32_t));
}

void GpuGenerator::frames_decode(int first, int frames, std::vector<float>* pcm) {
    if (frames == 0) return;
    const int nq = decoder_->config().num_quantizers;
    decode_codes_.resize(size_t(frames) * nq);
    for (int f = 0; f < frames; ++f)
        std::copy_n(host_codes_.data() + size_t(first + f) * k::SAMPLE_MAX_GROUPS, nq,
                    decode_codes_.begin() + long(f) * nq);
    decoder_->decode(decode_codes_.data(), frames, pcm);
}

bool GpuGenerator::stop_check() {
    const int f = frames_;
    if (host_codes_[size_t(f) * k::SAMPLE_MAX_GROUPS] == eos_id_) {
        done_ = true;
        stop_reason_ = StopReason::STOP_EOS;
        return true;
    }
    if (f >= frame_limit_) {
        done_ = true;
        stop_reason_ = limit_is_explicit_ ? StopReason::STOP_MAX_FRAMES : StopReason::STOP_FRAME_BUDGET;
        if (!limit_is_explicit_)
            QTTS_LOG_WARN("generation stopped by the frame budget after {} frames ({} text tokens): no end-of-speech",
                          f, text_tokens_);
        return true;
    }
    return false;
}

ChunkStatus GpuGenerator::chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) {
    tail_land();
    if (!started_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "chunk before start()");
    QTTS_ASSERT(start_landed_);
    QTTS_ASSERT(frames >= 1 && codes && (pcm || !decoder_));
    QTTS_ASSERT(audio_owed_ == 0);  // the last chunk's samples were taken (audio_take)
    if (done_) return ChunkStatus::CHUNK_STATUS_DONE;
    // Nothing is computed past a chunk: every computed frame was emitted.
    QTTS_ASSERT(frames_ == computed_);
    if (stop_check()) return ChunkStatus::CHUNK_STATUS_DONE;
    // Exactly the frames asked for, unless the frame limit or the text track ends sooner.
    int n = std::min(frames, frame_limit_ - computed_);
    if (!text_closed_) {
        n = std::min(n, lm_.trailing_rows() - computed_);
        if (n <= 0) return ChunkStatus::CHUNK_STATUS_WAITING_FOR_TEXT;
    }
    const int first = computed_;
    const int decoded = chunk_compute(n, pcm);
    // The frames before an end-of-speech row are emitted; any computed after it are dropped.
    int valid = 0;
    while (valid < n && host_codes_[size_t(first + valid) * k::SAMPLE_MAX_GROUPS] != eos_id_) ++valid;
    QTTS_ASSERT(decoded == 0 || decoded == valid);  // a fused replay decodes a whole chunk, a batched pass the kept frames
    const int groups = lm_.weights().num_code_groups;
    for (int f = 0; f < valid; ++f) {
        const int32_t* row = host_codes_.data() + size_t(first + f) * k::SAMPLE_MAX_GROUPS;
        FrameCodes c{};
        for (int g = 0; g < groups; ++g) c[size_t(g)] = row[g];
        codes->push_back(c);
    }
    if (decoder_ && decoded == 0) frames_decode(first, valid, pcm);
    frames_ += valid;
    if (valid < n) {
        done_ = true;
        stop_reason_ = StopReason::STOP_EOS;
        return ChunkStatus::CHUNK_STATUS_DONE;
    }
    // A stop right after the chunk is known now (codebook 0 of the next frame came with it),
    // unless that row is still in a fused replay's tail: then the next call sees an end-of-speech
    // and ends the segment with no frames (ChunkGenerator::chunk allows it). At the frame limit
    // the segment ends here either way, so the tail lands now (the stop reason needs its row).
    if (frames_ >= frame_limit_) tail_land();
    if (!tail_pending() && stop_check()) return ChunkStatus::CHUNK_STATUS_DONE;
    return n < frames ? ChunkStatus::CHUNK_STATUS_WAITING_FOR_TEXT : ChunkStatus::CHUNK_STATUS_FULL;
}

}  // namespace qtts::cuda
