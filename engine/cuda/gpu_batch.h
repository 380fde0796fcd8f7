// Many streams in one device step (issue 17): the talker step, the 15 code-predictor passes and
// the codebook draws of B streams together, so that each weight matrix is read once per frame
// for all of them instead of once per stream.
//
// What stays per stream, and where: every stream is a GpuLm (cuda/gpu_lm.h) that keeps its own
// KV cache, position, text track, repetition history, sampling parameters, seed, codes and stop
// flag in its device buffers; prefill runs there, one stream at a time, as before. A GpuBatch
// owns only what one step shares: the activations of B rows, the code predictor's short caches
// (rebuilt every frame), the logits, and a table of rows (kernels/batch.cuh) that points each row
// at its stream's buffers. So streams at different positions, with different prompts, voices and
// sampling settings share one step, and each gets the codes it would get alone:
//   * products: below `wide_rows` rows (default 2: one-row products) the gemv kernel computes
//     every row exactly as in a batch of one (rows in groups of 8, same arithmetic, bitwise equal
//     to batch 1, kept by the tests with a large wide_rows); from `wide_rows` rows tensor cores with split hi/lo bf16 activations, equal to fp32-level
//     accuracy (~1e-6 relative): up to `skinny_max_rows` rows in one launch (kernels/skinny.cuh),
//     wider ones as one cuBLAS GEMM between a split and a combine launch, as prefill does
//     (a pass of those fuses each residual combine into the next split: stack_split_pass);
//   * attention: one launch over all rows, each with its own cache and position;
//   * sampling: one block per row, Philox keyed by the stream's seed, codebook and frame.
// A stream that draws end-of-speech, reaches its frame_end or fills its cache sets its stop flag
// on the device and from then on no longer advances (no cache write, no code, no state change),
// without host help, while the others go on.
//
// Graphs: one graph per (bucket, frames) pair, captured at start-up (capture() logs time, nodes
// and memory of each), all in the device's one graph pool; none allocates. A batch of n streams
// replays the smallest bucket >= n; the rows past n are idle and skipped. A size without a graph
// replays the bucket's one-frame graph once per frame; graphs off runs the same kernels eagerly,
// with identical results.
//
// Threading: the owner thread of the context (every replay goes through its OwnerGuard). bind()
// and run() are host calls between steps; bind() waits for the stream.
#pragma once

#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "engine/cuda/device_buffer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_lm.h"
#include "kernels/attention.cuh"
#include "kernels/batch.cuh"
#include "kernels/gemv.cuh"
#include "kernels/skinny.cuh"

namespace qtts::cuda {

struct DecodeRows;  // cuda/gpu_lm_launch.h

struct GpuBatchOptions {
    std::vector<int> buckets = {1, 2, 4, 8, 12, 16, 24, 32, 48, 64};  // batch sizes with graphs
    std::vector<int> chunk_frames = {1};  // frames per replay, captured for every bucket
    bool cuda_graphs = true;
    int wide_rows = 2;  // products over at least this many rows use tensor cores; fewer: gemv (measured: docs/performance.md)
    // Tensor-core products over at most this many rows run as one launch (kernels/skinny.cuh);
    // wider ones as split hi/lo + cuBLAS GEMM + combine, whose passes fuse the residual combines
    // (faster from 20 rows on the H200: buckets 20 / 24 step 6.37 / 6.50 ms against 6.67 / 6.79
    // with one launch up to 24; at 16 one launch wins, 5.66 against 6.06: docs/performance.md).
    // 0: always cuBLAS. At most SKINNY_MAX_ROWS.
    int skinny_max_rows = 16;
    // Tiles per block of those one-launch products (kernels/skinny.cuh): 1 or 2 for every
    // product, 0 the kernel's choice by W's shape. The same bits either way; only the speed
    // differs (`qtts bench --batch` compares them).
    int skinny_tiles = 0;
    // Where those products keep the weight steps they have in flight: a shared-memory ring (the
    // default) or registers (the kernel before; measurements). The same bits either way.
    kernels::SkinnyWeights skinny_weights = kernels::SkinnyWeights::SKINNY_WEIGHTS_SHARED;
    // Passes whose products all take the split cuBLAS path (more than skinny_max_rows rows) fuse
    // each residual combine into the next product's split, the SwiGLU combine writes its split,
    // and the attention reads the qkv GEMM's halves and writes the o product's split
    // (stack_split_pass: 8 launches a layer instead of 13, the same bits). false: three launches
    // per product (measurements).
    bool split_fusion = true;
    // The talker's decode attention cuts each stream's context into slices of at least
    // ATTN_KEYS_PER_SPLIT keys (not ATTN_MIN_CHUNK) from this many rows on: one block per row, KV
    // head and slice then fills the GPU already, and longer slices mean fewer blocks and partial
    // states to combine. 0: from the rows at which rows x KV heads reaches the SM count (one block
    // per SM). Such launches also have about four blocks per SM along the key axis
    // (AttentionArgs::grid_splits), each taking several slices in turn when the context is long.
    // Only the last bits of the attention sums differ; tests set it to exercise both.
    int long_slices_rows = 0;
    // Blocks per SM the talker's decode attention aims at along the key axis: from
    // long_slices_rows rows this many (1 per stream and KV head at least); below it, where the
    // slices stay short (16 keys or more), this many but at least short_slices_blocks per stream
    // and KV head, when short_slices_blocks > 0. Each block takes slices y, y + grid, ... in turn,
    // with the same bits as a block per slice (test_gpu_kernels). Why: the engine's 4096-position
    // caches have 32 slices per KV head, almost all empty at a short context; with 8, a 10-row
    // launch of the 1.7B would have 640 blocks instead of 2560, and a context of up to 128 keys
    // still a block per slice. 0: a block per slice below long_slices_rows (the old default);
    // `qtts bench --batch --batch-paths auto,short0` compares the two, and docs/performance.md
    // ("Thirty-eighth session") has the numbers behind the default.
    int slice_blocks_per_sm = 4;
    int short_slices_blocks = 8;
};

// Checks the options (buckets ascending, 1..GEMV_MAX_BATCH_ROWS / 2; chunk frames >= 1;
// wide_rows >= 1); throws ERROR_INVALID_ARGUMENT with the reason.
void gpu_batch_options_validate(const GpuBatchOptions& options);

class GpuBatch {
public:
    // Allocates the shared step buffers for the largest bucket. Streams bound later must use
    // `weights` and have max_context positions. Graphs are captured by capture().
    GpuBatch(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, int max_context,
             GpuBatchOptions options);
    GpuBatch(const GpuBatch&) = delete;
    GpuBatch& operator=(const GpuBatch&) = delete;

    const GpuBatchOptions& options() const { return options_; }
    int max_streams() const { return options_.buckets.back(); }
    // The smallest bucket holding n streams (1 <= n <= max_streams()).
    int bucket_for(int n) const;

    // Rows 0..n-1 become these streams (each started with generation_start, distinct); the rest
    // of the bucket is idle. Between steps only; waits for the context stream.
    void bind(const std::vector<GpuLm*>& streams);
    int bound() const { return bound_; }

    // Captures one graph per (bucket, chunk frames) (when graphs are on): start-up cost, logged.
    void capture();
    const std::vector<GraphStats>& graph_stats() const { return stats_; }
    long long graph_device_bytes() const;

    // `frames` frame steps of every bound stream (the stopped ones stay put): one replay of the
    // graph for (bucket_for(bound()), frames) when captured, else of its one-frame graph per
    // frame, else the same steps eagerly.
    void run(int frames);
    // One frame step over the first `rows` rows, enqueued (graph-capturable; benchmarks).
    void step_enqueue(int rows);

    // Talker logits of row r after the last step, [codec_vocab] (tests; synchronous).
    void talker_logits_read(int row, float* out);
    size_t workspace_bytes() const { return memory_.bytes(); }

private:
    struct Activations {
        float* x = nullptr;     // [rows, H] residual stream
        float* qkv = nullptr;   // [rows, qkv_dim]
        float* attn = nullptr;  // [rows, q_dim]
        float* mlp = nullptr;   // [rows, I]
    };

    void product(const kernels::GemvArgs& a);  // gemv, or tensor cores for wide batches
    // One pass of stack s over `rows` rows: stack_split_pass when every product is a split one
    // (and split_fusion is on), else stack_decode_pass through product().
    template <typename Attend>
    void stack_pass(const GpuStack& s, const DecodeRows& b, Attend&& attend);
    // Passes after the first start at their first layer: the draw before wrote their input
    // (draw_next_predictor_input).
    void predictor_pass(int rows, int group);
    void talker_step(int rows);
    kernels::AttentionArgs talker_attention(int layer, int rows) const;
    kernels::AttentionArgs predictor_attention(int layer, int rows, int group) const;

    std::shared_ptr<const GpuLmWeights> weights_;
    GpuContext& context_;
    const int max_context_;
    const GpuBatchOptions options_;
    int bound_ = 0;
    int talker_splits_ = 1;
    int rows_cap_ = 0;  // activation rows: 2 per stream (the predictor's first pass)

    DeviceBuffer memory_;
    kernels::StreamSlot* slots_ = nullptr;             // [max streams]
    kernels::AttentionSeq* talker_seqs_ = nullptr;     // [max streams]
    kernels::AttentionSeq* predictor_seqs_ = nullptr;  // [max streams]
    int32_t* batch_codes_ = nullptr;                   // [max streams, 16]
    float* hidden_ = nullptr;                          // [max streams, H]
    Activations talker_;                               // [max streams, ...]
    Activations predictor_;                            // [2 max streams, ...]
    float* predictor_in_ = nullptr;                    // [2 max streams, H] before the projection
    float* predictor_k_ = nullptr;                     // [max streams, layers, n_kv, G, head_dim]
    float* predictor_v_ = nullptr;
    float* talker_logits_ = nullptr;     // [max streams, codec_vocab]
    float* predictor_logits_ = nullptr;  // [max streams, predictor_vocab]
    float* partial_ = nullptr;           // talker attention split-K scratch, one region per stream
    uint32_t* counters_ = nullptr;       // its counters (kept zero)
    bf16_t* xb_ = nullptr;               // [2 rows_cap, max_in] split activations (wide products)
    float* y2_ = nullptr;                // [2 rows_cap, max_out]
    int max_in_ = 0, max_out_ = 0;

    PinnedArray<kernels::StreamSlot> host_slots_;
    PinnedArray<kernels::AttentionSeq> host_talker_seqs_;
    PinnedArray<kernels::AttentionSeq> host_predictor_seqs_;

    std::map<std::pair<int, int>, GraphExec> graphs_;  // (bucket, frames)
    std::vector<GraphStats> stats_;
};

}  // namespace qtts::cuda
