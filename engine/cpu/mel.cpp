#include "engine/cpu/mel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include <cblas.h>
#include <fftw3.h>

#include "engine/common/error.h"

namespace qtts::cpu {

namespace {

// Slaney's mel scale (librosa htk=False): linear below 1 kHz (200/3 Hz per mel), logarithmic
// above (27 mels per factor 6.4).
constexpr double kSlaneyHzPerMel = 200.0 / 3.0;
constexpr double kSlaneyBreakHz = 1000.0;
constexpr double kSlaneyBreakMel = kSlaneyBreakHz / kSlaneyHzPerMel;  // 15

double slaney_log_step() { return std::log(6.4) / 27.0; }

double hz_to_mel_slaney(double hz) {
    if (hz >= kSlaneyBreakHz) return kSlaneyBreakMel + std::log(hz / kSlaneyBreakHz) / slaney_log_step();
    return hz / kSlaneyHzPerMel;
}

double mel_to_hz_slaney(double mel) {
    if (mel >= kSlaneyBreakMel) return kSlaneyBreakHz * std::exp(slaney_log_step() * (mel - kSlaneyBreakMel));
    return mel * kSlaneyHzPerMel;
}

struct FftwFree {
    void operator()(void* p) const { fftwf_free(p); }
};
template <typename T>
using FftwBuffer = std::unique_ptr<T, FftwFree>;

}  // namespace

std::mutex& fftw_planner_mutex() {
    static std::mutex mutex;
    return mutex;
}

std::vector<float> mel_filterbank_slaney(int sample_rate, int n_fft, int n_mels, double fmin, double fmax) {
    const int n_bins = n_fft / 2 + 1;
    // Band edges: n_mels + 2 points evenly spaced on the mel scale, back in Hz.
    std::vector<double> edges_hz(size_t(n_mels) + 2);
    const double mel_lo = hz_to_mel_slaney(fmin), mel_hi = hz_to_mel_slaney(fmax);
    for (int i = 0; i < n_mels + 2; ++i) {
        const double mel = mel_lo + (mel_hi - mel_lo) * double(i) / double(n_mels + 1);
        edges_hz[size_t(i)] = mel_to_hz_slaney(mel);
    }
    std::vector<double> bin_hz(static_cast<size_t>(n_bins));
    for (int k = 0; k < n_bins; ++k) bin_hz[size_t(k)] = double(sample_rate) / 2.0 * double(k) / double(n_bins - 1);

    std::vector<float> bank(size_t(n_mels) * n_bins, 0.0f);
    for (int m = 0; m < n_mels; ++m) {
        const double lo = edges_hz[size_t(m)], mid = edges_hz[size_t(m) + 1], hi = edges_hz[size_t(m) + 2];
        // Slaney normalisation: each triangle has unit area in Hz (height 2 / bandwidth).
        const double norm = 2.0 / (hi - lo);
        for (int k = 0; k < n_bins; ++k) {
            const double f = bin_hz[size_t(k)];
            const double rising = (f - lo) / (mid - lo);
            const double falling = (hi - f) / (hi - mid);
            const double w = std::max(0.0, std::min(rising, falling));
            bank[size_t(m) * n_bins + size_t(k)] = float(w * norm);
        }
    }
    return bank;
}

std::vector<float> hann_window_periodic(int n) {
    std::vector<float> w(size_t(std::max(n, 0)));
    const double two_pi = 6.283185307179586476925286766559;
    for (int i = 0; i < n; ++i) w[size_t(i)] = float(0.5 - 0.5 * std::cos(two_pi * double(i) / double(n)));
    return w;
}

void reference_audio_validate(const float* audio, size_t num_samples, size_t min_samples, const char* what) {
    if (num_samples == 0 || audio == nullptr)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}: the reference audio is empty (needs at least {} samples)", what,
             min_samples);
    if (num_samples < min_samples)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "{}: the reference audio is too short: {} samples, needs at least {} samples", what, num_samples,
             min_samples);
    if (num_samples > kReferenceAudioMaxSamples)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "{}: the reference audio is too long: {} samples, at most {} samples (600 s at 24 kHz) are accepted",
             what, num_samples, kReferenceAudioMaxSamples);
    for (size_t i = 0; i < num_samples; ++i) {
        if (!std::isfinite(audio[i]))
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "{}: the reference audio has a non-finite sample ({}) at index {}; only finite samples are accepted",
                 what, audio[i], i);
    }
}

MelSpectrogram::MelSpectrogram(const MelConfig& config) : config_(config) {
    const MelConfig& c = config_;
    if (c.sample_rate <= 0 || c.n_fft <= 1 || c.hop <= 0 || c.win <= 0 || c.n_mels <= 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "mel config: sample_rate {}, n_fft {}, hop {}, win {}, n_mels {}: all must be positive (n_fft > 1)",
             c.sample_rate, c.n_fft, c.hop, c.win, c.n_mels);
    if (c.win > c.n_fft)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "mel config: window length {} exceeds n_fft {}", c.win, c.n_fft);
    if (c.hop > c.n_fft)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "mel config: hop {} exceeds n_fft {}", c.hop, c.n_fft);
    if (!(c.fmin >= 0.0 && c.fmin < c.fmax && c.fmax <= c.sample_rate / 2.0))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "mel config: need 0 <= fmin ({}) < fmax ({}) <= sample_rate/2 ({})",
             c.fmin, c.fmax, c.sample_rate / 2.0);

    pad_ = (c.n_fft - c.hop) / 2;
    // torch.stft centres a shorter window inside the n_fft frame.
    window_.assign(size_t(c.n_fft), 0.0f);
    const std::vector<float> hann = hann_window_periodic(c.win);
    const int offset = (c.n_fft - c.win) / 2;
    std::copy(hann.begin(), hann.end(), window_.begin() + offset);
    filterbank_ = mel_filterbank_slaney(c.sample_rate, c.n_fft, c.n_mels, c.fmin, c.fmax);

    const int n_bins = c.n_fft / 2 + 1;
    FftwBuffer<float> in(static_cast<float*>(fftwf_malloc(sizeof(float) * size_t(c.n_fft))));
    FftwBuffer<fftwf_complex> out(static_cast<fftwf_complex*>(fftwf_malloc(sizeof(fftwf_complex) * size_t(n_bins))));
    if (!in || !out) fail(ErrorCode::ERROR_INTERNAL, "mel: cannot allocate FFT buffers of {} points", c.n_fft);
    {
        std::lock_guard<std::mutex> lock(fftw_planner_mutex());
        plan_ = fftwf_plan_dft_r2c_1d(c.n_fft, in.get(), out.get(), FFTW_ESTIMATE);
    }
    if (!plan_) fail(ErrorCode::ERROR_INTERNAL, "mel: FFTW could not plan a {}-point real FFT", c.n_fft);
}

MelSpectrogram::~MelSpectrogram() {
    if (plan_) {
        std::lock_guard<std::mutex> lock(fftw_planner_mutex());
        fftwf_destroy_plan(static_cast<fftwf_plan>(plan_));
    }
}

size_t MelSpectrogram::min_samples() const {
    // Reflection of `pad_` samples needs pad_ + 1 samples; one frame needs n_fft padded samples.
    const size_t for_reflect = size_t(pad_) + 1;
    const long for_frame = long(config_.n_fft) - 2L * pad_;
    return std::max(for_reflect, size_t(std::max(for_frame, 1L)));
}

int MelSpectrogram::frame_count(size_t num_samples) const {
    const long padded = long(num_samples) + 2L * pad_;
    if (padded < config_.n_fft) return 0;
    return int((padded - config_.n_fft) / config_.hop + 1);
}

MelOutput MelSpectrogram::compute(const float* audio, size_t num_samples) const {
    const MelConfig& c = config_;
    reference_audio_validate(audio, num_samples, min_samples(), "mel spectrogram");
    const int frames = frame_count(num_samples);
    const int n_bins = c.n_fft / 2 + 1;
    const long N = long(num_samples);

    // Reflect padding (the edge sample is not repeated, as torch's "reflect").
    std::vector<float> padded(size_t(N + 2L * pad_));
    std::memcpy(padded.data() + pad_, audio, sizeof(float) * num_samples);
    for (int i = 0; i < pad_; ++i) {
        padded[size_t(pad_ - 1 - i)] = audio[i + 1];
        padded[size_t(pad_ + N + i)] = audio[N - 2 - i];
    }

    // Magnitude spectrogram, time-major [frames, n_bins].
    std::vector<float> magnitude(size_t(frames) * n_bins);
    FftwBuffer<float> in(static_cast<float*>(fftwf_malloc(sizeof(float) * size_t(c.n_fft))));
    FftwBuffer<fftwf_complex> out(static_cast<fftwf_complex*>(fftwf_malloc(sizeof(fftwf_complex) * size_t(n_bins))));
    if (!in || !out) fail(ErrorCode::ERROR_INTERNAL, "mel: cannot allocate FFT buffers of {} points", c.n_fft);
    for (int t = 0; t < frames; ++t) {
        const float* frame = padded.data() + size_t(t) * c.hop;
        for (int i = 0; i < c.n_fft; ++i) in.get()[i] = frame[i] * window_[size_t(i)];
        fftwf_execute_dft_r2c(static_cast<fftwf_plan>(plan_), in.get(), out.get());
        float* row = magnitude.data() + size_t(t) * n_bins;
        for (int k = 0; k < n_bins; ++k) {
            const float re = out.get()[k][0], im = out.get()[k][1];
            row[k] = std::sqrt(re * re + im * im + 1e-9f);
        }
    }

    // mel [frames, n_mels] = magnitude [frames, n_bins] · filterbankᵀ, then log compression.
    MelOutput result;
    result.frames = frames;
    result.n_mels = c.n_mels;
    result.values.resize(size_t(frames) * c.n_mels);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, frames, c.n_mels, n_bins, 1.0f, magnitude.data(), n_bins,
                filterbank_.data(), n_bins, 0.0f, result.values.data(), c.n_mels);
    for (float& v : result.values) v = std::log(std::max(v, 1e-5f));
    return result;
}

}  // namespace qtts::cpu
