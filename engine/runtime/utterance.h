// One utterance in flight: a PreparedSpeech (runtime/speech_model.h) turned into PCM chunks on
// the engine thread.
//
//   Utterance utt(model, std::move(prep));
//   while (utt.chunk(4, &pcm, &codes) != UtteranceStatus::UTTERANCE_DONE) { ... }
//
// Long text is split at sentence boundaries (text/text_split.h) and the segments are spoken
// back to back by one ChunkGenerator (generation/chunk_generator.h), whose decoder state carries
// across them, so the audio is one continuous stream. The utterance does not decode: it asks
// the backend for chunks (codes + PCM) and handles segments, incremental text and max_frames.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/runtime/speech_model.h"

namespace qtts {

enum class UtteranceStatus {
    UTTERANCE_CHUNK,             // frames were produced (pcm/codes appended)
    UTTERANCE_WAITING_FOR_TEXT,  // incremental text ran dry; append or close, then call again
    UTTERANCE_DONE,              // finished; see stop_reason()
    UTTERANCE_STARTING,          // sliced starts only: nothing made; start_advance() runs the due start
};

// One utterance in flight. Not thread-safe: the engine thread drives it (and, on CUDA, must be
// the model's GPU owner thread: it creates, drives and destroys the utterance).
class Utterance {
public:
    Utterance(std::shared_ptr<const SpeechModel> model, PreparedSpeech prepared);

    // Generates up to `frames` (>= 1) frames with their audio: appends frames × SAMPLES_PER_FRAME
    // samples to *pcm and the frames' codes to *codes (may be null). Exactly `frames` unless a
    // stop, dry incremental text, or a sentence boundary ends the chunk sooner (one backend call
    // per chunk, see chunk()). Returns UTTERANCE_CHUNK when at least one frame was made.
    UtteranceStatus chunk(int frames, std::vector<float>* pcm, std::vector<FrameCodes>* codes);
    // After a chunk made in a step whose decoder pass runs beside the next one
    // (SpeechModel::batch_run with defer_audio): the last audio_owed() frames of that chunk came
    // without their samples; audio_take() appends them (waiting for the pass if it still runs),
    // and must come before the next chunk().
    int audio_owed() const { return generator_ ? generator_->audio_owed() : 0; }
    void audio_take(std::vector<float>* pcm) { generator_->audio_take(pcm); }
    // Batched steps (SpeechModel::batch_run): this utterance's generator when its next chunk(frames)
    // continues the current segment for all `frames` frames (ChunkGenerator::batch_ready), else
    // null (between segments, done, or the backend does not batch).
    ChunkGenerator* batch_candidate(int frames);
    // Batched first chunks (the engine's newcomers): an utterance with complete text that has made
    // no frames starts its first segment now (the prompt prefill, alone) and returns
    // batch_candidate(frames), so that its first chunk can be made in a batched step with other
    // newcomers' and emitted by chunk(frames) as usual. Null when it has frames already, is
    // incremental (its text comes through the engine's service pass) or has no segment to start
    // (chunk() then ends it). Throws what the prefill throws.
    ChunkGenerator* first_candidate(int frames);
    // Batched starts (SpeechModel::batch_start): the start of this utterance's first segment when
    // first_candidate() would start one now (complete text, no frames, not started), for the
    // engine to run together with other newcomers' starts; nothing is started here. After the
    // backend started it, first_started() records it (first_candidate() then starts nothing).
    std::optional<GenerationStart> first_request() const;
    void first_started();

    // Sliced starts (the engine's EngineOptions::prefill_slice; docs/engine.md, "Sliced
    // starts"), on backends whose generator slices a prefill (ChunkGenerator::start_slices:
    // cpu-fast). With start_slice_set(n, r), n, r >= 1, a segment start whose prompt prefill has
    // more than n rows, or that still has more than r reference frames to decode (in-context
    // cloning: its first start decodes them), is not run by chunk(), first_request() or
    // first_candidate(): chunk() returns UTTERANCE_STARTING with nothing made, and each
    // start_advance() runs a piece of it between the engine's steps for other streams: r
    // reference frames while any are left, then n prompt rows (opening the start first: the
    // prompt is built and embedded). When start_pending() turns false the segment has started
    // (or is left to start whole, within one slice), exactly as chunk() would have started it.
    // (0, 0), the default, runs every start whole: an open one at the next start_advance().
    // Shorter starts and incremental utterances (whose text trails a short prompt) start whole,
    // through the usual calls.
    void start_slice_set(int rows, int ref_frames);
    // A start that start_advance() runs: open, or due with more than a slice's rows or
    // reference frames.
    bool start_pending() const;
    int start_advance();  // returns the prompt rows it ran (0 for reference frames); throws what the start throws
    int start_rows_left() const { return start_left_; }  // of the open start; 0 when none is open

    // Incremental text (prepared with incremental = true).
    void text_append(const std::string& text);
    void text_close();

    StopReason stop_reason() const { return stop_reason_; }
    int64_t frames() const { return frames_; }
    // True once the utterance has nothing left to make: chunk() returns UTTERANCE_DONE from its
    // next call on. Already true after the chunk that made the last frames (which chunk() reports
    // as UTTERANCE_CHUNK), so a caller can end the stream with that chunk instead of a call later.
    bool done() const { return done_; }

private:
    bool segment_start();              // starts the next complete segment; false when none is left
    void reference_flush(int frames);  // decodes up to `frames` more of the reference codes left
    GenerationStart segment_request() const;  // what segment_start() starts (a segment is left)
    void segment_started();                   // the segment segment_request() described has started
    bool incremental_start();          // starts the incremental utterance once text exists
    void incremental_commit(bool all);  // tokenizes pending text whose ids can no longer change

    std::shared_ptr<const SpeechModel> model_;  // first: outlives the generator (its decoder is the model's)
    PreparedSpeech prepared_;
    std::unique_ptr<ChunkGenerator> generator_;  // CPU or GPU, with its decoder: model_->generator_new()
    std::vector<FrameCodes> chunk_codes_;        // the codes of the chunk being made
    size_t next_segment_ = 0;
    bool generating_ = false;
    // Sliced starts: rows and reference frames per start_advance() (0: whole), the reference
    // frames and the open start's rows to go, and the prompt rows of the due segment's start
    // (-1: not counted yet).
    int slice_rows_ = 0;
    int slice_ref_ = 0;  // reference frames per start_advance()
    int ref_left_ = 0;   // in-context cloning: reference frames not decoded yet (slicing generators)
    int start_left_ = 0;  // > 0: a sliced start is open
    mutable int due_rows_ = -1;
    bool done_ = false;
    int64_t frames_ = 0;
    StopReason stop_reason_ = StopReason::STOP_NONE;

    // incremental text
    std::string pending_text_;            // NFC text not yet tokenized
    std::vector<int32_t> committed_ids_;  // tokenized, not yet handed to the generator
    bool text_closed_ = false;
    bool text_seen_ = false;              // some appended text was not whitespace
};

}  // namespace qtts
