// audio_read / audio_resample: mono mixing, resampling length and frequency, and a clear,
// file-naming error for every kind of bad input.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <sndfile.h>

#include "audio_io/audio_file.h"
#include "audio_io/wav_writer.h"
#include "engine/common/error.h"
#include "test_support.h"

namespace {

std::string temp_path(const std::string& name) { return qtts_test::temp_dir() + "/" + name; }

void file_write_bytes(const std::string& path, const std::string& bytes) {
    std::ofstream f(path, std::ios::binary);
    f.write(bytes.data(), std::streamsize(bytes.size()));
}

// Writes interleaved float frames with libsndfile directly (independent of the code under test).
void sndfile_write(const std::string& path, int format, int sample_rate, int channels, const std::vector<float>& x) {
    SF_INFO info{};
    info.samplerate = sample_rate;
    info.channels = channels;
    info.format = format;
    SNDFILE* f = sf_open(path.c_str(), SFM_WRITE, &info);
    REQUIRE(f != nullptr);
    REQUIRE(sf_write_float(f, x.data(), sf_count_t(x.size())) == sf_count_t(x.size()));
    sf_close(f);
}

std::vector<float> sine(double freq, int sample_rate, size_t n, float amp) {
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = amp * float(std::sin(2.0 * M_PI * freq * double(i) / sample_rate));
    return x;
}

// Frequency from upward zero crossings (linear interpolation), away from the edges.
double frequency_estimate(const std::vector<float>& x, int sample_rate) {
    double first = -1, last = -1;
    int crossings = 0;
    for (size_t i = x.size() / 10; i + 1 < x.size() * 9 / 10; ++i) {
        if (x[i] <= 0.0f && x[i + 1] > 0.0f) {
            const double t = double(i) + double(-x[i]) / double(x[i + 1] - x[i]);
            if (first < 0) first = t;
            last = t;
            ++crossings;
        }
    }
    return crossings > 1 ? (crossings - 1) * sample_rate / (last - first) : 0.0;
}

// Asserts that read() throws `code`, names the file and says `words`.
void require_error(const std::function<void()>& read, const std::string& path, qtts::ErrorCode code,
                   const std::string& words) {
    try {
        read();
        FAIL("expected an error for " << path);
    } catch (const qtts::Error& e) {
        INFO(e.what());
        CHECK(e.code() == code);
        CHECK(std::string(e.what()).find(path) != std::string::npos);
        CHECK(std::string(e.what()).find(words) != std::string::npos);
    }
}

// Asserts that audio_read(path) throws `code` and names the file.
void require_read_error(const std::string& path, qtts::ErrorCode code, const std::string& words) {
    require_error([&] { qtts::audio_read(path); }, path, code, words);
}

}  // namespace

TEST_CASE("stereo 44.1 kHz becomes mono 24 kHz with the right length and frequency", "[audio_file]") {
    const int in_rate = 44100;
    const size_t in_frames = 44100 * 2;  // 2 s
    const double freq = 440.0;
    // Left and right carry the same sine at different levels; the mono mix is their average.
    const std::vector<float> left = sine(freq, in_rate, in_frames, 0.8f);
    const std::vector<float> right = sine(freq, in_rate, in_frames, 0.2f);
    std::vector<float> stereo(in_frames * 2);
    for (size_t i = 0; i < in_frames; ++i) {
        stereo[2 * i] = left[i];
        stereo[2 * i + 1] = right[i];
    }
    const std::string path = temp_path("stereo44k.wav");
    sndfile_write(path, SF_FORMAT_WAV | SF_FORMAT_FLOAT, in_rate, 2, stereo);

    const qtts::AudioData audio = qtts::audio_read(path);
    CHECK(audio.sample_rate == in_rate);
    CHECK(audio.source_channels == 2);
    REQUIRE(audio.samples.size() == in_frames);
    const std::vector<float> expected_mix = sine(freq, in_rate, in_frames, 0.5f);
    CHECK(qtts_test::max_abs_error(audio.samples.data(), expected_mix.data(), in_frames) < 1e-6);

    const std::vector<float> mono24 = qtts::audio_read_mono_24k(path);
    CHECK(mono24.size() == 48000);  // 2 s at 24 kHz
    CHECK(frequency_estimate(mono24, 24000) == Approx(freq).epsilon(1e-3));
    // Linear phase with the delay removed: the resampled signal lines up with an ideal 24 kHz sine.
    const std::vector<float> ideal = sine(freq, 24000, mono24.size(), 0.5f);
    const size_t edge = 2400;
    CHECK(qtts_test::max_abs_error(mono24.data() + edge, ideal.data() + edge, mono24.size() - 2 * edge) < 1e-3);
}

TEST_CASE("resampling lengths and rates", "[audio_file]") {
    const std::vector<float> x = qtts_test::random_floats(12345, 4);
    CHECK(qtts::audio_resample(x, 24000, 24000) == x);
    CHECK(qtts::audio_resample(x, 22050, 24000).size() == 13437);  // round(12345 * 24000 / 22050)
    CHECK(qtts::audio_resample(x, 48000, 24000).size() == 6173);   // round(6172.5) (half up)
    CHECK(qtts::audio_resample(x, 16000, 24000).size() == 18518);  // round(18517.5)
    CHECK(qtts::audio_resample({}, 16000, 24000).empty());
    const std::vector<float> low = sine(1000.0, 16000, 16000, 0.7f);
    const std::vector<float> up = qtts::audio_resample(low, 16000, 24000);
    CHECK(frequency_estimate(up, 24000) == Approx(1000.0).epsilon(1e-3));
    CHECK_THROWS_AS(qtts::audio_resample(x, 0, 24000), qtts::Error);
    CHECK_THROWS_AS(qtts::audio_resample(x, 24000, -5), qtts::Error);
}

TEST_CASE("FLAC and 16-bit WAV files are read", "[audio_file]") {
    const std::vector<float> x = sine(300.0, 24000, 24000, 0.5f);
    const std::string flac = temp_path("tone.flac");
    sndfile_write(flac, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 24000, 1, x);
    const qtts::AudioData a = qtts::audio_read(flac);
    CHECK(a.samples.size() == x.size());
    CHECK(qtts_test::max_abs_error(a.samples.data(), x.data(), x.size()) < 2.0 / 32767.0);
    CHECK(a.format_name.find("FLAC") != std::string::npos);

    const std::string wav = temp_path("tone16.wav");
    qtts::wav_write_file(wav, x, 24000, qtts::WavFormat::WAV_FORMAT_S16);
    const std::vector<float> back = qtts::audio_read_mono_24k(wav);
    CHECK(back.size() == x.size());
    CHECK(qtts_test::max_abs_error(back.data(), x.data(), x.size()) < 2.0 / 32767.0);
}

TEST_CASE("a caller's shorter limit refuses a longer file by its header, and a file at the limit reads", "[audio_file]") {
    // 8 kHz keeps the files small; the limit is in seconds whatever the rate.
    const int rate = 8000;
    const std::string longer = temp_path("31s.wav"), exact = temp_path("30s.wav");
    sndfile_write(longer, SF_FORMAT_WAV | SF_FORMAT_PCM_16, rate, 2, sine(440.0, rate, size_t(31 * rate) * 2, 0.3f));
    sndfile_write(exact, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, rate, 1, sine(440.0, rate, size_t(30 * rate), 0.3f));
    const std::string words = "31.0 s long; at most 30.0 s";
    require_error([&] { qtts::audio_read(longer, 30.0); }, longer, qtts::ErrorCode::ERROR_FORMAT, words);
    require_error([&] { qtts::audio_read_mono_24k(longer, 30.0); }, longer, qtts::ErrorCode::ERROR_FORMAT, words);
    // The default limit (an hour) takes it; the 30 s file passes a 30 s limit whole.
    CHECK(qtts::audio_read(longer).samples.size() == size_t(31 * rate));
    CHECK(qtts::audio_read(exact, 30.0).samples.size() == size_t(30 * rate));
    CHECK(qtts::audio_read_mono_24k(exact, 30.0).size() == size_t(30 * qtts::SAMPLE_RATE));
}

TEST_CASE("bad files give clear errors that name the file", "[audio_file]") {
    SECTION("missing") {
        require_read_error(temp_path("does-not-exist.wav"), qtts::ErrorCode::ERROR_NOT_FOUND, "does not exist");
    }
    SECTION("a folder") {
        const std::string dir = temp_path("a-folder.wav");
        std::filesystem::create_directories(dir);
        require_read_error(dir, qtts::ErrorCode::ERROR_IO, "folder");
    }
    SECTION("empty (0 bytes)") {
        const std::string path = temp_path("empty.wav");
        file_write_bytes(path, "");
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "empty");
    }
    SECTION("garbage bytes") {
        const std::string path = temp_path("garbage.wav");
        std::string bytes;
        for (int i = 0; i < 4096; ++i) bytes.push_back(char((i * 7919 + 13) & 0xFF));
        file_write_bytes(path, bytes);
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "not a readable audio file");
    }
    SECTION("a text file named .wav") {
        const std::string path = temp_path("text.wav");
        file_write_bytes(path, "hello, this is not audio\n");
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "not a readable audio file");
    }
    SECTION("a WAV cut inside its header") {
        const std::string path = temp_path("cut-header.wav");
        qtts::wav_write_file(path, qtts_test::random_floats(1000, 5));
        std::filesystem::resize_file(path, 30);
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "not a readable audio file");
    }
    SECTION("a WAV cut inside its data") {
        const std::string path = temp_path("cut-data.wav");
        qtts::wav_write_file(path, qtts_test::random_floats(24000, 6));
        std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "truncated");
    }
    SECTION("a FLAC cut in the middle") {
        const std::string path = temp_path("cut.flac");
        sndfile_write(path, SF_FORMAT_FLAC | SF_FORMAT_PCM_16, 24000, 1, qtts_test::random_floats(48000, 7));
        std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
        try {
            qtts::audio_read(path);
            FAIL("expected an error");
        } catch (const qtts::Error& e) {
            CHECK(e.code() == qtts::ErrorCode::ERROR_FORMAT);
            CHECK(std::string(e.what()).find(path) != std::string::npos);
        }
    }
    SECTION("a FLAC header announcing an hour at 768 kHz, with no audio") {
        // Found by fuzz_audio_file (tests/fuzz): the samples were allocated from the header's
        // claim, 11 GB for these 42 bytes. Memory now grows with what decodes.
        const uint64_t frames = 3600ull * 768000 - 1;
        const uint64_t packed = (uint64_t(768000) << 44) | (uint64_t(16 - 1) << 36) | frames;  // mono, 16-bit
        std::string streaminfo = {0x10, 0x00, 0x10, 0x00, 0, 0, 0, 0, 0, 0};  // block sizes 4096, frame sizes unknown
        for (int i = 7; i >= 0; --i) streaminfo.push_back(char((packed >> (8 * i)) & 0xFF));
        streaminfo.append(16, '\0');  // no MD5
        const std::string path = temp_path("hour-header-only.flac");
        file_write_bytes(path, std::string("fLaC") + char(0x80) + std::string({0, 0, char(streaminfo.size())}) + streaminfo);
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "truncated or corrupt");
    }
    SECTION("a valid WAV with zero samples") {
        const std::string path = temp_path("zero-length.wav");
        qtts::wav_write_file(path, {});
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "no audio");
    }
    SECTION("NaN samples in a float WAV") {
        const std::string path = temp_path("nan.wav");
        std::vector<float> x = qtts_test::random_floats(100, 8);
        x[50] = std::nanf("");
        sndfile_write(path, SF_FORMAT_WAV | SF_FORMAT_FLOAT, 24000, 1, x);
        require_read_error(path, qtts::ErrorCode::ERROR_FORMAT, "NaN");
    }
    SECTION("an empty path") {
        CHECK_THROWS_AS(qtts::audio_read(""), qtts::Error);
    }
}
