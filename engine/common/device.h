// What accelerator this process can use. Safe to call on machines without a GPU or driver.
#pragma once

#include <string>

namespace qtts {

// True when this build contains the CUDA backend.
bool cuda_compiled();

// Number of usable CUDA devices (0 without CUDA, without a driver, or without a GPU).
int cuda_device_count();

// One line describing why no GPU is usable, or the device name when one is.
std::string cuda_describe(int device);

}  // namespace qtts
