// Streaming WAV output through libsndfile. Each write() lands in the file at once and the RIFF
// header is rewritten after it, so a reader (or a crash) at any moment sees a valid WAV holding
// everything written so far: `qtts say -o out.wav` can be played while it is still growing.
//
// Thread safety: one WavWriter per thread; not for the audio callback (it does file I/O).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/api/qtts.h"

typedef struct sf_private_tag SNDFILE;  // libsndfile's opaque handle (declared in sndfile.h)

namespace qtts {

enum class WavFormat {
    WAV_FORMAT_S16,  // 16-bit signed PCM (samples clipped to [-1, 1])
    WAV_FORMAT_F32,  // 32-bit IEEE float (stored as is)
};

// "s16" / "f32" (also "pcm16", "float") -> WavFormat; a clear error for anything else.
WavFormat wav_format_parse(const std::string& name);
const char* wav_format_name(WavFormat format);

class WavWriter {
public:
    WavWriter() = default;
    // Opens at once (see open()).
    WavWriter(const std::string& path, int sample_rate = SAMPLE_RATE, int channels = 1,
              WavFormat format = WavFormat::WAV_FORMAT_S16);
    ~WavWriter();  // closes; errors on this path are logged, not thrown

    WavWriter(const WavWriter&) = delete;
    WavWriter& operator=(const WavWriter&) = delete;
    WavWriter(WavWriter&& other) noexcept;
    WavWriter& operator=(WavWriter&& other) noexcept;

    // Creates (or truncates) path. Throws qtts::Error (ERROR_IO) when it cannot be created,
    // ERROR_INVALID_ARGUMENT for a bad sample rate / channel count or when already open.
    void open(const std::string& path, int sample_rate = SAMPLE_RATE, int channels = 1,
              WavFormat format = WavFormat::WAV_FORMAT_S16);

    // Appends n samples (interleaved when channels > 1, so n must be a multiple of channels).
    // The header is valid again when this returns. Throws ERROR_IO on a short write (disk full).
    void write(const float* samples, size_t n);
    void write(const std::vector<float>& samples) { write(samples.data(), samples.size()); }

    // Finalises the header and closes the file; a no-op when not open.
    void close();

    bool is_open() const { return file_ != nullptr; }
    const std::string& path() const { return path_; }
    uint64_t frames_written() const { return frames_written_; }
    int sample_rate() const { return sample_rate_; }
    int channels() const { return channels_; }

private:
    SNDFILE* file_ = nullptr;
    std::string path_;
    int sample_rate_ = 0;
    int channels_ = 0;
    uint64_t frames_written_ = 0;
};

// Writes a whole mono buffer to path in one go.
void wav_write_file(const std::string& path, const std::vector<float>& samples, int sample_rate = SAMPLE_RATE,
                    WavFormat format = WavFormat::WAV_FORMAT_S16);

}  // namespace qtts
