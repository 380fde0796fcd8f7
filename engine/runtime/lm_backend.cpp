#include "engine/runtime/lm_backend.h"

#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts {

const char* lm_backend_name(LmBackend backend) {
    switch (backend) {
        case LmBackend::LM_BACKEND_CPU: return "cpu";
        case LmBackend::LM_BACKEND_CPU_FAST: return "cpu-fast";
        case LmBackend::LM_BACKEND_CUDA: return "cuda";
    }
    return "?";
}

LmBackendChoice lm_backend_choose(const std::string& requested, int device) {
    if (requested != "auto" && requested != "cpu" && requested != "cpu-fast" && requested != "cuda")
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown backend '{}': use auto, cpu, cpu-fast or cuda", requested);
    LmBackendChoice choice;
    choice.device = device;
    if (requested == "cpu") {
        choice.reason = "fp32 CPU reference requested";
        return choice;
    }
    if (requested == "cpu-fast") {
        choice.backend = LmBackend::LM_BACKEND_CPU_FAST;
        choice.reason = "fast CPU backend requested";
        return choice;
    }
    const int count = cuda_device_count();
    const bool usable = cuda_compiled() && device >= 0 && device < count;
    if (usable) {
        choice.backend = LmBackend::LM_BACKEND_CUDA;
        choice.reason = "CUDA device " + std::to_string(device) + ": " + cuda_describe(device);
        return choice;
    }
    const std::string why = cuda_describe(device);
    if (requested == "cuda")
        fail(ErrorCode::ERROR_UNSUPPORTED, "the CUDA backend was requested but cannot run on device {}: {}", device, why);
    choice.backend = LmBackend::LM_BACKEND_CPU_FAST;
    choice.reason = "no usable GPU for CUDA device " + std::to_string(device) + " (" + why +
                    "); falling back to the fast CPU backend";
    // No GPU at all is a normal machine for the CPU backend: say why at info level. A GPU that is
    // present but not at the index asked for is probably a mistake: warn.
    if (count > 0) QTTS_LOG_WARN("{}", choice.reason);
    else QTTS_LOG_INFO("{}", choice.reason);
    return choice;
}

}  // namespace qtts
