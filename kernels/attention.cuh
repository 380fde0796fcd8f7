// Causal grouped-query attention over a KV cache whose length is read from device memory.
//
// One launch covers T new tokens (queries) at absolute positions pos0..pos0+T-1, where pos0 (the
// number of positions already cached) is read from device memory, so a captured graph replays
// at a new position every frame. Each block owns one KV head, one slice of the key range and up
// to ATTN_TILE query tokens. The queries (and, when `append` is set, the new keys) get the
// per-head RMSNorm and rotary embedding here. With splits > 1 every block writes a partial
// softmax state and the last block of its group combines them (split-K, flash-decoding style).
// Prefill launches (append = false: kv_append stored the keys first) use a second kernel that
// stages each block's key slice and queries in shared memory and scores one key per thread.
// KV cache layout: [n_kv, max_ctx, head_dim] fp32.
#pragma once

#include "kernels/common.cuh"

namespace qtts::kernels {

constexpr int ATTN_TILE = 8;          // query tokens per block
constexpr int ATTN_KEYS_PER_SPLIT = 128;  // upper bound of one block's key range
constexpr int ATTN_MAX_HEAD_DIM = 128;
constexpr int ATTN_MIN_CHUNK = 16;  // default shortest key slice: below it, fewer blocks do more each
constexpr int ATTN_MAX_GROUP = 4;     // query heads per KV head

// One sequence of a batched decode launch (device memory, written by the host when the batch
// changes): its caches at layer 0 (AttentionArgs::seq_layer_offset selects the layer), the
// position of its first query (null: AttentionArgs::pos_host) and its stop flag (null: never
// stopped). k_cache == nullptr marks an idle sequence; idle and stopped sequences are skipped.
struct AttentionSeq {
    float* k_cache = nullptr;
    float* v_cache = nullptr;
    const int32_t* pos = nullptr;
    const int32_t* stopped = nullptr;
};

// One sequence of a batched prefill launch (device memory, written by the host before the
// launch): what a launch of that sequence alone would take. Its rows are qkv/out rows
// row0 .. row0 + T - 1 of the launch, at positions pos0 ..; its caches at layer 0
// (AttentionArgs::seq_layer_offset selects the layer); splits = attention_splits(pos0 + T), with
// its own split-K scratch when splits > 1.
struct AttentionPrefillSeq {
    float* k_cache = nullptr;
    float* v_cache = nullptr;
    int row0 = 0;
    int T = 0;
    int pos0 = 0;
    int splits = 1;
    float* partial = nullptr;
    uint32_t* counters = nullptr;
};

struct AttentionArgs {
    const float* qkv = nullptr;    // [T, ld_qkv]: q heads, then k heads, then v heads (raw projections)
    int ld_qkv = 0;
    // Decode launches (append): qkv and qkv_lo are a split GEMM's hi and lo rows (the same
    // layout), each projection their sum as linear_split_combine's store gives it, bit for bit,
    // so the combine needs no launch of its own. Null: qkv holds the projections.
    const float* qkv_lo = nullptr;
    int T = 1;
    int n_heads = 0;
    int n_kv = 0;
    int head_dim = 0;
    const float* q_norm = nullptr;   // [head_dim] per-head RMSNorm weight (null: none)
    const float* k_norm = nullptr;   // [head_dim]
    float eps = 1e-6f;
    const float* inv_freq = nullptr; // [head_dim / 2] rotary frequencies (null: no rotation)
    float* k_cache = nullptr;        // [n_kv, max_ctx, head_dim]
    float* v_cache = nullptr;
    int max_ctx = 0;
    const int32_t* pos_dev = nullptr;  // position of query 0; null: pos_host
    int pos_host = 0;
    bool append = true;  // normalise, rotate and store the T new keys/values (needs T <= ATTN_TILE)
    // pos_dev was written at least two launches before this one (the frame steps: the sampler
    // advances it at the end of a step), so a read before griddepcontrol.wait is final and the
    // blocks whose key slice lies past the context return before waiting, freeing their SM slot
    // at once; the others keep that read after the wait instead of reading again. Leave false
    // where the previous kernel may still write the position.
    bool pos_settled = false;
    float* out = nullptr;  // [T, ld_out], heads concatenated
    int ld_out = 0;
    // Decode launches (append): the output also as the bf16 hi/lo pair a split product reads,
    // [2 rows, n_heads x head_dim] with rows = batch x T (row r's hi at r, lo at rows + r): what
    // rmsnorm_split_bf16(out, rows, ..., nullptr) writes from it, bit for bit. Null: none.
    bf16_t* out_split = nullptr;
    int splits = 1;                  // key-range slices per KV head (fixed; sized for max_ctx)
    // Shortest slice, in keys (1..ATTN_KEYS_PER_SPLIT): a context of ctx keys is cut into
    // min(splits, ceil(ctx / max(min_chunk, ceil(ctx / splits)))) slices. Short slices spread one
    // sequence's keys over more SMs; a wide batch fills the GPU with its rows already and does
    // better with long ones (fewer blocks, fewer partial states to combine).
    int min_chunk = ATTN_MIN_CHUNK;
    // Decode launches: blocks per (KV head, query tile) along the key axis, 0 = one per slice
    // (splits). Fewer (1..splits): each block takes slices y, y + grid_splits, ... in turn, the
    // same bits; a wide batch's launch then does not schedule thousands of blocks that find no key.
    int grid_splits = 0;
    float* partial = nullptr;        // attention_partial_floats() scratch (splits > 1)
    uint32_t* counters = nullptr;    // attention_counter_count() zeros (splits > 1); left zeroed
    // Batched decode (append only): `batch` independent sequences of T queries each, qkv/out rows
    // seq * T + t; seqs[seq] gives each one's caches, position and stop flag (k_cache, v_cache
    // and pos_dev above are then unused); partial/counters hold one region per sequence.
    const AttentionSeq* seqs = nullptr;
    int batch = 1;
    size_t seq_layer_offset = 0;  // floats from a sequence's layer-0 cache to this layer's
    // Batched prefill (append = false; kv_append and attention): `batch` sequences of different
    // lengths and positions, prefill_seqs[s] each (k_cache, v_cache, pos_*, partial and counters
    // above are then unused). Host-side totals for the grids: every sequence's rows and query
    // tiles (ceil(T / ATTN_TILE) each); T and splits above = the largest of any sequence (they
    // size the launch). Each sequence's results are bitwise those of its own launch.
    const AttentionPrefillSeq* prefill_seqs = nullptr;
    int prefill_rows = 0;
    int prefill_tiles = 0;
};

// Slices needed so that no slice exceeds ATTN_KEYS_PER_SPLIT keys at max_ctx.
int attention_splits(int max_ctx);
size_t attention_partial_floats(int n_heads, int T, int splits, int head_dim);
size_t attention_counter_count(int n_kv, int T);

void attention(const AttentionArgs& args, const Launch& launch);

// Prefill helper: per-head RMSNorm + rotary embedding of the T new keys and a copy of the values
// into the cache at rows pos0..pos0+T-1 (what attention() does itself when `append` is set).
void kv_append(const AttentionArgs& args, const Launch& launch);

}  // namespace qtts::kernels
