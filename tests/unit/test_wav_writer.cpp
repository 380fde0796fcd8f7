// WavWriter: round trips in both formats, a header that is valid after every streamed write,
// clipping instead of wrap-around, and clear errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <sndfile.h>

#include "audio_io/wav_writer.h"
#include "engine/common/error.h"
#include "test_support.h"

using qtts::WavFormat;
using qtts::WavWriter;

namespace {

struct WavContents {
    SF_INFO info{};
    std::vector<float> samples;
};

// Reads with a separate libsndfile handle (works while the writer still has the file open).
WavContents wav_read_back(const std::string& path) {
    WavContents c;
    SNDFILE* f = sf_open(path.c_str(), SFM_READ, &c.info);
    REQUIRE(f != nullptr);
    c.samples.resize(size_t(c.info.frames) * size_t(c.info.channels));
    const sf_count_t got = sf_readf_float(f, c.samples.data(), c.info.frames);
    sf_close(f);
    REQUIRE(got == c.info.frames);
    return c;
}

std::string temp_path(const std::string& name) { return qtts_test::temp_dir() + "/" + name; }

}  // namespace

TEST_CASE("f32 WAV round-trips exactly", "[wav]") {
    const std::vector<float> input = qtts_test::random_floats(12345, 1);
    const std::string path = temp_path("f32.wav");
    qtts::wav_write_file(path, input, 24000, WavFormat::WAV_FORMAT_F32);
    const WavContents c = wav_read_back(path);
    CHECK(c.info.samplerate == 24000);
    CHECK(c.info.channels == 1);
    CHECK((c.info.format & SF_FORMAT_TYPEMASK) == SF_FORMAT_WAV);
    CHECK((c.info.format & SF_FORMAT_SUBMASK) == SF_FORMAT_FLOAT);
    REQUIRE(c.samples.size() == input.size());
    CHECK(qtts_test::max_abs_error(c.samples.data(), input.data(), input.size()) == 0.0);
}

TEST_CASE("s16 WAV round-trips within one quantisation step", "[wav]") {
    const std::vector<float> input = qtts_test::random_floats(5000, 2, -0.99f, 0.99f);
    const std::string path = temp_path("s16.wav");
    qtts::wav_write_file(path, input, 16000, WavFormat::WAV_FORMAT_S16);
    const WavContents c = wav_read_back(path);
    CHECK(c.info.samplerate == 16000);
    CHECK((c.info.format & SF_FORMAT_SUBMASK) == SF_FORMAT_PCM_16);
    REQUIRE(c.samples.size() == input.size());
    CHECK(qtts_test::max_abs_error(c.samples.data(), input.data(), input.size()) <= 1.0 / 32767.0);
    CHECK(qtts_test::max_abs_error(c.samples.data(), input.data(), input.size()) > 0.0);  // really quantised
}

TEST_CASE("s16 output clips out-of-range samples instead of wrapping", "[wav]") {
    const std::string path = temp_path("clip.wav");
    qtts::wav_write_file(path, {1.5f, -3.0f, 0.5f, 1.0f, -1.0f}, 24000, WavFormat::WAV_FORMAT_S16);
    const WavContents c = wav_read_back(path);
    REQUIRE(c.samples.size() == 5);
    CHECK(c.samples[0] > 0.999f);
    CHECK(c.samples[1] < -0.999f);
    CHECK(c.samples[2] == Approx(0.5f).margin(1e-4));
}

TEST_CASE("streaming: the header is valid after every write", "[wav]") {
    for (WavFormat format : {WavFormat::WAV_FORMAT_S16, WavFormat::WAV_FORMAT_F32}) {
        CAPTURE(qtts::wav_format_name(format));
        const std::string path = temp_path(std::string("stream-") + qtts::wav_format_name(format) + ".wav");
        const std::vector<size_t> chunks = {1920, 1920, 1, 3839, 1920, 16, 1920};
        const std::vector<float> input = qtts_test::random_floats(11536, 3, -0.9f, 0.9f);  // sum of chunks
        WavWriter writer(path, 24000, 1, format);
        size_t written = 0;
        for (size_t chunk : chunks) {
            writer.write(input.data() + written, chunk);
            written += chunk;
            // Another reader sees every sample written so far, with the right length.
            const WavContents c = wav_read_back(path);
            REQUIRE(size_t(c.info.frames) == written);
            CHECK(qtts_test::max_abs_error(c.samples.data(), input.data(), written) <= 1.0 / 32767.0);
        }
        CHECK(writer.frames_written() == written);
        writer.close();
        CHECK_FALSE(writer.is_open());
        CHECK(size_t(wav_read_back(path).info.frames) == input.size());
    }
}

TEST_CASE("stereo frames are interleaved and must be whole", "[wav]") {
    const std::string path = temp_path("stereo.wav");
    WavWriter writer(path, 48000, 2, WavFormat::WAV_FORMAT_F32);
    const std::vector<float> lr = {0.1f, -0.1f, 0.2f, -0.2f};
    writer.write(lr);
    CHECK_THROWS_AS(writer.write(lr.data(), 3), qtts::Error);
    writer.close();
    const WavContents c = wav_read_back(path);
    CHECK(c.info.channels == 2);
    CHECK(c.info.frames == 2);
    CHECK(c.samples == lr);
}

TEST_CASE("clear errors for bad paths and misuse", "[wav]") {
    const std::string bad = qtts_test::temp_dir() + "/no/such/folder/out.wav";
    try {
        qtts::wav_write_file(bad, {0.0f});
        FAIL("expected an error");
    } catch (const qtts::Error& e) {
        CHECK(e.code() == qtts::ErrorCode::ERROR_IO);
        CHECK(std::string(e.what()).find(bad) != std::string::npos);
    }
    WavWriter writer;
    CHECK_THROWS_AS(writer.write(std::vector<float>{0.0f}), qtts::Error);  // not open
    CHECK_THROWS_AS(writer.open(temp_path("x.wav"), 0), qtts::Error);
    CHECK_THROWS_AS(writer.open(temp_path("x.wav"), 24000, 0), qtts::Error);
    writer.open(temp_path("x.wav"));
    CHECK_THROWS_AS(writer.open(temp_path("y.wav")), qtts::Error);  // already open
    writer.close();
    writer.close();  // harmless

    CHECK(qtts::wav_format_parse("s16") == WavFormat::WAV_FORMAT_S16);
    CHECK(qtts::wav_format_parse("F32") == WavFormat::WAV_FORMAT_F32);
    CHECK_THROWS_AS(qtts::wav_format_parse("mp3"), qtts::Error);
}

TEST_CASE("a moved writer keeps writing the same file", "[wav]") {
    const std::string path = temp_path("moved.wav");
    WavWriter a(path, 24000, 1, WavFormat::WAV_FORMAT_F32);
    a.write(std::vector<float>{0.25f});
    WavWriter b(std::move(a));
    b.write(std::vector<float>{0.5f});
    b.close();
    const WavContents c = wav_read_back(path);
    CHECK(c.samples == std::vector<float>{0.25f, 0.5f});
}
