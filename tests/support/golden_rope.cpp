#include "golden_rope.h"

#include <map>
#include <stdexcept>

namespace qtts_test {

const GoldenLmRope& golden_lm_rope(const std::string& model) {
    static const std::map<std::string, GoldenLmRope> tables = {
        {"tiny-customvoice",
         {{0.1640625f, -0.04296875f, -0.09814453125f, -0.115234375f, 0.2080078125f, 0.1796875f, 0.07763671875f,
           -0.01434326171875f},
          {0.029296875f, 0.037353515625f, 0.0478515625f, 0.09716796875f, 0.042724609375f, -0.1572265625f,
           -0.06640625f, -0.1328125f}}},
        {"tiny-voicedesign",
         {{-0.1513671875f, -0.1328125f, 0.0191650390625f, 0.18359375f, -0.00127410888671875f, -0.0031890869140625f,
           0.02490234375f, 0.02001953125f, 0.111328125f, 0.10888671875f, -0.000934600830078125f, -0.0152587890625f},
          {0.047607421875f, -0.10546875f, 0.0810546875f, -0.16015625f, 0.0634765625f, 0.1103515625f, 0.1171875f,
           -0.08642578125f}}},
        {"tiny-base",
         {{0.08544921875f, -0.197265625f, -0.2080078125f, -0.005096435546875f, 0.11083984375f, -0.1650390625f,
           0.006134033203125f, -0.0703125f},
          {0.0093994140625f, 0.08154296875f, 0.087402343750f, 0.1103515625f, 0.048828125f, 0.14453125f,
           -0.19921875f, -0.17578125f}}},
    };
    return tables.at(model);
}

const std::vector<float>& golden_decoder_rope() {
    static const std::vector<float> table = {-127.0f / 8192.0f, -243.0f / 16384.0f, 217.0f / 4096.0f,
                                             -225.0f / 2048.0f};
    return table;
}

const std::vector<float>& golden_encoder_rope() {
    // Fitted to tiny-base ref_codes (docs/voice-cloning.md): from random starts in [-0.3, 0.3],
    // Nelder-Mead on the hinge of each code's relative distance margin (target entry vs the
    // nearest other entry, residuals teacher-forced with the golden codes, frames 1..19) found one
    // region where all 320 codes match; this is its point of largest smallest margin (relative
    // margin 1.2e-3), rounded to bf16. Alone, each value may move by a few bf16 steps (first
    // 0..+1, second -2..+2, third -8..+1, fourth -1..+4) and still reproduce every code.
    static const std::vector<float> table = {9.0f / 64.0f, -49.0f / 512.0f, -149.0f / 8192.0f,
                                             -235.0f / 2048.0f};
    return table;
}

std::shared_ptr<const qtts::cpu::LmWeights> lm_weights_with_golden_rope(const qtts::cpu::LmWeights& weights,
                                                                        const std::string& model) {
    const GoldenLmRope& rope = golden_lm_rope(model);
    if (weights.talker.rope_inv_freq.size() != rope.talker.size() ||
        weights.predictor.rope_inv_freq.size() != rope.predictor.size())
        throw std::invalid_argument("golden RoPE table sizes do not match the model " + model);
    auto copy = std::make_shared<qtts::cpu::LmWeights>(weights);
    copy->talker.rope_inv_freq = rope.talker;
    copy->predictor.rope_inv_freq = rope.predictor;
    return copy;
}

}  // namespace qtts_test
