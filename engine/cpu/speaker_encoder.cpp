#include "engine/cpu/speaker_encoder.h"
#include "engine/api/qtts.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/common/error.h"
#include "engine/cpu/conv_ops.h"
#include "engine/model/safetensors.h"

namespace qtts::cpu {

namespace {

// Converts one checkpoint conv, checking its shape against what the config implies.
ConvF32 conv_convert(const ConvWeights& src, int out, int in, int k, const std::string& what) {
    if (src.w == nullptr)
        fail(ErrorCode::ERROR_SHAPE, "speaker encoder: conv {} has no weight tensor", what);
    const std::vector<int64_t> expected{out, in, k};
    if (src.w->shape != expected)
        fail(ErrorCode::ERROR_SHAPE, "speaker encoder: {} ({}) has shape {}, the config implies [{}, {}, {}]", what,
             src.w->name, src.w->shape_str(), out, in, k);
    ConvF32 c;
    c.out = out;
    c.in = in;
    c.k = k;
    c.w = tensor_to_f32(*src.w);
    if (src.b) {
        if (src.b->shape != std::vector<int64_t>{out})
            fail(ErrorCode::ERROR_SHAPE, "speaker encoder: {} ({}) has shape {}, expected [{}]", what, src.b->name,
                 src.b->shape_str(), out);
        c.b = tensor_to_f32(*src.b);
    }
    return c;
}

// torch Conv1d(padding="same"): the total padding d·(k-1) is split with the smaller half left.
int same_pad_left(int k, int dilation) { return dilation * (k - 1) / 2; }
int same_pad_right(int k, int dilation) { return dilation * (k - 1) - same_pad_left(k, dilation); }

// Conv1d with 'same' reflect padding: x [in, T] -> [out, T].
std::vector<float> conv_same_reflect(const ConvF32& conv, const float* x, int T, int dilation) {
    std::vector<float> y(size_t(conv.out) * T);
    const float* bias = conv.b.empty() ? nullptr : conv.b.data();
    const int left = same_pad_left(conv.k, dilation), right = same_pad_right(conv.k, dilation);
    if (left == 0 && right == 0) {
        conv1d(x, conv.in, T, conv.w.data(), bias, conv.out, conv.k, 1, dilation, 1, y.data());
        return y;
    }
    const std::vector<float> padded = pad1d(x, conv.in, T, left, right, PadMode::PAD_REFLECT);
    conv1d(padded.data(), conv.in, T + left + right, conv.w.data(), bias, conv.out, conv.k, 1, dilation, 1, y.data());
    return y;
}

void relu_inplace(std::vector<float>& x) {
    for (float& v : x) v = std::max(v, 0.0f);
}

// TDNN block of the reference: 'same' reflect conv, then ReLU.
std::vector<float> tdnn_forward(const ConvF32& conv, const float* x, int T, int dilation) {
    std::vector<float> y = conv_same_reflect(conv, x, T, dilation);
    relu_inplace(y);
    return y;
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Weighted mean and standard deviation over time of every channel of x [C, T]; weights [C, T]
// (null: uniform 1/T). std = sqrt(max(Σ w (x-μ)², 1e-12)), as the reference clamps it.
void weighted_stats(const std::vector<float>& x, int C, int T, const float* weights, std::vector<float>* mean,
                    std::vector<float>* std_dev) {
    mean->assign(size_t(C), 0.0f);
    std_dev->assign(size_t(C), 0.0f);
    for (int c = 0; c < C; ++c) {
        const float* xc = x.data() + size_t(c) * T;
        const float* wc = weights ? weights + size_t(c) * T : nullptr;
        double mu = 0.0;
        for (int t = 0; t < T; ++t) mu += double(wc ? wc[t] : 1.0f / float(T)) * xc[t];
        double var = 0.0;
        for (int t = 0; t < T; ++t) {
            const double d = xc[t] - mu;
            var += double(wc ? wc[t] : 1.0f / float(T)) * d * d;
        }
        (*mean)[size_t(c)] = float(mu);
        (*std_dev)[size_t(c)] = float(std::sqrt(std::max(var, 1e-12)));
    }
}

}  // namespace

SpeakerEncoder::SpeakerEncoder(const SpeakerEncoderConfig& config, const SpeakerEncoderWeights& weights)
    : config_(config) {
    const SpeakerEncoderConfig& c = config_;
    const size_t n = c.enc_channels.size();
    if (n < 3 || c.enc_kernel_sizes.size() != n || c.enc_dilations.size() != n)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speaker encoder config: enc_channels ({}), enc_kernel_sizes ({}) and enc_dilations ({}) must have the "
             "same length, at least 3 (the released models use 5)",
             n, c.enc_kernel_sizes.size(), c.enc_dilations.size());
    for (size_t i = 0; i < n; ++i) {
        if (c.enc_channels[i] <= 0 || c.enc_kernel_sizes[i] <= 0 || c.enc_dilations[i] <= 0)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "speaker encoder config: layer {} has channels {}, kernel {}, dilation {}; all must be positive", i,
                 c.enc_channels[i], c.enc_kernel_sizes[i], c.enc_dilations[i]);
    }
    if (c.mel_dim <= 0 || c.enc_dim <= 0 || c.enc_attention_channels <= 0 || c.enc_se_channels <= 0 ||
        c.enc_res2net_scale < 2)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speaker encoder config: mel_dim {}, enc_dim {}, enc_attention_channels {}, enc_se_channels {} must be "
             "positive and enc_res2net_scale {} at least 2",
             c.mel_dim, c.enc_dim, c.enc_attention_channels, c.enc_se_channels, c.enc_res2net_scale);
    if (c.sample_rate != SAMPLE_RATE || c.mel_dim != 128)
        fail(ErrorCode::ERROR_UNSUPPORTED,
             "speaker encoder config: sample_rate {} / mel_dim {}: only the reference front end (24000 Hz, 128 mels) "
             "is supported",
             c.sample_rate, c.mel_dim);
    const size_t num_blocks = n - 2;
    int concat_channels = 0;
    for (size_t i = 1; i <= num_blocks; ++i) {
        if (c.enc_channels[i] != c.enc_channels[i - 1])
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "speaker encoder config: SE-Res2Net block {} maps {} to {} channels; its residual needs them equal",
                 i, c.enc_channels[i - 1], c.enc_channels[i]);
        if (c.enc_channels[i] % c.enc_res2net_scale != 0)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "speaker encoder config: block {} has {} channels, not divisible by enc_res2net_scale {}", i,
                 c.enc_channels[i], c.enc_res2net_scale);
        concat_channels += c.enc_channels[i];
    }
    const int C_last = c.enc_channels[n - 1];
    if (C_last != concat_channels)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speaker encoder config: the last enc_channels entry ({}) must equal the sum of the SE-Res2Net block "
             "channels ({}), since mfa maps their concatenation to itself",
             C_last, concat_channels);
    if (weights.blocks.size() != num_blocks)
        fail(ErrorCode::ERROR_SHAPE, "speaker encoder: the weights have {} SE-Res2Net blocks, the config implies {}",
             weights.blocks.size(), num_blocks);

    SpeakerEncoderF32Weights& w = weights_;
    w.block0 = conv_convert(weights.block0, c.enc_channels[0], c.mel_dim, c.enc_kernel_sizes[0], "blocks.0.conv");
    for (size_t i = 1; i <= num_blocks; ++i) {
        const SpeakerEncoderBlockWeights& src = weights.blocks[i - 1];
        const std::string p = "blocks." + std::to_string(i) + ".";
        const int C = c.enc_channels[i], sub = C / c.enc_res2net_scale, k = c.enc_kernel_sizes[i];
        SpeakerEncoderBlockF32 blk;
        blk.kernel = k;
        blk.dilation = c.enc_dilations[i];
        blk.tdnn1 = conv_convert(src.tdnn1, C, c.enc_channels[i - 1], 1, p + "tdnn1");
        if (src.res2net.size() != size_t(c.enc_res2net_scale - 1))
            fail(ErrorCode::ERROR_SHAPE, "speaker encoder: {}res2net_block has {} convs, enc_res2net_scale {} implies {}",
                 p, src.res2net.size(), c.enc_res2net_scale, c.enc_res2net_scale - 1);
        for (size_t j = 0; j < src.res2net.size(); ++j)
            blk.res2net.push_back(conv_convert(src.res2net[j], sub, sub, k, p + "res2net_block.blocks." + std::to_string(j)));
        blk.tdnn2 = conv_convert(src.tdnn2, C, C, 1, p + "tdnn2");
        blk.se_conv1 = conv_convert(src.se_conv1, c.enc_se_channels, C, 1, p + "se_block.conv1");
        blk.se_conv2 = conv_convert(src.se_conv2, C, c.enc_se_channels, 1, p + "se_block.conv2");
        w.blocks.push_back(std::move(blk));
    }
    w.mfa = conv_convert(weights.mfa, C_last, concat_channels, c.enc_kernel_sizes[n - 1], "mfa.conv");
    w.asp_tdnn = conv_convert(weights.asp_tdnn, c.enc_attention_channels, 3 * C_last, 1, "asp.tdnn.conv");
    w.asp_conv = conv_convert(weights.asp_conv, C_last, c.enc_attention_channels, 1, "asp.conv");
    w.fc = conv_convert(weights.fc, c.enc_dim, 2 * C_last, 1, "fc");

    // Reflect padding of p samples needs more than p frames; the largest pad decides.
    int max_pad = 0;
    for (size_t i = 0; i < n; ++i) max_pad = std::max(max_pad, same_pad_right(c.enc_kernel_sizes[i], c.enc_dilations[i]));
    min_frames_ = max_pad + 1;

    mel_ = std::make_unique<MelSpectrogram>(MelConfig());
}

size_t SpeakerEncoder::min_samples() const {
    // frames = floor(N / hop): min_frames() frames need min_frames() · hop samples.
    const size_t for_frames = size_t(min_frames_) * size_t(mel_->config().hop);
    return std::max(for_frames, mel_->min_samples());
}

std::vector<float> SpeakerEncoder::block0_forward(const float* mel_ct, int T) const {
    return tdnn_forward(weights_.block0, mel_ct, T, config_.enc_dilations[0]);
}

std::vector<float> SpeakerEncoder::se_res2net_forward(const SpeakerEncoderBlockF32& block, const std::vector<float>& x,
                                                      int T) const {
    const int C = block.tdnn1.out;
    const int scale = config_.enc_res2net_scale, sub = C / scale;
    const std::vector<float> reduced = tdnn_forward(block.tdnn1, x.data(), T, 1);  // [C, T]

    // Res2Net: chunk 0 passes through; chunk 1 goes through conv 0; chunk i >= 2 goes through
    // conv i-1 after adding the previous chunk's output (a growing receptive field).
    std::vector<float> res2net_out(size_t(C) * T);
    std::vector<float> previous;  // [sub, T]
    std::vector<float> chunk_in(size_t(sub) * T);
    for (int i = 0; i < scale; ++i) {
        const float* chunk = reduced.data() + size_t(i) * sub * T;
        float* dst = res2net_out.data() + size_t(i) * sub * T;
        if (i == 0) {
            std::copy(chunk, chunk + size_t(sub) * T, dst);
            continue;
        }
        std::copy(chunk, chunk + size_t(sub) * T, chunk_in.begin());
        if (i >= 2) {
            for (size_t j = 0; j < chunk_in.size(); ++j) chunk_in[j] += previous[j];
        }
        previous = tdnn_forward(block.res2net[size_t(i) - 1], chunk_in.data(), T, block.dilation);
        std::copy(previous.begin(), previous.end(), dst);
    }

    std::vector<float> expanded = tdnn_forward(block.tdnn2, res2net_out.data(), T, 1);  // [C, T]

    // Squeeze-excitation: per-channel gates from the time-averaged signal.
    std::vector<float> channel_mean(size_t(C), 0.0f);
    for (int c = 0; c < C; ++c) {
        double sum = 0.0;
        for (int t = 0; t < T; ++t) sum += expanded[size_t(c) * T + t];
        channel_mean[size_t(c)] = float(sum / T);
    }
    std::vector<float> squeezed = conv_same_reflect(block.se_conv1, channel_mean.data(), 1, 1);  // [se, 1]
    relu_inplace(squeezed);
    std::vector<float> gates = conv_same_reflect(block.se_conv2, squeezed.data(), 1, 1);  // [C, 1]
    for (float& g : gates) g = sigmoid(g);

    std::vector<float> out(size_t(C) * T);
    for (int c = 0; c < C; ++c) {
        for (int t = 0; t < T; ++t) {
            const size_t i = size_t(c) * T + t;
            out[i] = expanded[i] * gates[size_t(c)] + x[i];
        }
    }
    return out;
}

std::vector<float> SpeakerEncoder::attentive_pool_forward(const std::vector<float>& x, int T) const {
    const int C = weights_.mfa.out;
    // Global context: every frame sees the utterance's mean and std beside its own features.
    std::vector<float> global_mean, global_std;
    weighted_stats(x, C, T, nullptr, &global_mean, &global_std);
    std::vector<float> context(size_t(3) * C * T);  // [3C, T] = [x; μ; σ]
    std::copy(x.begin(), x.end(), context.begin());
    for (int c = 0; c < C; ++c) {
        float* mean_row = context.data() + (size_t(C) + c) * T;
        float* std_row = context.data() + (size_t(2) * C + c) * T;
        std::fill(mean_row, mean_row + T, global_mean[size_t(c)]);
        std::fill(std_row, std_row + T, global_std[size_t(c)]);
    }
    std::vector<float> attention_hidden = tdnn_forward(weights_.asp_tdnn, context.data(), T, 1);  // [att, T]
    for (float& v : attention_hidden) v = std::tanh(v);
    std::vector<float> attention = conv_same_reflect(weights_.asp_conv, attention_hidden.data(), T, 1);  // [C, T]
    // Softmax over time, per channel.
    for (int c = 0; c < C; ++c) {
        float* row = attention.data() + size_t(c) * T;
        const float max_v = *std::max_element(row, row + T);
        double sum = 0.0;
        for (int t = 0; t < T; ++t) {
            row[t] = std::exp(row[t] - max_v);
            sum += row[t];
        }
        const float inv = float(1.0 / sum);
        for (int t = 0; t < T; ++t) row[t] *= inv;
    }
    std::vector<float> pooled_mean, pooled_std;
    weighted_stats(x, C, T, attention.data(), &pooled_mean, &pooled_std);
    std::vector<float> pooled(size_t(2) * C);  // [μ; σ]
    std::copy(pooled_mean.begin(), pooled_mean.end(), pooled.begin());
    std::copy(pooled_std.begin(), pooled_std.end(), pooled.begin() + C);
    return pooled;
}

std::vector<float> SpeakerEncoder::embed_mel(const float* mel, int frames, int mel_dim) const {
    const SpeakerEncoderConfig& c = config_;
    if (mel_dim != c.mel_dim)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "speaker encoder: the mel has {} bins, the model takes {}", mel_dim,
             c.mel_dim);
    if (mel == nullptr || frames < min_frames_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "speaker encoder: the reference mel has {} frames, needs at least {} (about {} ms of audio)", frames,
             min_frames_, min_samples() * 1000 / size_t(c.sample_rate));
    const int T = frames;
    for (size_t i = 0; i < size_t(T) * mel_dim; ++i) {
        if (!std::isfinite(mel[i]))
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "speaker encoder: the mel has a non-finite value at frame {}, bin {}",
                 i / size_t(mel_dim), i % size_t(mel_dim));
    }
    // The convolutions run channel-major.
    std::vector<float> mel_ct(size_t(mel_dim) * T);
    for (int t = 0; t < T; ++t)
        for (int m = 0; m < mel_dim; ++m) mel_ct[size_t(m) * T + t] = mel[size_t(t) * mel_dim + m];

    std::vector<float> hidden = block0_forward(mel_ct.data(), T);  // [C0, T]
    std::vector<std::vector<float>> block_outputs;
    for (const SpeakerEncoderBlockF32& block : weights_.blocks) {
        hidden = se_res2net_forward(block, hidden, T);
        block_outputs.push_back(hidden);
    }
    // Multi-layer feature aggregation over the SE-Res2Net outputs.
    std::vector<float> concat;
    for (const auto& o : block_outputs) concat.insert(concat.end(), o.begin(), o.end());
    const std::vector<float> aggregated = tdnn_forward(weights_.mfa, concat.data(), T, c.enc_dilations.back());

    const std::vector<float> pooled = attentive_pool_forward(aggregated, T);  // [2C]
    return conv_same_reflect(weights_.fc, pooled.data(), 1, 1);              // [enc_dim]
}

std::vector<float> SpeakerEncoder::embed_audio(const float* audio, size_t num_samples) const {
    reference_audio_validate(audio, num_samples, min_samples(), "speaker encoder");
    const MelOutput mel = mel_->compute(audio, num_samples);
    return embed_mel(mel.values.data(), mel.frames, mel.n_mels);
}

}  // namespace qtts::cpu
