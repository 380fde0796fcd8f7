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
