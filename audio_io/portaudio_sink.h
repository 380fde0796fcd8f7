// The PortAudio output (audio_io/portaudio_sink.cpp), present when the build has PortAudio
// (QTTS_HAVE_PORTAUDIO, CMake option QTTS_WITH_PORTAUDIO). Callers go through
// audio_list_devices / audio_sink_open (audio_io/audio_output.h), which say what is missing in a
// build without it.
#pragma once

#include <memory>
#include <vector>

#include "audio_io/audio_output.h"

namespace qtts {

std::vector<AudioDeviceInfo> portaudio_list_devices();
// Opens `config.device` ("" / "default", an index, or a unique name match). Throws qtts::Error.
std::unique_ptr<AudioSink> portaudio_sink_open(const AudioSinkConfig& config, RenderSource source);

}  // namespace qtts
