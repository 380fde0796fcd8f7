// Raw PCM and WAV framing for network responses: float samples -> 16-bit little-endian bytes,
// and RIFF/WAVE headers for a known length (whole files) or an unknown one (streams).
//
// Thread safety: pure functions, callable from any thread; not for the audio callback
// (they append to std::string).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qtts {

// Size of the canonical PCM WAV header produced below (RIFF + fmt + data chunk headers).
constexpr size_t kWavHeaderBytes = 44;

// Converts one float sample to s16: clipped to [-1, 1], scaled by 32767, rounded to nearest.
// NaN becomes 0 so a numerical fault upstream is silence, not a full-scale click.
int16_t pcm_sample_to_s16(float sample);

// Appends n samples as s16le (2 bytes each) to out.
void pcm_append_s16le(const float* samples, size_t n, std::string& out);

// A 44-byte PCM s16 WAV header. data_bytes = the length of the sample data that follows.
std::string wav_header_s16(int sample_rate, int channels, uint32_t data_bytes);

// The header for a stream whose length is not known yet: the RIFF and data sizes hold
// 0xFFFFFFFF, which ffmpeg/ffplay, SoX and browsers read as "until the end of the stream".
std::string wav_header_s16_streaming(int sample_rate, int channels);

}  // namespace qtts
