#include "engine/common/device.h"

#include <atomic>
#include <filesystem>

#include <fmt/format.h>

#ifdef QTTS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/arch.cuh"
#include "kernels/check.cuh"
#endif

#ifndef QTTS_CUDA_ARCHS_TEXT
#define QTTS_CUDA_ARCHS_TEXT ""
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

CudaReport cuda_report(int device) {
    CudaReport report;
#ifdef QTTS_HAVE_CUDA
    report.archs_compiled = QTTS_CUDA_ARCHS_TEXT;
    const int count = cuda_device_count();
    if (device < 0 || device >= count) {
        report.why = cuda_describe(device);
        return report;
    }
    int previous = 0;
    if (cudaGetDevice(&previous) != cudaSuccess) previous = device;
    cudaDeviceProp prop{};
    if (cudaSetDevice(device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
        report.why = fmt::format("CUDA device {} cannot be opened ({})", device, cudaGetErrorString(cudaGetLastError()));
        cudaSetDevice(previous);
        return report;
    }
    report.name = prop.name;
    report.major = prop.major;
    report.minor = prop.minor;
    try {
        const kernels::KernelArch arch = kernels::kernel_arch_current();
        report.kernel_ptx = arch.ptx_version;
        report.kernel_sass = arch.binary_version;
        // The same rule as GpuContext: the Hopper path needs the device and the code.
        report.kernel_path = prop.major >= 9 && arch.path == kernels::KernelPath::KERNEL_PATH_HOPPER
                                 ? "hopper"
                                 : "portable";
        report.usable = true;
    } catch (const kernels::KernelError& e) {
        cudaGetLastError();
        report.why = fmt::format("this binary has no kernels for sm_{}{} (built for {}): {}", prop.major, prop.minor,
                                 report.archs_compiled, e.what());
    }
    cudaSetDevice(previous);
#else
    report.why = cuda_describe(device);
#endif
    return report;
}

namespace {

constexpr int TRACKED_DEVICES = 64;
struct TrackedDevice {
    std::atomic<size_t> current{0};
    std::atomic<size_t> peak{0};
};
TrackedDevice g_tracked[TRACKED_DEVICES];

TrackedDevice* tracked(int device) { return device >= 0 && device < TRACKED_DEVICES ? &g_tracked[device] : nullptr; }

}  // namespace

GpuMemoryUse gpu_memory_use(int device) {
    GpuMemoryUse use;
    if (const TrackedDevice* t = tracked(device)) {
        use.current_bytes = t->current.load();
        use.peak_bytes = t->peak.load();
    }
    return use;
}

void gpu_memory_peak_reset(int device) {
    if (TrackedDevice* t = tracked(device)) t->peak.store(t->current.load());
}

void gpu_memory_allocated(int device, size_t bytes) {
    TrackedDevice* t = tracked(device);
    if (!t) return;
    const size_t now = t->current.fetch_add(bytes) + bytes;
    size_t peak = t->peak.load();
    while (now > peak && !t->peak.compare_exchange_weak(peak, now)) {
    }
}

void gpu_memory_released(int device, size_t bytes) {
    if (TrackedDevice* t = tracked(device)) t->current.fetch_sub(bytes);
}

}  // namespace qtts
