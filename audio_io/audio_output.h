// Audio output: where rendered PCM goes. Every sink PULLS samples from a render source (normally
// a JitterBuffer) on its own clock:
//   - PortAudio sink: the device's callback (ALSA / JACK / OSS on Debian);
//   - NullAudioSink ("--audio-device null"): a thread that pulls at real-time pace and discards;
//   - VirtualAudioSink (tests): pulls odd or random block sizes, as fast as possible or at
//     real-time pace, and records everything.
//
// The render source is a plain function pointer + user pointer (no std::function: nothing on the
// audio thread may allocate). It must follow the real-time rules in docs/audio.md.
//
// Headless machines: PortAudio's ALSA host API can abort() inside Pa_Initialize when the machine
// has no sound devices at all. Every PortAudio entry point here first runs
// audio_probe_environment() and throws a clear qtts::Error instead of initialising PortAudio.
// ALSA's and JACK's own stderr messages are routed to the debug log.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts {

class JitterBuffer;

// Fills out[0..frames) completely; out_time is when out[0] is heard, on the sink's clock
// (AudioSink::time_now()). Called on the sink's audio thread.
using RenderFn = void (*)(void* user, float* out, size_t frames, double out_time);

struct RenderSource {
    RenderFn fn = nullptr;
    void* user = nullptr;
};

// The usual source: jitter.render().
RenderSource render_source(JitterBuffer& jitter);

// ---------------------------------------------------------------------------------------------
// Devices and the headless guard
// ---------------------------------------------------------------------------------------------

struct AudioEnvironment {
    bool output_possible = false;
    std::string evidence;  // what was found (or, when headless, what was looked for)
};

// Looks for anything PortAudio could play through without touching PortAudio: ALSA playback
// devices (/dev/snd/pcmC*D*p), a PulseAudio/PipeWire server socket (reached through ALSA's
// pulse plugin), a JACK server, OSS /dev/dsp. QTTS_AUDIO_PROBE=headless forces "none found",
// QTTS_AUDIO_PROBE=force skips the checks (for setups the probe does not know).
AudioEnvironment audio_probe_environment();

// Throws qtts::Error (ERROR_NOT_FOUND) with the user-facing message when no output is possible.
void audio_require_output_environment();

// The message thrown on headless machines.
extern const char* const k_audio_no_device_message;

struct AudioDeviceInfo {
    int index = -1;
    std::string name;
    std::string host_api;
    int max_output_channels = 0;
    double default_sample_rate = 0;
    double default_low_latency_s = 0;
    double default_high_latency_s = 0;
    bool is_default = false;
};

// Output-capable PortAudio devices. Throws the headless error (see above) instead of aborting.
std::vector<AudioDeviceInfo> audio_list_devices();

// ---------------------------------------------------------------------------------------------
// Sinks
// ---------------------------------------------------------------------------------------------

class AudioSink {
public:
    virtual ~AudioSink() = default;
    virtual void start() = 0;  // begins pulling from the render source
    virtual void stop() = 0;   // stops pulling; returns when the source will not be called again
    virtual bool is_running() const = 0;
    virtual int sample_rate() const = 0;
    virtual double output_latency_s() const = 0;  // as reported by the device after opening
    virtual double time_now() const = 0;          // the clock that out_time uses, in seconds
    virtual std::string describe() const = 0;
};

struct AudioSinkConfig {
    std::string device;               // "" or "default", "null", a PortAudio index, or part of a name
    int sample_rate = SAMPLE_RATE;
    int channels = 0;                 // 0: mono if the device accepts it, else stereo (mono copied)
    double suggested_latency_s = 0;   // 0: the device's defaultLowOutputLatency
    size_t null_block_frames = 480;   // NullAudioSink block (20 ms at 24 kHz)
};

// Opens the sink named by config.device ("null" never touches PortAudio).
std::unique_ptr<AudioSink> audio_sink_open(const AudioSinkConfig& config, RenderSource source);

// Pulls block_frames every block_frames / sample_rate seconds from its own thread (sleep_until on
// the steady clock, so the pace does not drift) and throws the audio away.
class NullAudioSink : public AudioSink {
public:
    NullAudioSink(RenderSource source, int sample_rate = SAMPLE_RATE, size_t block_frames = 480);
    ~NullAudioSink() override;
    void start() override;
    void stop() override;
    bool is_running() const override { return running_.load(std::memory_order_acquire); }
    int sample_rate() const override { return sample_rate_; }
    double output_latency_s() const override { return double(block_frames_) / sample_rate_; }
    double time_now() const override;
    std::string describe() const override;
    uint64_t frames_pulled() const { return frames_pulled_.load(std::memory_order_relaxed); }

private:
    void run() noexcept;

    RenderSource source_;
    int sample_rate_;
    size_t block_frames_;
    std::unique_ptr<float[]> block_;  // [block_frames]
    std::atomic<bool> running_{false};
    std::atomic<uint64_t> frames_pulled_{0};
    int64_t clock_origin_ns_ = 0;     // steady-clock origin of time_now()
    std::thread thread_;
};

struct VirtualSinkConfig {
    int sample_rate = SAMPLE_RATE;
    std::vector<size_t> block_sizes = {441};  // pulled in turn (cycled) unless random_max > 0
    size_t random_min = 1;                     // random block sizes in [random_min, random_max]
    size_t random_max = 0;
    uint64_t seed = 1;
    bool realtime = false;                     // thread mode: pace pulls like a device would
    size_t record_capacity = size_t(SAMPLE_RATE) * 120;      // pre-allocated; samples beyond it are counted, not kept
};

// Test sink. pull() runs synchronously on the caller's thread; start()/stop() run the same loop on
// a thread. Its clock is the sample counter: out_time of a block = frames pulled before it /
// sample_rate, so first-sample timestamps are exact in tests.
class VirtualAudioSink : public AudioSink {
public:
    VirtualAudioSink(const VirtualSinkConfig& config, RenderSource source);
    ~VirtualAudioSink() override;

    // Pulls whole blocks until at least `frames` more frames were pulled; returns how many.
    // Real-time safe (no allocation): the recording buffer is allocated up front.
    size_t pull(size_t frames);
    size_t pull_block();

    void start() override;
    void stop() override;
    bool is_running() const override { return running_.load(std::memory_order_acquire); }
    int sample_rate() const override { return config_.sample_rate; }
    double output_latency_s() const override { return 0.0; }
    double time_now() const override;
    std::string describe() const override;

    // Everything pulled so far (up to record_capacity). Read it while the thread is stopped.
    std::vector<float> recorded() const;
    uint64_t frames_pulled() const { return frames_pulled_.load(std::memory_order_acquire); }
    uint64_t blocks_pulled() const { return blocks_pulled_.load(std::memory_order_relaxed); }
    uint64_t frames_not_recorded() const { return frames_not_recorded_; }

private:
    size_t next_block_size() noexcept;
    void run() noexcept;

    VirtualSinkConfig config_;
    RenderSource source_;
    size_t block_max_ = 0;
    std::unique_ptr<float[]> block_;     // [block_max]
    std::unique_ptr<float[]> record_;    // [record_capacity]
    size_t recorded_ = 0;
    uint64_t frames_not_recorded_ = 0;
    size_t block_cursor_ = 0;
    uint64_t rng_state_ = 0;
    std::atomic<uint64_t> frames_pulled_{0};
    std::atomic<uint64_t> blocks_pulled_{0};
    std::atomic<bool> running_{false};
    std::thread thread_;
};

}  // namespace qtts
