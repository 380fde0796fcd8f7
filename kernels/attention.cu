#include "kernels/attention.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/check.cuh"
#include "kernels/rope.cuh"

#include <cuda_pipeline.h>

namespace qtts::kernels {

namespace {

constexpr int ATTN_WARPS = 4;
constexpr int ATTN_THREADS = ATTN_WARPS * 32;
constexpr int ATTN_KEY_BATCH = 4;   // key rows loaded per warp before use
constexpr int ATTN_STAGE_KEYS = 32; // decode slices up to this many keys are staged in shared memory
// Decode grids of at most this many blocks (the code predictor's: 8 KV heads, one slice) ask for
// all the shared memory a block may have, so that each block has its SM to itself: the blocks of
// the next launch, started early by programmatic dependent launch, find no room there and queue
// on the other SMs instead of sharing the attention's: the predictor's 15 passes -0.4% on an H100
// (docs/performance.md, "Forty-ninth session"). The talker's grids (8 KV heads x its splits) and
// a batch's are larger and keep what they need; they would close too many SMs to the next launch.
constexpr unsigned ATTN_ALONE_MAX_BLOCKS = 16;

__host__ __device__ inline int query_tiles(int T) { return (T + ATTN_TILE - 1) / ATTN_TILE; }

// Keys per slice for a context of `ctx` keys: spread over the splits, at least min_chunk.
__host__ __device__ inline int split_chunk(int ctx, int splits, int min_chunk) {
    int chunk = (ctx + splits - 1) / splits;
    chunk = chunk < min_chunk ? min_chunk : chunk;
    return chunk > ATTN_KEYS_PER_SPLIT ? ATTN_KEYS_PER_SPLIT : chunk;
}

// Slices that hold keys at a context of `ctx` keys cut into `chunk`-key slices (the blocks of
// later slices have nothing to do).
__host__ __device__ inline int active_slices(int ctx, int splits, int chunk) {
    const int needed = (ctx + chunk - 1) / chunk;
    return needed < splits ? needed : splits;
}

// The buffers one sequence of a launch works on: the launch's own, or (batched) those of
// sequence `seq` (blockIdx.z = seq * tiles + tile). Kept apart from AttentionArgs, which stays
// the kernel parameter as passed. Reads only the host-written table, so it may run before
// pdl_wait(). k_cache == nullptr: an idle sequence.
struct SeqBuffers {
    const float* qkv;
    const float* qkv_lo;  // null: qkv holds the projections
    float* out;
    float* k_cache;
    float* v_cache;
    const int32_t* pos_dev;
    const int32_t* stopped;  // null: no flag (one sequence, or a batch row without one)
    float* partial;
    uint32_t* counters;
    int row0;  // the sequence's first row in the launch's rows (out_split)
};

__device__ __forceinline__ SeqBuffers seq_buffers(const AttentionArgs& a, int seq) {
    if (!a.seqs)
        return SeqBuffers{a.qkv, a.qkv_lo, a.out, a.k_cache, a.v_cache, a.pos_dev, nullptr, a.partial, a.counters, 0};
    const AttentionSeq s = a.seqs[seq];
    const int tiles = query_tiles(a.T);
    SeqBuffers b;
    b.qkv = a.qkv + size_t(seq) * a.T * a.ld_qkv;
    b.qkv_lo = a.qkv_lo ? a.qkv_lo + size_t(seq) * a.T * a.ld_qkv : nullptr;
    b.out = a.out + size_t(seq) * a.T * a.ld_out;
    b.k_cache = s.k_cache ? s.k_cache + a.seq_layer_offset : nullptr;
    b.v_cache = s.v_cache ? s.v_cache + a.seq_layer_offset : nullptr;
    b.pos_dev = s.pos;
    b.stopped = s.stopped;
    b.partial = a.partial ? a.partial + size_t(seq) * a.n_heads * a.T * a.splits * (a.head_dim + 2) : nullptr;
    b.counters = a.counters ? a.counters + size_t(seq) * a.n_kv * tiles : nullptr;
    b.row0 = seq * a.T;
    return b;
}

// Output value (token t of the sequence, column col = head x head_dim + d): into out and, when
// asked, its bf16 hi/lo pair into out_split.
__device__ __forceinline__ void attention_store(const AttentionArgs& a, const SeqBuffers& sb, int t, int col, float v) {
    sb.out[size_t(t) * a.ld_out + col] = v;
    if (a.out_split) {
        const size_t rows = size_t(a.batch) * a.T, width = size_t(a.n_heads) * a.head_dim, r = sb.row0 + t;
        bf16_split(v, a.out_split + r * width + col, a.out_split + (rows + r) * width + col);
    }
}

// The query tile and key slice `split` of this block (blockIdx.z = tile).
struct BlockSlice {
    int t0, nq;        // first query token of the tile; query rows (tokens × heads per KV head)
    int pos0, ctx;     // position of query 0; keys in the context after this launch
    int chunk, k0, k1; // slice length and its keys [k0, k1)
    int k1_visible;    // end of the keys some query of the tile can see
    int active;        // slices that hold keys at this context (the others return at once)
};

// pos0: the sequence's position (position_read), read by the caller with its other loads.
__device__ __forceinline__ BlockSlice block_slice(const AttentionArgs& a, int pos0, int group, int tile, int split) {
    BlockSlice b;
    b.t0 = tile * ATTN_TILE;
    const int qt = min(ATTN_TILE, a.T - b.t0);
    b.nq = qt * group;
    b.pos0 = pos0;
    b.ctx = b.pos0 + a.T;
    b.chunk = split_chunk(b.ctx, a.splits, a.min_chunk);
    b.k0 = split * b.chunk;
    b.k1 = min(b.ctx, b.k0 + b.chunk);
    b.k1_visible = min(b.k1, b.pos0 + b.t0 + qt);
    b.active = active_slices(b.ctx, a.splits, b.chunk);
    return b;
}

// The part both attention kernels share, once the scores of the block's queries against its key
// slice are in s_s ([nq, ATTN_KEYS_PER_SPLIT], -inf where masked) and the slice's values are at
// v_base (row j = key k0 + j, stride head_dim): softmax, probabilities times values, and either
// the output (one split) or this split's partial state plus, in the last block of the (KV head,
// query tile), the split-K combine. Called by every thread of the block.
__device__ __forceinline__ void attention_finish(const AttentionArgs& a, const SeqBuffers& sb, float* s_s, const float* v_base, int n, int t0,
                                                 int nq, int ctx, int chunk, float* m_s, float* l_s,
                                                 int tile, int split) {
    const int hd = a.head_dim;
    const int group = a.n_heads / a.n_kv;
    const int g = blockIdx.x;
    const int cap = ATTN_KEYS_PER_SPLIT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int threads = blockDim.x, warps = threads >> 5;  // the kernels use 128 or 256 threads
    // Softmax statistics per query (unnormalised probabilities stay in s_s).
    for (int qi = warp; qi < nq; qi += warps) {
        float* sq = s_s + qi * cap;
        float m = -INFINITY;
        for (int j = lane; j < n; j += 32) m = fmaxf(m, sq[j]);
        m = warp_max(m);
        float l = 0.0f;
        for (int j = lane; j < n; j += 32) {
            const float e = sq[j] == -INFINITY ? 0.0f : expf(sq[j] - m);
            sq[j] = e;
            l += e;
        }
        l = warp_sum(l);
        if (lane == 0) {
            m_s[qi] = m;
            l_s[qi] = l;
        }
    }
    __syncthreads();

    // Probabilities times values.
    for (int o = threadIdx.x; o < nq * hd; o += threads) {
        const int qi = o / hd, d = o % hd;
        const float* p = s_s + qi * cap;
        const float* v_col = v_base + d;
        float acc = 0.0f;
#pragma unroll 4
        for (int j = 0; j < n; ++j) acc = fmaf(p[j], v_col[size_t(j) * hd], acc);
        const int t = t0 + qi / group, h = g * group + qi % group;
        if (a.splits == 1) {
            const float l = l_s[qi];
            attention_store(a, sb, t, h * hd + d, l > 0.0f ? acc / l : 0.0f);
        } else {
            float* P = sb.partial + ((size_t(t) * a.n_heads + h) * a.splits + split) * (hd + 2);
            P[d] = acc;
            if (d == 0) {
                P[hd] = m_s[qi];
                P[hd + 1] = l_s[qi];
            }
        }
    }
    if (a.splits == 1) return;

    // The last block of this (KV head, tile) combines the partial states of the splits that
    // hold keys (the blocks of later splits returned without taking part).
    const int active = active_slices(ctx, a.splits, chunk);
    if (!block_arrive_last(sb.counters + size_t(g) * query_tiles(a.T) + tile, uint32_t(active))) return;
    timeline_mark(3);  // profiling builds: this block arrived last, the combine starts
    // Each warp loads its queries' (max, sum) pairs in one round, lane-strided over the splits,
    // into registers; then the weights w = exp(m - M) into s_s (free now) and the sums, in the
    // order of the loops that loaded the maxima and the sums one round after the other (the same
    // bits, one dependent round and one barrier fewer).
    constexpr int SPLIT_STEPS = ATTN_KEYS_PER_SPLIT / 32;  // splits <= ATTN_KEYS_PER_SPLIT
    float* w_s = s_s;  // [nq, active]
    for (int qi = warp; qi < nq; qi += warps) {
        const int t = t0 + qi / group, h = g * group + qi % group;
        const float* stats = sb.partial + (size_t(t) * a.n_heads + h) * a.splits * (hd + 2) + hd;  // split 0's m, l
        float m[SPLIT_STEPS], l[SPLIT_STEPS];
#pragma unroll
        for (int i = 0; i < SPLIT_STEPS; ++i) {
            const int sp = lane + 32 * i;
            m[i] = sp < active ? load_coherent(stats + size_t(sp) * (hd + 2)) : -INFINITY;
            l[i] = sp < active ? load_coherent(stats + size_t(sp) * (hd + 2) + 1) : 0.0f;
        }
        float M = -INFINITY;
#pragma unroll
        for (int i = 0; i < SPLIT_STEPS; ++i)
            if (lane + 32 * i < active) M = fmaxf(M, m[i]);
        M = warp_max(M);
        float L = 0.0f;
#pragma unroll
        for (int i = 0; i < SPLIT_STEPS; ++i) {
            const int sp = lane + 32 * i;
            if (sp < active) {
                const float w = (m[i] == -INFINITY || M == -INFINITY) ? 0.0f : expf(m[i] - M);
                w_s[qi * active + sp] = w;
                L = fmaf(w, l[i], L);
            }
        }
        L = warp_sum(L);
        if (lane == 0) l_s[qi] = L;
    }
    __syncthreads();
    for (int o = threadIdx.x; o < nq * hd; o += threads) {
        const int qi = o / hd, d = o % hd;
        const int t = t0 + qi / group, h = g * group + qi % group;
        const float* P = sb.partial + (size_t(t) * a.n_heads + h) * a.splits * (hd + 2) + d;
        const float* w = w_s + qi * active;
        float acc = 0.0f;
#pragma unroll 4
        for (int sp = 0; sp < active; ++sp) acc = fmaf(w[sp], load_coherent(P + sp * (hd + 2)), acc);
        const float L = l_s[qi];
        attention_store(a, sb, t, h * hd + d, L > 0.0f ? acc / L : 0.0f);
    }
}

// grid: (n_kv, grid_splits or splits, query tiles). See attention.cuh. Launches that append
// their new keys (decode); prefill launches go to attention_cached_kernel.
// Decode launches (T <= 2) whose key slice has at most ATTN_STAGE_KEYS rows copy the cached
// rows into shared memory with cp.async BEFORE griddepcontrol.wait (they do not depend on the
// previous kernel) and add the new rows there themselves; everything else reads the cache.
__global__ void __launch_bounds__(ATTN_THREADS) attention_kernel(const AttentionArgs a, int stage_keys) {
    extern __shared__ float4 attn_smem4[];
    const int tiles = query_tiles(a.T), tile = blockIdx.z % tiles, seq = blockIdx.z / tiles;
    const SeqBuffers sb = seq_buffers(a, seq);
    if (!sb.k_cache) return;  // an idle row of a batch
    __shared__ float m_s[ATTN_TILE * ATTN_MAX_GROUP];
    __shared__ float l_s[ATTN_TILE * ATTN_MAX_GROUP];

    const int hd = a.head_dim;
    const int group = a.n_heads / a.n_kv;
    const int g = blockIdx.x, first_split = blockIdx.y;
    const int nq_cap = min(a.T, ATTN_TILE) * group;
    const int cap = ATTN_KEYS_PER_SPLIT;
    float* q_s = reinterpret_cast<float*>(attn_smem4);  // [nq_cap, hd]
    float* s_s = q_s + nq_cap * hd;                      // [nq_cap, cap]
    float* scratch = s_s + nq_cap * cap;                 // [ATTN_WARPS, 128]
    float* k_stage = scratch + ATTN_WARPS * 128;         // [stage_keys, hd]
    float* v_stage = k_stage + stage_keys * hd;          // [stage_keys, hd]
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float* my_scratch = scratch + warp * 128;
    const size_t head_base = size_t(g) * size_t(a.max_ctx);

    // Before the wait: the position (written frames ago) and the cached rows of this slice.
    const int pos_early = position_read(sb.pos_dev, a.pos_host);
    bool staged = false;
    {
        const int ctx = pos_early + a.T;
        const int chunk = split_chunk(ctx, a.splits, a.min_chunk);
        if (a.pos_settled && first_split >= active_slices(ctx, a.splits, chunk)) return;  // no key here
        const int k0 = first_split * chunk, k1 = min(ctx, k0 + chunk);
        if (stage_keys > 0 && ctx <= a.max_ctx && k1 - k0 <= stage_keys && (hd & 3) == 0) {
            staged = true;
            const int old_rows = max(0, min(k1, pos_early) - k0);
            const int vec = hd / 4;  // 16-byte pieces per row
            for (int i = threadIdx.x; i < old_rows * vec; i += ATTN_THREADS) {
                const int r = i / vec, c = i % vec;
                const size_t src = (head_base + k0 + r) * hd + c * 4;
                __pipeline_memcpy_async(k_stage + r * hd + c * 4, sb.k_cache + src, 16);
                __pipeline_memcpy_async(v_stage + r * hd + c * 4, sb.v_cache + src, 16);
            }
            __pipeline_commit();
        } else if (threadIdx.x == 0 && (hd & 3) == 0 && ctx <= a.max_ctx) {
            const int last = min(pos_early, k1);
            if (last > k0) {
                const uint32_t bytes = uint32_t(last - k0) * uint32_t(hd) * 4u;
                prefetch_l2(sb.k_cache + (head_base + k0) * hd, bytes);
                prefetch_l2(sb.v_cache + (head_base + k0) * hd, bytes);
            }
        }
    }
    pdl_wait();
    // A settled position was final before the wait, so the early read stands: the new rows' loads,
    // whose addresses depend on it, follow the wait without a round of their own for it (the 1.7B
    // frame -0.1 to -0.2%). Otherwise the position and the stop flag are read in one round.
    const int pos_now = a.pos_settled ? pos_early : position_read(sb.pos_dev, a.pos_host);
    const bool stopped = sb.stopped && *sb.stopped;
    if (stopped) {
        if (staged) __pipeline_wait_prior(0);
        return;  // the stream ended: its cache and position stay as they are
    }

    // Slices blockIdx.y, + gridDim.y, ...: one each when the grid has a block per slice, several
    // in a wide batch's launch (grid_splits); the slice staged before the wait is the first.
    for (int split = blockIdx.y;; split += gridDim.y) {
        const BlockSlice b = block_slice(a, pos_now, group, tile, split);
        const int t0 = b.t0, nq = b.nq, pos0 = b.pos0, ctx = b.ctx, chunk = b.chunk, k0 = b.k0, k1 = b.k1;
        const int k1_visible = b.k1_visible;
        if (split >= b.active) {  // no key of the context falls in this slice
            if (staged) __pipeline_wait_prior(0);
            return;
        }
        if (staged) {
            __pipeline_wait_prior(0);
            staged = pos0 == pos_early;  // the early read was right (always, in the frame step)
        }

        // The new keys and values of this slice and the tile's queries, as independent warp jobs so
        // that their global loads are in flight together.
        const int r_first = max(k0, pos0);
        const int n_new = max(0, k1 - r_first);  // launched with append only
        const int jobs = 2 * n_new + nq;
        for (int job = warp; job < jobs; job += ATTN_WARPS) {
            if (job < n_new) {  // key row: per-head norm + rotation, into the stage and the cache
                const int r = r_first + job;
                const size_t at = size_t(r - pos0) * a.ld_qkv + size_t(a.n_heads + g) * hd;
                const float* k_lo = sb.qkv_lo ? sb.qkv_lo + at : nullptr;
                float* k_dst = sb.k_cache + (head_base + r) * hd;
                if (staged) {
                    float* k_row = k_stage + (r - k0) * hd;
                    warp_head_norm_rope(sb.qkv + at, my_scratch, k_row, hd, a.k_norm, a.eps, a.inv_freq, r, k_lo);
                    for (int d = lane; d < hd; d += 32) k_dst[d] = k_row[d];
                } else {
                    warp_head_norm_rope(sb.qkv + at, my_scratch, k_dst, hd, a.k_norm, a.eps, a.inv_freq, r, k_lo);
                }
            } else if (job < 2 * n_new) {  // value row: copied as is
                const int r = r_first + job - n_new;
                const size_t at = size_t(r - pos0) * a.ld_qkv + size_t(a.n_heads + a.n_kv + g) * hd;
                float* v_dst = sb.v_cache + (head_base + r) * hd;
                for (int d = lane; d < hd; d += 32) {
                    const float v = projection_value(sb.qkv + at, sb.qkv_lo ? sb.qkv_lo + at : nullptr, d);
                    v_dst[d] = v;
                    if (staged) v_stage[(r - k0) * hd + d] = v;
                }
            } else {  // query qi = token * group + head-in-group
                const int qi = job - 2 * n_new;
                const int t = t0 + qi / group, h = g * group + qi % group;
                const size_t at = size_t(t) * a.ld_qkv + size_t(h) * hd;
                warp_head_norm_rope(sb.qkv + at, my_scratch, q_s + qi * hd, hd, a.q_norm, a.eps, a.inv_freq, pos0 + t,
                                    sb.qkv_lo ? sb.qkv_lo + at : nullptr);
            }
        }
        __syncthreads();
        timeline_mark(0);  // profiling builds: the rows normalised and rotated (kernels/timeline.cuh)
        // The next launch is released here, not after the wait: released there, its blocks' weight
        // loads held up the new rows' loads (the 1.7B frame 3.2% slower; released after the scores
        // instead, 1.2% slower than here; kernels/common.cuh, pdl_trigger). The first slice only:
        // once is enough.
        if (split == int(blockIdx.y)) pdl_trigger();

        const float* k_base = staged ? k_stage : sb.k_cache + (head_base + k0) * hd;  // row j = key k0 + j
        const float* v_base = staged ? v_stage : sb.v_cache + (head_base + k0) * hd;

        // Scores: a warp takes ATTN_KEY_BATCH keys at a time, lanes split the head dimension.
        const int n = max(0, k1_visible - k0);
        const float scale = 1.0f / sqrtf(float(hd));
        for (int j0 = warp * ATTN_KEY_BATCH; j0 < n; j0 += ATTN_WARPS * ATTN_KEY_BATCH) {
            float kv[ATTN_KEY_BATCH][4];
#pragma unroll
            for (int b = 0; b < ATTN_KEY_BATCH; ++b) {
                const float* k_row = k_base + size_t(j0 + b) * hd;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int d = lane + 32 * i;
                    kv[b][i] = (j0 + b < n && d < hd) ? k_row[d] : 0.0f;
                }
            }
            for (int qi = 0; qi < nq; ++qi) {
                const int q_pos = pos0 + t0 + qi / group;
                float qv[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int d = lane + 32 * i;
                    qv[i] = d < hd ? q_s[qi * hd + d] : 0.0f;
                }
#pragma unroll
                for (int b = 0; b < ATTN_KEY_BATCH; ++b) {
                    float p = 0.0f;
#pragma unroll
                    for (int i = 0; i < 4; ++i) p = fmaf(qv[i], kv[b][i], p);
                    p = warp_sum(p);
                    const int j = j0 + b;
                    if (lane == 0 && j < n) s_s[qi * cap + j] = (k0 + j <= q_pos) ? p * scale : -INFINITY;
                }
            }
        }
        __syncthreads();
        timeline_mark(2);  // the scores

        attention_finish(a, sb, s_s, v_base, n, t0, nq, ctx, chunk, m_s, l_s, tile, split);
        timeline_mark(1);  // block 0's slice done (and the combine, where it came last)
        staged = false;   // later slices read the cache
        __syncthreads();  // they reuse q_s and s_s
    }
}

// Prefill attention (append = false: every key, the new ones included, is already in the cache).
// grid: (n_kv, splits, query tiles), like attention_kernel. The block stages its whole key slice
// (K rows padded to head_dim + 1 floats, so that one key per thread reads without bank
// conflicts, and V rows) and its queries (normalised, rotated) in shared memory; each thread
// scores one key against every query of the tile, eight queries at a time from registers.
// STAGE_KV = false is the variant for GPUs with less shared memory per block (sm_86/89: 99 KiB;
// a 128-key slice at head_dim 128 needs ~150 KiB): K and V are read from the cache in global
// memory (L1/L2) instead; the arithmetic and its order are the same, so are the results.
constexpr int ATTN_CACHED_THREADS = 256;  // two warps per scheduler: the score and value loops are latency-bound
constexpr int ATTN_CACHED_WARPS = ATTN_CACHED_THREADS / 32;

// Batched prefill: the arguments a launch of blockIdx.z's sequence alone would pass, and the
// query tile within it (blockIdx.z counts the tiles of sequence 0, then of sequence 1, ...).
__device__ __forceinline__ AttentionArgs prefill_seq_args(const AttentionArgs& batch, int* tile) {
    int z = blockIdx.z, s = 0;
    for (; s < batch.batch - 1; ++s) {
        const int tiles = query_tiles(batch.prefill_seqs[s].T);
        if (z < tiles) break;
        z -= tiles;
    }
    const AttentionPrefillSeq q = batch.prefill_seqs[s];
    AttentionArgs a = batch;
    a.qkv = batch.qkv + size_t(q.row0) * batch.ld_qkv;
    a.out = batch.out + size_t(q.row0) * batch.ld_out;
    a.T = q.T;
    a.pos_dev = nullptr;
    a.pos_host = q.pos0;
    a.splits = q.splits;
    a.k_cache = q.k_cache + batch.seq_layer_offset;
    a.v_cache = q.v_cache + batch.seq_layer_offset;
    a.partial = q.partial;
    a.counters = q.counters;
    a.prefill_seqs = nullptr;
    a.batch = 1;
    *tile = z;
    return a;
}

// One block of a prefill launch: query tile `tile` of the sequence `a` describes; nq_cap = the
// query rows the launch sized its shared memory for.
template <bool STAGE_KV>
__device__ __forceinline__ void attention_cached_block(const AttentionArgs& a, int tile, int nq_cap) {
    extern __shared__ float4 attn_smem4[];
    __shared__ float m_s[ATTN_TILE * ATTN_MAX_GROUP];
    __shared__ float l_s[ATTN_TILE * ATTN_MAX_GROUP];

    const int hd = a.head_dim, kld = STAGE_KV ? hd + 1 : hd;
    const int group = a.n_heads / a.n_kv;
    const int g = blockIdx.x;
    const int cap = ATTN_KEYS_PER_SPLIT;
    float* q_s = reinterpret_cast<float*>(attn_smem4);  // [nq_cap, hd]
    float* s_s = q_s + nq_cap * hd;                      // [nq_cap, cap]
    float* k_s = s_s + nq_cap * cap;                     // [cap, hd + 1]  (STAGE_KV)
    float* v_s = k_s + (STAGE_KV ? cap * kld : 0);       // [cap, hd]      (STAGE_KV)
    float* scratch = v_s + (STAGE_KV ? cap * hd : 0);    // [ATTN_CACHED_WARPS, 128]
    const int warp = threadIdx.x >> 5;
    const size_t head_base = size_t(g) * size_t(a.max_ctx);

    const SeqBuffers sb = seq_buffers(a, 0);  // a is one sequence (a batch's: prefill_seq_args)
    const BlockSlice b = block_slice(a, position_read(sb.pos_dev, a.pos_host), group, tile, blockIdx.y);
    if (int(blockIdx.y) >= b.active) return;  // no key of the context falls in this slice
    const int t0 = b.t0, nq = b.nq, pos0 = b.pos0, k0 = b.k0;
    const int n = max(0, b.k1_visible - k0);  // keys some query of this tile can see

    const float* k_base = k_s;  // row j = key k0 + j, stride kld
    const float* v_base = v_s;  // row j = key k0 + j, stride hd
    if (STAGE_KV) {
        // The slice's rows are contiguous in the cache: [n, hd] from row k0. Read as float4 where
        // head_dim allows (the caches are 16-byte aligned), four per thread in flight: the copy
        // is bound by L2 latency, not bandwidth (measured: the scalar copy took about half of a
        // 121-row prefill block's time). Same values staged either way.
        const size_t first = (head_base + size_t(k0)) * hd;
        if ((hd & 3) == 0) {
            const int hd4 = hd >> 2;
            const float4* k_src = reinterpret_cast<const float4*>(a.k_cache + first);
            const float4* v_src = reinterpret_cast<const float4*>(a.v_cache + first);
#pragma unroll 4
            for (int i = threadIdx.x; i < n * hd4; i += ATTN_CACHED_THREADS) {
                const int r = i / hd4, d = (i % hd4) * 4;
                const float4 kv = k_src[i], vv = v_src[i];
                float* k_row = k_s + r * kld + d;  // padded rows (kld = hd + 1): scalar stores
                k_row[0] = kv.x;
                k_row[1] = kv.y;
                k_row[2] = kv.z;
                k_row[3] = kv.w;
                *reinterpret_cast<float4*>(v_s + r * hd + d) = vv;
            }
        } else {
            for (int i = threadIdx.x; i < n * hd; i += ATTN_CACHED_THREADS) {
                const int r = i / hd, d = i % hd;
                k_s[r * kld + d] = a.k_cache[first + i];
                v_s[r * hd + d] = a.v_cache[first + i];
            }
        }
    } else {
        k_base = a.k_cache + (head_base + size_t(k0)) * hd;
        v_base = a.v_cache + (head_base + size_t(k0)) * hd;
    }
    for (int qi = warp; qi < nq; qi += ATTN_CACHED_WARPS) {
        const int t = t0 + qi / group, h = g * group + qi % group;
        warp_head_norm_rope(a.qkv + size_t(t) * a.ld_qkv + size_t(h) * hd, scratch + warp * 128, q_s + qi * hd, hd,
                            a.q_norm, a.eps, a.inv_freq, pos0 + t);
    }
    __syncthreads();

    const float scale = 1.0f / sqrtf(float(hd));
    constexpr int QB = 8;  // queries per register block
    // Work item = (block of QB queries, key), keys fastest: a warp reads consecutive (padded) K
    // rows and the same query values.
    const int q_blocks = (nq + QB - 1) / QB;
    for (int w = threadIdx.x; w < q_blocks * n; w += ATTN_CACHED_THREADS) {
        const int qb = (w / n) * QB, j = w % n;
        const float* k_row = k_base + size_t(j) * kld;
        float acc[QB];
#pragma unroll
        for (int u = 0; u < QB; ++u) acc[u] = 0.0f;
        for (int d = 0; d < hd; ++d) {
            const float kv = k_row[d];
#pragma unroll
            for (int u = 0; u < QB; ++u)
                if (qb + u < nq) acc[u] = fmaf(q_s[(qb + u) * hd + d], kv, acc[u]);
        }
#pragma unroll
        for (int u = 0; u < QB; ++u) {
            const int qi = qb + u;
            if (qi < nq) s_s[qi * cap + j] = (k0 + j <= pos0 + t0 + qi / group) ? acc[u] * scale : -INFINITY;
        }
    }
    __syncthreads();
    attention_finish(a, sb, s_s, v_base, n, t0, nq, b.ctx, b.chunk, m_s, l_s, tile, blockIdx.y);
}

template <bool STAGE_KV>
__global__ void __launch_bounds__(ATTN_CACHED_THREADS) attention_cached_kernel(const AttentionArgs a) {
    pdl_wait();  // the keys were appended by the previous kernel
    pdl_trigger();
    attention_cached_block<STAGE_KV>(a, blockIdx.z, min(a.T, ATTN_TILE) * (a.n_heads / a.n_kv));
}

// grid: (n_kv, largest splits, every sequence's query tiles).
template <bool STAGE_KV>
__global__ void __launch_bounds__(ATTN_CACHED_THREADS) attention_cached_batched_kernel(const AttentionArgs batch) {
    pdl_wait();
    pdl_trigger();
    int tile = 0;
    const AttentionArgs a = prefill_seq_args(batch, &tile);
    attention_cached_block<STAGE_KV>(a, tile, min(batch.T, ATTN_TILE) * (batch.n_heads / batch.n_kv));
}

size_t attention_cached_smem(const AttentionArgs& a, bool stage_kv) {
    const int nq_cap = std::min(a.T, ATTN_TILE) * (a.n_heads / a.n_kv);
    const size_t kv = stage_kv ? size_t(ATTN_KEYS_PER_SPLIT) * (2 * a.head_dim + 1) : 0;
    return (size_t(nq_cap) * (a.head_dim + ATTN_KEYS_PER_SPLIT) + kv + ATTN_CACHED_WARPS * 128) * sizeof(float);
}

// Key/value row t of the sequence `a` describes, KV head blockIdx.y; one warp.
__device__ __forceinline__ void kv_append_row(const AttentionArgs& a, int t) {
    __shared__ float scratch[128];
    const int g = blockIdx.y, hd = a.head_dim;
    const int r = position_read(a.pos_dev, a.pos_host) + t;
    const float* row = a.qkv + size_t(t) * a.ld_qkv;
    const size_t dst = (size_t(g) * a.max_ctx + r) * hd;
    warp_head_norm_rope(row + size_t(a.n_heads + g) * hd, scratch, a.k_cache + dst, hd, a.k_norm, a.eps, a.inv_freq,
                        r);
    const float* v_src = row + size_t(a.n_heads + a.n_kv + g) * hd;
    for (int d = threadIdx.x; d < hd; d += 32) a.v_cache[dst + d] = v_src[d];
}

// grid: (T, n_kv); one warp per KV head row.
__global__ void __launch_bounds__(32) kv_append_kernel(const AttentionArgs a) {
    pdl_wait();
    pdl_trigger();
    kv_append_row(a, blockIdx.x);
}

// grid: (every sequence's rows, n_kv): launch row blockIdx.x is row t of the sequence holding it.
__global__ void __launch_bounds__(32) kv_append_batched_kernel(const AttentionArgs batch) {
    pdl_wait();
    pdl_trigger();
    const int row = blockIdx.x;
    int s = 0;
    while (s < batch.batch - 1 && row >= batch.prefill_seqs[s].row0 + batch.prefill_seqs[s].T) ++s;
    const AttentionPrefillSeq& q = batch.prefill_seqs[s];
    AttentionArgs a = batch;
    a.qkv = batch.qkv + size_t(q.row0) * batch.ld_qkv;
    a.pos_dev = nullptr;
    a.pos_host = q.pos0;
    a.k_cache = q.k_cache + batch.seq_layer_offset;
    a.v_cache = q.v_cache + batch.seq_layer_offset;
    kv_append_row(a, row - q.row0);
}

// A batched prefill launch: the table and its host-side totals (each entry was checked by the
// caller that wrote it).
void attention_prefill_validate(const AttentionArgs& a) {
    const bool ok = a.prefill_seqs && !a.seqs && !a.append && a.batch >= 1 && a.prefill_rows >= a.batch &&
                    a.prefill_tiles >= a.batch && a.qkv && a.out && a.T >= 1 && a.n_kv >= 1 &&
                    a.n_heads >= a.n_kv && a.n_heads % a.n_kv == 0 && a.n_heads / a.n_kv <= ATTN_MAX_GROUP &&
                    a.head_dim >= 2 && a.head_dim <= ATTN_MAX_HEAD_DIM && a.head_dim % 2 == 0 && a.splits >= 1 &&
                    a.splits <= ATTN_KEYS_PER_SPLIT && a.max_ctx >= 1 &&
                    a.min_chunk >= 1 && a.min_chunk <= ATTN_KEYS_PER_SPLIT && !a.out_split && !a.qkv_lo;
    if (!ok)
        check_fail("attention", "invalid batched prefill arguments (a table of sequences, their row and tile totals)",
                   __func__, __FILE__, __LINE__);
}

void attention_validate(const AttentionArgs& a) {
    if (a.prefill_seqs) {
        attention_prefill_validate(a);
        return;
    }
    const bool caches = a.seqs ? a.batch >= 1 && a.append : a.batch == 1 && a.k_cache && a.v_cache;
    // Prefill launches read the cache as float4 when head_dim allows: 16-byte aligned caches.
    const bool aligned = a.append || a.seqs || a.head_dim % 4 != 0 ||
                         ((reinterpret_cast<uintptr_t>(a.k_cache) | reinterpret_cast<uintptr_t>(a.v_cache)) & 15) == 0;
    const bool ok = caches && aligned && a.qkv && a.out && a.T >= 1 && a.n_kv >= 1 && a.n_heads >= a.n_kv &&
                    a.n_heads % a.n_kv == 0 && a.n_heads / a.n_kv <= ATTN_MAX_GROUP && a.head_dim >= 2 &&
                    a.head_dim <= ATTN_MAX_HEAD_DIM && a.head_dim % 2 == 0 && a.splits >= 1 && a.splits <= ATTN_KEYS_PER_SPLIT &&
                    (a.splits == 1 || (a.partial && a.counters)) && a.max_ctx >= 1 &&
                    (a.pos_dev || a.pos_host + a.T <= a.max_ctx) && a.splits * ATTN_KEYS_PER_SPLIT >= a.pos_host + a.T &&
                    a.min_chunk >= 1 && a.min_chunk <= ATTN_KEYS_PER_SPLIT && a.grid_splits >= 0 &&
                    a.grid_splits <= a.splits && ((!a.out_split && !a.qkv_lo) || a.append);
    if (!ok)
        check_fail("attention", "invalid arguments (head_dim even <= 128, group <= 4, splits cover the context)",
                         __func__, __FILE__, __LINE__);
}

}  // namespace

int attention_splits(int max_ctx) { return std::max(1, (max_ctx + ATTN_KEYS_PER_SPLIT - 1) / ATTN_KEYS_PER_SPLIT); }

size_t attention_partial_floats(int n_heads, int T, int splits, int head_dim) {
    return size_t(n_heads) * size_t(T) * size_t(splits) * size_t(head_dim + 2);
}

size_t attention_counter_count(int n_kv, int T) { return size_t(n_kv) * size_t(query_tiles(T)); }

// A prefill launch of `kernel` (one of the four cached-key kernels) with `smem` bytes.
template <typename Kernel>
void prefill_launch(Kernel kernel, const AttentionArgs& a, dim3 grid, size_t smem, std::atomic<uint64_t>& raised,
                    const Launch& l) {
    smem_limit_raise(kernel, smem, raised);
    KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(ATTN_CACHED_THREADS), smem, kernel, a));
}

void attention(const AttentionArgs& a, const Launch& l) {
    attention_validate(a);
    const bool batched_prefill = a.prefill_seqs != nullptr;
    const dim3 grid(a.n_kv, a.splits, batched_prefill ? a.prefill_tiles : query_tiles(a.T) * a.batch);
    if (!a.append) {
        // Prefill: keys already in the cache (kv_append), staged per block.
        // K/V staged in shared memory where the device has room for the slice, else read in place.
        static std::atomic<uint64_t> raised[4];
        const size_t staged = attention_cached_smem(a, true);
        if (smem_fits(staged)) {
            if (batched_prefill) prefill_launch(attention_cached_batched_kernel<true>, a, grid, staged, raised[0], l);
            else prefill_launch(attention_cached_kernel<true>, a, grid, staged, raised[1], l);
        } else {
            const size_t smem = attention_cached_smem(a, false);
            if (batched_prefill) prefill_launch(attention_cached_batched_kernel<false>, a, grid, smem, raised[2], l);
            else prefill_launch(attention_cached_kernel<false>, a, grid, smem, raised[3], l);
        }
        return;
    }
    // Decode: the kernel appends the new keys itself.
    if (a.T > ATTN_TILE)
        check_fail("attention", "append needs T <= ATTN_TILE (use kv_append for longer prefills)", __func__,
                         __FILE__, __LINE__);
    const int group = a.n_heads / a.n_kv;
    const int nq_cap = std::min(a.T, ATTN_TILE) * group;
    const int stage_keys = a.T <= 2 ? ATTN_STAGE_KEYS : 0;
    const size_t smem = (size_t(nq_cap) * (a.head_dim + ATTN_KEYS_PER_SPLIT) + ATTN_WARPS * 128 +
                         2 * size_t(stage_keys) * a.head_dim) *
                        sizeof(float);
    const dim3 decode_grid(a.n_kv, a.grid_splits > 0 ? a.grid_splits : a.splits, grid.z);
    const bool alone = decode_grid.x * decode_grid.y * decode_grid.z <= ATTN_ALONE_MAX_BLOCKS;
    const size_t launch_smem = alone ? std::max(smem, smem_block_limit() - SMEM_STATIC_ALLOWANCE) : smem;
    static std::atomic<uint64_t> raised{0};
    smem_limit_raise(attention_kernel, launch_smem, raised);
    KERNEL_CUDA_CHECK(launch_kernel(l, decode_grid, dim3(ATTN_THREADS), launch_smem, attention_kernel, a, stage_keys));
}

void kv_append(const AttentionArgs& a, const Launch& l) {
    attention_validate(a);
    if (a.seqs) check_fail("kv_append", "batched launches append inside attention()", __func__, __FILE__, __LINE__);
    if (a.prefill_seqs)
        KERNEL_CUDA_CHECK(launch_kernel(l, dim3(a.prefill_rows, a.n_kv), dim3(32), 0, kv_append_batched_kernel, a));
    else
        KERNEL_CUDA_CHECK(launch_kernel(l, dim3(a.T, a.n_kv), dim3(32), 0, kv_append_kernel, a));
}

}  // namespace qtts::kernels
