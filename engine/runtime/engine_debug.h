// Debug and test seams of the engine (not part of the application API, engine/api/qtts.h): requests
// given as token ids or raw token syntax (qtts say --input-ids/--instruct-ids/--raw-tokens, tests),
// and fault injection into the engine thread, so tests can check that one stream's failure ends
// that stream alone, and that a pool routes around an engine whose backend is lost. Servers
// never use this header.
//
// Thread safety: as Engine::submit (any thread).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts {

// What a debugging request adds to a SpeechRequest.
struct SpeechRequestDebug {
    std::vector<int32_t> input_ids;     // assistant-template ids: spoken instead of `text` (skips the tokenizer)
    std::vector<int32_t> instruct_ids;  // instruct-template ids: used instead of `instruct`
    // Special-token strings in text and instruct ("<|im_end|>", "<tts_pad>", ...) become control
    // tokens. Off (and always in SpeechRequest): they are read as plain text.
    bool raw_tokens = false;
};

// Engine::submit with the debugging inputs: validated the same way (ids are checked against the
// template and the vocabulary), throws qtts::Error for a bad request.
std::shared_ptr<Stream> engine_submit_debug(Engine& engine, const SpeechRequest& request, const SpeechRequestDebug& debug);

// The next chunk of stream `stream_id`, or the next slice of its start (sliced starts,
// EngineOptions::prefill_slice), fails on the engine thread as a backend call would
// (CUDA: a real failed runtime call, ERROR_CUDA; CPU: ERROR_INTERNAL). The stream ends with
// STOP_ERROR and its error; the engine recovers the backend and keeps serving the others.
void engine_fault_inject(Engine& engine, uint64_t stream_id);

// The engine's backend fails for good at the engine thread's next round, as after a sticky CUDA
// error (an illegal address, a lost device): it raises the injected fault and is treated as not
// recoverable, so every stream of the engine ends with STOP_ERROR, Engine::healthy() turns false
// and submit refuses (ERROR_CUDA). Works with or without running streams, on either backend.
void engine_fault_inject_fatal(Engine& engine);

// A slow backend, for admission tests: after each chunk that made audio the engine thread sleeps
// `delay` (0 = off), so the engine's measured capacity drops as a slower device's would.
void engine_chunk_delay_set(Engine& engine, std::chrono::microseconds delay);

// The order in which the engine thread served streams: from engine_trace_start on, one entry per
// chunk that made audio, in the order made, up to `capacity` entries (later ones are dropped);
// engine_trace_take returns them and clears the list. Off until started.
struct EngineTraceEntry {
    uint64_t round = 0;      // the engine round that made it
    uint64_t stream_id = 0;
    int32_t frames = 0;
    bool batched = false;    // its frames were made in a batched step (CUDA, cpu-fast) with other streams'
    bool ended = false;      // the stream ended with this chunk (its last frames)
    int32_t step_frames = 0; // frames of the batched step that made it (>= frames; 0: not batched)
};
void engine_trace_start(Engine& engine, size_t capacity);
std::vector<EngineTraceEntry> engine_trace_take(Engine& engine);

}  // namespace qtts
