// The code predictor's attention folded into its o product, kept in the kernel lab to measure
// one launch a layer fewer (issue 20; qtts-kernel-lab attno).
//
// Why: a predictor layer is qkv product -> attention -> o product -> gate/up -> down, each launch
// waiting for the one before. The attention of one new row over at most 16 cached keys moves
// almost nothing (~130 KB, all in L2) yet costs a launch boundary (~2 us under programmatic
// dependent launch) plus its own dependent steps. Here every block of the o product computes the
// whole attention itself (all KV heads, in shared memory) and then its 8 rows of the product:
// the work of the attention launch is repeated in every block instead of waited for.
// Earlier tries put the attention in the qkv product's tail (one block, or one per KV head, after
// a counter) and lost to the boundary they saved (docs/performance.md): a tail starts only when
// the product's last block is done. This form has no tail; it pays with redundant work and with
// ~130 KB of staged keys and values per block (one block per SM).
//
// The arithmetic is the product's, in the same order: the keys and queries normalised and
// rotated by warp_head_norm_rope, a score as one warp's sum of its lanes' four products, the
// softmax and the probability-weighted values of kernels/attention.cu with one key slice, and a
// product row as the gemv's (kernels/gemv_device.cuh, one row, residual add). So the logits and
// caches are compared bitwise with the product's launches.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/common.cuh"

namespace qtts::kernel_lab {

constexpr int ATTNO_MAX_CTX = 32;  // keys of one KV head the blocks stage

struct AttnOArgs {
    const float* qkv = nullptr;              // [(n_heads + 2 n_kv) hd] raw projections of the new row
    const kernels::bf16_t* o = nullptr;      // [hidden, n_heads hd]
    const float* q_norm = nullptr;           // [hd]
    const float* k_norm = nullptr;           // [hd]
    float eps = 1e-6f;
    const float* inv_freq = nullptr;         // [hd / 2]
    float* k_cache = nullptr;                // this layer's [n_kv, max_ctx, hd]; block 0 appends the new row
    float* v_cache = nullptr;
    int max_ctx = 0;
    int pos = 0;                             // the new row's position: keys 0..pos
    int hidden = 0, n_heads = 0, n_kv = 0, head_dim = 0;
    float* x = nullptr;                      // [hidden] residual stream: x += W_o · attention
};

bool attno_supported(const AttnOArgs& args);
void attno_launch(const AttnOArgs& args, const kernels::Launch& launch);

}  // namespace qtts::kernel_lab
