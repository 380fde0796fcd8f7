// One utterance in flight: a PreparedSpeech (runtime/speech_model.h) turned into PCM chunks on
// the engine thread.
//
//   Utterance utt(model, std::move(prep));
//   while (utt.chunk(4, &pcm, &codes) != UtteranceStatus::UTTERANCE_DONE) { ... }
//
// Long text is split at sentence boundaries (text/text_split.h) and the segments are spoken
// back to back with one decoder state, so the audio is one continuous stream.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/speech_model.h"

namespace qtts {

enum class UtteranceStatus {
    UTTERANCE_CHUNK,             // frames were produced (pcm/codes appended)
    UTTERANCE_WAITING_FOR_TEXT,  // incremental text ran dry; append or close, then call again
    UTTERANCE_DONE,              // finished; see stop_reason()
};

// One utterance in flight. Not thread-safe: the engine thread drives it (and, on CUDA, must be
// the model's GPU owner thread: it creates, drives and destroys the utterance).
class Utterance {
public:
    Utterance(std::shared_ptr<const SpeechModel> model, PreparedSpeech prepared);

    // Generates up to max_frames frames, decodes them, appends frames × 1920 samples to pcm
    // and the frames' codes to codes. Returns UTTERANCE_CHUNK when at least one frame was made.
    UtteranceStatus chunk(int max_frames, std::vector<float>* pcm, std::vector<FrameCodes>* codes);

    // Incremental text (prepared with incremental = true).
    void text_append(const std::string& text);
    void text_close();

    StopReason stop_reason() const { return stop_reason_; }
    int64_t frames() const { return frames_; }

private:
    bool segment_start();              // starts the next complete segment; false when none is left
    bool incremental_start();          // starts the incremental utterance once text exists
    void incremental_commit(bool all);  // tokenizes pending text whose ids can no longer change
    // Codes -> PCM for one chunk: the GPU decoder stream when the model has one, else the CPU.
    void frames_decode(const std::vector<FrameCodes>& frames, std::vector<float>* pcm);

    std::shared_ptr<const SpeechModel> model_;
    PreparedSpeech prepared_;
    std::unique_ptr<FrameGenerator> generator_;  // CPU or GPU, from model_->generator_new()
    std::unique_ptr<DecoderStream> gpu_decoder_;  // CUDA decoder lease (model_->decoder_stream_new()), unless
                                                  // the generator decodes its own frames
    cpu::DecoderState decoder_state_;             // CPU decoder (empty when gpu_decoder_ is set)
    std::vector<int32_t> codes_flat_;             // [frames, 16] of the chunk being decoded
    size_t next_segment_ = 0;
    bool generating_ = false;
    bool done_ = false;
    int64_t frames_ = 0;
    StopReason stop_reason_ = StopReason::STOP_NONE;

    // incremental text
    std::string pending_text_;            // NFC text not yet tokenized
    std::vector<int32_t> committed_ids_;  // tokenized, not yet handed to the generator
    bool text_closed_ = false;
    bool text_seen_ = false;              // some appended text was not whitespace
    std::vector<FrameCodes> frame_buf_;
};

}  // namespace qtts
