// PortAudio playback: device enumeration and resolution, the PortAudio sink, and ALSA/JACK
// messages routed to the debug log. Compiled only with QTTS_WITH_PORTAUDIO (CMake); the sink is
// opened through audio_sink_open (audio_io/audio_output.h).
#include "audio_io/portaudio_sink.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include <dlfcn.h>
#include <portaudio.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/strings.h"

namespace qtts {

extern const char* const k_audio_no_device_message;

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
    const std::string wanted = ascii_lower(spec);
    std::vector<AudioDeviceInfo> matches;
    for (const auto& d : devices) {
        if (ascii_lower(d.name) == wanted) return d.index;
        if (ascii_lower(d.name).find(wanted) != std::string::npos) matches.push_back(d);
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

}  // namespace

std::vector<AudioDeviceInfo> portaudio_list_devices() {
    PaSession session;
    BackendMessagesToLog to_log;
    return output_devices_enumerate();
}

std::unique_ptr<AudioSink> portaudio_sink_open(const AudioSinkConfig& config, RenderSource source) {
    return std::make_unique<PortAudioSink>(config, source);
}

}  // namespace qtts
