#include "audio_io/stream_player.h"

#include <chrono>
#include <thread>
#include <vector>

#include "audio_io/jitter_buffer.h"
#include "engine/api/qtts.h"

namespace qtts {

namespace {

bool stop_requested(const std::atomic<bool>* stop) { return stop && stop->load(std::memory_order_acquire); }

// Pushes all n samples, waiting for the callback to free room; false when stopped first.
bool jitter_push_all(JitterBuffer& jitter, const float* pcm, size_t n, const std::atomic<bool>* stop) {
    size_t pushed = 0;
    while (pushed < n) {
        pushed += jitter.push(pcm + pushed, n - pushed);
        if (pushed == n) break;
        if (stop_requested(stop)) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));  // ~1/16 of a chunk
    }
    return true;
}

}  // namespace

StreamPumpResult stream_pump(Stream& stream, JitterBuffer* jitter, const StreamPumpOptions& options) {
    StreamPumpResult result;
    std::vector<float> block(options.read_block > 0 ? options.read_block : 4800);
    while (!stream.finished()) {
        if (stop_requested(options.stop)) {
            result.stopped = true;
            break;
        }
        const size_t n = stream.read(block.data(), block.size());
        if (n == 0) {
            stream.wait(std::chrono::milliseconds(20));
            continue;
        }
        if (options.tee) options.tee(block.data(), n);
        if (jitter && !jitter_push_all(*jitter, block.data(), n, options.stop)) {
            result.stopped = true;
            break;
        }
        result.samples += n;
    }
    if (result.stopped) {
        stream.discard();
        if (jitter) jitter->flush();  // drops this stream up to the end mark pushed next
    }
    if (jitter) jitter->end_stream();
    return result;
}

bool playback_wait(const JitterBuffer& jitter, double timeout_s, const std::atomic<bool>* stop) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!jitter.finished()) {
        if (stop_requested(stop) || std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
}

}  // namespace qtts
