// The log-mel front end of the speaker encoder against an independent, deliberately naive
// implementation written here (double-precision DFT, librosa's Slaney formulas restated), plus
// analytic checks (tone energy, Slaney normalisation), framing, thread safety and input errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/mel.h"
#include "test_errors.h"
#include "test_support.h"

namespace {

using qtts_test::require_error;

using qtts::cpu::MelConfig;
using qtts::cpu::MelOutput;
using qtts::cpu::MelSpectrogram;

constexpr double kPi = 3.14159265358979323846;

// Slaney mel scale, written as a single piecewise expression (independent of the library's).
double slaney_mel(double hz) { return hz < 1000.0 ? 3.0 * hz / 200.0 : 15.0 + 27.0 * std::log(hz / 1000.0) / std::log(6.4); }
double slaney_hz(double mel) { return mel < 15.0 ? 200.0 * mel / 3.0 : 1000.0 * std::pow(6.4, (mel - 15.0) / 27.0); }

// Filter m evaluated at frequency f (Hz), Slaney-normalised.
double reference_filter(int m, double f, int n_mels, double fmin, double fmax) {
    auto edge = [&](int i) {
        return slaney_hz(slaney_mel(fmin) + (slaney_mel(fmax) - slaney_mel(fmin)) * i / (n_mels + 1.0));
    };
    const double lo = edge(m), mid = edge(m + 1), hi = edge(m + 2);
    double tri = 0.0;
    if (f > lo && f <= mid) tri = (f - lo) / (mid - lo);
    else if (f > mid && f < hi) tri = (hi - f) / (hi - mid);
    return tri * 2.0 / (hi - lo);
}

// Naive log-mel: reflect pad, periodic Hann, O(N²) DFT in double, filterbank from the formula.
std::vector<double> reference_log_mel(const std::vector<float>& audio, const MelConfig& c, int* frames_out) {
    const int pad = (c.n_fft - c.hop) / 2;
    const int N = int(audio.size());
    std::vector<double> padded;
    for (int i = pad; i >= 1; --i) padded.push_back(audio[size_t(i)]);
    for (float v : audio) padded.push_back(v);
    for (int i = 1; i <= pad; ++i) padded.push_back(audio[size_t(N - 1 - i)]);
    const int frames = (int(padded.size()) - c.n_fft) / c.hop + 1;
    const int n_bins = c.n_fft / 2 + 1;
    std::vector<double> bank(size_t(c.n_mels) * n_bins);
    for (int m = 0; m < c.n_mels; ++m)
        for (int k = 0; k < n_bins; ++k)
            bank[size_t(m) * n_bins + k] = reference_filter(m, double(k) * c.sample_rate / c.n_fft, c.n_mels, c.fmin, c.fmax);
    std::vector<double> out(size_t(frames) * c.n_mels);
    std::vector<double> mag(static_cast<size_t>(n_bins));
    for (int t = 0; t < frames; ++t) {
        for (int k = 0; k < n_bins; ++k) {
            double re = 0.0, im = 0.0;
            for (int n = 0; n < c.n_fft; ++n) {
                const double w = 0.5 * (1.0 - std::cos(2.0 * kPi * n / c.n_fft));
                const double x = padded[size_t(t) * c.hop + n] * w;
                const double phase = -2.0 * kPi * double(k) * n / c.n_fft;
                re += x * std::cos(phase);
                im += x * std::sin(phase);
            }
            mag[size_t(k)] = std::sqrt(re * re + im * im + 1e-9);
        }
        for (int m = 0; m < c.n_mels; ++m) {
            double s = 0.0;
            for (int k = 0; k < n_bins; ++k) s += bank[size_t(m) * n_bins + k] * mag[size_t(k)];
            out[size_t(t) * c.n_mels + m] = std::log(std::max(s, 1e-5));
        }
    }
    *frames_out = frames;
    return out;
}

}  // namespace

TEST_CASE("mel filterbank matches the Slaney formula", "[mel]") {
    const MelConfig c;
    const std::vector<float> bank = qtts::cpu::mel_filterbank_slaney(c.sample_rate, c.n_fft, c.n_mels, c.fmin, c.fmax);
    const int n_bins = c.n_fft / 2 + 1;
    REQUIRE(bank.size() == size_t(c.n_mels) * n_bins);
    double max_err = 0.0, max_val = 0.0;
    for (int m = 0; m < c.n_mels; ++m) {
        int nonzero = 0;
        for (int k = 0; k < n_bins; ++k) {
            const double expected = reference_filter(m, double(k) * c.sample_rate / c.n_fft, c.n_mels, c.fmin, c.fmax);
            const double got = bank[size_t(m) * n_bins + k];
            max_err = std::max(max_err, std::fabs(got - expected));
            max_val = std::max(max_val, std::fabs(expected));
            CHECK(got >= 0.0f);
            nonzero += got > 0.0f;
        }
        CHECK(nonzero >= 1);  // 128 filters over 513 bins: every filter catches a bin
    }
    INFO("max abs filterbank error " << max_err << " (max value " << max_val << ")");
    CHECK(max_err <= 1e-6 * max_val);
}

TEST_CASE("mel of random audio matches a naive double-precision implementation", "[mel]") {
    const MelConfig c;
    MelSpectrogram mel(c);
    for (size_t n : {size_t(385), size_t(1000), size_t(3001)}) {
        const std::vector<float> audio = qtts_test::random_floats(n, 1234 + n, -0.8f, 0.8f);
        const MelOutput got = mel.compute(audio.data(), audio.size());
        int frames = 0;
        const std::vector<double> expected = reference_log_mel(audio, c, &frames);
        REQUIRE(got.frames == frames);
        REQUIRE(got.frames == int(n / 256));
        REQUIRE(got.n_mels == 128);
        double max_err = 0.0;
        for (size_t i = 0; i < expected.size(); ++i)
            max_err = std::max(max_err, std::fabs(double(got.values[i]) - expected[i]));
        INFO("N = " << n << ": max abs log-mel error " << max_err);
        CHECK(max_err < 1e-4);
    }
}

TEST_CASE("mel of a bin-centred tone has the analytic energy", "[mel]") {
    // A sinusoid on FFT bin k0 with amplitude A has |X[k0]| = A·N/4 and |X[k0±1]| = A·N/8 under a
    // periodic Hann window (its spectrum is 1/2, -1/4, -1/4); every other bin is ~0.
    const MelConfig c;
    MelSpectrogram mel(c);
    const int k0 = 100;
    const double A = 0.5;
    std::vector<float> audio(24000);
    for (size_t i = 0; i < audio.size(); ++i) audio[i] = float(A * std::sin(2.0 * kPi * k0 * double(i) / c.n_fft));
    const MelOutput got = mel.compute(audio.data(), audio.size());
    const std::vector<float>& bank = mel.filterbank();
    const int n_bins = c.n_fft / 2 + 1;
    const double floor_mag = std::sqrt(1e-9);
    const int t = got.frames / 2;  // far from the reflected edges
    for (int m = 0; m < c.n_mels; ++m) {
        double expected = 0.0;
        for (int k = 0; k < n_bins; ++k) {
            double mag = floor_mag;
            if (k == k0) mag = A * c.n_fft / 4.0;
            if (k == k0 - 1 || k == k0 + 1) mag = A * c.n_fft / 8.0;
            expected += double(bank[size_t(m) * n_bins + k]) * mag;
        }
        expected = std::log(std::max(expected, 1e-5));
        const double value = got.values[size_t(t) * c.n_mels + m];
        if (expected > 0.0) CHECK(std::fabs(value - expected) < 1e-3);
    }
    // The loudest filter is the one whose band holds the tone.
    const float* row = got.values.data() + size_t(t) * c.n_mels;
    const int loudest = int(std::max_element(row, row + c.n_mels) - row);
    CHECK(bank[size_t(loudest) * n_bins + k0] > 0.0f);
}

TEST_CASE("mel frame count is floor(N / hop)", "[mel]") {
    MelSpectrogram mel;
    CHECK(mel.min_samples() == 385);
    for (size_t n : {size_t(385), size_t(511), size_t(512), size_t(513), size_t(38400), size_t(38401)}) {
        CHECK(mel.frame_count(n) == int(n / 256));
        const std::vector<float> audio = qtts_test::random_floats(n, n);
        CHECK(mel.compute(audio.data(), n).frames == int(n / 256));
    }
}

TEST_CASE("mel is safe to compute from several threads", "[mel]") {
    const std::vector<float> audio = qtts_test::random_floats(24000, 7);
    MelSpectrogram shared;
    const MelOutput serial = shared.compute(audio.data(), audio.size());
    std::vector<MelOutput> results(4);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < results.size(); ++i) {
        threads.emplace_back([&, i] {
            // Even threads share one instance; odd ones plan their own (exercises the planner lock).
            if (i % 2 == 0) {
                results[i] = shared.compute(audio.data(), audio.size());
            } else {
                MelSpectrogram own;
                results[i] = own.compute(audio.data(), audio.size());
            }
        });
    }
    for (auto& t : threads) t.join();
    for (const MelOutput& r : results) {
        REQUIRE(r.frames == serial.frames);
        CHECK(qtts_test::max_abs_error(r.values.data(), serial.values.data(), r.values.size()) == 0.0);
    }
}

TEST_CASE("mel rejects unusable audio with clear errors", "[mel][errors]") {
    MelSpectrogram mel;
    using qtts::ErrorCode;
    std::vector<float> audio = qtts_test::random_floats(2000, 3);
    require_error([&] { mel.compute(audio.data(), 0); }, ErrorCode::ERROR_INVALID_ARGUMENT, "empty");
    require_error([&] { mel.compute(nullptr, 100); }, ErrorCode::ERROR_INVALID_ARGUMENT, "empty");
    require_error([&] { mel.compute(audio.data(), 384); }, ErrorCode::ERROR_INVALID_ARGUMENT, "too short");
    audio[1500] = std::numeric_limits<float>::quiet_NaN();
    require_error([&] { mel.compute(audio.data(), audio.size()); }, ErrorCode::ERROR_INVALID_ARGUMENT, "index 1500");
    audio[1500] = 0.0f;
    audio[7] = -std::numeric_limits<float>::infinity();
    require_error([&] { mel.compute(audio.data(), audio.size()); }, ErrorCode::ERROR_INVALID_ARGUMENT, "non-finite");
    std::vector<float> too_long(qtts::cpu::kReferenceAudioMaxSamples + 1, 0.0f);
    require_error([&] { mel.compute(too_long.data(), too_long.size()); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "too long");
}

TEST_CASE("mel rejects a bad config", "[mel][errors]") {
    using qtts::ErrorCode;
    MelConfig c;
    c.win = 2048;
    require_error([&] { MelSpectrogram m(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "window length");
    c = MelConfig();
    c.fmax = 13000.0;
    require_error([&] { MelSpectrogram m(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "fmax");
    c = MelConfig();
    c.n_mels = 0;
    require_error([&] { MelSpectrogram m(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "positive");
    c = MelConfig();
    c.hop = 2048;
    require_error([&] { MelSpectrogram m(c); }, ErrorCode::ERROR_INVALID_ARGUMENT, "hop");
}
