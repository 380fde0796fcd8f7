// Reading audio files (reference voices for cloning, test fixtures) and resampling them to the
// model's 24 kHz. libsndfile decodes (WAV, FLAC, Ogg Vorbis/Opus, AIFF, CAF, MP3 where the
// installed libsndfile supports it, ...); libsoxr resamples at its "high quality" setting.
//
// Every malformed input ends in a qtts::Error that names the file and says what was wrong:
// missing (ERROR_NOT_FOUND), unreadable or a folder (ERROR_IO), empty, not audio, truncated,
// zero samples, NaN/Inf samples, or longer than k_audio_max_seconds (ERROR_FORMAT).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qtts {

// Longest file audio_read() accepts by default; a guard against accidentally loading hours of
// audio. Callers that want less (voice cloning's reference clips: VOICE_REF_MAX_SECONDS) pass
// their own limit, so a file past it fails before its samples are decoded (the header's length)
// or as soon as they are (formats whose length is an estimate), never after hours of them.
constexpr double k_audio_max_seconds = 3600.0;

struct AudioData {
    std::vector<float> samples;  // [frames] mono (the file's channels averaged)
    int sample_rate = 0;         // Hz, as stored in the file
    int source_channels = 0;     // channel count in the file, before the mono mix
    std::string format_name;     // libsndfile's name of the container, e.g. "WAV (Microsoft)"

    double duration_s() const { return sample_rate > 0 ? double(samples.size()) / sample_rate : 0.0; }
};

// Decodes a whole file and mixes it to mono by averaging the channels. A file longer than
// `max_seconds` (0 < max_seconds <= k_audio_max_seconds) is an ERROR_FORMAT.
AudioData audio_read(const std::string& path, double max_seconds = k_audio_max_seconds);

// Band-limited resampling (libsoxr, high quality, linear phase, delay compensated).
// Output length is round(n * to_sr / from_sr). Equal rates return a copy.
std::vector<float> audio_resample(const std::vector<float>& samples, int from_sr, int to_sr);

// audio_read() + audio_resample() to 24 kHz mono: what the speaker encoder expects.
std::vector<float> audio_read_mono_24k(const std::string& path, double max_seconds = k_audio_max_seconds);

}  // namespace qtts
