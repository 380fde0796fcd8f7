// The CPU reference backend behind the runtime's FrameGenerator interface
// (engine/generation/frame_generator.h).
#pragma once

#include <memory>

#include "engine/cpu/generator.h"
#include "engine/generation/frame_generator.h"

namespace qtts {

// The CPU reference backend: a thin forwarder to cpu::Generator (no behaviour of its own, so the
// CPU path gives exactly the codes cpu::Generator gives).
class CpuFrameGenerator final : public FrameGenerator {
public:
    explicit CpuFrameGenerator(std::shared_ptr<const cpu::LmWeights> weights) : generator_(std::move(weights)) {}

    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) override {
        generator_.start(prompt, params, seed);
    }
    FrameStatus next_frame(FrameCodes& codes) override { return generator_.next_frame(codes); }
    void text_append(const int32_t* ids, size_t n) override { generator_.text_append(ids, n); }
    void text_close() override { generator_.text_close(); }
    StopReason stop_reason() const override { return generator_.stop_reason(); }
    int frames_emitted() const override { return generator_.frames_emitted(); }

    cpu::Generator& generator() { return generator_; }

private:
    cpu::Generator generator_;
};

}  // namespace qtts
