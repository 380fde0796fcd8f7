// The fast CPU backend behind the runtime's ChunkGenerator interface
// (engine/generation/chunk_generator.h): the CPU backends' chunk loop (cpu::CpuChunkGenerator)
// with cpu_fast::FastGenerator for the codes and, for the audio, this utterance's own stream of
// the fast speech decoder (FastLm::decoder), or of the fp32 reference decoder when the model has
// no fast one. It batches: SpeechModel::batch_run makes the next chunk's frames of several
// such generators in one cpu_fast::FastBatchStep (batch_computed), and chunk() then emits and
// decodes them.
#pragma once

#include <vector>

#include "engine/cpu/cpu_chunk_generator.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/cpu_fast/fast_generator.h"
#include "engine/cpu_fast/fast_speech_decoder.h"

namespace qtts {

class FastChunkGenerator final : public CpuChunkGenerator {
public:
    // `reference_decoder` (used when lm.decoder is null) and lm.decoder must outlive the generator.
    FastChunkGenerator(const cpu_fast::FastLm& lm, const cpu::CpuSpeechDecoder& reference_decoder);

    bool batch_ready(int frames) override;
    int frames_left() const override;
    // The frames a batched step made for this chunk, when one did; else made here.
    ChunkStatus chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) override;

    // generator(), which this class made a FastGenerator.
    cpu_fast::FastGenerator& fast_generator() { return static_cast<cpu_fast::FastGenerator&>(generator()); }
    // A batched step made `made` (≤ frames; fewer: the segment stopped) for the next chunk(frames).
    void batch_computed(std::vector<FrameCodes>& made, int frames);

private:
    std::vector<FrameCodes> batched_;  // the frames of the next chunk, made by a batched step
    int batched_frames_ = 0;           // the step's size; 0: none pending
};

}  // namespace qtts
