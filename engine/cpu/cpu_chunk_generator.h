// The CPU reference backend behind the runtime's ChunkGenerator interface
// (engine/generation/chunk_generator.h): cpu::Generator for the codes, the CPU speech decoder
// (cpu::CpuSpeechDecoder with this utterance's own state) for the audio.
#pragma once

#include <memory>
#include <vector>

#include "engine/cpu/generator.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/generation/chunk_generator.h"
#include "engine/generation/decoder_stream.h"

namespace qtts {

// The CPU speech decoder as a DecoderStream: the shared decoder and one utterance's state. Also
// what the CUDA backend decodes with when the model was loaded with gpu_decoder = false (the
// runtime hands it over; engine/cuda never sees engine/cpu).
class CpuDecoderStream final : public DecoderStream {
public:
    // `decoder` must outlive the stream (the SpeechModel owns it; an utterance holds the model).
    explicit CpuDecoderStream(const cpu::CpuSpeechDecoder& decoder) : decoder_(decoder), state_(decoder.state_new()) {}
    void decode(const int32_t* codes, int n, std::vector<float>* pcm) override {
        decoder_.decode(state_, codes, n, pcm);
    }

private:
    const cpu::CpuSpeechDecoder& decoder_;
    cpu::DecoderState state_;
};

// The CPU backends: a cpu::Generator frame by frame up to the chunk's size (no stop rule of its
// own, so the CPU path gives exactly the codes the generator gives), then one decoder call for
// the chunk's frames. The reference: the fp32 generator and decoder; the fast backend
// (cpu_fast::FastChunkGenerator) hands in its own generator and decoder stream.
class CpuChunkGenerator : public ChunkGenerator {
public:
    CpuChunkGenerator(std::shared_ptr<const cpu::LmWeights> weights, const cpu::CpuSpeechDecoder& decoder)
        : CpuChunkGenerator(std::make_unique<cpu::Generator>(std::move(weights)),
                            std::make_unique<CpuDecoderStream>(decoder)) {}
    CpuChunkGenerator(std::unique_ptr<cpu::Generator> generator, std::unique_ptr<DecoderStream> decoder)
        : generator_(std::move(generator)), decoder_(std::move(decoder)) {}

    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) override {
        generator_->start(prompt, params, seed);
    }
    bool start_slices() const override { return generator_->lm().prefill_slices(); }
    int start_open(const Prompt& prompt, const GenerationParams& params, uint64_t seed) override {
        if (!start_slices()) return ChunkGenerator::start_open(prompt, params, seed);
        return generator_->start_open(prompt, params, seed);
    }
    int start_advance(int rows) override { return start_slices() ? generator_->start_advance(rows) : 0; }
    ChunkStatus chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) override;
    void text_append(const int32_t* ids, size_t n) override { generator_->text_append(ids, n); }
    void text_close() override { generator_->text_close(); }
    StopReason stop_reason() const override { return generator_->stop_reason(); }
    int frames_emitted() const override { return generator_->frames_emitted(); }
    void reference_decode(const int32_t* codes, int frames) override;

    cpu::Generator& generator() { return *generator_; }
    const cpu::Generator& generator() const { return *generator_; }

protected:
    // Decodes the frames in chunk_frames() and appends them and their samples; returns `status`.
    ChunkStatus chunk_emit(ChunkStatus status, std::vector<FrameCodes>* codes, std::vector<float>* pcm);
    std::vector<FrameCodes>& chunk_frames() { return chunk_; }

private:
    std::unique_ptr<cpu::Generator> generator_;
    std::unique_ptr<DecoderStream> decoder_;
    std::vector<FrameCodes> chunk_;  // the frames of the chunk being made
};

}  // namespace qtts
