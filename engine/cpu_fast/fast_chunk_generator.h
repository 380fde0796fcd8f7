// The fast CPU backend behind the runtime's ChunkGenerator interface
// (engine/generation/chunk_generator.h): cpu_fast::FastGenerator for the codes, and for the audio
// this utterance's own stream of the fast speech decoder (FastLm::decoder), or of the fp32
// reference decoder when the model has no fast one. The same shape as the reference's
// CpuChunkGenerator.
#pragma once

#include <memory>
#include <vector>

#include "engine/cpu/cpu_chunk_generator.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/cpu_fast/fast_generator.h"
#include "engine/cpu_fast/fast_speech_decoder.h"
#include "engine/generation/chunk_generator.h"

namespace qtts {

class FastChunkGenerator final : public ChunkGenerator {
public:
    // `reference_decoder` (used when lm.decoder is null) and lm.decoder must outlive the generator.
    FastChunkGenerator(cpu_fast::FastLm lm, const cpu::CpuSpeechDecoder& reference_decoder);

    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) override {
        generator_.start(prompt, params, seed);
    }
    ChunkStatus chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) override;
    void text_append(const int32_t* ids, size_t n) override { generator_.text_append(ids, n); }
    void text_close() override { generator_.text_close(); }
    StopReason stop_reason() const override { return generator_.stop_reason(); }
    int frames_emitted() const override { return generator_.frames_emitted(); }
    void reference_decode(const int32_t* codes, int frames) override;

    cpu_fast::FastGenerator& generator() { return generator_; }

private:
    cpu_fast::FastGenerator generator_;
    std::unique_ptr<DecoderStream> decoder_;
    std::vector<FrameCodes> chunk_;  // the frames of the chunk being made
};

}  // namespace qtts
