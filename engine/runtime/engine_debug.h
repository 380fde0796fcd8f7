// Debug and test seams of the engine (not part of the application API, engine/api/qtts.h): requests
// given as token ids or raw token syntax (qtts say --input-ids/--instruct-ids/--raw-tokens, tests),
// and fault injection into the engine thread, so tests can check that one stream's failure ends
// that stream alone, and that a pool routes around an engine whose backend is lost. Servers
// never use this header.
//
// Thread safety: as Engine::submit (any thread).
#pragma once

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

// The next chunk of stream `stream_id` fails on the engine thread as a backend call would
// (CUDA: a real failed runtime call, ERROR_CUDA; CPU: ERROR_INTERNAL). The stream ends with
// STOP_ERROR and its error; the engine recovers the backend and keeps serving the others.
void engine_fault_inject(Engine& engine, uint64_t stream_id);

// The engine's backend fails for good at the engine thread's next round, as after a sticky CUDA
// error (an illegal address, a lost device): it raises the injected fault and is treated as not
// recoverable, so every stream of the engine ends with STOP_ERROR, Engine::healthy() turns false
// and submit refuses (ERROR_CUDA). Works with or without running streams, on either backend.
void engine_fault_inject_fatal(Engine& engine);

}  // namespace qtts
