// pcm_format: float -> s16le conversion (rounding, clipping, NaN) and WAV headers.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>

#include "audio_io/pcm_format.h"
#include "engine/common/error.h"
#include "test_support.h"

namespace {

uint32_t u32_at(const std::string& s, size_t at) {
    return uint32_t(uint8_t(s[at])) | uint32_t(uint8_t(s[at + 1])) << 8 | uint32_t(uint8_t(s[at + 2])) << 16 |
           uint32_t(uint8_t(s[at + 3])) << 24;
}
uint16_t u16_at(const std::string& s, size_t at) { return uint16_t(uint8_t(s[at]) | (uint8_t(s[at + 1]) << 8)); }

}  // namespace

TEST_CASE("s16 conversion rounds, clips and silences NaN", "[unit]") {
    CHECK(qtts::pcm_sample_to_s16(0.0f) == 0);
    CHECK(qtts::pcm_sample_to_s16(1.0f) == 32767);
    CHECK(qtts::pcm_sample_to_s16(-1.0f) == -32767);
    CHECK(qtts::pcm_sample_to_s16(3.5f) == 32767);
    CHECK(qtts::pcm_sample_to_s16(-7.0f) == -32767);
    CHECK(qtts::pcm_sample_to_s16(std::numeric_limits<float>::infinity()) == 32767);
    CHECK(qtts::pcm_sample_to_s16(std::numeric_limits<float>::quiet_NaN()) == 0);
    CHECK(qtts::pcm_sample_to_s16(0.5f) == 16384);  // 16383.5 rounds to nearest even
    CHECK(qtts::pcm_sample_to_s16(-0.25f) == -8192);
}

TEST_CASE("s16le bytes are little-endian and match the scalar conversion", "[unit]") {
    const auto x = qtts_test::random_floats(1001, 42, -1.2f, 1.2f);
    std::string bytes = "prefix";
    qtts::pcm_append_s16le(x.data(), x.size(), bytes);
    REQUIRE(bytes.size() == 6 + 2 * x.size());
    CHECK(bytes.compare(0, 6, "prefix") == 0);
    for (size_t i = 0; i < x.size(); ++i) {
        const int16_t v = int16_t(u16_at(bytes, 6 + 2 * i));
        REQUIRE(v == qtts::pcm_sample_to_s16(x[i]));
        // Within half a step of the clipped input.
        const double clipped = std::max(-1.0, std::min(1.0, double(x[i])));
        REQUIRE(std::fabs(v / 32767.0 - clipped) <= 0.5 / 32767 + 1e-9);
    }
}

TEST_CASE("WAV headers: exact sizes for whole files, 0xFFFFFFFF while streaming", "[unit]") {
    const std::string h = qtts::wav_header_s16(24000, 1, 48000);
    REQUIRE(h.size() == qtts::kWavHeaderBytes);
    CHECK(h.compare(0, 4, "RIFF") == 0);
    CHECK(u32_at(h, 4) == 36 + 48000);
    CHECK(h.compare(8, 8, "WAVEfmt ") == 0);
    CHECK(u32_at(h, 16) == 16);
    CHECK(u16_at(h, 20) == 1);      // PCM
    CHECK(u16_at(h, 22) == 1);      // mono
    CHECK(u32_at(h, 24) == 24000);  // rate
    CHECK(u32_at(h, 28) == 48000);  // bytes per second
    CHECK(u16_at(h, 32) == 2);      // block align
    CHECK(u16_at(h, 34) == 16);     // bits
    CHECK(h.compare(36, 4, "data") == 0);
    CHECK(u32_at(h, 40) == 48000);

    const std::string st = qtts::wav_header_s16_streaming(48000, 2);
    REQUIRE(st.size() == qtts::kWavHeaderBytes);
    CHECK(u32_at(st, 4) == 0xFFFFFFFFu);
    CHECK(u32_at(st, 40) == 0xFFFFFFFFu);
    CHECK(u16_at(st, 22) == 2);
    CHECK(u32_at(st, 28) == 48000u * 4);

    CHECK_THROWS_AS(qtts::wav_header_s16(100, 1, 0), qtts::Error);
    CHECK_THROWS_AS(qtts::wav_header_s16(24000, 0, 0), qtts::Error);
    CHECK_THROWS_AS(qtts::wav_header_s16(24000, 1, 0xFFFFFFF0u), qtts::Error);
}
