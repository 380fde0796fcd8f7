// Helpers shared by the tests: where the reference data lives, golden tensors, error metrics.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace qtts_test {

// ../shared/reference (or $QTTS_REFERENCE_DIR).
std::string reference_dir();
bool reference_available();
std::string reference_model_dir(const std::string& model);    // reference/models/<model>
std::string golden_path(const std::string& model, const std::string& scenario);

// Largest |batched - alone| audio difference allowed with the GPU decoder's default split-bf16
// (bf16x3) products, against 1e-5 with fp32 products: every conv input is split into a bf16
// hi/lo pair again, and a value one fp32 ulp apart between two runs (sums ordered differently by
// a wider product) can round to another pair, a ~2^-17 relative step. Measured up to 1.5e-5 on
// the tiny tokenizer, whose own error against the fp32 CPU decode is 2e-5 (docs/cuda.md).
constexpr double GPU_SPLIT_DECODER_TOLERANCE = 4e-5;

// A scratch directory unique to this test process, removed at exit.
std::string temp_dir();

// ‖a−b‖ / ‖b‖ over the whole span.
double rel_error(const float* a, const float* b, size_t n);
// max |a−b|.
double max_abs_error(const float* a, const float* b, size_t n);

// Deterministic pseudo-random floats in [lo, hi) (never all zeros).
std::vector<float> random_floats(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// The tiny-customvoice preset with its speech-decoder config changed by `edit` (nullptr: as
// is), random weights from `seed`, written to temp_dir()/name and loaded.
std::shared_ptr<const qtts::Checkpoint> tiny_checkpoint_with_decoder(const std::string& name,
                                                                     void (*edit)(qtts::DecoderConfig*), uint64_t seed);
// An `edit` for it: the release-size speech decoder (the real tokenizer's dimensions).
void decoder_release_size(qtts::DecoderConfig* decoder);

}  // namespace qtts_test
