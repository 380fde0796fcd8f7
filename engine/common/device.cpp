#include "engine/common/device.h"

#include <filesystem>

#include <fmt/format.h>

#ifdef QTTS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace qtts {

bool cuda_compiled() {
#ifdef QTTS_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int cuda_device_count() {
#ifdef QTTS_HAVE_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return count;
#else
    return 0;
#endif
}

std::string cuda_describe(int device) {
#ifdef QTTS_HAVE_CUDA
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess) {
        cudaGetLastError();
        // Without the NVIDIA kernel driver the runtime reports an "insufficient driver"; on a
        // machine with no GPU that reads like a fault, so say what is really missing.
        if ((err == cudaErrorInsufficientDriver || err == cudaErrorNoDevice) &&
            !std::filesystem::exists("/proc/driver/nvidia/version"))
            return "no NVIDIA GPU driver is loaded on this machine";
        return fmt::format("no usable CUDA device ({})", cudaGetErrorString(err));
    }
    if (device < 0 || device >= count) {
        return fmt::format("CUDA device {} does not exist ({} present)", device, count);
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, device);
    return fmt::format("{} (sm_{}{}, {:.0f} GiB)", prop.name, prop.major, prop.minor,
                       prop.totalGlobalMem / 1073741824.0);
#else
    (void)device;
    return "this build has no CUDA backend (configured with QTTS_CUDA=OFF or no toolkit)";
#endif
}

DeviceMemory cuda_memory(int device) {
    DeviceMemory memory;
#ifdef QTTS_HAVE_CUDA
    if (device < 0 || device >= cuda_device_count()) return memory;
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = device;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaSetDevice(device) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
        memory.total_bytes = total_bytes;
        memory.used_bytes = total_bytes - free_bytes;
    } else {
        cudaGetLastError();  // a failed query is reported as zeros, not left as a pending error
    }
    cudaSetDevice(previous);
#else
    (void)device;
#endif
    return memory;
}

}  // namespace qtts
