// Which backend runs the talker and code predictor: the CUDA engine when this build has it and
// a usable GPU is present, otherwise the fast CPU backend (packed bf16/int8 weights,
// docs/cpu-fast.md); the fp32 CPU reference when asked for by name. Safe on machines without a GPU or driver
// (compiled in every build, CUDA or not).
#pragma once

#include <string>

namespace qtts {

enum class LmBackend { LM_BACKEND_CPU, LM_BACKEND_CPU_FAST, LM_BACKEND_CUDA };
const char* lm_backend_name(LmBackend backend);  // "cpu", "cpu-fast", "cuda"

struct LmBackendChoice {
    LmBackend backend = LmBackend::LM_BACKEND_CPU;
    int device = 0;      // CUDA device index (LM_BACKEND_CUDA)
    std::string reason;  // one line: why this backend (logged by the caller)
};

// requested: "auto" (CUDA when usable, else cpu-fast with a logged reason), "cpu" (the fp32
// reference), "cpu-fast", or "cuda" (throws
// ERROR_UNSUPPORTED with the reason when no usable CUDA device `device` exists). Anything else
// throws ERROR_INVALID_ARGUMENT listing the accepted values.
LmBackendChoice lm_backend_choose(const std::string& requested, int device);

}  // namespace qtts
