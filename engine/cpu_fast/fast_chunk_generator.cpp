#include "engine/cpu_fast/fast_chunk_generator.h"

#include <memory>

#include "engine/common/error.h"

namespace qtts {

namespace {

std::unique_ptr<DecoderStream> decoder_stream_new(const cpu_fast::FastLm& lm, const cpu::CpuSpeechDecoder& reference) {
    if (lm.decoder) return std::make_unique<cpu_fast::FastDecoderStream>(*lm.decoder);
    return std::make_unique<CpuDecoderStream>(reference);
}

}  // namespace

FastChunkGenerator::FastChunkGenerator(const cpu_fast::FastLm& lm, const cpu::CpuSpeechDecoder& reference_decoder)
    : CpuChunkGenerator(std::make_unique<cpu_fast::FastGenerator>(lm), decoder_stream_new(lm, reference_decoder)) {}

bool FastChunkGenerator::batch_ready(int frames) {
    QTTS_ASSERT(batched_frames_ == 0);  // the last step's chunk was emitted
    return fast_generator().batch_ready(frames);
}

int FastChunkGenerator::frames_left() const { return generator().frame_limit() - frames_emitted(); }

void FastChunkGenerator::batch_computed(std::vector<FrameCodes>& made, int frames) {
    QTTS_ASSERT(batched_frames_ == 0 && frames >= 1 && int(made.size()) <= frames);
    batched_.swap(made);
    batched_frames_ = frames;
}

ChunkStatus FastChunkGenerator::chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) {
    if (batched_frames_ == 0) return CpuChunkGenerator::chunk(frames, codes, pcm);
    QTTS_ASSERT(frames == batched_frames_ && codes && pcm);
    batched_frames_ = 0;
    chunk_frames().swap(batched_);
    // Fewer frames than the step made: this generator stopped inside it.
    const ChunkStatus status =
        int(chunk_frames().size()) == frames ? ChunkStatus::CHUNK_STATUS_FULL : ChunkStatus::CHUNK_STATUS_DONE;
    return chunk_emit(status, codes, pcm);
}

}  // namespace qtts
