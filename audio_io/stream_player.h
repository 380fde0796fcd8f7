// The consumer side of live playback: moves one engine stream's PCM into the jitter buffer that
// an audio sink drains (engine thread -> stream ring -> this pump -> jitter buffer -> callback),
// optionally handing every sample to a second consumer (a WAV file) on the way.
//
// The pump runs on the caller's thread (never the audio thread); it blocks on the stream and, when
// the jitter buffer is full, waits for the callback to make room. It always ends the jitter stream.
//
// Stopping is a barge-in: when `stop` is set the pump discards the stream (generation stops within
// a chunk, its unread audio is dropped) and flushes the jitter buffer, so the sink fades to silence
// at its next period instead of playing out what was queued. For the quickest cut, the thread
// that sets `stop` calls jitter.flush() itself (any thread may): the pump notices `stop` only
// between its reads (<= 20 ms).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace qtts {

class JitterBuffer;
class Stream;

struct StreamPumpOptions {
    size_t read_block = 4800;                        // samples per read from the stream (200 ms)
    std::function<void(const float*, size_t)> tee;   // also gets every sample, in order (may be empty)
    const std::atomic<bool>* stop = nullptr;         // set from another thread to stop early (barge-in)
};

struct StreamPumpResult {
    uint64_t samples = 0;  // samples read from the stream and queued for playback
    bool stopped = false;  // ended by `stop` (the stream was discarded, the jitter buffer flushed)
};

// Pumps until the stream is finished (or stopped), then calls jitter->end_stream(). Does not wait
// for the audio to be played: see playback_wait(). jitter may be null (no playback: the samples
// only go to options.tee, e.g. a WAV file).
StreamPumpResult stream_pump(Stream& stream, JitterBuffer* jitter, const StreamPumpOptions& options = {});

// Waits until the jitter buffer has played everything it was given (true), or `stop` is set /
// the timeout passes (false).
bool playback_wait(const JitterBuffer& jitter, double timeout_s, const std::atomic<bool>* stop = nullptr);

}  // namespace qtts
