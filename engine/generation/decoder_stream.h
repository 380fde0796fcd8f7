// The speech decoder as one utterance's backend sees it: a stream of codes in, PCM out. The CPU
// backend wraps cpu::CpuSpeechDecoder with its own state (engine/cpu/cpu_chunk_generator.h);
// on CUDA it is a pooled GPU decoder state (cuda/gpu_decoder_pool.h), or the CPU one when the
// model was loaded with BackendOptions::gpu_decoder = false. A ChunkGenerator (chunk_generator.h)
// that does not decode its frames itself decodes them through one of these. Both stream exactly,
// so chunking does not change the samples; GPU vs CPU agree to float rounding (docs/cuda.md).
// Not thread-safe: the thread that got it (the engine thread) drives and destroys it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/generation/frame.h"

namespace qtts {

class DecoderStream {
public:
    virtual ~DecoderStream() = default;
    // Decodes n frames (codes [n, 16] row-major, host memory) following everything decoded on
    // this stream and appends n × SAMPLES_PER_FRAME samples to *pcm (on the host when it returns).
    virtual void decode(const int32_t* codes, int n, std::vector<float>* pcm) = 0;

    // The same for n frames as a generator emits them.
    void frames_decode(const FrameCodes* frames, int n, std::vector<float>* pcm) {
        if (n <= 0) return;
        flat_.resize(size_t(n) * MAX_CODE_GROUPS);
        for (int f = 0; f < n; ++f)
            std::copy(frames[f].begin(), frames[f].end(), flat_.begin() + long(f) * MAX_CODE_GROUPS);
        decode(flat_.data(), n, pcm);
    }

private:
    std::vector<int32_t> flat_;  // [n, 16] of the frames being decoded
};

}  // namespace qtts
