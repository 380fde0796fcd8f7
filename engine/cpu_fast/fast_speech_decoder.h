// The fast CPU speech decoder (codes -> 24 kHz audio): the reference decoder's stages
// (engine/cpu/speech_decoder.h, qwen3-tts-model.md §8) on time-major signals, with every conv,
// transposed conv and linear run by conv_gemm (conv_gemm.h: register-blocked AVX2, weights packed
// once in fp32 or bf16, work split across the thread pool) and SnakeBeta by a vectorised sine.
//
//   RVQ dequantize -> causal pre_conv k3 -> sliding-window transformer -> 2 × (transposed conv
//   ×2 + ConvNeXt) -> conv k7 -> 4 × (SnakeBeta + causal transposed conv ×r + 3 residual units)
//   -> SnakeBeta -> conv k7 -> clamp.
//
// Streaming is exact as in the reference: a FastDecoderState carries each stage's past (conv
// input tails as the last rows of the time-major input, transposed-conv overlaps, the last
// window-1 keys/values), so chunks of any size give the samples of one pass, to float rounding.
// Against the fp32 reference the fp32 format differs only in the order of fp32 sums and in the
// sine; bf16 rounds every conv/linear weight once (SNR measured in docs/cpu-fast.md).
//
// Weights (FastSpeechDecoder) are read-only after load and shared by every stream; a
// FastDecoderState is one stream's and is used by one thread at a time. Decodes of different
// streams may run on different threads; they take turns on the shared pool.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cpu/speech_decoder.h"
#include "engine/cpu_fast/conv_gemm.h"
#include "engine/cpu_fast/thread_pool.h"
#include "engine/generation/decoder_stream.h"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace qtts::cpu_fast {

// The weight format a model's fast decoder gets, picked from the measured SNR against the fp32
// decode (docs/cpu-fast.md, "Speech decoder"): bf16 weights give 38-39 dB on the random models,
// below the 50 dB floor, and are not faster enough to pay for it.
constexpr ConvFormat FAST_DECODER_FORMAT_DEFAULT = ConvFormat::CONV_FORMAT_FP32;

// The past of one causal stage, time-major: the last `rows` rows of its input (or of its
// transposed-conv output still owed to the next chunk), [rows, channels].
struct TimeTail {
    int rows = 0;
    int channels = 0;
    std::vector<float> data;  // [rows, channels]
};

struct FastDecoderBlockState {
    TimeTail upsample_overlap;    // [k - r, C_out]
    std::vector<TimeTail> units;  // 3 × [6·d, C_out] inputs of the dilated k7 convs (d = 1, 3, 9)
};

// Buffers reused across calls (grown on demand, never shrunk).
struct FastDecoderScratch {
    std::vector<float> x, y;        // the signal between stages, time-major [T, C], ping-pong
    std::vector<float> act;         // [T, C] a residual unit's branch
    std::vector<float> concat;      // [tail + T, C] a causal conv's input with its past
    std::vector<float> cols;        // [T, k·C_out] transposed-conv columns before overlap-add
    std::vector<float> wide;        // [T, 4C] ConvNeXt hidden / transformer MLP
    std::vector<float> q_sem, q_ac; // [n, cd/2] RVQ sums
    std::vector<float> xn, qkv, q, k, v, att, kbuf, vbuf, gate, up, proj;  // transformer [n, ·]
    std::vector<int64_t> positions;  // [n]
};

struct FastDecoderState {
    int64_t frames_done = 0;                       // position of the next frame
    TimeTail pre_conv;                             // [2, codebook_dim]
    std::vector<cpu::AttentionCache> attention;    // one per transformer layer
    std::vector<TimeTail> upsample_overlap;        // per upsampling stage [k - s, latent]
    std::vector<TimeTail> convnext;                // per upsampling stage [6, latent]
    TimeTail conv_in;                              // [6, latent]
    std::vector<FastDecoderBlockState> blocks;     // 4
    TimeTail conv_out;                             // [6, C_last]
    FastDecoderScratch scratch;
};

class FastSpeechDecoder {
public:
    FastSpeechDecoder(const DecoderConfig& config, const SpeechDecoderWeights& weights, ConvFormat format,
                      std::shared_ptr<ThreadPool> pool, int max_chunk_frames = 25);

    const DecoderConfig& config() const { return config_; }
    ConvFormat format() const { return format_; }
    int samples_per_frame() const { return samples_per_frame_; }  // 1920
    size_t packed_bytes() const;                                  // every packed conv and linear
    double macs_per_frame() const;  // multiply-adds of the convs and linears per frame (benchmarks)

    FastDecoderState state_new() const;

    // Decodes n frames (codes [n, num_quantizers]) following everything decoded with `state` and
    // appends n × samples_per_frame() samples to *pcm_out. Throws ERROR_INVALID_ARGUMENT for a code
    // out of range (before touching the state) or a state made by another decoder.
    void decode(FastDecoderState& state, const int32_t* codes, int n, std::vector<float>* pcm_out) const;

    std::vector<float> decode_full(const int32_t* codes, int n) const;

private:
    struct Snake {
        std::vector<float> alpha, inv_beta;  // [C] exp(log_alpha), 1 / (exp(log_beta) + 1e-9)
    };
    struct TransConv {
        int stride = 0, k = 0, cout = 0;
        PackedConv cols;          // [k·cout, cin] as a linear
        std::vector<float> bias;  // [cout]
    };
    struct Layer {
        std::vector<float> input_norm, attn_scale, post_norm, mlp_scale;  // [D]
        PackedConv qkv;       // [qd + 2·kvd, D]: q_proj, k_proj, v_proj stacked
        PackedConv o_proj;    // [D, qd]
        PackedConv gate_up;   // [2·I, D]: gate_proj, up_proj stacked
        PackedConv down;      // [D, I]
    };
    struct ConvNeXt {
        std::vector<float> dw_w;      // [7, C] depthwise taps, time-major
        std::vector<float> dw_b;      // [C]
        std::vector<float> norm_w, norm_b, gamma;  // [C]
        PackedConv pw1;               // [4C, C] + bias
        PackedConv pw2;               // [C, 4C] + bias
    };
    struct Unit {
        Snake act1, act2;  // [C]
        PackedConv conv1;  // [C, C, 7], dilation 1/3/9, + bias
        PackedConv conv2;  // [C, C, 1] + bias
    };
    struct Block {
        Snake snake;       // [C_in]
        TransConv upsample;
        std::vector<Unit> units;
    };

    void chunk_decode(FastDecoderState& state, const int32_t* codes, int n, float* pcm) const;
    void rvq_dequantize(FastDecoderScratch& s, const int32_t* codes, int n) const;  // -> s.y [n, cd]
    void transformer_forward(FastDecoderState& state, int n) const;                   // s.x [n, latent]
    void layer_forward(FastDecoderState& state, int layer, int n, float* h) const;   // h [n, D]
    void convnext_forward(const ConvNeXt& cx, TimeTail& tail, FastDecoderScratch& s, int T) const;
    int block_forward(const Block& blk, FastDecoderBlockState& bs, FastDecoderScratch& s, int T) const;
    void causal_conv(const PackedConv& conv, TimeTail& tail, const float* x, int T, FastDecoderScratch& s, float* y,
                     bool accumulate = false) const;
    void causal_trans_conv(const TransConv& tc, TimeTail& overlap, const float* x, int T, FastDecoderScratch& s,
                           float* y) const;
    void state_check(const FastDecoderState& state) const;

    Snake snake_load(const SnakeWeights& w) const;
    PackedConv conv_load(const ConvWeights& w, int dilation) const;
    TransConv trans_conv_load(const ConvWeights& w, int stride) const;

    DecoderConfig config_;
    ConvFormat format_;
    std::shared_ptr<ThreadPool> pool_;
    int max_chunk_frames_ = 25;
    int samples_per_frame_ = 0;
    int codebook_half_ = 0;
    std::vector<float> rope_inv_freq_;            // [head_dim / 2]
    std::vector<std::vector<float>> codebooks_;   // num_quantizers × [codebook_size, cd/2]
    PackedConv rvq_first_proj_, rvq_rest_proj_;   // [cd, cd/2]
    PackedConv pre_conv_;                         // [latent, cd, 3] + bias
    PackedConv tr_input_proj_;                    // [D, latent] + bias
    std::vector<Layer> tr_layers_;
    std::vector<float> tr_norm_;                  // [D]
    PackedConv tr_output_proj_;                   // [latent, D] + bias
    std::vector<TransConv> upsample_conv_;        // [latent, latent, ratio], stride ratio
    std::vector<ConvNeXt> upsample_convnext_;
    PackedConv conv_in_;                          // [decoder_dim, latent, 7] + bias
    std::vector<Block> blocks_;
    Snake snake_out_;                             // [C_last]
    PackedConv conv_out_;                         // [1, C_last, 7] + bias
};

// The fast decoder as a DecoderStream: the shared decoder and one utterance's state.
class FastDecoderStream final : public DecoderStream {
public:
    // `decoder` must outlive the stream.
    explicit FastDecoderStream(const FastSpeechDecoder& decoder) : decoder_(decoder), state_(decoder.state_new()) {}
    void decode(const int32_t* codes, int n, std::vector<float>* pcm) override { decoder_.decode(state_, codes, n, pcm); }

private:
    const FastSpeechDecoder& decoder_;
    FastDecoderState state_;
};

}  // namespace qtts::cpu_fast
