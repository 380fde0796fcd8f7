// The frame-by-frame generation loop of the fast CPU backend: the reference's loop
// (engine/cpu/generator.h, written once) on the packed talker and code predictor (fast_lm.h),
// through a cpu::LmSession. Same sampling, text track, stop rules and hooks, so with the same
// seed the two backends differ only where the packed weights move a logit enough to change a pick.
//
// One FastGenerator is one utterance in flight; the weights and the thread pool are shared.
// Not thread-safe: one thread drives a generator.
#pragma once

#include "engine/cpu/generator.h"
#include "engine/cpu_fast/fast_lm.h"

namespace qtts::cpu_fast {

using FastGeneratorHooks = cpu::GeneratorHooks;

class FastGenerator final : public cpu::Generator {
public:
    explicit FastGenerator(FastLm lm);
};

}  // namespace qtts::cpu_fast
