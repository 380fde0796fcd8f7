#include "kernels/sampling.cuh"

#include "kernels/batch.cuh"
#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {


__host__ __device__ inline uint32_t mul_hi(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }

// Philox4x32-10, first output word; counter = {index lo, index hi, stream, 0}, key = seed.
__host__ __device__ inline uint32_t philox_word0(uint64_t seed, uint32_t stream, uint64_t index) {
    uint32_t c0 = uint32_t(index), c1 = uint32_t(index >> 32), c2 = stream, c3 = 0u;
    uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
    for (int round = 0; round < 10; ++round) {
        const uint32_t hi0 = mul_hi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const uint32_t hi1 = mul_hi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        const uint32_t n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    return c0;
}

__host__ __device__ inline float philox_uniform(uint64_t seed, uint32_t stream, uint64_t index) {
    return float(philox_word0(seed, stream, index) >> 8) * (1.0f / 16777216.0f);
}

// Float -> unsigned key with the same order.
__device__ __forceinline__ uint32_t order_key(float v) {
    const uint32_t u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// One block samples one row. The block size is a template parameter (the helpers work for any
// multiple of 32 from 512 to 1024 threads: block_compact takes a round a warp). Measured on the
// H200 (1.7B, top-k 50, before the bracket): 1024 threads 10.2 / 9.9 us (codebook 0 / predictor),
// 512 10.9 / 9.9, 256 14.8 / 12.1.
constexpr int SAMPLE_BLOCK = 1024;
constexpr int SAMPLE_BRACKET_BUCKETS = 32;      // buckets below the max that bracket the k-th largest
constexpr int SAMPLE_BRACKET_CANDIDATES = 256;  // the most values the bracket's rank selection takes
template <int SAMPLE_THREADS>
struct SampleImpl {
    static constexpr int SAMPLE_WARPS = SAMPLE_THREADS / 32;
    static constexpr int PER_THREAD = SAMPLE_MAX_VOCAB / SAMPLE_THREADS;

struct Shared {
    uint32_t hist[256];
    float red_v[SAMPLE_WARPS];
    int red_i[SAMPLE_WARPS];
    int round_count[PER_THREAD][SAMPLE_WARPS];
    int round_offset[PER_THREAD][SAMPLE_WARPS];
    int digit;
    int above;
    int result;
    int count;
    // block_kth_largest_bracket: per-warp partials (max, sum, finite count), the bucket counts,
    // the bracket's candidates (in `value`) and the chosen value.
    float red_s[SAMPLE_WARPS];
    int red_c[SAMPLE_WARPS];
    uint32_t bucket[SAMPLE_BRACKET_BUCKETS];
    int candidates;
    float kth;
    float value[SAMPLE_MAX_VOCAB];  // compacted candidates (probabilities or values)
    int index[SAMPLE_MAX_VOCAB];
    unsigned char removed[SAMPLE_MAX_VOCAB];
};

// Largest value; ties -> lowest index (torch.argmax). Every thread gets the index.
static __device__ __forceinline__ int block_argmax(const float (&v)[PER_THREAD], int n, Shared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float best = -INFINITY;
    int best_i = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int i = tid + j * SAMPLE_THREADS;
        if (i < n && (best_i == 0x7fffffff || v[j] > best)) {
            best = v[j];
            best_i = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
        if (ov > best || (ov == best && oi < best_i)) {
            best = ov;
            best_i = oi;
        }
    }
    if (lane == 0) {
        sh.red_v[warp] = best;
        sh.red_i[warp] = best_i;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < SAMPLE_WARPS ? sh.red_v[lane] : -INFINITY;
        best_i = lane < SAMPLE_WARPS ? sh.red_i[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
            if (ov > best || (ov == best && oi < best_i)) {
                best = ov;
                best_i = oi;
            }
        }
        if (lane == 0) sh.result = best_i;
    }
    __syncthreads();
    return sh.result;
}

static __device__ __forceinline__ float block_max(const float (&v)[PER_THREAD], int n, Shared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j)
        if (tid + j * SAMPLE_THREADS < n) m = fmaxf(m, v[j]);
    m = warp_max(m);
    __syncthreads();  // red_v may still be read by a previous reduction
    if (lane == 0) sh.red_v[warp] = m;
    __syncthreads();
    if (warp == 0) {
        const float w = warp_max(lane < SAMPLE_WARPS ? sh.red_v[lane] : -INFINITY);
        if (lane == 0) sh.red_v[0] = w;
    }
    __syncthreads();
    return sh.red_v[0];
}

// The k-th largest value among v[i], i < n, in four barriers where the distribution allows
// (false otherwise: the caller runs block_kth_largest's radix passes). The finite values' max m
// and mean come from one reduction; each value falls in bucket floor((m - v) / delta), delta =
// (m - mean) / 16, here (m - v) * (1 / delta): both roundings are monotone, so the bucket never
// decreases as v decreases and the values of the buckets before the one where the running count
// reaches k are all larger than that bucket's and the values after it all smaller: the k-th
// largest is that bucket's (k - above)-th largest, chosen by rank among its few values. The same
// value as the radix select (the CPU's nth_element), bit for bit. *max_out: m (the max the
// softmax needs, which top-k and top-p keep). Returns false, with nothing decided, when the values
// are all equal or all -inf, when the 32 buckets hold fewer than k values, or when the bracket
// holds more than SAMPLE_BRACKET_CANDIDATES; every thread returns the same.
//
// With 32 warps on one SM, work that every warp repeats is paid 32 times on the SM's shared
// memory and shuffle pipe: each warp reduces the 32 partials with one shuffle butterfly (every
// lane of every warp gets the same bits: the same additions, commutative pairs) rather than a
// loop of 96 shared-memory reads, counts its buckets with ballots (lane L the lanes whose bucket
// is L: five ballots of the bucket's bits, one atomic a lane) rather than a match and an atomic
// a value, and finds the bracket with one scan over the 32 counts (a lane a bucket).
static __device__ __forceinline__ bool block_kth_largest_bracket(const float (&v)[PER_THREAD], int n, int k, Shared& sh,
                                                                 float* kth_out, float* max_out) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float m = -INFINITY, sum = 0.0f;
    int finite = 0;
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        if (tid + j * SAMPLE_THREADS < n && v[j] != -INFINITY) {
            m = fmaxf(m, v[j]);
            sum += v[j];
            ++finite;
        }
    }
    m = warp_max(m);
    sum = warp_sum(sum);
    finite = int(__reduce_add_sync(0xffffffffu, uint32_t(finite)));  // sm_80+, as every build
    if (lane == 0) {  // the draw's first reduction: no earlier one reads red_v
        sh.red_v[warp] = m;
        sh.red_s[warp] = sum;
        sh.red_c[warp] = finite;
    }
    if (tid < SAMPLE_BRACKET_BUCKETS) sh.bucket[tid] = 0u;
    if (tid == 0) {
        sh.candidates = 0;
        sh.kth = NAN;
    }
    __syncthreads();
    m = warp_max(lane < SAMPLE_WARPS ? sh.red_v[lane] : -INFINITY);
    sum = warp_sum(lane < SAMPLE_WARPS ? sh.red_s[lane] : 0.0f);
    finite = int(__reduce_add_sync(0xffffffffu, lane < SAMPLE_WARPS ? uint32_t(sh.red_c[lane]) : 0u));
    if (finite < k) return false;
    const float delta = (m - sum / float(finite)) * (1.0f / 16.0f);
    if (!(delta > 0.0f) || !(delta < INFINITY)) return false;
    const float per_delta = 1.0f / delta;
    if (!(per_delta > 0.0f) || !(per_delta < INFINITY)) return false;
    int b[PER_THREAD];
    uint32_t in_my_bucket = 0u;  // lane L: the warp's values in bucket L
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        b[j] = SAMPLE_BRACKET_BUCKETS;  // past the buckets (or not a value)
        if (tid + j * SAMPLE_THREADS < n && v[j] != -INFINITY) {
            const float q = (m - v[j]) * per_delta;
            if (q < float(SAMPLE_BRACKET_BUCKETS)) b[j] = int(q);
        }
        unsigned same = __ballot_sync(0xffffffffu, b[j] < SAMPLE_BRACKET_BUCKETS);
        if (same) {  // the same in every lane
#pragma unroll
            for (int bit = 0; bit < 5; ++bit) {
                const unsigned set = __ballot_sync(0xffffffffu, (b[j] >> bit) & 1);
                same &= ((lane >> bit) & 1) ? set : ~set;
            }
            in_my_bucket += uint32_t(__popc(same));
        }
    }
    static_assert(SAMPLE_BRACKET_BUCKETS == 32, "a lane a bucket");
    if (in_my_bucket) atomicAdd(&sh.bucket[lane], in_my_bucket);
    __syncthreads();
    const uint32_t in_bucket = sh.bucket[lane];
    const uint32_t through = warp_inclusive_sum(in_bucket);  // values in buckets 0..lane
    const unsigned reached = __ballot_sync(0xffffffffu, through >= uint32_t(k));
    if (!reached) return false;
    const int bracket = __ffs(int(reached)) - 1;
    const int above = int(__shfl_sync(0xffffffffu, through - in_bucket, bracket));
    // The bracket's values: one slot range a warp (one atomic), in (j, lane) order within it.
    unsigned hit[PER_THREAD];
    int hits = 0;
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        hit[j] = __ballot_sync(0xffffffffu, b[j] == bracket);
        hits += __popc(hit[j]);
    }
    if (hits) {
        int slot = 0;
        if (lane == 0) slot = atomicAdd(&sh.candidates, hits);
        slot = __shfl_sync(0xffffffffu, slot, 0);
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j) {
            if (hit[j] & (1u << lane)) {
                const int mine = slot + __popc(hit[j] & ((1u << lane) - 1u));
                if (mine < SAMPLE_BRACKET_CANDIDATES) sh.value[mine] = v[j];
            }
            slot += __popc(hit[j]);
        }
    }
    __syncthreads();
    const int count = sh.candidates;
    if (count > SAMPLE_BRACKET_CANDIDATES) return false;
    const int rank = k - above;  // 1..count
    if (tid < count) {
        const float c = sh.value[tid];
        int greater = 0, not_less = 0;
#pragma unroll 8  // the reads in flight together, not one after another's compare
        for (int i = 0; i < count; ++i) {
            const float o = sh.value[i];
            greater += o > c ? 1 : 0;
            not_less += o >= c ? 1 : 0;
        }
        if (greater < rank && rank <= not_less) sh.kth = c;  // ties write the same value
    }
    __syncthreads();
    const float kth = sh.kth;
    if (kth != kth) return false;  // not reached (it is whenever the counts above hold)
    *kth_out = kth;
    *max_out = m;
    return true;
}

// The k-th largest value among v[i], i < n (radix select on order-preserving keys, 8 bits a pass).
static __device__ __forceinline__ float block_kth_largest(const float (&v)[PER_THREAD], int n, int k, Shared& sh) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    uint32_t key[PER_THREAD];
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) key[j] = order_key(v[j]);
    uint32_t prefix = 0u, mask = 0u;
    int remaining = k;
    for (int shift = 24; shift >= 0; shift -= 8) {
        if (tid < 256) sh.hist[tid] = 0u;
        __syncthreads();
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j) {
            // Warp-aggregated increments: logits share their top bits, and 32 lanes hitting one
            // shared-memory counter would serialise. Non-participating lanes get a unique tag.
            const bool counts = tid + j * SAMPLE_THREADS < n && (key[j] & mask) == prefix;
            const uint32_t digit = (key[j] >> shift) & 255u;
            if (shift == 24) {
                const uint32_t tag = counts ? digit : 256u + uint32_t(lane);
                const unsigned peers = __match_any_sync(0xffffffffu, tag);
                if (counts && lane == __ffs(peers) - 1) atomicAdd(&sh.hist[digit], uint32_t(__popc(peers)));
            } else if (counts) {
                atomicAdd(&sh.hist[digit], 1u);
            }
        }
        __syncthreads();
        if (warp == 0) {
            // Lane l holds digits 255-8l .. 248-8l (descending).
            uint32_t c[8];
            uint32_t lane_total = 0u;
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                c[i] = sh.hist[255 - (8 * lane + i)];
                lane_total += c[i];
            }
            const uint32_t inclusive = warp_inclusive_sum(lane_total);
            uint32_t before = inclusive - lane_total;
            if (before < uint32_t(remaining) && uint32_t(remaining) <= inclusive) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    if (before + c[i] >= uint32_t(remaining)) {
                        sh.digit = 255 - (8 * lane + i);
                        sh.above = int(before);
                        break;
                    }
                    before += c[i];
                }
            }
        }
        __syncthreads();
        prefix |= uint32_t(sh.digit) << shift;
        mask |= 255u << shift;
        remaining -= sh.above;
    }
    return key_value(prefix);
}

// Writes the finite entries (i < n) into sh.index/sh.value in ascending index order, with
// value = f(v). Returns the count (every thread). Index i = tid + j * SAMPLE_THREADS, so the
// order is (j, warp, lane): one ballot per j, then warp j scans the 32 warp counts of round j and
// adds the counts of the rounds before it, so a warp reads only the offsets of the rounds where
// it has entries (after a top-k, few do).
template <typename F>
    static __device__ __forceinline__ int block_compact(const float (&v)[PER_THREAD], int n, Shared& sh, F f) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned ballot[PER_THREAD];
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int i = tid + j * SAMPLE_THREADS;
        ballot[j] = __ballot_sync(0xffffffffu, i < n && v[j] != -INFINITY);
        if (lane == 0) sh.round_count[j][warp] = __popc(ballot[j]);
    }
    __syncthreads();
    if (warp < PER_THREAD) {
        const int round = warp;
        uint32_t before = 0u;  // entries of the rounds before this one
        for (int r = 0; r < round; ++r)
            before += __reduce_add_sync(0xffffffffu, lane < SAMPLE_WARPS ? uint32_t(sh.round_count[r][lane]) : 0u);
        const int c = lane < SAMPLE_WARPS ? sh.round_count[round][lane] : 0;
        const int inclusive = warp_inclusive_sum(c);
        if (lane < SAMPLE_WARPS) sh.round_offset[round][lane] = int(before) + inclusive - c;
        if (round == PER_THREAD - 1 && lane == 31) sh.count = int(before) + inclusive;
    }
    static_assert(PER_THREAD <= SAMPLE_WARPS, "a warp a round");
    __syncthreads();
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        if (ballot[j] & (1u << lane)) {
            const int i = tid + j * SAMPLE_THREADS;
            const int slot = sh.round_offset[j][warp] + __popc(ballot[j] & ((1u << lane) - 1u));
            sh.index[slot] = i;
            sh.value[slot] = f(v[j]);
        }
    }
    const int count = sh.count;
    __syncthreads();
    return count;
}

// HF TopPLogitsWarper (engine/runtime/sampling.cpp logits_apply_top_p) on the `count` finite
// entries compacted into sh.value/sh.index: sets sh.removed[i] for the ids it drops. Kept out of
// line: it is the slow path (top_p < 1) and would otherwise crowd the registers of the draw.
static __device__ __noinline__ void block_top_p_mark(int count, int n, float top_p, Shared& sh) {
    const int tid = threadIdx.x;
    for (int i = tid; i < n; i += SAMPLE_THREADS) sh.removed[i] = 0;
    if (count <= 1) {
        __syncthreads();
        return;
    }
    int padded = 1;
    while (padded < count) padded <<= 1;
    for (int i = count + tid; i < padded; i += SAMPLE_THREADS) {
        sh.value[i] = INFINITY;
        sh.index[i] = 0x7fffffff;
    }
    __syncthreads();
    // Bitonic sort ascending by (value, index): the stable ascending order of the reference.
    for (int size = 2; size <= padded; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = tid; i < padded; i += SAMPLE_THREADS) {
                const int j = i ^ stride;
                if (j <= i) continue;
                const float vi = sh.value[i], vj = sh.value[j];
                const int ii = sh.index[i], ij = sh.index[j];
                const bool greater = vi > vj || (vi == vj && ii > ij);
                const bool ascending = (i & size) == 0;
                if (greater == ascending) {
                    sh.value[i] = vj;
                    sh.value[j] = vi;
                    sh.index[i] = ij;
                    sh.index[j] = ii;
                }
            }
            __syncthreads();
        }
    }
    if (tid == 0) {
        const float max_v = sh.value[count - 1];
        float total = 0.0f;
        for (int i = 0; i < count; ++i) total += expf(sh.value[i] - max_v);
        const float limit = 1.0f - top_p;
        float cumulative = 0.0f;
        for (int i = 0; i < count - 1; ++i) {
            cumulative += expf(sh.value[i] - max_v) / total;
            if (cumulative <= limit) sh.removed[sh.index[i]] = 1;
        }
    }
    __syncthreads();
}

    // The draw from the `count` probabilities compacted into sh.value (ids in sh.index), as
    // probs_pick() on the CPU makes it: the first entry whose running sum in index order exceeds
    // u * total, else the last nonzero one. Called by the 32 lanes of one warp; every lane returns
    // the id. Overwrites sh.value with the running sums.
    //
    // Why a warp: thread 0 alone walked the list with one dependent shared-memory read and add
    // after another, ~36 ns a candidate (~1.8 us of a top-k 50 draw; a draw from the whole
    // vocabulary walks 2048 or more). Here lane l of a 32-entry round adds entries 32c .. 32c + l, one after another, to the
    // sum carried from the round before: the same additions in the same order as the serial loop,
    // so every running sum has the serial loop's bits, and 32 of them come out of one pass of
    // broadcast reads. Adding a zero leaves a sum as it is, so a zero never exceeds the target
    // first (target = u * total >= 0) and the pick is the first sum above it.
    static __device__ __forceinline__ int warp_draw(int count, float u, Shared& sh) {
        const int lane = threadIdx.x & 31;
        float carry = 0.0f;
        int last_nonzero = -1;
        for (int c0 = 0; c0 < count; c0 += 32) {
            const int in_round = min(32, count - c0);
            float sum = carry;
#pragma unroll
            for (int t = 0; t < 32; ++t) {
                const float p = t < in_round ? sh.value[c0 + t] : 0.0f;
                if (t <= lane) sum += p;
            }
            if (lane < in_round && sh.value[c0 + lane] != 0.0f) last_nonzero = c0 + lane;
            __syncwarp();
            if (lane < in_round) sh.value[c0 + lane] = sum;
            carry = __shfl_sync(0xffffffffu, sum, in_round - 1);
        }
        last_nonzero = __reduce_max_sync(0xffffffffu, last_nonzero);  // sm_80+, as every build
        __syncwarp();
        const float target = u * carry;  // carry: the total
        int pick = -1;
        for (int c0 = 0; c0 < count && pick < 0; c0 += 32) {
            const unsigned over = __ballot_sync(0xffffffffu, c0 + lane < count && sh.value[c0 + lane] > target);
            if (over) pick = c0 + __ffs(int(over)) - 1;
        }
        if (pick < 0) pick = last_nonzero;
        return pick >= 0 ? sh.index[pick] : (count > 0 ? sh.index[0] : 0);
    }

    // Tests: the draw from probabilities[0..count) with ids 0..count - 1 (warp_draw above).
    static __device__ __forceinline__ void draw_probe(const float* probabilities, int count, float u, int* out,
                                                      Shared& sh) {
        for (int i = threadIdx.x; i < count; i += SAMPLE_THREADS) {
            sh.value[i] = probabilities[i];
            sh.index[i] = i;
        }
        __syncthreads();
        if ((threadIdx.x >> 5) == 0) {
            const int pick = warp_draw(count, u, sh);
            if (threadIdx.x == 0) *out = pick;
        }
    }

    // Tests: the k-th largest of values[0..n) by the bracket (out[0], NaN when it declined; out[2]
    // its max) and by the radix passes (out[1]), from the same registers.
    static __device__ __forceinline__ void kth_probe(const float* values, int n, int k, float* out, Shared& sh) {
        float v[PER_THREAD];
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j) {
            const int i = threadIdx.x + j * SAMPLE_THREADS;
            v[j] = i < n ? values[i] : -INFINITY;
        }
        float bracket = NAN, max_v = NAN;
        const bool took = block_kth_largest_bracket(v, n, k, sh, &bracket, &max_v);
        const float radix = block_kth_largest(v, n, k, sh);
        if (threadIdx.x == 0) {
            out[0] = took ? bracket : NAN;
            out[1] = radix;
            out[2] = took ? max_v : NAN;
        }
    }

    // With SampleArgs::embed_out: the block's row of the next predictor pass's input, row `code`
    // of the embedding (bf16) or of the projected rows (fp32). Called by every thread of the block.
    static __device__ __forceinline__ void embed_row(const SampleArgs& a, int code) {
        float* dst = a.embed_out + size_t(blockIdx.x) * a.embed_ld;
        if (a.embed_rows) {
            const float* src = a.embed_rows + size_t(code) * a.embed_dim;
            for (int i = threadIdx.x; i < a.embed_dim; i += SAMPLE_THREADS) dst[i] = src[i];
        } else {
            const bf16_t* src = a.embed_table + size_t(code) * a.embed_dim;
            for (int i = threadIdx.x; i < a.embed_dim; i += SAMPLE_THREADS) dst[i] = bf16_to_float(src[i]);
        }
    }

    static __device__ __forceinline__ void run(const SampleArgs& args, Shared& sh) {
    // Batched: this block's row takes its stream's buffers; idle and stopped rows draw nothing.
    // The slot table is written by the host before the step (GpuBatch::bind), so it is read
    // before the wait. Idle rows return at once, or, asked for the embedding (embed_out), after
    // writing that of the code they hold.
    SampleArgs a = args;
    int32_t* batch_code = nullptr;
    if (args.slots) {
        const int r = blockIdx.x;
        const StreamSlot slot = args.slots[r];
        batch_code = args.batch_codes + size_t(r) * SAMPLE_MAX_GROUPS + args.group;
        if (!slot.state) {
            if (args.embed_out) {
                pdl_wait();  // batch_codes was written by this step's slots_load
                pdl_trigger();
                embed_row(args, *batch_code);
            }
            return;
        }
        a.state = slot.state;
        a.seen = slot.seen;
        a.codes = slot.codes;
        a.logits = args.logits + size_t(r) * args.ld_logits;
    }
    pdl_wait();
    const int tid = threadIdx.x, n = a.n;
    GenerationDeviceState* st = a.state;
    // The logits and the stream's state in one round of loads: a stopped row's are read and
    // dropped.
    float v[PER_THREAD];
#pragma unroll
    for (int j = 0; j < PER_THREAD; ++j) {
        const int i = tid + j * SAMPLE_THREADS;
        v[j] = i < n ? a.logits[i] : -INFINITY;
    }
    const SamplingDeviceParams p = a.group == 0 ? st->talker : st->predictor;
    const int frame = st->frame + a.frame_offset;
    if (args.slots && st->stopped) {
        if (args.embed_out) embed_row(args, *batch_code);
        return;
    }
    if (a.group == 0) {
        const bool mask_eos = st->history_count < st->min_new_tokens;
        const float penalty = p.repetition_penalty;
#pragma unroll
        for (int j = 0; j < PER_THREAD; ++j) {
            const int i = tid + j * SAMPLE_THREADS;
            if (i >= n) continue;
            if (penalty != 1.0f && a.seen[i]) v[j] = v[j] < 0.0f ? v[j] * penalty : v[j] / penalty;
            if (mask_eos && i == a.eos_id) v[j] = -INFINITY;
            if (i >= a.suppress_begin && i != a.eos_id) v[j] = -INFINITY;
        }
    }

    // The next launch (the next pass's q/k/v product) is released once this thread has its
    // logits: released right after the wait, its blocks' weight loads held up these loads ~2 µs
    // (the kernel timeline: the pass's last draw, followed by a launch that loads nothing, had its
    // logits reduced 2 µs sooner than the others; the frame -0.4% with the release here).
    pdl_trigger();
    int chosen;
    if (p.greedy) {
        chosen = block_argmax(v, n, sh);
    } else {
        if (p.temperature != 1.0f) {
#pragma unroll
            for (int j = 0; j < PER_THREAD; ++j) v[j] = v[j] / p.temperature;
        }
        float max_known = NAN;  // the max, when the top-k bracket found it on the way
        if (p.top_k > 0 && p.top_k < n) {
            float threshold;
            if (!block_kth_largest_bracket(v, n, p.top_k, sh, &threshold, &max_known)) {
                max_known = NAN;
                threshold = block_kth_largest(v, n, p.top_k, sh);
            }
            timeline_mark(2);  // profiling builds: the top-k threshold found
#pragma unroll
            for (int j = 0; j < PER_THREAD; ++j)
                if (v[j] < threshold) v[j] = -INFINITY;
        }
        if (p.top_p < 1.0f && n > 1) {
            const int count = block_compact(v, n, sh, [](float x) { return x; });
            block_top_p_mark(count, n, p.top_p, sh);
#pragma unroll
            for (int j = 0; j < PER_THREAD; ++j) {
                const int i = tid + j * SAMPLE_THREADS;
                if (i < n && sh.removed[i]) v[j] = -INFINITY;
            }
            __syncthreads();
        }
        // The max survives top-k and top-p (both keep the most likely id): the bracket's, when it
        // ran; fmaxf picks the same value either way (a +0 / -0 tie gives the same exponentials).
        const float max_v = max_known == max_known ? max_known : block_max(v, n, sh);
        const int count = block_compact(v, n, sh, [max_v](float x) { return expf(x - max_v); });
        timeline_mark(3);  // the probabilities compacted
        if ((tid >> 5) == 0) {
            const int pick = warp_draw(count, philox_uniform(st->seed, uint32_t(a.group), uint64_t(frame)), sh);
            if (tid == 0) sh.result = pick;
        }
        __syncthreads();
        chosen = sh.result;
    }

    timeline_mark(0);  // profiling builds: the code chosen (kernels/timeline.cuh)
    if (tid == 0) {
        st->current[a.group] = chosen;
        if (frame >= 0 && frame < st->code_capacity) a.codes[size_t(frame) * SAMPLE_MAX_GROUPS + a.group] = chosen;
        if (a.group == 0) {
            if (chosen >= 0 && chosen < n) a.seen[chosen] = 1;
            st->history_count += 1;
        }
        if (a.advance) {
            st->frame += 1;
            st->position += 1;
            if (chosen == a.eos_id)
                st->stopped = 1;
            else if (st->frame >= st->frame_end || st->position >= st->position_end)
                st->stopped = 2;
        }
        if (batch_code) *batch_code = chosen;
    }
    if (args.embed_out) embed_row(args, chosen);  // every thread holds `chosen`
    timeline_mark(1);
    }
};

template <int SAMPLE_THREADS>
__global__ void __launch_bounds__(SAMPLE_THREADS) sample_kernel(const SampleArgs a) {
    __shared__ typename SampleImpl<SAMPLE_THREADS>::Shared sh;
    SampleImpl<SAMPLE_THREADS>::run(a, sh);
}

__global__ void __launch_bounds__(SAMPLE_BLOCK) kth_probe_kernel(const float* values, int n, int k, float* out) {
    __shared__ SampleImpl<SAMPLE_BLOCK>::Shared sh;
    SampleImpl<SAMPLE_BLOCK>::kth_probe(values, n, k, out, sh);
}

__global__ void __launch_bounds__(SAMPLE_BLOCK) draw_probe_kernel(const float* probabilities, int count, float u,
                                                                   int* out) {
    __shared__ SampleImpl<SAMPLE_BLOCK>::Shared sh;
    SampleImpl<SAMPLE_BLOCK>::draw_probe(probabilities, count, u, out, sh);
}

}  // namespace

float philox_uniform_host(uint64_t seed, uint32_t stream, uint64_t index) { return philox_uniform(seed, stream, index); }

void top_k_threshold_probe(const float* values, int n, int k, float* out, const Launch& l) {
    if (!values || !out || n < 2 || n > SAMPLE_MAX_VOCAB || k < 1 || k >= n)
        check_fail("top_k_threshold_probe", "invalid arguments (2 <= n <= 4096, 1 <= k < n)", __func__, __FILE__,
                   __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(1), dim3(SAMPLE_BLOCK), 0, kth_probe_kernel, values, n, k, out));
}

void draw_probe(const float* probabilities, int count, float u, int* out, const Launch& l) {
    if (!probabilities || !out || count < 1 || count > SAMPLE_MAX_VOCAB || !(u >= 0.0f && u < 1.0f))
        check_fail("draw_probe", "invalid arguments (1 <= count <= 4096, 0 <= u < 1)", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(1), dim3(SAMPLE_BLOCK), 0, draw_probe_kernel, probabilities, count, u, out));
}

void sample(const SampleArgs& a, const Launch& l) {
    const bool batched = a.slots != nullptr;
    const bool embed = !a.embed_out || ((a.embed_table != nullptr) != (a.embed_rows != nullptr) && a.embed_dim >= 1 &&
                                        a.embed_ld >= a.embed_dim);
    const bool buffers = batched ? (a.rows >= 1 && a.ld_logits >= a.n && a.batch_codes && embed)
                                 : (a.state && a.codes && (a.group != 0 || a.seen) && embed);
    if (!a.logits || a.n <= 0 || a.n > SAMPLE_MAX_VOCAB || !buffers || a.group < 0 || a.group >= SAMPLE_MAX_GROUPS)
        check_fail("sample",
                   "invalid arguments (vocab <= 4096, group 0..15, state/codes/seen or slots set; embed_* whole)",
                   __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(batched ? a.rows : 1), dim3(SAMPLE_BLOCK), 0, sample_kernel<SAMPLE_BLOCK>, a));
}

}  // namespace qtts::kernels
