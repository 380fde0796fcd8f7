// The kernel lab's `persist` and `attno` modes (apps/kernel-lab/persistent_lab.cpp): the code
// predictor's passes as the product's launches against the lab's persistent kernel
// (persistent_pass.h) or with the attention folded into the o product (attention_o.h).
#pragma once

#include <cstdint>
#include <string>

namespace qtts::kernel_lab {

// Compares and times both on the checkpoint's predictor; returns 0 when the results are
// bitwise equal.
int lab_persist(const std::string& model, int device, uint64_t seed);

// The `attno` mode: the same passes with each layer's attention folded into its o product
// (attention_o.h) against the product's launches: compared bitwise, then timed.
int lab_attno(const std::string& model, int device, uint64_t seed);

}  // namespace qtts::kernel_lab
