#include "audio_io/pcm_format.h"

#include <cmath>

#include "engine/common/error.h"

namespace qtts {

namespace {

void append_u16le(std::string& out, uint16_t v) {
    out.push_back(char(v & 0xff));
    out.push_back(char((v >> 8) & 0xff));
}

void append_u32le(std::string& out, uint32_t v) {
    for (int shift = 0; shift < 32; shift += 8) out.push_back(char((v >> shift) & 0xff));
}

// riff_size and data_size are written as given (0xFFFFFFFF for "unknown").
std::string wav_header_build(int sample_rate, int channels, uint32_t riff_size, uint32_t data_size) {
    if (sample_rate < 1000 || sample_rate > 768000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WAV sample rate must be in 1000..768000 Hz, got {}", sample_rate);
    if (channels < 1 || channels > 8)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WAV channel count must be in 1..8, got {}", channels);
    const uint16_t bits = 16;
    const uint16_t block_align = uint16_t(channels * (bits / 8));
    std::string h;
    h.reserve(kWavHeaderBytes);
    h += "RIFF";
    append_u32le(h, riff_size);
    h += "WAVE";
    h += "fmt ";
    append_u32le(h, 16);  // fmt chunk size for plain PCM
    append_u16le(h, 1);   // WAVE_FORMAT_PCM
    append_u16le(h, uint16_t(channels));
    append_u32le(h, uint32_t(sample_rate));
    append_u32le(h, uint32_t(sample_rate) * block_align);  // byte rate
    append_u16le(h, block_align);
    append_u16le(h, bits);
    h += "data";
    append_u32le(h, data_size);
    return h;
}

}  // namespace

int16_t pcm_sample_to_s16(float sample) {
    if (std::isnan(sample)) return 0;
    if (sample >= 1.0f) return 32767;
    if (sample <= -1.0f) return -32767;
    return int16_t(std::lrint(double(sample) * 32767.0));  // double: no float rounding before the int rounding
}

void pcm_append_s16le(const float* samples, size_t n, std::string& out) {
    const size_t start = out.size();
    out.resize(start + 2 * n);
    char* dst = &out[start];
    for (size_t i = 0; i < n; ++i) {
        const uint16_t v = uint16_t(pcm_sample_to_s16(samples[i]));
        dst[2 * i] = char(v & 0xff);
        dst[2 * i + 1] = char(v >> 8);
    }
}

std::string wav_header_s16(int sample_rate, int channels, uint32_t data_bytes) {
    // A RIFF size must fit in 32 bits: 36 header bytes after the size field plus the data.
    if (data_bytes > 0xFFFFFFFFu - 36u)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "WAV data of {} bytes does not fit a 32-bit RIFF size", data_bytes);
    return wav_header_build(sample_rate, channels, 36u + data_bytes, data_bytes);
}

std::string wav_header_s16_streaming(int sample_rate, int channels) {
    return wav_header_build(sample_rate, channels, 0xFFFFFFFFu, 0xFFFFFFFFu);
}

}  // namespace qtts
