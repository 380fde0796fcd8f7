// The speech decoder as one utterance sees it: a stream of codes in, PCM out, on whichever
// backend the model decodes with. Utterance decodes on the CPU reference (cpu::CpuSpeechDecoder
// with its own DecoderState) unless the model hands it one of these, which on the CUDA backend
// wraps a pooled GPU decoder state (cuda/gpu_decoder_pool.h). Both stream exactly, so chunking
// does not change the samples; GPU vs CPU agree to float rounding (docs/cuda.md).
// Not thread-safe: the thread that got it (the engine thread) drives and destroys it.
#pragma once

#include <cstdint>
#include <vector>

namespace qtts {

class DecoderStream {
public:
    virtual ~DecoderStream() = default;
    // Decodes n frames (codes [n, 16] row-major, host memory) following everything decoded on
    // this stream and appends n × 1920 samples to *pcm (on the host when it returns).
    virtual void decode(const int32_t* codes, int n, std::vector<float>* pcm) = 0;
};

}  // namespace qtts
