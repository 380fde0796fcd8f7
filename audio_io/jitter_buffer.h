// The jitter buffer between the engine (producer: pushes PCM chunks as they are decoded) and the
// audio callback (consumer: render() fills every buffer the device asks for). It absorbs the
// irregular arrival of chunks and turns a late chunk into a short, click-free gap instead of a
// glitch, and it adapts: each underrun makes it wait for one more chunk before (re)starting.
//
// States (owned by the consumer; see docs/audio.md for the full table):
//   Idle       no stream; outputs silence. First data or an end mark -> Prebuffer.
//   Prebuffer  outputs silence until `start_watermark` samples are buffered (or the stream has
//              ended) -> Playing (or Draining). The first start plays the samples untouched.
//   Playing    copies buffered samples. Runs dry -> Underrun. Stream ended -> Draining.
//   Underrun   counts one event; holds the last output value and ramps it to 0 over `ramp`
//              samples; then silence (every synthesised sample counts as missing); raises the
//              watermark by one chunk (up to the max); once the watermark is buffered (or the
//              stream ended) -> Playing/Draining with a `ramp`-sample fade-in.
//   Draining   the producer marked the end: plays everything up to the mark, then -> Idle and the
//              stream counts as finished.
//   Flushing   flush() (barge-in) was seen at the start of a render: the last output value fades to
//              0 over `ramp` samples, then silence; every sample of the current stream is dropped
//              as it arrives, up to its end mark; the stream then counts as finished -> Idle, and
//              the next stream plays as usual. A flush that finds nothing playing or queued is
//              ignored.
//
// Real-time contract: render() never allocates, locks, blocks, logs or does I/O; it reads the
// ring with acquire loads and publishes counters with relaxed stores (single writer). It sets
// flush-to-zero / denormals-are-zero for its own duration.
//
// Threads: push()/end_stream()/available_write() from ONE producer thread; render() from ONE
// consumer thread (the audio callback); flush() and every getter from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "engine/common/spsc_ring.h"
#include "engine/api/qtts.h"

namespace qtts {

enum class JitterState : int {
    JITTER_IDLE = 0,
    JITTER_PREBUFFER,
    JITTER_PLAYING,
    JITTER_UNDERRUN,
    JITTER_DRAINING,
    JITTER_FLUSHING,
};

const char* jitter_state_name(JitterState state);

struct JitterBufferConfig {
    int sample_rate = SAMPLE_RATE;
    size_t capacity_samples = size_t(1) << 20;  // ring size, rounded up to a power of two (~44 s at 24 kHz)
    size_t chunk_samples = SAMPLES_PER_FRAME;              // one engine chunk (80 ms frame at 24 kHz); watermark step
    size_t start_watermark_samples = 0;          // initial start watermark; 0 = one chunk
    size_t max_watermark_samples = 0;            // bound for the raised watermark; 0 = 8 chunks
    size_t ramp_samples = 0;                     // fade length; 0 = 5 ms at sample_rate (120 at 24 kHz)
    size_t watermark_decay_samples = 0;          // underrun-free playback that lowers the watermark by
                                                 // one chunk; 0 = 10 s at sample_rate
};

// A snapshot of the counters (each field is read atomically; the set is not one instant).
struct JitterStats {
    JitterState state = JitterState::JITTER_IDLE;
    uint64_t samples_pushed = 0;     // accepted by push()
    uint64_t samples_played = 0;     // taken from the ring and output
    uint64_t underrun_events = 0;    // times the ring ran dry while a stream was playing
    uint64_t underrun_samples = 0;   // output samples synthesised during underruns (fade + silence)
    uint64_t streams_started = 0;
    uint64_t streams_ended = 0;      // end_stream() calls
    uint64_t streams_finished = 0;   // ended streams fully played out
    uint64_t renders = 0;            // render() calls
    uint64_t flushes = 0;            // flush() requests that found a stream to drop
    uint64_t samples_flushed = 0;    // samples dropped by them, never played
    size_t start_watermark = 0;      // current (possibly raised) start watermark, samples
    size_t buffered = 0;             // samples in the ring
    double first_sample_time = -1;   // out_time of the latest stream's first sample (-1: none yet)
};

class JitterBuffer {
public:
    // Called from render() (the audio thread!) when a stream's first sample is output; must be
    // real-time safe itself. `time` is render()'s out_time plus the sample's offset.
    using FirstSampleHook = void (*)(void* user, double time);

    explicit JitterBuffer(const JitterBufferConfig& config = JitterBufferConfig());

    JitterBuffer(const JitterBuffer&) = delete;
    JitterBuffer& operator=(const JitterBuffer&) = delete;

    // ---- producer thread ----
    // Queues up to n samples; returns how many fit (the rest must be pushed again later).
    size_t push(const float* pcm, size_t n);
    // Everything pushed so far is the whole stream: play it out even if below the watermark.
    // Samples pushed afterwards start a new stream. Throws if 64 ended streams are still queued.
    void end_stream();
    size_t available_write() const { return ring_.available_write(); }

    // ---- consumer thread (real-time safe) ----
    // Fills out[0..frames) completely. out_time: when out[0] reaches the DAC (any clock in
    // seconds, e.g. PortAudio's outputBufferDacTime); used only for the first-sample timestamp.
    void render(float* out, size_t frames, double out_time = 0.0) noexcept;
    // Plain-function adapter for AudioSink render sources: user is a JitterBuffer*.
    static void render_callback(void* user, float* out, size_t frames, double out_time) noexcept;

    // Set before playback starts (not while render() may run).
    void set_first_sample_hook(FirstSampleHook hook, void* user);

    // ---- any thread ----
    // Barge-in: drops the current stream. The next render() fades the output to silence within
    // `ramp` samples and from then on throws away every sample of that stream (what is buffered
    // and what the producer still pushes) up to its end mark; the producer must still call
    // end_stream() for it (stream_pump does). Streams after that mark play normally. One atomic
    // increment: no lock, no allocation, so any thread (even a callback) may call it.
    void flush() noexcept { flush_requests_.fetch_add(1, std::memory_order_release); }
    JitterState state() const { return JitterState(state_shared_.load(std::memory_order_relaxed)); }
    // True when at least one stream was ended and every ended stream has been played out.
    bool finished() const;
    uint64_t underrun_events() const { return underrun_events_.load(std::memory_order_relaxed); }
    uint64_t underrun_samples() const { return underrun_samples_.load(std::memory_order_relaxed); }
    uint64_t samples_played() const { return samples_played_.load(std::memory_order_relaxed); }
    uint64_t samples_flushed() const { return samples_flushed_.load(std::memory_order_relaxed); }
    uint64_t streams_finished() const { return streams_finished_.load(std::memory_order_acquire); }
    size_t start_watermark() const { return watermark_shared_.load(std::memory_order_relaxed); }
    double first_sample_time() const { return first_sample_time_.load(std::memory_order_acquire); }
    size_t buffered() const { return ring_.available_read(); }
    JitterStats stats() const;
    const JitterBufferConfig& config() const { return config_; }

private:
    // Consumer-side helpers (all real-time safe).
    size_t readable_in_stream(bool* end_marked, uint64_t* end_position) noexcept;
    size_t play_from_ring(float* out, size_t n, size_t offset_in_buffer, double out_time) noexcept;
    void enter_state(JitterState next) noexcept;
    void enter_underrun() noexcept;
    void start_stream() noexcept;
    void finish_stream() noexcept;
    void flush_begin() noexcept;

    JitterBufferConfig config_;
    size_t initial_watermark_ = 0;
    size_t max_watermark_ = 0;
    size_t ramp_ = 0;
    size_t decay_after_ = 0;

    SpscRing<float> ring_;        // [capacity] PCM of the current (and following) streams
    SpscRing<uint64_t> marks_;    // end positions (total samples pushed at end_stream())

    // Producer-only.
    uint64_t pushed_total_ = 0;

    // Consumer-only.
    JitterState state_ = JitterState::JITTER_IDLE;
    uint64_t consumed_total_ = 0;
    size_t watermark_ = 0;
    size_t ramp_in_pos_ = 0;       // == ramp_ when no fade-in is running
    size_t ramp_out_pos_ = 0;      // fade-out progress inside Underrun
    float hold_value_ = 0.0f;      // last output value, faded out on underrun
    float last_output_ = 0.0f;
    uint64_t samples_since_underrun_ = 0;
    bool first_sample_pending_ = false;
    uint64_t flush_seen_ = 0;      // flush requests already handled
    FirstSampleHook first_sample_hook_ = nullptr;
    void* first_sample_user_ = nullptr;

    // Shared counters: written by one side, read anywhere.
    std::atomic<int> state_shared_{0};
    std::atomic<size_t> watermark_shared_{0};
    std::atomic<uint64_t> samples_pushed_{0};
    std::atomic<uint64_t> streams_ended_{0};
    std::atomic<uint64_t> samples_played_{0};
    std::atomic<uint64_t> underrun_events_{0};
    std::atomic<uint64_t> underrun_samples_{0};
    std::atomic<uint64_t> streams_started_{0};
    std::atomic<uint64_t> streams_finished_{0};
    std::atomic<uint64_t> renders_{0};
    std::atomic<uint64_t> flushes_{0};
    std::atomic<uint64_t> samples_flushed_{0};
    std::atomic<uint64_t> flush_requests_{0};  // written by flush() (any thread), read by render()
    std::atomic<double> first_sample_time_{-1.0};
};

}  // namespace qtts
