// The frame generator as the runtime sees it: one utterance's talker + code predictor state on
// whichever backend the model runs (CPU reference or CUDA). Utterance drives it and does not care
// which one it got; both produce the same codes (docs/cuda.md, "Numerics").
//
//   std::unique_ptr<FrameGenerator> gen = model->generator_new();   // engine thread
//   gen->start(prompt, params, seed);
//   while (gen->next_frame(codes) == FrameStatus::FRAME_STATUS_FRAME) decode(codes);
//
// The contract is cpu::Generator's (engine/cpu/generator.h): same statuses, stop reasons and streaming
// text calls. One difference is allowed: the CUDA generator may report WAITING_FOR_TEXT one frame
// earlier, because it prepares the next frame's talker input ahead of time.
// Not thread-safe: the thread that created it (the engine thread) drives and destroys it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/generation/frame.h"
#include "engine/generation/decoder_stream.h"
#include "engine/generation/sampling.h"
#include "engine/text/prompt.h"

namespace qtts {

class FrameGenerator {
public:
    virtual ~FrameGenerator() = default;

    // Embeds a built prompt and runs the talker prefill (restarts any previous utterance).
    virtual void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) = 0;
    virtual FrameStatus next_frame(FrameCodes& codes) = 0;
    virtual void text_append(const int32_t* ids, size_t n) = 0;
    virtual void text_close() = 0;
    virtual StopReason stop_reason() const = 0;
    virtual int frames_emitted() const = 0;

    // Generators that decode their own frames (CUDA backend, fused chunks: cuda/gpu_generator.h)
    // return their decoder here, for the in-context cloning warm-up before generation; the
    // utterance then takes each chunk's samples with audio_take() instead of decoding. nullptr:
    // the caller decodes.
    virtual DecoderStream* decoder() { return nullptr; }
    // Appends the samples of the frames next_frame() returned since the last call.
    virtual void audio_take(std::vector<float>* pcm) { (void)pcm; }
};

}  // namespace qtts
