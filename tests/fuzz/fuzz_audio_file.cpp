// Fuzz target: reading a reference-audio file (libsndfile decodes WAV, FLAC, Ogg, AIFF, ...;
// qtts checks channels, rate, truncation, length and sample values, mixes to mono and
// resamples to 24 kHz).
#include <cmath>

#include "audio_io/audio_file.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static qtts::fuzz::MemoryFile file("fuzz.audio");
    const std::string& path = file.write(data, size);
    try {
        const qtts::AudioData audio = qtts::audio_read(path);
        qtts::fuzz::property(!audio.samples.empty(), "an accepted file has samples");
        for (float x : audio.samples) qtts::fuzz::property(std::isfinite(x), "samples are finite");
        // Resampling a few seconds is cheap; longer accepted files only cost time.
        if (audio.duration_s() < 5.0) qtts::audio_resample(audio.samples, audio.sample_rate, 24000);
    } catch (const qtts::Error& e) {
        qtts::fuzz::error_check(e);
    }
    return 0;
}
