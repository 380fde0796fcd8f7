#include "audio_io/audio_output.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>

#include <unistd.h>

#include "audio_io/jitter_buffer.h"
#include "audio_io/portaudio_sink.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/strings.h"

namespace qtts {

const char* const k_audio_no_device_message =
    "no audio output device found; use --audio-device null to discard audio, or -o file.wav";

RenderSource render_source(JitterBuffer& jitter) {
    RenderSource source;
    source.fn = &JitterBuffer::render_callback;
    source.user = &jitter;
    return source;
}

// ---------------------------------------------------------------------------------------------
// Headless probe
// ---------------------------------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

bool path_exists(const std::string& path) {
    std::error_code ec;
    return fs::exists(path, ec);
}

// First entry of `folder` whose name starts with `prefix` and ends with `suffix`, or "".
std::string find_entry(const std::string& folder, const std::string& prefix, const std::string& suffix) {
    std::error_code ec;
    fs::directory_iterator it(folder, ec);
    if (ec) return "";
    for (; it != fs::directory_iterator(); it.increment(ec)) {
        if (ec) break;
        const std::string name = it->path().filename().string();
        if (name.size() >= prefix.size() + suffix.size() && name.compare(0, prefix.size(), prefix) == 0 &&
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
            return it->path().string();
        }
    }
    return "";
}

std::string env_or_empty(const char* name) {
    const char* value = std::getenv(name);
    return value ? value : "";
}

}  // namespace

AudioEnvironment audio_probe_environment() {
    AudioEnvironment env;
    const std::string override_mode = env_or_empty("QTTS_AUDIO_PROBE");
    if (override_mode == "headless") {
        env.evidence = "QTTS_AUDIO_PROBE=headless";
        return env;
    }
    if (override_mode == "force") {
        env.output_possible = true;
        env.evidence = "QTTS_AUDIO_PROBE=force (checks skipped)";
        return env;
    }

    // 1. ALSA playback devices: /dev/snd/pcmC<card>D<device>p.
    if (std::string pcm = find_entry("/dev/snd", "pcmC", "p"); !pcm.empty()) {
        env.output_possible = true;
        env.evidence = "ALSA playback device " + pcm;
        return env;
    }
    // 2. A PulseAudio or PipeWire server (ALSA reaches it through its pulse plugin).
    if (std::string server = env_or_empty("PULSE_SERVER"); !server.empty()) {
        env.output_possible = true;
        env.evidence = "PULSE_SERVER=" + server;
        return env;
    }
    std::string runtime_dir = env_or_empty("XDG_RUNTIME_DIR");
    if (runtime_dir.empty()) runtime_dir = "/run/user/" + std::to_string(::getuid());
    for (const std::string& socket : {runtime_dir + "/pulse/native", runtime_dir + "/pipewire-0",
                                      std::string("/run/pulse/native"), std::string("/var/run/pulse/native")}) {
        if (path_exists(socket)) {
            env.output_possible = true;
            env.evidence = "sound server socket " + socket;
            return env;
        }
    }
    // 3. A JACK server (jack2 keeps its sockets in /dev/shm, jack1 in /tmp/jack-<uid>).
    if (std::string jack = find_entry("/dev/shm", "jack", ""); !jack.empty()) {
        env.output_possible = true;
        env.evidence = "JACK server " + jack;
        return env;
    }
    if (std::string jack = "/tmp/jack-" + std::to_string(::getuid()); path_exists(jack)) {
        env.output_possible = true;
        env.evidence = "JACK server " + jack;
        return env;
    }
    // 4. OSS.
    if (path_exists("/dev/dsp")) {
        env.output_possible = true;
        env.evidence = "OSS device /dev/dsp";
        return env;
    }
    env.evidence =
        "no ALSA playback device in /dev/snd, no PulseAudio/PipeWire socket (PULSE_SERVER, " + runtime_dir +
        "/pulse/native, " + runtime_dir + "/pipewire-0, /run/pulse/native), no JACK server, no /dev/dsp";
    return env;
}

void audio_require_output_environment() {
    const AudioEnvironment env = audio_probe_environment();
    QTTS_LOG_DEBUG("audio probe: {}", env.evidence);
    if (!env.output_possible) fail(ErrorCode::ERROR_NOT_FOUND, "{}", k_audio_no_device_message);
}

// ---------------------------------------------------------------------------------------------
// Opening a sink
// ---------------------------------------------------------------------------------------------

namespace {

int64_t steady_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

#ifndef QTTS_HAVE_PORTAUDIO
[[noreturn]] void no_portaudio(const char* what) {
    fail(ErrorCode::ERROR_UNSUPPORTED,
         "{}: this qtts was built without PortAudio (CMake QTTS_WITH_PORTAUDIO=OFF); use --audio-device null "
         "to discard audio, or -o file.wav",
         what);
}
#endif

}  // namespace

std::vector<AudioDeviceInfo> audio_list_devices() {
#ifdef QTTS_HAVE_PORTAUDIO
    return portaudio_list_devices();
#else
    no_portaudio("listing audio devices");
#endif
}

std::unique_ptr<AudioSink> audio_sink_open(const AudioSinkConfig& config, RenderSource source) {
    if (!source.fn) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "audio sink needs a render source");
    if (config.sample_rate < 1000 || config.sample_rate > 768000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "audio sample rate must be in 1000..768000 Hz, got {}",
             config.sample_rate);
    if (ascii_lower(config.device) == "null")
        return std::make_unique<NullAudioSink>(source, config.sample_rate, config.null_block_frames);
#ifdef QTTS_HAVE_PORTAUDIO
    return portaudio_sink_open(config, source);
#else
    no_portaudio("opening an audio device");
#endif
}

// ---------------------------------------------------------------------------------------------
// Null sink
// ---------------------------------------------------------------------------------------------

NullAudioSink::NullAudioSink(RenderSource source, int sample_rate, size_t block_frames)
    : source_(source), sample_rate_(sample_rate), block_frames_(block_frames) {
    if (!source.fn) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "null audio sink needs a render source");
    if (sample_rate < 1000 || sample_rate > 768000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "null audio sink sample rate must be in 1000..768000 Hz, got {}",
             sample_rate);
    if (block_frames == 0 || block_frames > size_t(sample_rate))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "null audio sink block must be 1..{} frames, got {}", sample_rate,
             block_frames);
    block_.reset(new float[block_frames]());
    clock_origin_ns_ = steady_now_ns();
}

NullAudioSink::~NullAudioSink() { stop(); }

void NullAudioSink::start() {
    if (running_.exchange(true)) return;
    thread_ = std::thread([this] { run(); });
}

void NullAudioSink::stop() {
    running_.store(false, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
}

double NullAudioSink::time_now() const { return double(steady_now_ns() - clock_origin_ns_) * 1e-9; }

std::string NullAudioSink::describe() const {
    return fmt::format("null device ({} Hz, {}-frame blocks at real-time pace)", sample_rate_, block_frames_);
}

void NullAudioSink::run() noexcept {
    using clock = std::chrono::steady_clock;
    // Block k is due at start + k * block / rate; computing each deadline from the frame count
    // (rather than adding a rounded period) keeps the pace exact over hours.
    // If the thread was held up for longer than k_max_lag_ns (machine suspended, debugger), the
    // origin moves forward instead of pulling a burst of blocks to catch up, as a device would.
    constexpr int64_t k_max_lag_ns = 250'000'000;
    int64_t start_ns = steady_now_ns();
    uint64_t frames = 0;
    while (running_.load(std::memory_order_acquire)) {
        const double out_time = double(start_ns - clock_origin_ns_) * 1e-9 + double(frames) / sample_rate_;
        source_.fn(source_.user, block_.get(), block_frames_, out_time);
        frames += block_frames_;
        frames_pulled_.store(frames, std::memory_order_relaxed);
        const int64_t due_ns = start_ns + int64_t(double(frames) * 1e9 / sample_rate_);
        const int64_t lag_ns = steady_now_ns() - due_ns;
        if (lag_ns > k_max_lag_ns) {
            start_ns += lag_ns;
            continue;
        }
        std::this_thread::sleep_until(clock::time_point(std::chrono::nanoseconds(due_ns)));
    }
}

// ---------------------------------------------------------------------------------------------
// Virtual sink
// ---------------------------------------------------------------------------------------------

VirtualAudioSink::VirtualAudioSink(const VirtualSinkConfig& config, RenderSource source)
    : config_(config), source_(source) {
    if (!source.fn) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "virtual audio sink needs a render source");
    if (config.sample_rate < 1000 || config.sample_rate > 768000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "virtual audio sink sample rate must be in 1000..768000 Hz, got {}",
             config.sample_rate);
    if (config.random_max > 0) {
        if (config.random_min == 0 || config.random_min > config.random_max)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "virtual audio sink random block range [{}, {}] is invalid",
                 config.random_min, config.random_max);
        block_max_ = config.random_max;
    } else {
        if (config.block_sizes.empty())
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "virtual audio sink needs at least one block size");
        for (size_t b : config.block_sizes) {
            if (b == 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "virtual audio sink block sizes must be positive");
            block_max_ = std::max(block_max_, b);
        }
    }
    block_.reset(new float[block_max_]());
    record_.reset(new float[std::max<size_t>(config.record_capacity, 1)]());  // zero-filled: pre-touched
    rng_state_ = config.seed ? config.seed : 0x9E3779B97F4A7C15ull;
}

VirtualAudioSink::~VirtualAudioSink() { stop(); }

size_t VirtualAudioSink::next_block_size() noexcept {
    if (config_.random_max == 0) {
        const size_t size = config_.block_sizes[block_cursor_];
        block_cursor_ = (block_cursor_ + 1) % config_.block_sizes.size();
        return size;
    }
    // xorshift64*: cheap, allocation-free, reproducible from the seed.
    rng_state_ ^= rng_state_ >> 12;
    rng_state_ ^= rng_state_ << 25;
    rng_state_ ^= rng_state_ >> 27;
    const uint64_t r = rng_state_ * 0x2545F4914F6CDD1Dull;
    return config_.random_min + size_t(r % (config_.random_max - config_.random_min + 1));
}

size_t VirtualAudioSink::pull_block() {
    const size_t n = next_block_size();
    const uint64_t before = frames_pulled_.load(std::memory_order_relaxed);
    source_.fn(source_.user, block_.get(), n, double(before) / config_.sample_rate);
    const size_t keep = std::min(n, config_.record_capacity - recorded_);
    std::memcpy(record_.get() + recorded_, block_.get(), keep * sizeof(float));
    recorded_ += keep;
    frames_not_recorded_ += n - keep;
    frames_pulled_.store(before + n, std::memory_order_release);
    blocks_pulled_.store(blocks_pulled_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    return n;
}

size_t VirtualAudioSink::pull(size_t frames) {
    size_t pulled = 0;
    while (pulled < frames) pulled += pull_block();
    return pulled;
}

void VirtualAudioSink::start() {
    if (running_.exchange(true)) return;
    thread_ = std::thread([this] { run(); });
}

void VirtualAudioSink::stop() {
    running_.store(false, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
}

double VirtualAudioSink::time_now() const { return double(frames_pulled()) / config_.sample_rate; }

std::string VirtualAudioSink::describe() const {
    return config_.random_max > 0
               ? fmt::format("virtual device (random blocks {}..{})", config_.random_min, config_.random_max)
               : fmt::format("virtual device ({} block size(s))", config_.block_sizes.size());
}

std::vector<float> VirtualAudioSink::recorded() const {
    return std::vector<float>(record_.get(), record_.get() + recorded_);
}

void VirtualAudioSink::run() noexcept {
    const int64_t start_ns = steady_now_ns();
    while (running_.load(std::memory_order_acquire)) {
        pull_block();
        if (config_.realtime) {
            const int64_t due_ns =
                start_ns + int64_t(double(frames_pulled_.load(std::memory_order_relaxed)) * 1e9 / config_.sample_rate);
            std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(due_ns)));
        } else {
            std::this_thread::yield();  // as fast as possible, but let a producer on the same core run
        }
    }
}

}  // namespace qtts
