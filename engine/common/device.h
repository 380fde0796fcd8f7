// What accelerator this process can use. Safe to call on machines without a GPU or driver.
#pragma once

#include <cstddef>
#include <string>

namespace qtts {

// True when this build contains the CUDA backend.
bool cuda_compiled();

// Number of usable CUDA devices (0 without CUDA, without a driver, or without a GPU).
int cuda_device_count();

// One line describing why no GPU is usable, or the device name when one is.
std::string cuda_describe(int device);

// Memory of CUDA device `device` as the driver reports it: every process's allocations count as
// used. Zeros without CUDA, without a usable device, or for an index that does not exist. Makes
// the device current on the calling thread for the query only (the previous one is restored).
struct DeviceMemory {
    size_t used_bytes = 0;
    size_t total_bytes = 0;
};
DeviceMemory cuda_memory(int device);

// What this build and this device make of each other, for `qtts version` and the start-up log:
// the device (name, compute capability), the architectures compiled in (QTTS_CUDA_ARCHS) and the
// kernel path the device's code takes ("hopper": sm_90+ code with programmatic dependent launch
// and L2 bulk prefetch; "portable": code for sm_80..89 or PTX JIT-compiled from it). Without a
// usable device, `usable` is false and `why` says why; the compiled architectures are still set.
struct CudaReport {
    bool usable = false;
    std::string why;
    std::string name;
    int major = 0;
    int minor = 0;
    std::string archs_compiled;  // "80-real,86-real,...", empty without CUDA
    std::string kernel_path;     // "hopper" or "portable" (usable only)
    int kernel_ptx = 0;          // the virtual architecture the device's code came from
    int kernel_sass = 0;         // the machine code it runs
};
CudaReport cuda_report(int device);

// Device memory qtts allocated itself, per device (the CUDA allocation helpers,
// engine/cuda/device_buffer.h, report every allocation and release here): what it holds now and
// the most it held at once since the start (or the last peak reset). Zeros for devices qtts
// never allocated on. Lock-free; any thread.
struct GpuMemoryUse {
    size_t current_bytes = 0;
    size_t peak_bytes = 0;
};
GpuMemoryUse gpu_memory_use(int device);
void gpu_memory_peak_reset(int device);  // peak := current (tests, benchmarks)
void gpu_memory_allocated(int device, size_t bytes);
void gpu_memory_released(int device, size_t bytes);

}  // namespace qtts
