// Log-mel front end of the Base models' speaker encoder (spec §11), fp32 on the CPU.
//
// What it computes, in the reference's order: reflect-pad (n_fft - hop) / 2 samples on both
// sides; STFT without centring (periodic Hann window, n_fft-point real FFT, hop `hop`);
// magnitude sqrt(re² + im² + 1e-9); a Slaney-scale, Slaney-normalised triangular mel filterbank
// (librosa's formula, computed in double, stored as float); log(max(mel, 1e-5)).
// Output is time-major [frames, n_mels] with frames = floor(num_samples / hop).
//
// FFTs go through FFTW (fftw3f). A plan is made once per MelSpectrogram and executed with the
// new-array interface on per-call buffers, so compute() is const and safe to call from several
// threads at once. FFTW's planner itself is not thread-safe: every plan creation or destruction
// in qtts must hold fftw_planner_mutex().
#pragma once

#include <cstddef>
#include <mutex>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts::cpu {

struct MelConfig {
    int sample_rate = SAMPLE_RATE;
    int n_fft = 1024;
    int hop = 256;
    int win = 1024;  // Hann window length (== n_fft in every released model)
    int n_mels = 128;
    double fmin = 0.0;
    double fmax = 12000.0;
};

// The one lock around FFTW's (global, non-thread-safe) planner.
std::mutex& fftw_planner_mutex();

// Slaney mel filterbank [n_mels, n_fft/2 + 1], row m = filter m over the FFT bins (as librosa's
// `filters.mel(htk=False, norm="slaney")`).
std::vector<float> mel_filterbank_slaney(int sample_rate, int n_fft, int n_mels, double fmin, double fmax);

// Periodic Hann window of length n (torch.hann_window default).
std::vector<float> hann_window_periodic(int n);

// Longest reference clip the cloning front ends accept (10 minutes at 24 kHz): cloning needs a
// few seconds, and this keeps every intermediate's size and index well inside int range.
constexpr size_t kReferenceAudioMaxSamples = size_t(SAMPLE_RATE) * 600;

// Checks a reference clip before any network sees it: at least `min_samples` samples (what the
// caller's padding and framing need), at most kReferenceAudioMaxSamples, every sample finite.
// Throws ERROR_INVALID_ARGUMENT naming `what` (e.g. "speaker encoder"), the problem and what is
// accepted.
void reference_audio_validate(const float* audio, size_t num_samples, size_t min_samples, const char* what);

struct MelOutput {
    int frames = 0;
    int n_mels = 0;
    std::vector<float> values;  // [frames, n_mels]
};

class MelSpectrogram {
public:
    // Validates the config (positive sizes, win <= n_fft, 0 <= fmin < fmax <= sample_rate / 2)
    // and builds the window, filterbank and FFT plan. Throws qtts::Error on a bad config.
    explicit MelSpectrogram(const MelConfig& config = MelConfig());
    ~MelSpectrogram();
    MelSpectrogram(const MelSpectrogram&) = delete;
    MelSpectrogram& operator=(const MelSpectrogram&) = delete;

    const MelConfig& config() const { return config_; }
    const std::vector<float>& filterbank() const { return filterbank_; }  // [n_mels, n_fft/2 + 1]

    // Smallest clip compute() accepts: more samples than the reflect pad (the reflection needs
    // them) and at least one frame.
    size_t min_samples() const;
    // floor(num_samples / hop).
    int frame_count(size_t num_samples) const;

    // audio: mono float samples at config().sample_rate. Throws ERROR_INVALID_ARGUMENT for a
    // clip shorter than min_samples() or with a NaN/Inf sample.
    MelOutput compute(const float* audio, size_t num_samples) const;

private:
    MelConfig config_;
    int pad_ = 0;                     // (n_fft - hop) / 2 reflect padding on each side
    std::vector<float> window_;       // [n_fft] Hann of length win, centred, zero elsewhere
    std::vector<float> filterbank_;   // [n_mels, n_fft/2 + 1]
    void* plan_ = nullptr;            // fftwf_plan (r2c, n_fft), owned
};

}  // namespace qtts::cpu
