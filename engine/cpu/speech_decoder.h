// CPU fp32 reference of the Qwen3-TTS speech-tokenizer decoder (codes -> 24 kHz audio).
//
// Stages (qwen3-tts-model.md §8): RVQ dequantize -> causal pre_conv k3 -> sliding-window
// transformer -> 2 × (transposed conv ×2 + ConvNeXt) -> conv k7 -> 4 × (SnakeBeta + causal
// transposed conv ×r + 3 residual units) -> SnakeBeta -> conv k7 -> clamp.
//
// Every stage is causal, so decoding is streamed *exactly*: a DecoderState carries what each
// stage needs from the past (conv input tails, transposed-conv overlap tails, the last
// window-1 keys/values of every attention layer and the absolute position). Decoding frames
// in chunks of any size gives the same samples as one pass over all frames, to float
// rounding. See docs/decoder.md.
//
// The weights (CpuSpeechDecoder) are converted to fp32 once and are read-only: one decoder can
// serve many streams on many threads, each with its own DecoderState. A DecoderState must only
// be used by one thread at a time. A DecoderState is a plain value: copying it forks the stream
// (both copies continue identically).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace qtts::cpu {

// The past a causal conv needs: the last `len` input columns of each channel (zeros before
// the first frame, which is exactly the causal zero padding of a full decode).
struct ConvTail {
    int channels = 0;
    int len = 0;
    std::vector<float> data;  // [channels, len]
};

// Keys/values of the last (window - 1) positions of one attention layer, oldest first, after
// RoPE (so they never need re-rotation).
struct AttentionCache {
    int rows = 0;        // valid rows (< window)
    std::vector<float> k;  // [window - 1, kv_heads * head_dim]
    std::vector<float> v;  // [window - 1, kv_heads * head_dim]
};

struct DecoderBlockState {
    ConvTail upsample_overlap;     // [C_out, r]   transposed-conv output still owed to the next frame
    std::vector<ConvTail> units;   // 3 × [C_out, 6·d] input tails of the dilated k7 convs (d = 1, 3, 9)
};

// Scratch buffers reused across calls (grown on demand, never shrunk).
struct DecoderScratch {
    std::vector<float> x, y;       // the signal between stages (channel-major), ping-pong
    std::vector<float> tmp, tmp2;  // stage temporaries
    std::vector<float> concat;     // [C, tail + T] conv input with its carried tail
    std::vector<float> xn, q, k, v, att, kbuf, vbuf, gate, up, proj;  // transformer (time-major)
    std::vector<int64_t> positions;                                  // [T] absolute positions
};

struct DecoderState {
    int64_t frames_done = 0;                  // frames decoded so far = position of the next frame
    ConvTail pre_conv;                        // [codebook_dim, 2]
    std::vector<AttentionCache> attention;    // one per transformer layer
    std::vector<ConvTail> upsample_overlap;   // per upsampling stage [latent, k - s] (0 wide when k == s)
    std::vector<ConvTail> convnext;           // per upsampling stage [latent, 6]
    ConvTail conv_in;                         // decoder.0 [latent, 6]
    std::vector<DecoderBlockState> blocks;    // 4
    ConvTail conv_out;                        // decoder.6 [C_last, 6]
    DecoderScratch scratch;

    // Bytes of carried state (excluding scratch).
    size_t carried_bytes() const;
};

struct CpuSpeechDecoderOptions {
    // decode() processes at most this many frames per internal step (bounds the scratch
    // memory: the 24 kHz stage holds C_last × 1920 × frames floats). Results do not depend on
    // it beyond float rounding, because streaming is exact.
    int max_chunk_frames = 25;
};

class CpuSpeechDecoder {
public:
    explicit CpuSpeechDecoder(const Checkpoint& checkpoint, CpuSpeechDecoderOptions options = {});
    CpuSpeechDecoder(const DecoderConfig& config, const SpeechDecoderWeights& weights,
                     CpuSpeechDecoderOptions options = {});

    const DecoderConfig& config() const { return config_; }
    int num_quantizers() const { return config_.num_quantizers; }
    int samples_per_frame() const { return samples_per_frame_; }  // 1920

    // A fresh stream: no past, next frame at position 0.
    DecoderState state_new() const;

    // Decodes n frames (codes [n, num_quantizers] row-major, one frame per row) that follow
    // everything decoded with `state` so far, and appends n × samples_per_frame() samples to
    // *pcm_out. Throws qtts::Error (ERROR_INVALID_ARGUMENT) for a code outside
    // 0..codebook_size-1 before touching the state, and for a state made by a different decoder.
    void decode(DecoderState& state, const int32_t* codes, int n, std::vector<float>* pcm_out) const;

    // One decode of all n frames from a fresh state (positions start at 0).
    std::vector<float> decode_full(const int32_t* codes, int n) const;

    // RVQ output before pre_conv, time-major [n, codebook_dim] (the golden `dequantized`).
    std::vector<float> dequantize(const int32_t* codes, int n) const;

private:
    struct Conv {
        int cin = 0, cout = 0, k = 0, dilation = 1, groups = 1;
        std::vector<float> w;  // [cout, cin/groups, k]
        std::vector<float> b;  // [cout] (empty: no bias)
    };
    struct TransConv {
        int cin = 0, cout = 0, k = 0, stride = 0;
        std::vector<float> w;  // [cin, cout, k]
        std::vector<float> b;  // [cout]
    };
    struct Snake {
        std::vector<float> log_alpha, log_beta;  // [C]
    };
    struct TransformerLayer {
        std::vector<float> input_norm;  // [D]
        std::vector<float> q_proj;      // [heads*hd, D]
        std::vector<float> k_proj;      // [kv*hd, D]
        std::vector<float> v_proj;      // [kv*hd, D]
        std::vector<float> o_proj;      // [D, heads*hd]
        std::vector<float> attn_scale;  // [D]
        std::vector<float> post_norm;   // [D]
        std::vector<float> gate_proj;   // [I, D]
        std::vector<float> up_proj;     // [I, D]
        std::vector<float> down_proj;   // [D, I]
        std::vector<float> mlp_scale;   // [D]
    };
    struct ConvNeXt {
        Conv dwconv;                  // depthwise [C, 1, 7]
        std::vector<float> norm_w;    // [C]
        std::vector<float> norm_b;    // [C]
        std::vector<float> pw1_w;     // [4C, C]
        std::vector<float> pw1_b;     // [4C]
        std::vector<float> pw2_w;     // [C, 4C]
        std::vector<float> pw2_b;     // [C]
        std::vector<float> gamma;     // [C]
    };
    struct ResidualUnit {
        Snake act1;
        Conv conv1;  // [C, C, 7], dilation 1/3/9
        Snake act2;
        Conv conv2;  // [C, C, 1]
    };
    struct Block {
        Snake snake;        // [C_in]
        TransConv upsample; // [C_in, C_out, 2r], stride r
        std::vector<ResidualUnit> units;
    };

    // Per-chunk stages. Each reads and writes the signal in scratch.x (channel-major [C, T]).
    void chunk_decode(DecoderState& state, const int32_t* codes, int n, float* pcm) const;
    void rvq_dequantize(const int32_t* codes, int n, float* z) const;  // z [n, codebook_dim]
    void transformer_forward(DecoderState& state, int n) const;
    void transformer_layer_forward(DecoderState& state, int layer, int n, float* h) const;  // h [n, D]
    void convnext_forward(const ConvNeXt& cx, ConvTail& tail, DecoderScratch& s, int T) const;
    int block_forward(const Block& block, DecoderBlockState& bs, DecoderScratch& s, int T) const;
    void state_check(const DecoderState& state) const;

    static void causal_conv(const Conv& conv, ConvTail& tail, const float* x, int T, std::vector<float>& buf,
                            float* y);
    static void causal_trans_conv(const TransConv& tc, ConvTail& overlap, const float* x, int T,
                                  std::vector<float>& buf, float* y);
    static Conv conv_load(const ConvWeights& w, int dilation, int groups);
    static TransConv trans_conv_load(const ConvWeights& w, int stride);
    static Snake snake_load(const SnakeWeights& w);

    DecoderConfig config_;
    CpuSpeechDecoderOptions options_;
    std::vector<float> rope_inv_freq_;  // [head_dim / 2]
    int samples_per_frame_ = 0;
    int codebook_half_ = 0;

    std::vector<std::vector<float>> codebooks_;  // num_quantizers × [codebook_size, codebook_dim/2]
    std::vector<float> rvq_first_proj_;          // [codebook_dim, codebook_dim/2]
    std::vector<float> rvq_rest_proj_;           // [codebook_dim, codebook_dim/2]
    Conv pre_conv_;                              // [latent, codebook_dim, 3]
    std::vector<float> tr_input_proj_w_;         // [D, latent]
    std::vector<float> tr_input_proj_b_;         // [D]
    std::vector<TransformerLayer> tr_layers_;
    std::vector<float> tr_norm_;                 // [D]
    std::vector<float> tr_output_proj_w_;        // [latent, D]
    std::vector<float> tr_output_proj_b_;        // [latent]
    std::vector<TransConv> upsample_conv_;       // [latent, latent, ratio], stride ratio
    std::vector<ConvNeXt> upsample_convnext_;
    Conv conv_in_;                               // [decoder_dim, latent, 7]
    std::vector<Block> blocks_;
    Snake snake_out_;                            // [C_last]
    Conv conv_out_;                              // [1, C_last, 7]
};

}  // namespace qtts::cpu
