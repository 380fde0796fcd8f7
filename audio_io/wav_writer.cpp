#include "audio_io/wav_writer.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include <sndfile.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/strings.h"

namespace qtts {

WavFormat wav_format_parse(const std::string& name) {
    const std::string lower = ascii_lower(name);
    if (lower == "s16" || lower == "pcm16" || lower == "int16") return WavFormat::WAV_FORMAT_S16;
    if (lower == "f32" || lower == "float" || lower == "float32") return WavFormat::WAV_FORMAT_F32;
    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown WAV sample format '{}' (accepted: s16, f32)", name);
}

const char* wav_format_name(WavFormat format) {
    return format == WavFormat::WAV_FORMAT_F32 ? "f32" : "s16";
}

WavWriter::WavWriter(const std::string& path, int sample_rate, int channels, WavFormat format) {
    open(path, sample_rate, channels, format);
}

WavWriter::~WavWriter() {
    try {
        close();
    } catch (const std::exception& e) {
        QTTS_LOG_ERROR("closing {} failed: {}", path_, e.what());
    }
}

WavWriter::WavWriter(WavWriter&& other) noexcept
    : file_(std::exchange(other.file_, nullptr)),
      path_(std::move(other.path_)),
      sample_rate_(other.sample_rate_),
      channels_(other.channels_),
      frames_written_(other.frames_written_) {}

WavWriter& WavWriter::operator=(WavWriter&& other) noexcept {
    if (this != &other) {
        if (file_) sf_close(file_);
        file_ = std::exchange(other.file_, nullptr);
        path_ = std::move(other.path_);
        sample_rate_ = other.sample_rate_;
        channels_ = other.channels_;
        frames_written_ = other.frames_written_;
    }
    return *this;
}

void WavWriter::open(const std::string& path, int sample_rate, int channels, WavFormat format) {
    if (file_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WavWriter is already writing {}; close it first", path_);
    if (sample_rate < 1000 || sample_rate > 768000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WAV sample rate must be in 1000..768000 Hz, got {}", sample_rate);
    if (channels < 1 || channels > 16)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WAV channel count must be in 1..16, got {}", channels);

    SF_INFO info{};
    info.samplerate = sample_rate;
    info.channels = channels;
    info.format = SF_FORMAT_WAV | (format == WavFormat::WAV_FORMAT_F32 ? SF_FORMAT_FLOAT : SF_FORMAT_PCM_16);
    SNDFILE* file = sf_open(path.c_str(), SFM_WRITE, &info);
    if (!file) {
        fail(ErrorCode::ERROR_IO, "cannot create WAV file '{}': {} (check that the folder exists and is writable)",
             path, sf_strerror(nullptr));
    }
    // Out-of-range floats must saturate in 16-bit output, not wrap around into loud clicks.
    sf_command(file, SFC_SET_CLIPPING, nullptr, SF_TRUE);
    // Rewrite the header after every write so the file is valid while it grows.
    sf_command(file, SFC_SET_UPDATE_HEADER_AUTO, nullptr, SF_TRUE);
    file_ = file;
    path_ = path;
    sample_rate_ = sample_rate;
    channels_ = channels;
    frames_written_ = 0;
}

void WavWriter::write(const float* samples, size_t n) {
    if (!file_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WavWriter::write called on a writer that is not open");
    if (n % size_t(channels_) != 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WAV write of {} samples is not a whole number of {}-channel frames",
             n, channels_);
    if (n == 0) return;
    const sf_count_t wanted = sf_count_t(n);
    const sf_count_t written = sf_write_float(file_, samples, wanted);
    frames_written_ += uint64_t(std::max<sf_count_t>(written, 0)) / uint64_t(channels_);
    if (written != wanted) {
        fail(ErrorCode::ERROR_IO, "writing to '{}' failed after {} of {} samples: {}", path_, written, wanted,
             sf_strerror(file_));
    }
}

void WavWriter::close() {
    if (!file_) return;
    SNDFILE* file = std::exchange(file_, nullptr);
    const int rc = sf_close(file);
    if (rc != 0) fail(ErrorCode::ERROR_IO, "closing WAV file '{}' failed: {}", path_, sf_error_number(rc));
}

void wav_write_file(const std::string& path, const std::vector<float>& samples, int sample_rate, WavFormat format) {
    WavWriter writer(path, sample_rate, 1, format);
    writer.write(samples.data(), samples.size());
    writer.close();
}

}  // namespace qtts
