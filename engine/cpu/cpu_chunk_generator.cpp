#include "engine/cpu/cpu_chunk_generator.h"

#include "engine/common/error.h"

namespace qtts {

ChunkStatus CpuChunkGenerator::chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) {
    QTTS_ASSERT(frames >= 1 && codes && pcm);
    chunk_.clear();
    ChunkStatus status = ChunkStatus::CHUNK_STATUS_FULL;
    FrameCodes frame{};
    while (int(chunk_.size()) < frames) {
        const FrameStatus s = generator_->next_frame(frame);
        if (s == FrameStatus::FRAME_STATUS_FRAME) {
            chunk_.push_back(frame);
            continue;
        }
        status = s == FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT ? ChunkStatus::CHUNK_STATUS_WAITING_FOR_TEXT
                                                                  : ChunkStatus::CHUNK_STATUS_DONE;
        break;
    }
    return chunk_emit(status, codes, pcm);
}

ChunkStatus CpuChunkGenerator::chunk_emit(ChunkStatus status, std::vector<FrameCodes>* codes, std::vector<float>* pcm) {
    decoder_->frames_decode(chunk_.data(), int(chunk_.size()), pcm);
    codes->insert(codes->end(), chunk_.begin(), chunk_.end());
    return status;
}

void CpuChunkGenerator::reference_decode(const int32_t* codes, int frames) {
    std::vector<float> discarded;
    discarded.reserve(size_t(frames) * SAMPLES_PER_FRAME);
    decoder_->decode(codes, frames, &discarded);
}

}  // namespace qtts
