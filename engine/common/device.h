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

}  // namespace qtts
