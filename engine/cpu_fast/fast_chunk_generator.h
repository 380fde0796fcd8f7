// The fast CPU backend behind the runtime's ChunkGenerator interface
// (engine/generation/chunk_generator.h): the CPU backends' chunk loop (cpu::CpuChunkGenerator)
// with cpu_fast::FastGenerator for the codes and, for the audio, this utterance's own stream of
// the fast speech decoder (FastLm::decoder), or of the fp32 reference decoder when the model has
// no fast one.
#pragma once

#include "engine/cpu/cpu_chunk_generator.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/cpu_fast/fast_generator.h"
#include "engine/cpu_fast/fast_speech_decoder.h"

namespace qtts {

class FastChunkGenerator final : public CpuChunkGenerator {
public:
    // `reference_decoder` (used when lm.decoder is null) and lm.decoder must outlive the generator.
    FastChunkGenerator(const cpu_fast::FastLm& lm, const cpu::CpuSpeechDecoder& reference_decoder);
};

}  // namespace qtts
