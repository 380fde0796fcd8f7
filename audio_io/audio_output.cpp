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

#include <dlfcn.h>
#include <portaudio.h>
#include <unistd.h>

#include "audio_io/jitter_buffer.h"
#include "engine/common/error.h"
#include "engine/common/log.h"

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
// PortAudio session: headless guard, backend noise routed to the debug log, init/terminate.
// ---------------------------------------------------------------------------------------------

namespace {

// Backend messages are only forwarded while we are inside set-up code on a normal thread. ALSA
// can also report from PortAudio's audio thread during playback; there they are dropped, because
// logging allocates and locks.
std::atomic<bool> g_backend_messages_to_log{false};

void alsa_message_handler(const char* file, int line, const char* function, int err, const char* fmt, ...) {
    if (!g_backend_messages_to_log.load(std::memory_order_relaxed) || !fmt) return;
    char text[512];
    va_list args;
    va_start(args, fmt);
    std::vsnprintf(text, sizeof(text), fmt, args);
    va_end(args);
    QTTS_LOG_DEBUG("alsa: {} ({}:{} {}, err {})", text, file ? file : "?", line, function ? function : "?", err);
}

void jack_message_handler(const char* message) {
    if (!g_backend_messages_to_log.load(std::memory_order_relaxed) || !message) return;
    QTTS_LOG_DEBUG("jack: {}", message);
}

// Resolved at run time so qtts needs neither library's headers nor a link dependency on them.
void backend_messages_silence() {
    static std::once_flag once;
    std::call_once(once, [] {
        using AlsaHandler = void (*)(const char*, int, const char*, int, const char*, ...);
        using AlsaSetHandler = int (*)(AlsaHandler);
        using JackSetFunction = void (*)(void (*)(const char*));
        void* alsa = dlopen("libasound.so.2", RTLD_LAZY | RTLD_NOLOAD);
        if (!alsa) alsa = dlopen("libasound.so.2", RTLD_LAZY);
        if (alsa) {
            if (auto set_handler = reinterpret_cast<AlsaSetHandler>(dlsym(alsa, "snd_lib_error_set_handler")))
                set_handler(&alsa_message_handler);
        }
        // libjack is only present when PortAudio was built with JACK; never load it ourselves.
        if (void* jack = dlopen("libjack.so.0", RTLD_LAZY | RTLD_NOLOAD)) {
            if (auto set_error = reinterpret_cast<JackSetFunction>(dlsym(jack, "jack_set_error_function")))
                set_error(&jack_message_handler);
            if (auto set_info = reinterpret_cast<JackSetFunction>(dlsym(jack, "jack_set_info_function")))
                set_info(&jack_message_handler);
        }
        // The handles stay open on purpose: PortAudio keeps using both libraries.
    });
}

class BackendMessagesToLog {
public:
    BackendMessagesToLog() { g_backend_messages_to_log.store(true); }
    ~BackendMessagesToLog() { g_backend_messages_to_log.store(false); }
};

// One Pa_Initialize/Pa_Terminate pair (PortAudio counts them, so sessions may overlap).
class PaSession {
public:
    PaSession() {
        audio_require_output_environment();
        backend_messages_silence();
        BackendMessagesToLog to_log;
        const PaError err = Pa_Initialize();
        if (err != paNoError)
            fail(ErrorCode::ERROR_IO, "cannot initialise PortAudio: {}; {}", Pa_GetErrorText(err),
                 k_audio_no_device_message);
    }
    ~PaSession() {
        BackendMessagesToLog to_log;
        Pa_Terminate();
    }
    PaSession(const PaSession&) = delete;
    PaSession& operator=(const PaSession&) = delete;
};

std::string lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
}

AudioDeviceInfo device_info_read(int index) {
    const PaDeviceInfo* info = Pa_GetDeviceInfo(index);
    AudioDeviceInfo d;
    d.index = index;
    if (!info) return d;
    d.name = info->name ? info->name : "";
    const PaHostApiInfo* api = Pa_GetHostApiInfo(info->hostApi);
    d.host_api = api && api->name ? api->name : "?";
    d.max_output_channels = info->maxOutputChannels;
    d.default_sample_rate = info->defaultSampleRate;
    d.default_low_latency_s = info->defaultLowOutputLatency;
    d.default_high_latency_s = info->defaultHighOutputLatency;
    d.is_default = index == Pa_GetDefaultOutputDevice();
    return d;
}

std::vector<AudioDeviceInfo> output_devices_enumerate() {
    std::vector<AudioDeviceInfo> devices;
    const int count = Pa_GetDeviceCount();
    for (int i = 0; i < count; ++i) {
        AudioDeviceInfo d = device_info_read(i);
        if (d.max_output_channels > 0) devices.push_back(d);
    }
    return devices;
}

std::string device_names_join(const std::vector<AudioDeviceInfo>& devices) {
    std::string names;
    for (const auto& d : devices) names += fmt::format("{}{}: '{}'", names.empty() ? "" : ", ", d.index, d.name);
    return names.empty() ? "none" : names;
}

// "" / "default" -> default output; digits -> index; otherwise a unique (case-insensitive) name
// match, exact first, then substring.
int device_resolve(const std::string& spec) {
    const std::vector<AudioDeviceInfo> devices = output_devices_enumerate();
    if (spec.empty() || spec == "default") {
        const PaDeviceIndex index = Pa_GetDefaultOutputDevice();
        if (index == paNoDevice) {
            if (devices.empty()) fail(ErrorCode::ERROR_NOT_FOUND, "{}", k_audio_no_device_message);
            return devices.front().index;
        }
        return index;
    }
    if (std::all_of(spec.begin(), spec.end(), [](unsigned char c) { return std::isdigit(c); })) {
        const int index = std::atoi(spec.c_str());
        for (const auto& d : devices)
            if (d.index == index) return index;
        fail(ErrorCode::ERROR_NOT_FOUND, "audio device index {} is not an output device (available: {})", spec,
             device_names_join(devices));
    }
    const std::string wanted = lower(spec);
    std::vector<AudioDeviceInfo> matches;
    for (const auto& d : devices) {
        if (lower(d.name) == wanted) return d.index;
        if (lower(d.name).find(wanted) != std::string::npos) matches.push_back(d);
    }
    if (matches.size() == 1) return matches.front().index;
    if (matches.empty())
        fail(ErrorCode::ERROR_NOT_FOUND, "no audio output device matches '{}' (available: {}; or 'null')", spec,
             device_names_join(devices));
    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "audio device '{}' is ambiguous: it matches {}", spec,
         device_names_join(matches));
}

// ---------------------------------------------------------------------------------------------
// PortAudio sink
// ---------------------------------------------------------------------------------------------

class PortAudioSink : public AudioSink {
public:
    PortAudioSink(const AudioSinkConfig& config, RenderSource source) : source_(source) {
        const int device = device_resolve(config.device);
        const AudioDeviceInfo info = device_info_read(device);
        device_name_ = info.name;
        host_api_ = info.host_api;
        sample_rate_ = config.sample_rate;

        PaStreamParameters params{};
        params.device = device;
        params.sampleFormat = paFloat32;
        params.suggestedLatency = config.suggested_latency_s > 0 ? config.suggested_latency_s
                                                                 : info.default_low_latency_s;
        params.hostApiSpecificStreamInfo = nullptr;
        BackendMessagesToLog to_log;
        if (config.channels > 0) {
            params.channelCount = config.channels;
        } else {
            // Mono if the device takes it, else stereo with the mono signal copied to both.
            params.channelCount = 1;
            if (Pa_IsFormatSupported(nullptr, &params, sample_rate_) != paFormatIsSupported &&
                info.max_output_channels >= 2) {
                params.channelCount = 2;
            }
        }
        if (params.channelCount > info.max_output_channels)
            fail(ErrorCode::ERROR_UNSUPPORTED, "audio device '{}' has {} output channel(s), {} requested",
                 device_name_, info.max_output_channels, params.channelCount);
        const PaError supported = Pa_IsFormatSupported(nullptr, &params, sample_rate_);
        if (supported != paFormatIsSupported)
            fail(ErrorCode::ERROR_UNSUPPORTED,
                 "audio device '{}' cannot play {} Hz float32 audio on {} channel(s) ({}); its native rate is {} Hz: "
                 "pick a device that resamples (ALSA 'default', 'pulse' or 'pipewire'), or use -o file.wav",
                 device_name_, sample_rate_, params.channelCount, Pa_GetErrorText(supported),
                 info.default_sample_rate);
        channels_ = params.channelCount;

        const PaError err = Pa_OpenStream(&stream_, nullptr, &params, double(sample_rate_),
                                          paFramesPerBufferUnspecified, paNoFlag, &PortAudioSink::callback, this);
        if (err != paNoError)
            fail(ErrorCode::ERROR_IO, "cannot open audio device '{}': {}", device_name_, Pa_GetErrorText(err));
        const PaStreamInfo* stream_info = Pa_GetStreamInfo(stream_);
        latency_s_ = stream_info ? stream_info->outputLatency : params.suggestedLatency;
        QTTS_LOG_INFO("audio output: '{}' ({}), {} Hz, {} channel(s), output latency {:.1f} ms (asked {:.1f} ms)",
                      device_name_, host_api_, sample_rate_, channels_, latency_s_ * 1e3,
                      params.suggestedLatency * 1e3);
    }

    ~PortAudioSink() override {
        if (stream_) {
            BackendMessagesToLog to_log;
            if (running_) Pa_StopStream(stream_);
            Pa_CloseStream(stream_);
        }
    }

    void start() override {
        if (running_) return;
        BackendMessagesToLog to_log;
        const PaError err = Pa_StartStream(stream_);
        if (err != paNoError)
            fail(ErrorCode::ERROR_IO, "cannot start audio device '{}': {}", device_name_, Pa_GetErrorText(err));
        running_ = true;
    }

    void stop() override {
        if (!running_) return;
        BackendMessagesToLog to_log;
        Pa_StopStream(stream_);  // plays out what the device already holds
        running_ = false;
    }

    bool is_running() const override { return running_; }
    int sample_rate() const override { return sample_rate_; }
    double output_latency_s() const override { return latency_s_; }
    double time_now() const override { return Pa_GetStreamTime(stream_); }
    std::string describe() const override { return fmt::format("'{}' ({})", device_name_, host_api_); }

private:
    // The device's audio thread: only the render source runs here (real-time rules apply).
    static int callback(const void* /*input*/, void* output, unsigned long frames,
                        const PaStreamCallbackTimeInfo* time_info, PaStreamCallbackFlags /*status*/,
                        void* user) {
        auto* self = static_cast<PortAudioSink*>(user);
        float* out = static_cast<float*>(output);
        const double out_time = time_info ? time_info->outputBufferDacTime : 0.0;
        if (self->channels_ == 1) {
            self->source_.fn(self->source_.user, out, size_t(frames), out_time);
            return paContinue;
        }
        // Render mono in slices through the pre-allocated scratch and copy it to every channel.
        const size_t channels = size_t(self->channels_);
        size_t done = 0;
        while (done < frames) {
            const size_t n = std::min(size_t(frames) - done, k_scratch_frames);
            self->source_.fn(self->source_.user, self->scratch_, n,
                             out_time + double(done) / double(self->sample_rate_));
            for (size_t i = 0; i < n; ++i)
                for (size_t c = 0; c < channels; ++c) out[(done + i) * channels + c] = self->scratch_[i];
            done += n;
        }
        return paContinue;
    }

    static constexpr size_t k_scratch_frames = 1024;

    PaSession session_;  // first member: initialised before, terminated after the stream
    RenderSource source_;
    PaStream* stream_ = nullptr;
    std::string device_name_;
    std::string host_api_;
    int sample_rate_ = 0;
    int channels_ = 1;
    double latency_s_ = 0;
    bool running_ = false;
    float scratch_[k_scratch_frames] = {};  // [k_scratch_frames] mono slice for multi-channel devices
};

int64_t steady_now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace

std::vector<AudioDeviceInfo> audio_list_devices() {
    PaSession session;
    BackendMessagesToLog to_log;
    return output_devices_enumerate();
}

std::unique_ptr<AudioSink> audio_sink_open(const AudioSinkConfig& config, RenderSource source) {
    if (!source.fn) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "audio sink needs a render source");
    if (config.sample_rate < 1000 || config.sample_rate > 768000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "audio sample rate must be in 1000..768000 Hz, got {}",
             config.sample_rate);
    if (lower(config.device) == "null")
        return std::make_unique<NullAudioSink>(source, config.sample_rate, config.null_block_frames);
    return std::make_unique<PortAudioSink>(config, source);
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
