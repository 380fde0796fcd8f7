// ECAPA-TDNN speaker encoder of the Base models (spec §11), fp32 on the CPU.
//
// log-mel [frames, 128] -> x-vector [enc_dim] (enc_dim = the talker's hidden size). The graph,
// read top-down in speaker_encoder.cpp:
//   block0: TDNN mel -> C0 (k0)
//   blocks 1..n: SE-Res2Net: TDNN k1 -> Res2Net (scale chunks, chained dilated TDNNs) -> TDNN k1
//                -> squeeze-excitation -> + input
//   mfa: concat(block outputs 1..n) -> TDNN k1
//   asp: attentive statistics pooling (global mean/std context, attention over time) -> [2·C]
//   fc:  1x1 conv -> [enc_dim]
// Every TDNN is Conv1d with 'same' reflect padding followed by ReLU; there is no BatchNorm.
// The bf16 checkpoint weights are converted to fp32 once, at construction; embedding is const
// and may run on several threads at once.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/cpu/mel.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace qtts::cpu {

// One fp32 conv (weights converted from the checkpoint).
struct ConvF32 {
    int out = 0, in = 0, k = 0;
    std::vector<float> w;  // [out, in, k]
    std::vector<float> b;  // [out] (empty: no bias)
};

struct SpeakerEncoderBlockF32 {
    ConvF32 tdnn1;                 // [C, C, 1]
    std::vector<ConvF32> res2net;  // (scale-1) x [C/scale, C/scale, k]
    ConvF32 tdnn2;                 // [C, C, 1]
    ConvF32 se_conv1;              // [se, C, 1]
    ConvF32 se_conv2;              // [C, se, 1]
    int kernel = 1;
    int dilation = 1;
};

struct SpeakerEncoderF32Weights {
    ConvF32 block0;                              // [C0, mel, k0]
    std::vector<SpeakerEncoderBlockF32> blocks;  // SE-Res2Net blocks 1..n
    ConvF32 mfa;                                 // [C_last, sum C_i, k_last]
    ConvF32 asp_tdnn;                            // [att, 3*C_last, 1]
    ConvF32 asp_conv;                            // [C_last, att, 1]
    ConvF32 fc;                                  // [enc_dim, 2*C_last, 1]
};

class SpeakerEncoder {
public:
    // Validates the config (list lengths, positive sizes, channel counts the graph needs, a
    // 24 kHz / 128-mel front end) and every weight shape against it, then converts the weights.
    // Throws qtts::Error (ERROR_INVALID_ARGUMENT / ERROR_UNSUPPORTED / ERROR_SHAPE) naming the
    // offending field or tensor.
    SpeakerEncoder(const SpeakerEncoderConfig& config, const SpeakerEncoderWeights& weights);

    const SpeakerEncoderConfig& config() const { return config_; }
    int embedding_dim() const { return config_.enc_dim; }
    // Fewest mel frames the reflect padding of the TDNN convs accepts.
    int min_frames() const { return min_frames_; }
    // Fewest 24 kHz samples embed_audio() accepts (mel framing and min_frames()).
    size_t min_samples() const;

    // mel: [frames, mel_dim] time-major, as MelSpectrogram produces. Returns [enc_dim].
    std::vector<float> embed_mel(const float* mel, int frames, int mel_dim) const;
    // audio: mono float at 24 kHz. Returns [enc_dim].
    std::vector<float> embed_audio(const float* audio, size_t num_samples) const;

private:
    // Stages (x is channel-major [C, T]).
    std::vector<float> block0_forward(const float* mel_ct, int T) const;
    std::vector<float> se_res2net_forward(const SpeakerEncoderBlockF32& block, const std::vector<float>& x,
                                          int T) const;
    std::vector<float> attentive_pool_forward(const std::vector<float>& x, int T) const;  // -> [2*C_last]

    SpeakerEncoderConfig config_;
    SpeakerEncoderF32Weights weights_;
    int min_frames_ = 1;
    std::unique_ptr<MelSpectrogram> mel_;
};

}  // namespace qtts::cpu
