// A persistent code-predictor kernel, kept in the kernel lab to measure what one launch for many
// predictor passes would save against the product's chain of launches (issue 20).
//
// Why: a predictor pass of the 1.7B model is 28 dependent launches (5 layers x qkv, attention, o,
// gate/up, down; the head, the draw, the input projection) that read ~166 MB in ~135 us, against
// 39 us at the card's 4.3 TB/s: the pass is latency, not bytes. Here one cooperative launch runs
// `passes` passes (5 layers and the head each, from a given input row per pass; no draw): every
// stage is spread over all blocks and the stages are separated by grid-wide barriers instead of
// kernel boundaries, and each warp prefetches its rows of the weights two stages ahead into L2,
// so the weights stream while the barriers settle.
//
// Forms measured (qtts-kernel-lab persist; docs/performance.md "Forty-first session"):
// - the first form above, with one of three grid barriers (per-block arrival words, one counter
//   reset by the last block, or a counter that only grows: release adds, acquire polls);
// - the first form with each warp's rows of the next stage loaded into registers between the
//   barrier's arrival and its wait (PersistArgs::preload);
// - the second form, one block per SM, each block's rows streamed through a ring of slots in its
//   shared memory by bulk copies or cp.async (PersistArgs::ring; persist_staged_launch).
//
// The arithmetic is the product's, in the same order: a product row is one warp's sum over its
// lanes' 16-byte weight pieces (kernels/gemv_device.cuh, one row), the RMSNorm input sums its
// squares over 256 threads and 8 warp partials, and the attention of a KV head is one block's as in
// kernels/attention.cu with one key slice. So the logits and caches are compared bitwise with the
// chain (qtts-kernel-lab persist).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/common.cuh"

namespace qtts::kernel_lab {

constexpr int PERSIST_MAX_LAYERS = 8;
constexpr int PERSIST_MAX_CTX = 32;  // keys the attention stage stages per KV head

struct PersistLayer {
    const kernels::bf16_t* qkv = nullptr;      // [(n_heads + 2 n_kv) hd, hidden]
    const kernels::bf16_t* o = nullptr;        // [hidden, n_heads hd]
    const kernels::bf16_t* gate_up = nullptr;  // [2 I, hidden]: gate rows, then up rows
    const kernels::bf16_t* down = nullptr;     // [hidden, I]
    const float* input_norm = nullptr;
    const float* post_norm = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
};

struct PersistArgs {
    PersistLayer layers[PERSIST_MAX_LAYERS];
    int n_layers = 0;
    const kernels::bf16_t* head = nullptr;  // [vocab, hidden]
    const float* final_norm = nullptr;
    float eps = 1e-6f;
    const float* inv_freq = nullptr;        // [head_dim / 2]
    int hidden = 0, intermediate = 0, n_heads = 0, n_kv = 0, head_dim = 0, vocab = 0;
    const float* x_in = nullptr;  // [passes, hidden]: pass p starts from row p
    float* x = nullptr;           // [hidden] residual stream
    float* qkv = nullptr;         // [qkv_dim]
    float* attn = nullptr;        // [n_heads hd]
    float* mlp = nullptr;         // [I]
    float* k_cache = nullptr;     // [layers, n_kv, max_ctx, hd]
    float* v_cache = nullptr;
    int max_ctx = 0;
    int pos0 = 0;                 // pass p appends position pos0 + p
    int passes = 0;
    float* logits = nullptr;      // [passes, vocab]
    unsigned* barrier = nullptr;  // [launch blocks + 3] arrival words and counters, zeros before the first launch
    // Measurement switches: the barriers (and prefetches) without the stages' work; the weight
    // prefetches off; the one-counter barrier or the growing counter instead of the arrival words.
    bool barriers_only = false;
    bool prefetch = true;
    bool counter_barrier = false;
    bool monotonic_barrier = false;  // one growing counter, release adds and acquire polls
    // The first form with each warp's rows of the next stage loaded into registers before the
    // barrier's wait (persist_preload_fits says where they fit; needs monotonic_barrier).
    bool preload = false;
    // The second form's ring (persist_staged_launch).
    struct Ring {
        uint32_t slot = 16384;  // bytes a slot, a multiple of 16
        bool issuers = false;   // the warps take turns issuing the slots' bulk copies (else thread 0)
        bool cp_async = false;  // every thread copies 16-byte pieces (cp.async) instead of bulk copies
        bool strided = false;   // block b's rows are b, b + blocks, ... (cp.async only), else a range
        bool spin = false;      // wait for a slot with mbarrier.test_wait in a loop, not try_wait
        bool eager = false;     // one-matrix stages take their rows slot by slot, refilling as they go
    };
    Ring ring;
};

bool persist_supported(const PersistArgs& args);
// Blocks of 256 threads per SM that can be resident together on `device` (at most two).
int persist_blocks_per_sm(int device);
void persist_launch(const PersistArgs& args, int blocks, cudaStream_t stream);
bool persist_preload_fits(const PersistArgs& args, int blocks);

// The second form (sm_90): one block per SM; each block's rows of every product stream through a
// ring in its shared memory (bulk copies, refilled as the stages use them; persistent_pass.cu).
// The same bits as the first. Returns false (nothing launched) when the blocks and their shared
// memory do not fit.
bool persist_staged_launch(const PersistArgs& args, int blocks, cudaStream_t stream);
// Dynamic shared memory a block of the second form uses.
size_t persist_staged_smem(const PersistArgs& args);

}  // namespace qtts::kernel_lab
