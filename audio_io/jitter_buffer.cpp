#include "audio_io/jitter_buffer.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#define QTTS_HAVE_MXCSR 1
#endif

#include "engine/common/error.h"

namespace qtts {

namespace {

constexpr size_t k_max_queued_stream_ends = 64;

// Flush-to-zero + denormals-are-zero while rendering: the fades multiply tiny values and a
// denormal slow path inside the callback can cost more than the whole buffer's budget.
// The previous mode is restored so a caller's thread (tests, the null sink) is left as it was.
class DenormalsOff {
public:
    DenormalsOff() noexcept {
#if defined(QTTS_HAVE_MXCSR)
        saved_ = _mm_getcsr();
        _mm_setcsr(saved_ | 0x8040u);  // FTZ (bit 15) | DAZ (bit 6)
#elif defined(__aarch64__)
        __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
        __asm__ __volatile__("msr fpcr, %0" ::"r"(saved_ | (uint64_t(1) << 24)));  // FZ
#endif
    }
    ~DenormalsOff() {
#if defined(QTTS_HAVE_MXCSR)
        _mm_setcsr(saved_);
#elif defined(__aarch64__)
        __asm__ __volatile__("msr fpcr, %0" ::"r"(saved_));
#endif
    }

private:
#if defined(QTTS_HAVE_MXCSR)
    unsigned saved_ = 0;
#elif defined(__aarch64__)
    uint64_t saved_ = 0;
#endif
};

// Single-writer counter update: a plain load + store is enough (and cheaper than fetch_add).
template <typename T>
void counter_add(std::atomic<T>& counter, T amount) noexcept {
    counter.store(counter.load(std::memory_order_relaxed) + amount, std::memory_order_relaxed);
}

}  // namespace

const char* jitter_state_name(JitterState state) {
    switch (state) {
        case JitterState::JITTER_IDLE: return "idle";
        case JitterState::JITTER_PREBUFFER: return "prebuffer";
        case JitterState::JITTER_PLAYING: return "playing";
        case JitterState::JITTER_UNDERRUN: return "underrun";
        case JitterState::JITTER_DRAINING: return "draining";
        case JitterState::JITTER_FLUSHING: return "flushing";
    }
    return "unknown";
}

JitterBuffer::JitterBuffer(const JitterBufferConfig& config)
    : config_(config), ring_(config.capacity_samples), marks_(k_max_queued_stream_ends) {
    if (config.sample_rate < 1000 || config.sample_rate > 768000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "jitter buffer sample rate must be in 1000..768000 Hz, got {}",
             config.sample_rate);
    if (config.chunk_samples == 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "jitter buffer chunk_samples must be positive");
    initial_watermark_ = config.start_watermark_samples ? config.start_watermark_samples : config.chunk_samples;
    max_watermark_ = config.max_watermark_samples ? config.max_watermark_samples : 8 * config.chunk_samples;
    max_watermark_ = std::max(max_watermark_, initial_watermark_);
    if (max_watermark_ > ring_.capacity())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "jitter buffer watermark ({} samples) does not fit its ring ({} samples); raise capacity_samples",
             max_watermark_, ring_.capacity());
    ramp_ = config.ramp_samples ? config.ramp_samples : std::max<size_t>(1, size_t(config.sample_rate) / 200);
    decay_after_ = config.watermark_decay_samples ? config.watermark_decay_samples : size_t(config.sample_rate) * 10;
    watermark_ = initial_watermark_;
    watermark_shared_.store(watermark_);
    ramp_in_pos_ = ramp_;
    ramp_out_pos_ = ramp_;
}

// ---------------------------------------------------------------------------------------------
// Producer side
// ---------------------------------------------------------------------------------------------

size_t JitterBuffer::push(const float* pcm, size_t n) {
    const size_t accepted = ring_.write(pcm, n);
    pushed_total_ += accepted;
    counter_add(samples_pushed_, uint64_t(accepted));
    return accepted;
}

void JitterBuffer::end_stream() {
    // The mark is published after the stream's samples (release), so a consumer that sees the mark
    // also sees every sample before it.
    if (marks_.write(&pushed_total_, 1) != 1)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "jitter buffer: {} ended streams are still waiting to be played; wait for finished() first",
             k_max_queued_stream_ends);
    streams_ended_.fetch_add(1, std::memory_order_release);
}

void JitterBuffer::set_first_sample_hook(FirstSampleHook hook, void* user) {
    first_sample_hook_ = hook;
    first_sample_user_ = user;
}

// ---------------------------------------------------------------------------------------------
// Any thread
// ---------------------------------------------------------------------------------------------

bool JitterBuffer::finished() const {
    const uint64_t ended = streams_ended_.load(std::memory_order_acquire);
    return ended > 0 && streams_finished_.load(std::memory_order_acquire) == ended;
}

JitterStats JitterBuffer::stats() const {
    JitterStats s;
    s.state = state();
    s.samples_pushed = samples_pushed_.load(std::memory_order_relaxed);
    s.samples_played = samples_played();
    s.underrun_events = underrun_events();
    s.underrun_samples = underrun_samples();
    s.streams_started = streams_started_.load(std::memory_order_relaxed);
    s.streams_ended = streams_ended_.load(std::memory_order_relaxed);
    s.streams_finished = streams_finished();
    s.renders = renders_.load(std::memory_order_relaxed);
    s.flushes = flushes_.load(std::memory_order_relaxed);
    s.samples_flushed = samples_flushed();
    s.start_watermark = start_watermark();
    s.buffered = buffered();
    s.first_sample_time = first_sample_time();
    return s;
}

// ---------------------------------------------------------------------------------------------
// Consumer side (the audio callback): no allocation, locks, logging or I/O below this line.
// ---------------------------------------------------------------------------------------------

void JitterBuffer::render_callback(void* user, float* out, size_t frames, double out_time) noexcept {
    static_cast<JitterBuffer*>(user)->render(out, frames, out_time);
}

// Samples of the current stream that can be read now. The ring is sampled BEFORE the end mark:
// if the ring already holds samples of the next stream, the mark that separates them was
// published earlier and is therefore visible, so the clamp below never lets one stream run into
// the next.
size_t JitterBuffer::readable_in_stream(bool* end_marked, uint64_t* end_position) noexcept {
    size_t readable = ring_.available_read();
    uint64_t end = 0;
    *end_marked = marks_.peek(&end, 1) == 1;
    if (*end_marked) {
        readable = std::min<size_t>(readable, size_t(end - consumed_total_));
        *end_position = end;
    }
    return readable;
}

void JitterBuffer::enter_state(JitterState next) noexcept {
    state_ = next;
    state_shared_.store(int(next), std::memory_order_relaxed);
}

void JitterBuffer::start_stream() noexcept {
    first_sample_pending_ = true;
    ramp_in_pos_ = ramp_;  // a fresh stream starts untouched: output equals input
    counter_add(streams_started_, uint64_t(1));
    enter_state(JitterState::JITTER_PREBUFFER);
}

void JitterBuffer::finish_stream() noexcept {
    marks_.discard(1);
    streams_finished_.fetch_add(1, std::memory_order_release);
    enter_state(JitterState::JITTER_IDLE);
}

void JitterBuffer::enter_underrun() noexcept {
    counter_add(underrun_events_, uint64_t(1));
    hold_value_ = last_output_;
    ramp_out_pos_ = 0;
    ramp_in_pos_ = ramp_;
    samples_since_underrun_ = 0;
    watermark_ = std::min(max_watermark_, watermark_ + config_.chunk_samples);
    watermark_shared_.store(watermark_, std::memory_order_relaxed);
    enter_state(JitterState::JITTER_UNDERRUN);
}

// A flush request seen by render(): fade out from wherever the output is and drop the stream.
// Nothing playing and nothing queued: there is no stream to drop, and the next one must play.
void JitterBuffer::flush_begin() noexcept {
    bool end_marked = false;
    uint64_t end_position = 0;
    const size_t readable = readable_in_stream(&end_marked, &end_position);
    if (state_ == JitterState::JITTER_IDLE && readable == 0 && !end_marked) return;
    counter_add(flushes_, uint64_t(1));
    hold_value_ = last_output_;
    ramp_out_pos_ = 0;
    first_sample_pending_ = false;
    enter_state(JitterState::JITTER_FLUSHING);
}

// Copies n ring samples to out (n must be readable), applying a running fade-in.
size_t JitterBuffer::play_from_ring(float* out, size_t n, size_t offset_in_buffer, double out_time) noexcept {
    if (n == 0) return 0;
    const size_t got = ring_.read(out, n);
    for (size_t i = 0; i < got && ramp_in_pos_ < ramp_; ++i, ++ramp_in_pos_) {
        out[i] *= float(ramp_in_pos_ + 1) / float(ramp_);
    }
    if (first_sample_pending_ && got > 0) {
        first_sample_pending_ = false;
        const double t = out_time + double(offset_in_buffer) / double(config_.sample_rate);
        first_sample_time_.store(t, std::memory_order_release);
        if (first_sample_hook_) first_sample_hook_(first_sample_user_, t);
    }
    consumed_total_ += got;
    counter_add(samples_played_, uint64_t(got));
    samples_since_underrun_ += got;
    if (watermark_ > initial_watermark_ && samples_since_underrun_ >= decay_after_) {
        // A long stretch without trouble: give back one chunk of latency.
        watermark_ = std::max(initial_watermark_, watermark_ - config_.chunk_samples);
        watermark_shared_.store(watermark_, std::memory_order_relaxed);
        samples_since_underrun_ = 0;
    }
    if (got > 0) last_output_ = out[got - 1];
    return got;
}

void JitterBuffer::render(float* out, size_t frames, double out_time) noexcept {
    DenormalsOff denormals_off;
    counter_add(renders_, uint64_t(1));
    const uint64_t flush_requests = flush_requests_.load(std::memory_order_acquire);
    if (flush_requests != flush_seen_) {
        flush_seen_ = flush_requests;  // several requests between two renders are one flush
        flush_begin();
    }
    size_t done = 0;
    // Each pass either writes samples or changes state; the state changes cannot cycle without
    // output (Idle -> Prebuffer -> Playing/Draining -> output), so the loop always terminates.
    while (done < frames) {
        const size_t want = frames - done;
        bool end_marked = false;
        uint64_t end_position = 0;
        const size_t readable = readable_in_stream(&end_marked, &end_position);

        switch (state_) {
            case JitterState::JITTER_IDLE: {
                if (readable > 0 || end_marked) {
                    start_stream();
                    continue;
                }
                std::memset(out + done, 0, want * sizeof(float));
                last_output_ = 0.0f;
                done = frames;
                break;
            }
            case JitterState::JITTER_PREBUFFER: {
                if (end_marked || readable >= watermark_) {
                    enter_state(end_marked ? JitterState::JITTER_DRAINING : JitterState::JITTER_PLAYING);
                    continue;
                }
                std::memset(out + done, 0, want * sizeof(float));
                last_output_ = 0.0f;
                done = frames;
                break;
            }
            case JitterState::JITTER_PLAYING: {
                if (end_marked) {
                    enter_state(JitterState::JITTER_DRAINING);
                    continue;
                }
                done += play_from_ring(out + done, std::min(want, readable), done, out_time);
                if (done < frames) enter_underrun();  // play what was left, then fade out
                break;
            }
            case JitterState::JITTER_DRAINING: {
                done += play_from_ring(out + done, std::min(want, readable), done, out_time);
                if (end_marked && consumed_total_ == end_position) {
                    finish_stream();
                } else if (done < frames) {
                    // Unreachable while producers follow the contract (samples before the mark);
                    // fill with silence rather than spin.
                    std::memset(out + done, 0, (frames - done) * sizeof(float));
                    done = frames;
                }
                break;
            }
            case JitterState::JITTER_FLUSHING: {
                // Drop what has arrived of the flushed stream (never past its end mark).
                const size_t dropped = ring_.discard(readable);
                consumed_total_ += dropped;
                counter_add(samples_flushed_, uint64_t(dropped));
                if (ramp_out_pos_ < ramp_) {
                    // The same bounded fade as an underrun's, so the cut does not click.
                    const size_t n = std::min(want, ramp_ - ramp_out_pos_);
                    for (size_t i = 0; i < n; ++i) {
                        ++ramp_out_pos_;
                        out[done + i] = hold_value_ * (1.0f - float(ramp_out_pos_) / float(ramp_));
                    }
                    last_output_ = out[done + n - 1];
                    done += n;
                    continue;
                }
                if (end_marked && consumed_total_ == end_position) {
                    finish_stream();  // -> Idle: a stream queued after the mark starts at once
                    continue;
                }
                std::memset(out + done, 0, want * sizeof(float));
                last_output_ = 0.0f;
                done = frames;
                break;
            }
            case JitterState::JITTER_UNDERRUN: {
                if (ramp_out_pos_ < ramp_) {
                    // Fade the held value to zero: bounded sample-to-sample steps, no click.
                    const size_t n = std::min(want, ramp_ - ramp_out_pos_);
                    for (size_t i = 0; i < n; ++i) {
                        ++ramp_out_pos_;
                        out[done + i] = hold_value_ * (1.0f - float(ramp_out_pos_) / float(ramp_));
                    }
                    last_output_ = out[done + n - 1];
                    counter_add(underrun_samples_, uint64_t(n));
                    done += n;
                    continue;
                }
                if (end_marked || readable >= watermark_) {
                    ramp_in_pos_ = 0;
                    enter_state(end_marked ? JitterState::JITTER_DRAINING : JitterState::JITTER_PLAYING);
                    continue;
                }
                std::memset(out + done, 0, want * sizeof(float));
                last_output_ = 0.0f;
                counter_add(underrun_samples_, uint64_t(want));
                done = frames;
                break;
            }
        }
    }
}

}  // namespace qtts
