// The frame-by-frame generation loop of the fast CPU backend: the reference's loop
// (engine/cpu/generator.h, written once) on the packed talker and code predictor (fast_lm.h),
// through a cpu::LmSession. Same sampling, text track, stop rules and hooks, so with the same
// seed the two backends differ only where the packed weights move a logit enough to change a pick.
//
// One FastGenerator is one utterance in flight; the weights and the thread pool are shared.
// Not thread-safe: one thread drives a generator.
//
// FastBatchStep makes the next frames of several generators together (the engine's batched
// steps on this backend: SpeechModel::batch_run). Each product runs over all their rows at once,
// so the weights stream from memory once for all of them instead of once per stream (the CPU
// frame is bound by those bytes); the attention, draws, text track and stop rules stay each
// generator's own, and every row gets the arithmetic it gets alone: each generator emits bitwise
// the frames its own next_frame() calls would.
#pragma once

#include <vector>

#include "engine/cpu/generator.h"
#include "engine/cpu_fast/fast_lm.h"

namespace qtts::cpu_fast {

using FastGeneratorHooks = cpu::GeneratorHooks;

class FastGenerator final : public cpu::Generator {
public:
    explicit FastGenerator(FastLm lm);

private:
    friend class FastBatchStep;
};

// Holds a batched step's activations (grown to the largest batch, then reused: a warm step
// allocates nothing). One thread runs it (the engine thread).
class FastBatchStep {
public:
    // Up to `frames` next frames of each generator (all on the same weights, each
    // batch_ready(frames)); codes[i] gets generator i's. A generator that stops inside the step
    // (end of speech, frame limit: its stop_reason()) gets fewer and drops out of the rest.
    void run(const std::vector<FastGenerator*>& generators, int frames, std::vector<std::vector<FrameCodes>>& codes);

private:
    FastBatchScratch scratch_;
    std::vector<size_t> live_, stepping_;  // indices into the generators
    std::vector<FrameCodes> frame_;        // [n] the frame being made
    std::vector<float> inputs_;            // [stepping, H]
    std::vector<FastTalkerState*> talkers_;
    std::vector<FastPredictorState*> predictors_;
    std::vector<const float*> hidden_;
    std::vector<int32_t> previous_;
};

}  // namespace qtts::cpu_fast
