#include "engine/runtime/utterance.h"

#include <algorithm>

#include "engine/common/error.h"
#include "engine/text/text_split.h"
#include "engine/text/tokenizer.h"

namespace qtts {


Utterance::Utterance(std::shared_ptr<const SpeechModel> model, PreparedSpeech prepared)
    : model_(std::move(model)), prepared_(std::move(prepared)), generator_(model_->generator_new()) {
    // In-context cloning: the reference codes become the decoder's left context (audio discarded).
    // A generator that slices starts decodes them with the first start (reference_flush), which a
    // sliced start may spread over rounds; the others decode them now.
    const PromptRequest& base = prepared_.base;
    if (base.ref_frames > 0 && base.ref_codes.size() == size_t(base.ref_frames) * MAX_CODE_GROUPS) {
        if (generator_->start_slices()) ref_left_ = base.ref_frames;
        else generator_->reference_decode(base.ref_codes.data(), base.ref_frames);
    }
}

void Utterance::reference_flush(int frames) {
    const int n = std::min(frames, ref_left_);
    if (n <= 0) return;
    const int done = prepared_.base.ref_frames - ref_left_;
    generator_->reference_decode(prepared_.base.ref_codes.data() + size_t(done) * MAX_CODE_GROUPS, n);
    ref_left_ -= n;
}

GenerationStart Utterance::segment_request() const {
    QTTS_ASSERT(next_segment_ < prepared_.segments.size());
    GenerationStart start;
    start.generator = generator_.get();
    PromptRequest req = prepared_.base;
    req.input_ids = prepared_.segments[next_segment_];
    start.prompt = prompt_build(model_->checkpoint().config, req);
    start.params = prepared_.params;
    if (prepared_.max_frames > 0) start.params.max_frames = int(std::max<int64_t>(1, prepared_.max_frames - frames_));
    // Each segment draws from its own counter range so segments do not repeat each other.
    start.seed = prepared_.seed + 0x9E3779B97F4A7C15ull * next_segment_;
    return start;
}

bool Utterance::segment_start() {
    if (next_segment_ >= prepared_.segments.size()) return false;
    const GenerationStart start = segment_request();
    generator_->start(start.prompt, start.params, start.seed);
    segment_started();
    return true;
}

void Utterance::segment_started() {
    reference_flush(ref_left_);  // before the segment's first chunk is decoded
    ++next_segment_;
    due_rows_ = -1;
    generating_ = true;
}

void Utterance::start_slice_set(int rows, int ref_frames) {
    QTTS_ASSERT(rows >= 0 && ref_frames >= 0 && (rows == 0) == (ref_frames == 0));
    const bool slices = generator_->start_slices() && !prepared_.incremental;
    slice_rows_ = slices ? rows : 0;
    slice_ref_ = slices ? ref_frames : 0;
}

bool Utterance::start_pending() const {
    if (start_left_ > 0) return true;  // an open start
    if (slice_rows_ == 0 || done_ || generating_ || prepared_.incremental || next_segment_ >= prepared_.segments.size())
        return false;
    if (ref_left_ > slice_ref_) return true;
    if (due_rows_ < 0) due_rows_ = int(segment_request().prompt.positions.size());
    return due_rows_ > slice_rows_;
}

int Utterance::start_advance() {
    QTTS_ASSERT(start_pending());
    if (start_left_ == 0 && ref_left_ > 0) {  // the reference codes first, a piece a call
        reference_flush(slice_ref_ > 0 ? slice_ref_ : ref_left_);
        return 0;
    }
    if (start_left_ == 0) {  // open it
        const GenerationStart start = segment_request();
        start_left_ = generator_->start_open(start.prompt, start.params, start.seed);
        QTTS_ASSERT(start_left_ >= 1);  // a prompt has rows, and a slicing generator ran none yet
    }
    const int before = start_left_;
    start_left_ = generator_->start_advance(slice_rows_ > 0 ? slice_rows_ : start_left_);
    if (start_left_ == 0) segment_started();
    return before - start_left_;
}

std::optional<GenerationStart> Utterance::first_request() const {
    if (start_pending()) return std::nullopt;  // start_advance() runs it
    if (done_ || frames_ > 0 || prepared_.incremental || generating_ || next_segment_ >= prepared_.segments.size())
        return std::nullopt;
    return segment_request();
}

void Utterance::first_started() {
    QTTS_ASSERT(!generating_ && next_segment_ < prepared_.segments.size());
    segment_started();
}

void Utterance::incremental_commit(bool all) {
    if (pending_text_.empty()) return;
    const std::string text = utf8_nfc(pending_text_);
    std::vector<std::string> pieces = model_->tokenizer().pretokenize(text, prepared_.text_tokens);
    // The last two pre-tokens may still change when more text arrives (a word continues,
    // whitespace attaches to the next word); keep them pending unless the text is closed.
    const size_t keep = all ? 0 : std::min<size_t>(2, pieces.size());
    if (pieces.size() <= keep) return;
    std::string ready;
    for (size_t i = 0; i + keep < pieces.size(); ++i) ready += pieces[i];
    const std::vector<int32_t> ids = model_->tokenizer().encode(ready, prepared_.text_tokens);
    committed_ids_.insert(committed_ids_.end(), ids.begin(), ids.end());
    pending_text_ = text.substr(ready.size());
}

bool Utterance::incremental_start() {
    // Whitespace alone is no text to speak: wait for more; closed blank text ends the utterance
    // with no frames (STOP_EOS), like closed empty text.
    if (committed_ids_.empty() || !text_seen_) return false;
    PromptRequest req = prepared_.base;
    const auto role = model_->assistant_ids("");  // role + end template, no text
    // assistant_ids("") = [im_start, assistant, \n, im_end, \n, im_start, assistant, \n]
    req.input_ids.assign(role.begin(), role.begin() + 3);
    req.input_ids.insert(req.input_ids.end(), committed_ids_.begin(), committed_ids_.end());
    req.input_ids.insert(req.input_ids.end(), role.begin() + 3, role.end());
    req.text_complete = text_closed_ && pending_text_.empty();
    const Prompt prompt = prompt_build(model_->checkpoint().config, req);
    GenerationParams params = prepared_.params;
    if (prepared_.max_frames > 0) params.max_frames = prepared_.max_frames;
    generator_->start(prompt, params, prepared_.seed);
    reference_flush(ref_left_);
    committed_ids_.clear();
    generating_ = true;
    next_segment_ = 1;
    return true;
}

void Utterance::text_append(const std::string& text) {
    if (!prepared_.incremental) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "this stream was not opened for incremental text");
    if (text_closed_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text was already closed");
    QTTS_ASSERT(utf8_is_valid(text));  // checked once at the edge (Stream::text_append)
    pending_text_ += text;
    text_seen_ = text_seen_ || !text_is_blank(text);
    incremental_commit(false);
    if (generating_ && !committed_ids_.empty()) {
        generator_->text_append(committed_ids_.data(), committed_ids_.size());
        committed_ids_.clear();
    }
}

void Utterance::text_close() {
    if (!prepared_.incremental || text_closed_) return;
    text_closed_ = true;
    incremental_commit(true);
    if (generating_) {
        if (!committed_ids_.empty()) generator_->text_append(committed_ids_.data(), committed_ids_.size());
        committed_ids_.clear();
        generator_->text_close();
    }
}

ChunkGenerator* Utterance::batch_candidate(int frames) {
    return !done_ && generating_ && generator_->batch_ready(frames) ? generator_.get() : nullptr;
}

ChunkGenerator* Utterance::first_candidate(int frames) {
    if (done_ || frames_ > 0 || prepared_.incremental) return nullptr;
    if (!generating_ && (start_pending() || !segment_start())) return nullptr;  // pending: start_advance() runs it
    return batch_candidate(frames);
}

UtteranceStatus Utterance::chunk(int frames, std::vector<float>* pcm, std::vector<FrameCodes>* codes) {
    QTTS_ASSERT(frames >= 1 && pcm);
    if (done_) return UtteranceStatus::UTTERANCE_DONE;
    // One backend call per chunk, at the size the engine picked. A segment (sentence) that ends
    // inside the chunk ends the chunk there, shorter, and the next segment starts with the next
    // chunk: asking the backend for the odd remainder would step outside the sizes it captured
    // graphs for (BackendOptions::chunk_sizes; docs/engine.md, "Chunks"). Only a segment that
    // ends with no frame in this call hands the same chunk on to the next segment.
    for (;;) {
        if (!generating_) {
            if (start_pending()) return UtteranceStatus::UTTERANCE_STARTING;
            const bool started = prepared_.incremental ? (next_segment_ == 0 && incremental_start()) : segment_start();
            if (!started) {
                if (prepared_.incremental && next_segment_ == 0 && !text_closed_)
                    return UtteranceStatus::UTTERANCE_WAITING_FOR_TEXT;
                done_ = true;
                if (stop_reason_ == StopReason::STOP_NONE) stop_reason_ = StopReason::STOP_EOS;
                return UtteranceStatus::UTTERANCE_DONE;
            }
        }
        chunk_codes_.clear();
        const size_t pcm_before = pcm->size();
        const ChunkStatus status = generator_->chunk(frames, &chunk_codes_, pcm);
        const int made = int(chunk_codes_.size());
        QTTS_ASSERT(made <= frames && (made == frames || status != ChunkStatus::CHUNK_STATUS_FULL));
        // Every frame's samples, or some owed by a batched decoder pass still running (audio_take).
        QTTS_ASSERT(pcm->size() - pcm_before + size_t(generator_->audio_owed()) * SAMPLES_PER_FRAME ==
                    size_t(made) * SAMPLES_PER_FRAME);
        frames_ += made;
        if (codes) codes->insert(codes->end(), chunk_codes_.begin(), chunk_codes_.end());
        // The segment finished, or the cap fell on this chunk's end (done now: done() says so).
        const bool out_of_frames = prepared_.max_frames > 0 && frames_ >= prepared_.max_frames;
        if (status == ChunkStatus::CHUNK_STATUS_DONE || out_of_frames) {
            generating_ = false;
            stop_reason_ = generator_->stop_reason();
            if (prepared_.incremental || out_of_frames || next_segment_ >= prepared_.segments.size()) {
                if (out_of_frames) stop_reason_ = StopReason::STOP_MAX_FRAMES;
                done_ = true;
            }
        }
        if (made > 0) return UtteranceStatus::UTTERANCE_CHUNK;
        if (done_) return UtteranceStatus::UTTERANCE_DONE;
        if (status == ChunkStatus::CHUNK_STATUS_WAITING_FOR_TEXT) return UtteranceStatus::UTTERANCE_WAITING_FOR_TEXT;
    }
}

}  // namespace qtts
