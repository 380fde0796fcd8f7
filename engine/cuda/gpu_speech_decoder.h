// The speech-tokenizer decoder (codes -> 24 kHz audio, model doc §8) on the GPU: the CUDA twin
// of cpu/speech_decoder.h, fp32 activations throughout, its convolution products on tensor cores
// as split-bf16 pairs (DecoderMath; cuBLAS SGEMM for the fp32 reference mode), and streamed
// exactly the same way: every causal stage carries what it needs from the past, so
// decoding frames in chunks of any size gives the samples of one pass over all frames.
//
// GpuSpeechDecoderWeights: every decoder tensor uploaded once as fp32, the convolution products'
// weights as bf16 hi/lo pairs instead under bf16x3 (read-only after upload; one upload can serve
// many GpuSpeechDecoder streams on the same device). Dense convs are
// stored as [C_out, C_in·K + 1] with the bias as the last column (the im2col appends a row of
// ones), Q/K/V and gate/up are stacked, SnakeBeta alpha/inv_beta precomputed as the CPU does.
//
// GpuSpeechDecoder: one stream's state on one device — conv input tails (two slots each: a
// chunk reads one and writes the other, chosen by the parity of a device chunk counter, so the
// tail update rides in the im2col launch), transposed-conv overlap tails, a K/V ring of
// (window - 1 + max_chunk_frames) rows per attention layer, the absolute position and the chunk
// counter, all in ONE device block (DecoderStateLayout; reset() is one memset) — plus a
// DecoderPass with scratch for max_chunk_frames frames, all allocated in the constructor. The
// same block can also be advanced by a batched pass of several streams (GpuBatchDecoder). A chunk of n frames is one
// device-resident sequence of kernels reading the position from device memory, so it is
// captured once per configured chunk size into a CUDA graph (default sizes {1, 2, 4}) and
// replayed; other sizes, or graphs off (the cuda_graphs option), run the same kernels
// eagerly with bitwise identical output.
//
// Use (the runtime's view):
//   auto w = GpuSpeechDecoderWeights::upload(*checkpoint, context.device());
//   GpuSpeechDecoder dec(w, context);           // on the context's owner thread
//   dec.decode(codes, n, &pcm);                  // codes [n, 16] host; appends n·1920 samples
//   dec.reset();                                 // next utterance
// decode() validates every code (0..codebook_size-1) before touching any state, uploads the
// codes, runs ceil(n / max_chunk_frames) chunks, and copies the PCM back with one D2H copy per
// chunk into a pinned buffer; it returns when the samples are on the host (it synchronises
// the context stream).
//
// Measured on the H200 (release size, graphs on, fp32): 1.15 / 0.70 / 0.43 / 0.23 ms of GPU time
// per 80 ms frame at chunks of 1 / 2 / 4 / 25 frames (docs/cuda.md).
//
// Threading: a GpuSpeechDecoder belongs to the owner thread of its GpuContext (checked on every
// call, like GpuLm); it shares the context's stream and cuBLAS handle.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/device_buffer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_context.h"
#include "kernels/decoder.cuh"
#include "kernels/few_columns.cuh"
#include "engine/model/config.h"
#include "engine/model/weights.h"

namespace qtts::cuda {

// Row-major fp32 product on the context's stream and cuBLAS handle (SGEMM; TF32 tensor cores
// only when `tf32` is set):
//   C[M, N] = op(A)[M, K] · op(B)[K, N] + beta · C    (op = transpose when trans_*)
void sgemm_row_major(GpuContext& context, bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                     const float* B, int ldb, float beta, float* C, int ldc, bool tf32 = false);

// The same product from bf16 hi/lo pairs on tensor cores with fp32 accumulation ("bf16x3"):
//   C[M, N] = A_hi·B_hi + A_hi·B_lo + A_lo·B_hi (+ beta · C)
// as one GEMM over 3K, [A_hi | A_hi | A_lo]·[B_hi; B_lo; B_hi]. `a3` holds A three times along K
// (hi, hi, lo: rows [M, 3K] with lda >= 3K, or with trans_a the blocks stacked [3K, M]); `b3` is
// [3K, N] (hi rows, lo rows, hi rows again; leading dimension N), as the split kernels write it.
// The lo·lo term is left out: about 16 mantissa bits per operand, against fp32's 24 and TF32's 11.
void split_gemm_row_major(GpuContext& context, bool trans_a, int M, int N, int K, const uint16_t* a3, int lda,
                          const uint16_t* b3, float beta, float* C, int ldc);

// The arithmetic of the decoder's convolution products (the im2col convs and the transposed
// convs: ~95% of its FLOPs). The transformer, the RVQ projection and the ConvNeXt pointwise
// layers stay fp32 (TF32 under DECODER_MATH_TF32).
enum class DecoderMath {
    DECODER_MATH_FP32,    // cuBLAS SGEMM
    DECODER_MATH_TF32,    // TF32 tensor cores: measured 53.5 dB SNR against fp32, kept for measurements
    DECODER_MATH_BF16X3,  // split-bf16 tensor-core products (split_gemm_row_major)
};
const char* decoder_math_name(DecoderMath math);  // "fp32", "tf32", "bf16x3"
bool decoder_math_parse(const std::string& name, DecoderMath* out);

struct GpuSpeechDecoderWeightOptions {
    // Pad the rows of the im2col-GEMM weights ([C_out, C_in·K + 1] and the ConvNeXt pointwise
    // layers) with zero columns to a multiple of 4 floats (8 under DECODER_MATH_BF16X3), so that
    // cuBLAS sees 16-byte aligned leading dimensions. Results are the same up to float rounding.
    bool pad_rows = true;
    // The default: bf16x3, measured against fp32 in docs/cuda.md ("Split-bf16 products").
    DecoderMath math = DecoderMath::DECODER_MATH_BF16X3;
};

class GpuSpeechDecoderWeights {
public:
    // A dense conv (groups 1): w [cout, row], row >= cin·k + 1: the weights, the bias (0 when
    // none) in column cin·k, zeros after it.
    // Under DECODER_MATH_BF16X3 the product's weights are bf16 pairs in `planes` and `w` is null
    // (but for the output conv, whose direct kernel reads `w`).
    struct Conv {
        int cin = 0, cout = 0, k = 0, dilation = 1, row = 0;
        const float* w = nullptr;
        const uint16_t* planes = nullptr;  // [cout, 3·row] bf16: each row's hi, hi again, lo
        int tail() const { return (k - 1) * dilation; }
    };
    struct TransConv {
        int cin = 0, cout = 0, k = 0, stride = 0;
        const float* w = nullptr;          // [cin, cout·k] (the checkpoint layout)
        const uint16_t* planes = nullptr;  // [3·cin, cout·k] bf16: hi rows, hi rows again, lo rows
        const float* b = nullptr;          // [cout]
        int overlap() const { return k - stride; }
    };
    struct Layer {
        const float* input_norm = nullptr;  // [D]
        const float* qkv = nullptr;         // [(heads + 2 kv)·hd, D]  q, k, v rows
        const float* o = nullptr;           // [D, heads·hd]
        const float* attn_scale = nullptr;  // [D]
        const float* post_norm = nullptr;   // [D]
        const float* gate_up = nullptr;     // [2I, D]  gate rows, then up rows
        const float* down = nullptr;        // [D, I]
        const float* mlp_scale = nullptr;   // [D]
    };
    struct ConvNeXt {
        int channels = 0, k = 7;
        const float* dw_w = nullptr;    // [C, 7] depthwise
        const float* dw_b = nullptr;    // [C]
        const float* norm_w = nullptr;  // [C]
        const float* norm_b = nullptr;  // [C]
        const float* pw1 = nullptr;     // [4C, pw1_row] (bias in column C, zeros after)
        const float* pw2 = nullptr;     // [C, pw2_row] (bias in column 4C, zeros after)
        int pw1_row = 0, pw2_row = 0;
        // Under DECODER_MATH_BF16X3 the two products' weights as bf16 pairs instead ([hi | hi | lo]
        // per row, as Conv::planes; pw1 and pw2 are null).
        const uint16_t* pw1_planes = nullptr;
        const uint16_t* pw2_planes = nullptr;
        const float* gamma = nullptr;   // [C]
    };
    struct ResidualUnit {
        kernels::SnakeParams act1;
        Conv conv1;  // [C, C·7 + 1], dilation 1/3/9
        kernels::SnakeParams act2;
        Conv conv2;  // [C, C + 1]
    };
    struct Block {
        kernels::SnakeParams snake;  // [C_in]
        TransConv upsample;          // k = 2r, stride r
        std::vector<ResidualUnit> units;
    };

    static std::shared_ptr<const GpuSpeechDecoderWeights> upload(const Checkpoint& checkpoint, int device,
                                                                 GpuSpeechDecoderWeightOptions options = {});
    static std::shared_ptr<const GpuSpeechDecoderWeights> upload(const DecoderConfig& config,
                                                                 const SpeechDecoderWeights& weights, int device,
                                                                 GpuSpeechDecoderWeightOptions options = {});

    const DecoderConfig& config() const { return config_; }
    DecoderMath math() const { return math_; }
    int device() const { return device_; }
    int samples_per_frame() const { return samples_per_frame_; }
    size_t device_bytes() const { return device_bytes_; }

    // Device pointers (read-only).
    const float* codebooks = nullptr;  // [nq, codebook_size, cd/2] (divided by cluster usage)
    const float* rvq_proj = nullptr;   // [cd, cd] = [first_proj | rest_proj]
    Conv pre_conv;
    const float* tr_input_w = nullptr;   // [D, latent]
    const float* tr_input_b = nullptr;   // [D]
    std::vector<Layer> layers;
    const float* tr_norm = nullptr;      // [D]
    const float* tr_output_w = nullptr;  // [latent, D]
    const float* tr_output_b = nullptr;  // [latent]
    const float* inv_freq = nullptr;     // [head_dim / 2]
    std::vector<TransConv> upsample;     // k == stride
    std::vector<ConvNeXt> convnext;
    Conv conv_in;
    std::vector<Block> blocks;
    kernels::SnakeParams snake_out;
    Conv conv_out;

private:
    GpuSpeechDecoderWeights() = default;
    const float* store(const std::vector<float>& host);  // uploads and keeps the allocation
    const uint16_t* store(const std::vector<uint16_t>& host);
    template <typename T>
    const T* store_in(const std::vector<T>& host, std::vector<DeviceArray<T>>* buffers);

    DecoderConfig config_;
    DecoderMath math_ = DecoderMath::DECODER_MATH_FP32;
    int device_ = 0;
    int samples_per_frame_ = 0;
    size_t device_bytes_ = 0;
    std::vector<DeviceArray<float>> buffers_;
    std::vector<DeviceArray<uint16_t>> buffers16_;
};

struct GpuSpeechDecoderOptions {
    int max_chunk_frames = 25;              // frames per internal chunk (sizes the scratch)
    std::vector<int> graph_chunk_sizes{1, 2, 4};  // one CUDA graph per size (<= max_chunk_frames)
    bool cuda_graphs = true;                // false: everything eager
    // Chunks of up to 8 frames run the transformer's products as fused small-row kernels
    // (kernels::small_linear) instead of cuBLAS + separate norm/epilogue kernels. Off by default:
    // measured 3-9% slower per frame than cuBLAS on the H200 (see docs/cuda.md).
    bool small_kernels = false;
};

// Where each piece of one stream's carried state lives in its device block (byte offsets from
// the block's start; kernels/decoder.cuh DecoderStates). The same for every stream decoded with
// the same weights and largest chunk, which is what lets one pass serve several streams.
struct DecoderStateLayout {
    size_t bytes = 0;   // the whole block
    int ring_rows = 0;  // K/V ring rows per attention layer: window - 1 + the largest chunk
    int max_chunk_frames = 0;
    size_t pre_conv_tail = 0;          // [2, C, L] tails (two slots) ...
    std::vector<size_t> k_ring, v_ring;  // per layer [ring_rows, kv·hd]
    std::vector<size_t> upsample_overlap, convnext_tail;
    size_t conv_in_tail = 0;
    std::vector<size_t> block_overlap;
    std::vector<std::vector<size_t>> unit_tail;  // [block][unit]
    size_t conv_out_tail = 0;

    static DecoderStateLayout make(const GpuSpeechDecoderWeights& weights, int max_chunk_frames);
    bool operator==(const DecoderStateLayout& o) const;
};

// The kernels of one decoder pass: n frames for each of S streams (S·n <= max_frames), reading
// codes_device() [S·n, nq] (stream-major) and writing pcm_device() [S, n·spf], with the scratch
// for max_frames frames. It owns no stream state: enqueue() is handed the table of the streams'
// state blocks. Shared by GpuSpeechDecoder (S = 1) and GpuBatchDecoder (S streams).
// Threading: the owner thread of the context.
class DecoderPass {
public:
    DecoderPass(std::shared_ptr<const GpuSpeechDecoderWeights> weights, GpuContext& context,
                const DecoderStateLayout& layout, int max_frames, const GpuSpeechDecoderOptions& options);
    DecoderPass(const DecoderPass&) = delete;
    DecoderPass& operator=(const DecoderPass&) = delete;

    // Every kernel of the pass, asynchronous on the context stream (graph-capturable); every
    // stream advances by n frames. n <= the layout's max_chunk_frames, states.count·n <= max_frames.
    void enqueue(kernels::DecoderStates states, int n);
    int32_t* codes_device() { return codes_dev_.get(); }
    const float* pcm_device() const { return pcm_dev_.get(); }
    int max_frames() const { return max_frames_; }
    size_t scratch_bytes() const { return scratch_bytes_; }
    const DecoderStateLayout& layout() const { return layout_; }
    const GpuSpeechDecoderWeights* weights() const { return weights_.get(); }
    const GpuSpeechDecoderOptions& options() const { return options_; }
    // Benchmarks: runs `enqueue` (which enqueues this pass's kernels, eagerly) with CUDA events
    // at the pass's stage boundaries and returns (what ran, GPU ms) pairs in launch order ("rvq",
    // "transformer", "convnext", "conv im2col", "conv products", ...: sum them by name).
    // Synchronous.
    std::vector<std::pair<std::string, float>> profile(const std::function<void()>& enqueue);

private:
    void mark(const char* stage);
    void marks_set(std::vector<std::pair<const char*, cudaEvent_t>>* marks) { marks_ = marks; }
    void transformer_enqueue(kernels::DecoderStates states, int n, float* x);
    // conv over [tail | snake(x)] for T frames per stream: y [cout, S·T] (= or += when beta is 1).
    void conv_enqueue(kernels::DecoderStates states, const GpuSpeechDecoderWeights::Conv& conv, size_t tail_at,
                      const float* x, int T, kernels::SnakeParams snake, float* y, float beta);
    // The transposed conv of snake(x) (x when snake.alpha is null): y [cout, S·T·stride]; x is
    // read before y is written, so y may be x.
    void trans_conv_enqueue(kernels::DecoderStates states, const GpuSpeechDecoderWeights::TransConv& tc,
                            size_t overlap_at, const float* x, int T, kernels::SnakeParams snake, float* y);
    void convnext_enqueue(kernels::DecoderStates states, const GpuSpeechDecoderWeights::ConvNeXt& cx, size_t tail_at,
                          float* x, int T);
    // C [M, N] = W [M, K] · B [K, N] (B fp32, row-major): on split-bf16 pairs when `planes` is set
    // (B split into the planes_ scratch first), else the fp32 weights `w` (SGEMM or TF32).
    void weight_product(int M, int N, int K, const float* w, const uint16_t* planes, const float* B, float* C);
    void gemm(bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda, const float* B, int ldb,
              float beta, float* C, int ldc) {
        sgemm_row_major(context_, trans_a, trans_b, M, N, K, A, lda, B, ldb, beta, C, ldc,
                        weights_->math() == DecoderMath::DECODER_MATH_TF32);
    }

    std::shared_ptr<const GpuSpeechDecoderWeights> weights_;
    GpuContext& context_;
    const DecoderStateLayout layout_;
    const int max_frames_;
    const GpuSpeechDecoderOptions options_;
    std::vector<std::pair<const char*, cudaEvent_t>>* marks_ = nullptr;
    DeviceArray<float> x_, y_, col_, aux_;  // signals, im2col / GEMM operands
    DeviceArray<uint16_t> planes_;          // bf16 hi/lo operands of the split products (bf16x3)
    DeviceArray<float> few_partials_;       // the few-column products' slices (kernels/few_columns.cuh)
    DeviceArray<uint32_t> few_tickets_;
    kernels::FewColumnsWorkspace few_workspace() {
        return {few_partials_.get(), few_partials_.size(), few_tickets_.get(), int(few_tickets_.size())};
    }
    DeviceArray<float> h_, xn_, qkv_, att_, tmp_, gu_, act_;  // transformer rows
    DeviceArray<int32_t> codes_dev_;
    DeviceArray<float> pcm_dev_;
    size_t scratch_bytes_ = 0;
};

class GpuSpeechDecoder {
public:
    // `shared_pass`: scratch shared with other decoders of the same weights, layout and options on
    // this context (they run one after another on its stream, so one scratch serves them all;
    // cuda/gpu_decoder_pool.cpp shares one per pool); null: a pass of its own.
    GpuSpeechDecoder(std::shared_ptr<const GpuSpeechDecoderWeights> weights, GpuContext& context,
                     GpuSpeechDecoderOptions options = {}, std::shared_ptr<DecoderPass> shared_pass = nullptr);
    GpuSpeechDecoder(const GpuSpeechDecoder&) = delete;
    GpuSpeechDecoder& operator=(const GpuSpeechDecoder&) = delete;

    const DecoderConfig& config() const { return weights_->config(); }
    const std::shared_ptr<const GpuSpeechDecoderWeights>& weights() const { return weights_; }
    const GpuSpeechDecoderOptions& options() const { return options_; }
    GpuContext& context() { return context_; }
    int samples_per_frame() const { return weights_->samples_per_frame(); }
    int max_chunk_frames() const { return options_.max_chunk_frames; }
    int64_t frames_done() const { return frames_done_; }
    bool graphs_enabled() const { return graphs_enabled_; }
    const std::vector<GraphStats>& graph_stats() const { return graph_stats_; }
    size_t state_bytes() const { return state_.bytes(); }
    size_t scratch_bytes() const { return pass_->scratch_bytes(); }

    // Decodes n frames (codes [n, num_quantizers] row-major, host memory) following everything
    // decoded since the last reset() and appends n × samples_per_frame() samples to *pcm_out.
    // Throws qtts::Error (ERROR_INVALID_ARGUMENT) for a code outside 0..codebook_size-1 before
    // touching the state. Synchronous.
    void decode(const int32_t* codes, int n, std::vector<float>* pcm_out);

    // A new stream: zero tails and K/V rings, position 0 (synchronous).
    void reset();

    // ---- for benchmarks: the device part of one chunk, without host copies --------------------
    // Uploads codes [n, nq] (n <= max_chunk_frames) into the device codes buffer (async).
    void codes_upload(const int32_t* codes, int n);
    // Runs one chunk of n frames on the uploaded codes (graph when captured for n, else eager);
    // the samples land in the device PCM buffer. Asynchronous on the context stream.
    void chunk_run(int n);
    bool has_graph(int n) const { return graphs_enabled_ && graphs_.count(n) != 0; }
    // One eager chunk of n frames on the uploaded codes with CUDA events between its pieces:
    // (what ran, GPU ms) pairs in launch order, a name once per piece ("conv im2col", "conv
    // products", "transposed conv input", "convnext", "transformer", ...: sum them by name).
    // Advances the stream like chunk_run (synchronous).
    std::vector<std::pair<std::string, float>> chunk_profile(int n);

    // ---- for fused chunk graphs (cuda/fused_chunks.h): the codes come from the device ----------
    int32_t* codes_device() { return pass_->codes_device(); }   // chunk input [max_chunk_frames, nq]
    const float* pcm_device() const { return pass_->pcm_device(); }  // chunk output [max_chunk_frames · spf]
    // Enqueues the kernels of one chunk of n frames on the context stream, for a capture the
    // caller has begun (owner thread).
    void chunk_enqueue_for_capture(int n);
    // Host bookkeeping after a fused replay or a batched pass decoded n frames (frames_done()).
    void frames_decoded_add(int n) { frames_done_ += n; }

    // ---- for batched passes (cuda/gpu_batch_decoder.h) -------------------------------------------
    const DecoderStateLayout& layout() const { return layout_; }
    char* state_block() { return static_cast<char*>(state_.get()); }  // device

private:
    void chunk_enqueue(int n) { pass_->enqueue({states_.get(), 1}, n); }  // graph-capturable

    std::shared_ptr<const GpuSpeechDecoderWeights> weights_;
    GpuContext& context_;
    GpuSpeechDecoderOptions options_;
    DecoderStateLayout layout_;
    bool graphs_enabled_ = false;
    int64_t frames_done_ = 0;

    DeviceBuffer state_;               // this stream's state block (layout_), reset() is one memset
    DeviceArray<char*> states_;        // [1]: the table the kernels read, pointing at state_
    std::shared_ptr<DecoderPass> pass_;  // scratch for max_chunk_frames frames, perhaps shared
    PinnedArray<int32_t> codes_host_;
    PinnedArray<float> pcm_host_;

    std::map<int, GraphExec> graphs_;
    std::vector<GraphStats> graph_stats_;
};

}  // namespace qtts::cuda
