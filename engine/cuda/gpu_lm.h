// The talker and the code predictor on the GPU (model doc §4, §5, §7), the CUDA twin of
// cpu/lm.h: same numbers up to fp32 rounding (bf16 weights, fp32 activations, fp32 KV cache,
// norms, RoPE and softmax in fp32).
//
// GpuLmWeights: every talker/predictor tensor uploaded once as bf16 (norms, biases and RoPE
// frequencies as fp32), Q/K/V and gate/up stacked so that one pass reads each layer's inputs
// once. Read-only after upload.
//
// GpuLm: one stream's mutable state on one device (KV caches, activations, sampling state,
// codes, text track), all allocated in the constructor, and the forward passes:
//   * step-by-step calls mirroring cpu/lm.h (host inputs/outputs; tests and debugging);
//   * the device-resident frame step (frame_step_enqueue): 15 predictor passes with on-device
//     sampling, the next talker input (16 codebook embeddings + text track), one talker step and
//     the codebook-0 draw. Positions, the frame index, the text cursor and the RNG counter live
//     in device memory and are advanced by the kernels, so the step can be captured once into a
//     CUDA graph and replayed every frame (graph rules 14-18).
// Decode-time products are custom gemv kernels; prefill-sized products are cuBLAS bf16 GEMMs on
// split (hi + lo) bf16 activations, which keeps fp32-level accuracy.
//
// Threading: a GpuLm belongs to the owner thread of its GpuContext (checked on every call).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/cuda/device_buffer.h"
#include "engine/cuda/gpu_context.h"
#include "kernels/attention.cuh"
#include "kernels/batch.cuh"
#include "kernels/linear.cuh"
#include "kernels/sampling.cuh"
#include "engine/model/weight_prep.h"
#include "engine/model/weights.h"
#include "engine/generation/sampling.h"
#include "engine/text/prompt.h"

namespace qtts::cuda {

using kernels::bf16_t;

// Device pointers of one decoder stack.
struct GpuStack : StackShape {
    struct Layer {
        const float* input_norm = nullptr;  // [H]
        const bf16_t* qkv = nullptr;        // [(n_heads + 2 n_kv) head_dim, H]  q, k, v rows
        const bf16_t* o = nullptr;          // [H, n_heads head_dim]
        const float* q_norm = nullptr;      // [head_dim]
        const float* k_norm = nullptr;      // [head_dim]
        const float* post_norm = nullptr;   // [H]
        const bf16_t* gate_up = nullptr;    // [2 I, H]  gate rows, then up rows
        const bf16_t* down = nullptr;       // [H, I]
    };
    std::vector<Layer> layers;
    const float* norm = nullptr;      // [H] final RMSNorm
    const float* inv_freq = nullptr;  // [head_dim / 2] RoPE frequencies, computed as the CPU does

    int q_dim() const { return n_heads * head_dim; }
    int kv_dim() const { return n_kv * head_dim; }
    int qkv_dim() const { return q_dim() + 2 * kv_dim(); }
    // bf16 weight bytes one decode pass reads (all layers, without the head).
    size_t layer_weight_bytes() const;
};

class GpuLmWeights {
public:
    // Uploads the talker and code predictor of a loaded checkpoint to `device`.
    static std::shared_ptr<const GpuLmWeights> upload(std::shared_ptr<const Checkpoint> checkpoint, int device);

    const ModelConfig& config() const { return checkpoint_->config; }
    const Checkpoint& checkpoint() const { return *checkpoint_; }
    int device() const { return device_; }
    size_t device_bytes() const { return arena_.bytes() + input_rows_.bytes(); }
    double upload_seconds() const { return upload_seconds_; }

    int num_code_groups = 16;
    int codec_vocab = 3072;
    int predictor_vocab = 2048;
    int text_hidden = 0;
    int text_vocab = 0;

    GpuStack talker;
    const bf16_t* codec_embedding = nullptr;  // [codec_vocab, H]
    const bf16_t* codec_head = nullptr;       // [codec_vocab, H]
    const bf16_t* text_embedding = nullptr;   // [text_vocab, Ht]
    const bf16_t* text_fc1_w = nullptr;       // [Ht, Ht]
    const float* text_fc1_b = nullptr;        // [Ht]
    const bf16_t* text_fc2_w = nullptr;       // [H, Ht]
    const float* text_fc2_b = nullptr;        // [H]

    GpuStack predictor;
    std::vector<const bf16_t*> predictor_codec_embedding;  // (G-1) x [predictor_vocab, H]
    std::vector<const bf16_t*> predictor_head;             // (G-1) x [predictor_vocab, Hc]
    const bf16_t* predictor_proj_w = nullptr;              // [Hc, H]; null = identity (0.6B)
    const float* predictor_proj_b = nullptr;               // [Hc]
    // With the projection: the input of predictor passes 2..G-1 for every code, computed once at
    // upload by the projection's own gemv (gathering each embedding row), so a row is bit for bit
    // what that launch would write for its code. The draw before a pass copies the row of the
    // code it picked (SampleArgs::embed_rows): the pass needs no projection launch. Entry g - 2
    // is pass g's, [predictor_vocab, Hc] fp32 (14 x 8 MB for the 1.7B). Empty without a projection
    // (the draw copies the embedding itself).
    std::vector<const float*> predictor_input_rows;

    // Bytes of bf16 weights one frame reads: the talker step + head; the predictor's G - 1 passes
    // + heads and its input projection, which only pass 1 reads (predictor_input_rows).
    size_t talker_step_bytes() const;
    size_t predictor_frame_bytes() const;

private:
    std::shared_ptr<const Checkpoint> checkpoint_;
    DeviceBuffer arena_;
    DeviceBuffer input_rows_;  // predictor_input_rows
    int device_ = 0;
    double upload_seconds_ = 0.0;
};

struct GpuLmOptions {
    int max_context = 4096;   // talker positions (prompt + generated frames) per utterance
    int prefill_chunk = 128;  // prompt rows per prefill pass
};

// What an utterance starts with (GenerationParams resolved for the device).
struct GpuGenerationSetup {
    uint64_t seed = 0;
    SamplingParams talker;
    SamplingParams predictor;
    int min_new_tokens = 2;
    // Batched steps: the stream stops (device-side) once it has this many frames (cuda/gpu_batch.h).
    int frame_end = 0x7fffffff;
};

class GpuLm final : public EmbeddingTables {
public:
    GpuLm(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, GpuLmOptions options = {});
    ~GpuLm() override;
    GpuLm(const GpuLm&) = delete;
    GpuLm& operator=(const GpuLm&) = delete;

    const GpuLmWeights& weights() const { return *weights_; }
    GpuContext& context() { return context_; }
    int max_context() const { return options_.max_context; }
    const GpuLmOptions& options() const { return options_; }
    int code_capacity() const { return code_capacity_; }
    size_t state_bytes() const { return state_bytes_; }

    // EmbeddingTables (synchronous; text_vector runs the projection on the GPU).
    int hidden_size() const override { return weights_->talker.hidden; }
    void text_vector(int32_t id, float* out) const override;
    void codec_vector(int codebook, int32_t id, float* out) const override;

    // ---- step by step, mirroring cpu/lm.h (host in, host out) ------------------------------
    void talker_prefill(const float* embeds, int L);  // embeds [L, H] -> hidden, logits of the last row
    void talker_step(const float* input);             // input [H] at the next position
    void predictor_prefill(int32_t code0);            // [P(hidden), P(E_talker[code0])] -> logits (codebook 1)
    void predictor_step(int group, int32_t previous_code);  // group 2..G-1
    void talker_hidden_read(float* out);      // [H]
    void talker_logits_read(float* out);      // [codec_vocab]
    void predictor_logits_read(float* out);   // [predictor_vocab]
    int talker_length() const { return talker_length_; }

    // ---- device-resident generation ------------------------------------------------------
    // Prefill from host vectors (prompt_embed() output) and sample codebook 0 of frame 0.
    void generation_start(const float* prefill, int L, const float* trailing, int T, const GpuGenerationSetup& setup);
    // Prefill from a built prompt: every embedding is computed on the GPU.
    void generation_start(const Prompt& prompt, const GpuGenerationSetup& setup);
    // Benchmarks: the talker prefill over the first L rows of the prompt-embedding buffer (what
    // the last generation_start() or prompt_load() left there), enqueued without a sync;
    // graph-capturable.
    void prefill_enqueue(int L);
    // generation_start(prompt, setup) in three parts, so that the middle one can run over several
    // streams' rows at once (cuda/gpu_prefill_batch.h): prompt_load() checks the prompt (throws
    // ERROR_INVALID_ARGUMENT before any device work, the stream unchanged) and builds its
    // embeddings and text track on the device; then the talker prefill of those rows
    // (prefill_enqueue(positions) alone, or GpuPrefillBatch::run); then generation_begin(): the
    // stream's generation state and the codebook-0 draw of frame 0, enqueued (no sync).
    struct PromptRows {
        int positions = 0;  // prompt rows (talker positions)
        int trailing = 0;   // text-track rows
    };
    PromptRows prompt_load(const Prompt& prompt);
    void generation_begin(const PromptRows& rows, const GpuGenerationSetup& setup);
    // Appends text-track rows (projected on the GPU) for the streaming text layout.
    void trailing_append(const int32_t* text_ids, size_t n);
    int trailing_rows() const { return trailing_rows_; }

    // One frame step on the context stream (no host sync; graph-capturable): completes frame k
    // (codebooks 1..15), runs talker step k and samples codebook 0 of frame k + 1.
    void frame_step_enqueue();
    // The two halves of the frame step (benchmarks time them separately; a fused chunk graph
    // decodes a first chunk between the last frame's two halves, cuda/fused_chunks.h). With
    // `after_non_kernel`, the talker half's first kernel waits for the whole node before it,
    // without programmatic dependent launch (in the fused graph that node is an event record;
    // programmatic edges join kernels).
    void predictor_frame_enqueue();
    void talker_frame_enqueue(bool after_non_kernel = false);

    // Device-side generation state and code buffer [code_capacity, 16] (read by the fused chunk
    // graphs' hand-off to the decoder, cuda/fused_chunks.h).
    const kernels::GenerationDeviceState* device_state() const { return state_; }
    const int32_t* codes_device() const { return codes_; }

    // This stream as a row of a batched step (cuda/gpu_batch.h): its device buffers, and its
    // talker caches / position / stop flag for the batched attention.
    kernels::StreamSlot batch_slot() const;
    kernels::AttentionSeq batch_talker_seq() const;

    // Codes of frames [first, first + count) -> out [count, 16] (synchronous).
    void codes_read(int first, int count, int32_t* out);
    // Same, asynchronous into pinned memory owned by the caller; the caller synchronises.
    void codes_read_async(int first, int count, int32_t* pinned_out);

private:
    friend class GpuPrefillBatch;  // runs prefill passes over its rows and this stream's caches

    struct StackBuffers {
        float* x = nullptr;     // [rows, H] residual stream
        float* qkv = nullptr;   // [rows, qkv_dim]
        float* attn = nullptr;  // [rows, q_dim]
        float* mlp = nullptr;   // [rows, I]
        float* k_cache = nullptr;  // [layers, n_kv, max_ctx, head_dim]
        float* v_cache = nullptr;
        int max_ctx = 0;
        int splits = 1;
    };

    void check(const char* what) const;
    kernels::Launch launch() const { return context_.launch(); }
    void stack_decode(const GpuStack& s, const StackBuffers& b, int T, const int32_t* pos_dev, int pos_host);
    void stack_prefill(const GpuStack& s, const StackBuffers& b, int T, int pos0);
    void linear_prefill(const float* x, int T, int in, const float* norm_w, float eps, const bf16_t* w, int out, int n,
                        const float* bias, kernels::LinearEpilogue epilogue, float* y, int ldy);
    int prefill_gemm_rows(int T) const;  // GEMM rows of a prefill product over T rows (few shapes)
    // Attention of talker layer `layer` for T prompt rows at positions pos0.. (qkv [T, qkv_dim]
    // in, attn [T, q_dim] out): their keys and values stored in this stream's cache first.
    void prefill_attention(int layer, float* qkv, float* attn, int T, int pos0);
    void talker_head(const float* x_row);  // [H] -> hidden_, talker_logits_
    // input_drawn: the previous draw wrote the pass's input (draw_next_predictor_input).
    void predictor_pass(int group, bool input_drawn);
    // next_input: a predictor draw also writes the next pass's input (not after the last group).
    void sample_enqueue(int group, int frame_offset, bool advance, bool next_input = false);
    void text_project(const int32_t* ids_dev, int n, float* out, int ldo);
    void prefill_device(const float* embeds_dev, int L);
    PromptRows prompt_embed_device(const Prompt& prompt);
    void generation_begin_device(const PromptRows& rows, const GpuGenerationSetup& setup);
    void state_upload(int L, int trailing, const GpuGenerationSetup& setup);
    void upload_ints(const int32_t* host, size_t n, int32_t* dev);

    std::shared_ptr<const GpuLmWeights> weights_;
    GpuContext& context_;
    GpuLmOptions options_;
    int code_capacity_ = 0;
    int talker_length_ = 0;
    int trailing_rows_ = 0;
    size_t state_bytes_ = 0;

    DeviceBuffer memory_;  // one allocation for every buffer below
    StackBuffers talker_buf_;
    StackBuffers predictor_buf_;
    float* hidden_ = nullptr;           // [H] talker output after the final norm
    float* talker_logits_ = nullptr;    // [codec_vocab]
    float* predictor_in_ = nullptr;     // [2, H] predictor inputs before the projection
    float* predictor_logits_ = nullptr; // [predictor_vocab]
    float* partial_ = nullptr;          // attention split-K scratch
    uint32_t* counters_ = nullptr;      // attention split-K counters (kept zero)
    bf16_t* xb_ = nullptr;              // [2 chunk, max_in] split activations
    float* y2_ = nullptr;               // [2 chunk, max_out] GEMM output
    float* text_in_ = nullptr;          // [chunk, Ht]
    float* text_mid_ = nullptr;         // [chunk, Ht]
    float* embeds_ = nullptr;           // [max_context, H] prompt embeddings
    float* scratch_rows_ = nullptr;     // [max_context, H]
    float* trailing_ = nullptr;         // [max_context, H] text track
    float* pad_ = nullptr;              // [H] text_projection(<tts_pad>)
    int32_t* ints_ = nullptr;           // [4 max_context + 64] uploaded ids / rows / codes
    int32_t* seen_ = nullptr;           // [codec_vocab]
    int32_t* codes_ = nullptr;          // [code_capacity, 16]
    kernels::GenerationDeviceState* state_ = nullptr;
    PinnedArray<int32_t> pinned_ints_;
    PinnedArray<float> pinned_floats_;
    PinnedArray<kernels::GenerationDeviceState> pinned_state_;
    PinnedArray<int32_t> pinned_codes_;  // codes_read's landing rows (grown on demand)
    // After the last copy out of pinned_ints_ / pinned_state_: they are refilled once it is done,
    // so a round of starts does not wait for the whole stream before each upload.
    StreamMark staged_;
};

}  // namespace qtts::cuda
