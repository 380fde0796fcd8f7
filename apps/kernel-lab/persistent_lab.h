// The kernel lab's `persist` mode (apps/kernel-lab/persistent_lab.cpp): the code predictor's
// passes as the product's launches against the lab's persistent kernel (persistent_pass.h).
#pragma once

#include <cstdint>
#include <string>

namespace qtts::kernel_lab {

// Compares and times both on the checkpoint's predictor; returns 0 when the results are
// bitwise equal.
int lab_persist(const std::string& model, int device, uint64_t seed);

}  // namespace qtts::kernel_lab
