#include "engine/cpu_fast/fast_chunk_generator.h"

#include <memory>

namespace qtts {

namespace {

std::unique_ptr<DecoderStream> decoder_stream_new(const cpu_fast::FastLm& lm, const cpu::CpuSpeechDecoder& reference) {
    if (lm.decoder) return std::make_unique<cpu_fast::FastDecoderStream>(*lm.decoder);
    return std::make_unique<CpuDecoderStream>(reference);
}

}  // namespace

FastChunkGenerator::FastChunkGenerator(const cpu_fast::FastLm& lm, const cpu::CpuSpeechDecoder& reference_decoder)
    : CpuChunkGenerator(std::make_unique<cpu_fast::FastGenerator>(lm), decoder_stream_new(lm, reference_decoder)) {}

}  // namespace qtts
