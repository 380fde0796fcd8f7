// The kernel lab's `persist`, `attno` and `parts` modes (apps/kernel-lab/persistent_lab.cpp): the code
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

// The `parts` mode: the predictor's 15 passes and a talker step (contexts 100 and 300) as the
// product launches them, each timed whole and with one kind of launch left out (q/k/v,
// attention, o, gate/up, down, head) or every launch replaced by a trivial one: what each kind
// costs inside the chain, where the per-kernel table times a kernel after itself. Also with the
// q/k/v product (and the talker's gate/up) as two launches of half the rows each.
int lab_parts(const std::string& model, int device, uint64_t seed);

}  // namespace qtts::kernel_lab
