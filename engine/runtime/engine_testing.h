// Test seams of the engine (not part of the application API): fault injection into the engine
// thread, so tests can check that one stream's failure ends that stream alone.
#pragma once

#include <cstdint>

#include "engine/api/qtts.h"

namespace qtts {

// The next chunk of stream `stream_id` fails on the engine thread as a backend call would
// (CUDA: a real failed runtime call, ERROR_CUDA; CPU: ERROR_INTERNAL). The stream ends with
// STOP_ERROR and its error; the engine recovers the backend and keeps serving the others.
void engine_fault_inject(Engine& engine, uint64_t stream_id);

}  // namespace qtts
