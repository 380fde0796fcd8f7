// Prompt prefills of several streams in one pass (issue 18: newcomers that arrive together).
//
// Why: a talker prefill of one ~125-position prompt takes ~4.4 ms on the H200 (1.7B), almost all
// of it latency: 28 layers of launches and GEMMs far too small to fill the GPU. When ten requests
// arrive at once, their prefills one after another put ~44 ms in front of the last one's first
// audio. Run together, the products of every layer see all the prompts' rows as one matrix (the
// weights are read once, the tensor cores get work), and only attention stays per stream.
//
// What: run() takes streams whose prompts were loaded (GpuLm::prompt_load: embeddings on the
// device) and prefills them. Streams are taken in the given order into groups of at most
// max_rows() rows; a group runs in passes of up to prefill_chunk rows per stream (a long prompt
// continues in the next pass, at its next position, as the single-stream prefill does in chunks),
// each pass layer by layer:
//   rows of every member   x [R, H]  (R = the members' rows this pass, stream after stream)
//   qkv  = W_qkv · rmsnorm(x)                         split-bf16 GEMMs over R rows (product())
//   attn = attention(qkv), one launch for all members each over its own cache, positions
//          pos0..pos0+T-1 (a table of the members: kernels/attention.cuh, AttentionPrefillSeq)
//   x   += W_o · attn; x += W_down · swiglu(W_gate_up · rmsnorm(x))   GEMMs over R rows
// and after a member's last pass its last row gives its hidden state and codebook-0 logits
// (GpuLm's talker head), exactly what GpuLm::prefill_enqueue leaves. Each row's products are
// computed on their own (no value of one stream reaches another's row), with the single-stream
// prefill's arithmetic (split hi/lo bf16 activations, fp32 sums), so the results match the
// stream prefilled alone to fp32 rounding (cuBLAS may pick another kernel for another row count:
// not bitwise; tested within 1e-5 relative, codes equal).
//
// Threading: the owner thread of the context; run() only enqueues (the caller synchronises).
#pragma once

#include <memory>
#include <vector>

#include "engine/cuda/device_buffer.h"
#include "engine/cuda/gpu_lm.h"

namespace qtts::cuda {

// Prompt rows one batched prefill pass takes in the engine: eight ~121-position prompts, ~180 MB
// of buffers at 1.7B. Measured (H200, 1.7B, `qtts bench --batch`): 1024-row passes prefill 8 /
// 10 / 16 such prompts in 17.2 / 22.7 / 34.3 ms of GPU time, 512-row ones in 19.0 / 24.5 / 37.8.
constexpr int PREFILL_BATCH_ROWS = 1024;

class GpuPrefillBatch {
public:
    // Buffers for `max_rows` rows of prompts in one pass (>= chunk_rows, the streams'
    // GpuLmOptions::prefill_chunk: a pass takes at most that many rows of one stream).
    GpuPrefillBatch(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, int chunk_rows, int max_rows);
    GpuPrefillBatch(const GpuPrefillBatch&) = delete;
    GpuPrefillBatch& operator=(const GpuPrefillBatch&) = delete;

    int max_rows() const { return max_rows_; }
    int chunk_rows() const { return chunk_rows_; }
    size_t workspace_bytes() const { return memory_.bytes(); }

    // The talker prefill of each stream's loaded prompt, `positions[i]` rows for streams[i]
    // (distinct streams on this weights and context, prefill_chunk == chunk_rows()). Enqueued;
    // afterwards each stream is where GpuLm::prefill_enqueue(positions[i]) leaves it.
    void run(const std::vector<GpuLm*>& streams, const std::vector<int>& positions);
    // Runs every GEMM shape run() can meet once, and the batched attention kernels, so that no
    // request pays cuBLAS's first use of a shape (milliseconds each) or a kernel's first load
    // (device memory past what start-up measured). Start-up; synchronous.
    void warm_up();

private:
    struct Member {
        GpuLm* lm = nullptr;
        int positions = 0;  // its prompt rows
        int row = 0;        // its first row in the pass
        int rows = 0;       // its rows in the pass (0: done)
    };

    void group_run(std::vector<Member>& group);
    void pass(const std::vector<Member>& members, int rows, int pos0);
    // y [rows, n] (epilogue) = W [out, in] · rmsnorm(x) (norm_w null: x) over g GEMM rows, split-bf16.
    void product(const float* x, int rows, int in, const float* norm_w, const bf16_t* w, int out, int n,
                 kernels::LinearEpilogue epilogue, float* y, int ldy, int g);
    int gemm_rows(int rows) const;  // the GEMM's row count for `rows` split rows (2 per row), rounded
    // The members' attention table for one pass, uploaded; returns it (device).
    const kernels::AttentionPrefillSeq* table_upload(const std::vector<Member>& members, int pos0);

    std::shared_ptr<const GpuLmWeights> weights_;
    GpuContext& context_;
    const int chunk_rows_;
    const int max_rows_;

    DeviceBuffer memory_;
    float* x_ = nullptr;     // [max_rows, H] residual stream
    float* qkv_ = nullptr;   // [max_rows, qkv_dim]
    float* attn_ = nullptr;  // [max_rows, q_dim]
    float* mlp_ = nullptr;   // [max_rows, I]
    bf16_t* xb_ = nullptr;   // [2 max_rows, max_in] split activations
    float* y2_ = nullptr;    // [2 max_rows, max_out] GEMM output
    // Attention tables of the passes of a run(), one region each, consecutive; when full, the
    // stream is synchronised and the regions reused.
    kernels::AttentionPrefillSeq* table_ = nullptr;  // [table_capacity_]
    PinnedArray<kernels::AttentionPrefillSeq> host_table_;
    size_t table_capacity_ = 0;
    size_t table_used_ = 0;
};

}  // namespace qtts::cuda
