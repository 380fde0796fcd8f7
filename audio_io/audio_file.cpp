#include "audio_io/audio_file.h"
#include "engine/api/qtts.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <sndfile.h>
#include <soxr.h>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts {

namespace {

constexpr int k_min_sample_rate = 1000;
constexpr int k_max_sample_rate = 768000;
constexpr const char* k_accepted_formats =
    "accepted: WAV, FLAC, Ogg Vorbis/Opus, AIFF and the other formats libsndfile reads";

// Closes the libsndfile handle on every exit path.
struct SndfileCloser {
    SNDFILE* file;
    ~SndfileCloser() {
        if (file) sf_close(file);
    }
};

void check_path_is_readable_file(const std::string& path) {
    if (path.empty()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "audio file path is empty");
    std::error_code ec;
    const auto status = std::filesystem::status(path, ec);
    if (!std::filesystem::exists(status)) fail(ErrorCode::ERROR_NOT_FOUND, "audio file '{}' does not exist", path);
    if (std::filesystem::is_directory(status))
        fail(ErrorCode::ERROR_IO, "audio file '{}' is a folder, not a file", path);
    if (::access(path.c_str(), R_OK) != 0)
        fail(ErrorCode::ERROR_IO, "audio file '{}' cannot be read: {}", path, std::strerror(errno));
    if (std::filesystem::is_regular_file(status) && std::filesystem::file_size(path, ec) == 0 && !ec)
        fail(ErrorCode::ERROR_FORMAT, "audio file '{}' is empty (0 bytes)", path);
}

// libsndfile silently shortens a WAV/AIFF whose data chunk claims more bytes than the file holds
// and only notes it in its log ("data : 4000 (should be 1000)"). A cut-off file is almost always a
// failed download or copy, so we report it instead of using half a reference voice.
void check_not_truncated(SNDFILE* file, const std::string& path) {
    char log[8192] = {0};
    sf_command(file, SFC_GET_LOG_INFO, log, sizeof(log));
    const char* line = log;
    while (line && *line) {
        const char* next = std::strchr(line, '\n');
        const bool is_data_chunk = std::strncmp(line, "data", 4) == 0 || std::strncmp(line, "SSND", 4) == 0;
        const char* should = std::strstr(line, "(should be ");
        if (is_data_chunk && should && (!next || should < next)) {
            const char* colon = std::strchr(line, ':');
            if (colon && colon < should) {
                const unsigned long long declared = std::strtoull(colon + 1, nullptr, 10);
                const unsigned long long actual = std::strtoull(should + std::strlen("(should be "), nullptr, 10);
                // 0xFFFFFFFF / 0 are the "length unknown" placeholders of streaming writers.
                const bool placeholder = declared == 0 || declared >= 0x7FFFFFFFull;
                if (!placeholder && actual < declared) {
                    fail(ErrorCode::ERROR_FORMAT,
                         "audio file '{}' is truncated: its header announces {} bytes of audio but only {} are "
                         "present",
                         path, declared, actual);
                }
            }
        }
        line = next ? next + 1 : nullptr;
    }
}

}  // namespace

AudioData audio_read(const std::string& path, double max_seconds) {
    QTTS_ASSERT(max_seconds > 0 && max_seconds <= k_audio_max_seconds);
    check_path_is_readable_file(path);

    SF_INFO info{};
    SndfileCloser handle{sf_open(path.c_str(), SFM_READ, &info)};
    if (!handle.file) {
        fail(ErrorCode::ERROR_FORMAT, "'{}' is not a readable audio file ({}); {}", path, sf_strerror(nullptr),
             k_accepted_formats);
    }
    SNDFILE* file = handle.file;

    SF_FORMAT_INFO format_info{};
    format_info.format = info.format & SF_FORMAT_TYPEMASK;
    sf_command(file, SFC_GET_FORMAT_INFO, &format_info, sizeof(format_info));
    const std::string format_name = format_info.name ? format_info.name : "unknown";

    if (info.channels < 1 || info.channels > 64)
        fail(ErrorCode::ERROR_FORMAT, "audio file '{}' declares {} channels (accepted: 1..64)", path, info.channels);
    if (info.samplerate < k_min_sample_rate || info.samplerate > k_max_sample_rate)
        fail(ErrorCode::ERROR_FORMAT, "audio file '{}' declares a sample rate of {} Hz (accepted: {}..{})", path,
             info.samplerate, k_min_sample_rate, k_max_sample_rate);
    check_not_truncated(file, path);
    if (info.frames <= 0) fail(ErrorCode::ERROR_FORMAT, "audio file '{}' contains no audio (0 samples)", path);
    // MP3 lengths are estimates; every other format knows its exact length.
    const bool length_is_estimate = (info.format & SF_FORMAT_TYPEMASK) == SF_FORMAT_MPEG;
    const auto too_long = [&](double seconds) {
        fail(ErrorCode::ERROR_FORMAT, "audio file '{}' is {:.1f} s long; at most {:.1f} s are accepted", path, seconds,
             max_seconds);
    };
    const double seconds = double(info.frames) / info.samplerate;
    // An estimate is checked against the hard limit only; the decoded samples against max_seconds.
    if (seconds > (length_is_estimate ? k_audio_max_seconds : max_seconds)) too_long(seconds);
    const size_t frames_max = size_t(std::ceil(max_seconds * info.samplerate));

    const size_t frames_declared = size_t(info.frames);
    const size_t channels = size_t(info.channels);
    AudioData audio;
    audio.sample_rate = info.samplerate;
    audio.source_channels = info.channels;
    audio.format_name = format_name;

    // Decode in blocks and mix each block straight into the mono output, so memory stays at one
    // mono copy of the file whatever its channel count. The output grows with what decodes: the
    // header's frame count is only a claim (a 50-byte FLAC header can announce an hour at 768 kHz,
    // 11 GB of samples, and hold none).
    constexpr size_t k_block_frames = 16384;
    audio.samples.reserve(std::min(frames_declared, 64 * k_block_frames));
    std::vector<float> block(k_block_frames * channels);  // [k_block_frames, channels]
    const float channel_weight = 1.0f / float(channels);
    size_t frames_read = 0;
    while (frames_read < frames_declared) {
        const size_t want = std::min(k_block_frames, frames_declared - frames_read);
        const sf_count_t got = sf_readf_float(file, block.data(), sf_count_t(want));
        if (got <= 0) break;
        if (frames_read + size_t(got) > frames_max) too_long(double(frames_read + size_t(got)) / info.samplerate);
        audio.samples.resize(frames_read + size_t(got));
        for (size_t f = 0; f < size_t(got); ++f) {
            const float* frame = block.data() + f * channels;
            float sum = 0.0f;
            for (size_t c = 0; c < channels; ++c) sum += frame[c];
            const float mono = channels == 1 ? sum : sum * channel_weight;
            if (!std::isfinite(mono))
                fail(ErrorCode::ERROR_FORMAT, "audio file '{}' contains a NaN or infinite sample at frame {}", path,
                     frames_read + f);
            audio.samples[frames_read + f] = mono;
        }
        frames_read += size_t(got);
    }
    if (sf_error(file) != SF_ERR_NO_ERROR)
        fail(ErrorCode::ERROR_FORMAT, "audio file '{}' could not be decoded after {} samples: {}", path, frames_read,
             sf_strerror(file));
    if (frames_read < frames_declared) {
        if (!length_is_estimate || frames_read == 0)
            fail(ErrorCode::ERROR_FORMAT,
                 "audio file '{}' is truncated or corrupt: {} samples announced, {} could be decoded", path,
                 frames_declared, frames_read);
        QTTS_LOG_DEBUG("{}: {} samples announced, {} decoded", path, frames_declared, frames_read);
    }
    return audio;
}

std::vector<float> audio_resample(const std::vector<float>& samples, int from_sr, int to_sr) {
    for (int rate : {from_sr, to_sr}) {
        if (rate < k_min_sample_rate || rate > k_max_sample_rate)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "cannot resample with a sample rate of {} Hz (accepted: {}..{})",
                 rate, k_min_sample_rate, k_max_sample_rate);
    }
    if (from_sr == to_sr || samples.empty()) return samples;

    const double ratio = double(to_sr) / double(from_sr);
    const size_t out_expected = size_t(std::llround(double(samples.size()) * ratio));
    std::vector<float> out(out_expected + 2);
    size_t out_done = 0;
    const soxr_io_spec_t io_spec = soxr_io_spec(SOXR_FLOAT32_I, SOXR_FLOAT32_I);
    const soxr_quality_spec_t quality = soxr_quality_spec(SOXR_HQ, 0);  // linear phase by default
    const soxr_runtime_spec_t runtime = soxr_runtime_spec(1);
    const soxr_error_t err = soxr_oneshot(double(from_sr), double(to_sr), 1, samples.data(), samples.size(),
                                          nullptr, out.data(), out.size(), &out_done, &io_spec, &quality, &runtime);
    if (err) fail(ErrorCode::ERROR_INTERNAL, "resampling {} -> {} Hz failed: {}", from_sr, to_sr, err);
    out.resize(std::min(out_done, out_expected));
    return out;
}

std::vector<float> audio_read_mono_24k(const std::string& path, double max_seconds) {
    AudioData audio = audio_read(path, max_seconds);
    if (audio.sample_rate != SAMPLE_RATE) {
        QTTS_LOG_DEBUG("{}: resampling {} Hz -> 24000 Hz ({} channel(s) mixed to mono)", path, audio.sample_rate,
                       audio.source_channels);
    }
    return audio_resample(audio.samples, audio.sample_rate, SAMPLE_RATE);
}

}  // namespace qtts
