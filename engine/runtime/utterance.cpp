#include "engine/runtime/utterance.h"

#include <algorithm>

#include "engine/common/error.h"
#include "engine/text/text_split.h"
#include "engine/text/tokenizer.h"

namespace qtts {


Utterance::Utterance(std::shared_ptr<const SpeechModel> model, PreparedSpeech prepared)
    : model_(std::move(model)),
      prepared_(std::move(prepared)),
      generator_(model_->generator_new()),
      gpu_decoder_(generator_->decoder() ? nullptr : model_->decoder_stream_new()) {
    // The decoder in use: the generator's own (it decodes its frames), a GPU lease, or the CPU's.
    DecoderStream* gpu_stream = generator_->decoder() ? generator_->decoder() : gpu_decoder_.get();
    if (!gpu_stream) decoder_state_ = model_->decoder().state_new();
    // In-context cloning: the reference codes are the decoder's left context, and their audio
    // is not part of the output. Decoding them once into the streaming state (audio thrown
    // away) makes every generated frame sound exactly as if decoded after the reference.
    // Same on both decoders: the GPU state is warmed with the same codes in the same call.
    const PromptRequest& base = prepared_.base;
    if (base.ref_frames > 0 && base.ref_codes.size() == size_t(base.ref_frames) * 16) {
        std::vector<float> discarded;
        discarded.reserve(size_t(base.ref_frames) * 1920);
        if (gpu_stream) gpu_stream->decode(base.ref_codes.data(), base.ref_frames, &discarded);
        else model_->decoder().decode(decoder_state_, base.ref_codes.data(), base.ref_frames, &discarded);
    }
}

bool Utterance::segment_start() {
    if (next_segment_ >= prepared_.segments.size()) return false;
    PromptRequest req = prepared_.base;
    req.input_ids = prepared_.segments[next_segment_];
    const Prompt prompt = prompt_build(model_->checkpoint().config, req);
    GenerationParams params = prepared_.params;
    if (prepared_.max_frames > 0) params.max_frames = int(std::max<int64_t>(1, prepared_.max_frames - frames_));
    // Each segment draws from its own counter range so segments do not repeat each other.
    generator_->start(prompt, params, prepared_.seed + 0x9E3779B97F4A7C15ull * next_segment_);
    ++next_segment_;
    generating_ = true;
    return true;
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

void Utterance::frames_decode(const std::vector<FrameCodes>& frames, std::vector<float>* pcm) {
    // Fused chunks: the generator decoded these frames already (in the same replay).
    if (generator_->decoder()) {
        const size_t before = pcm->size();
        generator_->audio_take(pcm);
        const size_t expected = frames.size() * size_t(model_->decoder().samples_per_frame());
        if (pcm->size() - before != expected)
            fail(ErrorCode::ERROR_INTERNAL, "the generator's decoder returned {} samples for {} frames",
                 pcm->size() - before, frames.size());
        return;
    }
    // Otherwise the CUDA backend decodes with its pooled GPU decoder state (unless the model was
    // loaded with gpu_decoder = false); the CPU backend with the CPU reference, as always.
    codes_flat_.resize(frames.size() * 16);
    for (size_t f = 0; f < frames.size(); ++f)
        std::copy(frames[f].begin(), frames[f].end(), codes_flat_.begin() + long(f) * 16);
    if (gpu_decoder_) gpu_decoder_->decode(codes_flat_.data(), int(frames.size()), pcm);
    else model_->decoder().decode(decoder_state_, codes_flat_.data(), int(frames.size()), pcm);
}

UtteranceStatus Utterance::chunk(int max_frames, std::vector<float>* pcm, std::vector<FrameCodes>* codes) {
    if (done_) return UtteranceStatus::UTTERANCE_DONE;
    frame_buf_.clear();
    bool waiting = false;
    while (int(frame_buf_.size()) < max_frames) {
        if (!generating_) {
            const bool started = prepared_.incremental ? (next_segment_ == 0 && incremental_start()) : segment_start();
            if (!started) {
                if (prepared_.incremental && next_segment_ == 0 && !text_closed_) {
                    waiting = true;
                } else {
                    done_ = true;
                    if (stop_reason_ == StopReason::STOP_NONE) stop_reason_ = StopReason::STOP_EOS;
                }
                break;
            }
        }
        FrameCodes frame{};
        const FrameStatus status = generator_->next_frame(frame);
        if (status == FrameStatus::FRAME_STATUS_FRAME) {
            frame_buf_.push_back(frame);
            ++frames_;
            continue;
        }
        if (status == FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT) {
            waiting = true;
            break;
        }
        // Segment finished.
        generating_ = false;
        stop_reason_ = generator_->stop_reason();
        const bool out_of_frames = prepared_.max_frames > 0 && frames_ >= prepared_.max_frames;
        if (prepared_.incremental || out_of_frames || next_segment_ >= prepared_.segments.size()) {
            if (out_of_frames) stop_reason_ = StopReason::STOP_MAX_FRAMES;
            done_ = true;
            break;
        }
    }
    if (!frame_buf_.empty()) {
        frames_decode(frame_buf_, pcm);
        if (codes) codes->insert(codes->end(), frame_buf_.begin(), frame_buf_.end());
        return UtteranceStatus::UTTERANCE_CHUNK;
    }
    if (done_) return UtteranceStatus::UTTERANCE_DONE;
    return waiting ? UtteranceStatus::UTTERANCE_WAITING_FOR_TEXT : UtteranceStatus::UTTERANCE_CHUNK;
}

}  // namespace qtts
