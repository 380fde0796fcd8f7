// The RoPE inverse-frequency tables the reference implementation actually ran with when it wrote
// ../shared/reference/golden, for the tests that compare against those files.
//
// The goldens do not follow the configs' rope_theta: the talker's, the code predictor's and the
// speech decoder's rotary `inv_freq` buffers held other values (bf16-representable, both signs,
// different per model: randomly initialised buffers of the golden generator; such non-persistent
// buffers are not saved in a checkpoint, so no loader can know them). They were recovered by
// least squares from the goldens (the first talker rows and predictor logits; the decoder's audio)
// and rounded to bf16; with them every golden row matches to ~1e-6 (docs/generation.md §6,
// docs/decoder.md). The speech encoder's table likewise (fitted to ref_codes,
// docs/voice-cloning.md). The library always uses the config's table; only tests swap these in.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "cpu/lm.h"

namespace qtts_test {

struct GoldenLmRope {
    std::vector<float> talker;     // [talker head_dim / 2]
    std::vector<float> predictor;  // [predictor head_dim / 2]
};

// "tiny-customvoice", "tiny-voicedesign", "tiny-base". Throws std::out_of_range for others.
const GoldenLmRope& golden_lm_rope(const std::string& model);

// The speech decoder's table (all three tiny models share one speech tokenizer) [head_dim / 2].
const std::vector<float>& golden_decoder_rope();

// The speech-tokenizer encoder's table (one rotary table shared by its transformer layers, as in
// transformers' MimiTransformerModel) [head_dim / 2], for the tiny-base `ref_codes`. Unlike the
// others it was fitted to discrete codes, not to floats: nearby bf16 tables (a few steps per value)
// reproduce all 320 codes as well, so this is the max-margin point of that region, not
// necessarily the generator's exact buffer.
const std::vector<float>& golden_encoder_rope();

// A copy of `weights` carrying the goldens' talker and predictor tables for `model`.
std::shared_ptr<const qtts::cpu::LmWeights> lm_weights_with_golden_rope(const qtts::cpu::LmWeights& weights,
                                                                        const std::string& model);

}  // namespace qtts_test
