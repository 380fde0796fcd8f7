// qtts devices: the audio output devices `--audio-device` accepts.
#include <cstdio>

#include "audio_io/audio_output.h"
#include "apps/qtts/cli.h"
#include "engine/common/error.h"

namespace {

int cmd_devices(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {}, {"help"});
    if (args.has("help")) {
        std::printf(
            "usage: qtts devices\n\n"
            "Lists the audio output devices. Pass the index or (part of) the name to --audio-device;\n"
            "'null' discards audio at real-time pace. On a machine without sound devices this prints\n"
            "why and exits non-zero (set QTTS_AUDIO_PROBE=force to skip the check).\n");
        return 0;
    }
    const std::vector<qtts::AudioDeviceInfo> devices = qtts::audio_list_devices();  // throws when headless
    if (devices.empty()) qtts::fail(qtts::ErrorCode::ERROR_NOT_FOUND, "{}", qtts::k_audio_no_device_message);

    std::printf("%5s  %-40s %-8s %4s %10s %9s\n", "index", "name", "host API", "ch", "latency", "rate");
    for (const auto& d : devices) {
        std::printf("%4d%s  %-40s %-8s %4d %7.1f ms %6.0f Hz\n", d.index, d.is_default ? "*" : " ", d.name.c_str(),
                    d.host_api.c_str(), d.max_output_channels, d.default_low_latency_s * 1e3,
                    d.default_sample_rate);
    }
    std::printf("%5s  %-40s (discards audio at real-time pace)\n", "null", "null");
    std::printf("\n* default device; latency = default low output latency\n");
    return 0;
}

}  // namespace

QTTS_COMMAND("devices", "list audio output devices (for --audio-device)", cmd_devices);
