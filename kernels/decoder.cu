#include "kernels/decoder.cuh"

#include <algorithm>

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int THREADS = 256;
constexpr int MAX_TAIL = 1024;
constexpr int MAX_WINDOW = 1024;

// Blocks for a grid-stride loop over `count` elements.
int grid_for(long long count) {
    const long long blocks = (count + THREADS - 1) / THREADS;
    return int(std::max<long long>(1, std::min<long long>(blocks, 32768)));
}

[[noreturn]] void bad_args(const char* what, const char* function) {
    check_fail(what, "invalid arguments", function, __FILE__, __LINE__);
}

// Stream s's piece of carried state at byte offset `at` in its block.
template <typename T>
__device__ __forceinline__ T* state_at(const DecoderStates& states, int s, size_t at) {
    return reinterpret_cast<T*>(states.blocks[s] + at);
}

bool states_ok(const DecoderStates& states) { return states.blocks != nullptr && states.count >= 1; }

__device__ __forceinline__ float snake_eval(float v, float alpha, float inv_beta) {
    const float s = sinf(alpha * v);
    return v + inv_beta * (s * s);
}

// Where an im2col stores its columns: fp32 (`col`), or as bf16 hi/lo pairs for the split-bf16
// products (`planes` [3, plane]: the hi plane, the lo plane, the hi plane again, so that one GEMM
// over 3K rows pairs them with the weights' hi | hi | lo).
struct ColumnSink {
    float* col = nullptr;
    bf16_t* planes = nullptr;
    size_t plane = 0;
    __device__ __forceinline__ void put(size_t i, float v) const {
        if (col)
            col[i] = v;
        else {
            bf16_t hi, lo;
            bf16_split(v, &hi, &lo);
            planes[i] = hi;
            planes[plane + i] = lo;
            planes[2 * plane + i] = hi;
        }
    }
    // Two consecutive columns' hi and lo halves, each pair packed in 32 bits (first column low).
    static __device__ __forceinline__ void split_packed(float a, float b, uint32_t& hi, uint32_t& lo) {
        bf16_t ha, la, hb, lb;
        bf16_split(a, &ha, &la);
        bf16_split(b, &hb, &lb);
        hi = ha | uint32_t(hb) << 16;
        lo = la | uint32_t(lb) << 16;
    }
    // Four consecutive columns from i (a multiple of 4) in one store per plane.
    __device__ __forceinline__ void put4(size_t i, float4 v) const {
        if (col) {
            *reinterpret_cast<float4*>(col + i) = v;
            return;
        }
        uint32_t hi[2], lo[2];
        split_packed(v.x, v.y, hi[0], lo[0]);
        split_packed(v.z, v.w, hi[1], lo[1]);
        *reinterpret_cast<uint2*>(planes + i) = make_uint2(hi[0], hi[1]);
        *reinterpret_cast<uint2*>(planes + plane + i) = make_uint2(lo[0], lo[1]);
        *reinterpret_cast<uint2*>(planes + 2 * plane + i) = make_uint2(hi[0], hi[1]);
    }
    // Eight consecutive columns from i (a multiple of 8): one 16-byte store per plane.
    __device__ __forceinline__ void put8(size_t i, const float* v) const {
        if (col) {
            *reinterpret_cast<float4*>(col + i) = make_float4(v[0], v[1], v[2], v[3]);
            *reinterpret_cast<float4*>(col + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
            return;
        }
        uint32_t hi[4], lo[4];
        for (int q = 0; q < 4; ++q) split_packed(v[2 * q], v[2 * q + 1], hi[q], lo[q]);
        *reinterpret_cast<uint4*>(planes + i) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
        *reinterpret_cast<uint4*>(planes + plane + i) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
        *reinterpret_cast<uint4*>(planes + 2 * plane + i) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    }
};

__device__ __forceinline__ float gelu_erf_ref(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

// Block-wide reductions (every thread gets the result); `shared` holds 32 floats.
__device__ float block_reduce_sum(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) total += shared[w];
    return total;
}

__device__ float block_reduce_max(float v, float* shared) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) m = fmaxf(m, shared[w]);
    return m;
}

__global__ void rvq_gather_kernel(const int32_t* codes, int nq, const float* codebooks, int size, int half, float* g) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    const int32_t* frame = codes + size_t(t) * nq;
    float* row = g + size_t(t) * 2 * half;
    for (int j = threadIdx.x; j < half; j += blockDim.x) {
        row[j] = codebooks[size_t(frame[0]) * half + j];
        float acc = 0.0f;  // same order as the CPU: 0 + book1 + book2 + ...
        for (int q = 1; q < nq; ++q) acc += codebooks[(size_t(q) * size + size_t(frame[q])) * half + j];
        row[half + j] = acc;
    }
}

// One block per channel: read every new tail value, then write (in place).
__global__ void conv_tail_update_kernel(float* tail, int L, const float* x, int T, SnakeParams snake) {
    pdl_wait();
    pdl_trigger();
    const int c = blockIdx.x;
    float* tc = tail + size_t(c) * L;
    const int j = threadIdx.x;
    float v = 0.0f;
    if (j < L) {
        const int s = T + j;  // column in [tail | x]
        if (s < L) {
            v = tc[s];
        } else {
            v = x[size_t(c) * T + (s - L)];
            if (snake.alpha) v = snake_eval(v, snake.alpha[c], snake.inv_beta[c]);
        }
    }
    __syncthreads();
    if (j < L) tc[j] = v;
}

__global__ void snake_kernel(const float* x, int C, int T, SnakeParams snake, float* y) {
    pdl_wait();
    pdl_trigger();
    const long long total = (long long)C * T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = int(i / T);
        y[i] = snake_eval(x[i], snake.alpha[c], snake.inv_beta[c]);
    }
}

// planes [3, C, T] = the bf16 hi, lo, hi planes of snake(x) (x when snake.alpha is null).
__global__ void split_planes_kernel(const float* x, int C, int T, SnakeParams snake, ColumnSink out) {
    pdl_wait();
    pdl_trigger();
    const long long total = (long long)C * T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float v = x[i];
        if (snake.alpha) {
            const int c = int(i / T);
            v = snake_eval(v, snake.alpha[c], snake.inv_beta[c]);
        }
        out.put(size_t(i), v);
    }
}

// Sum of the transposed-conv contributions to output sample m of channel co.
// cols: this stream's first column; ld: the row length of cols (S·T).
__device__ __forceinline__ float overlap_sum(const float* cols, int co, int K, int stride, int T, int ld, int m) {
    float sum = 0.0f;
    const int t_hi = min(m / stride, T - 1);
    for (int t = t_hi; t >= 0; --t) {
        const int k = m - t * stride;
        if (k >= K) break;
        sum += cols[(size_t(co) * K + k) * ld + t];
    }
    return sum;
}

// grid.y: the stream. A thread takes one input column t of one output channel and writes the
// stride outputs m = t·stride + r it starts; the contributions to m come from columns t, t - 1,
// ... (taps r, r + stride, ...), summed in that order (as overlap_sum does). Lanes of a warp take
// consecutive columns, so every read of `cols` is one coalesced row segment and each value is
// read once.
__global__ void trans_conv_overlap_add_kernel(const float* cols, int Cout, int K, int stride, int T, const float* bias,
                                              DecoderStates states, size_t overlap_at, float* y) {
    pdl_wait();
    pdl_trigger();
    const int b = blockIdx.y;
    const int O = K - stride, emit = T * stride, ld = states.count * T, y_ld = states.count * emit;
    const float* cols_b = cols + size_t(b) * T;
    float* overlap = O > 0 ? state_at<float>(states, b, overlap_at) : nullptr;
    const long long total = (long long)Cout * T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int co = int(i / T), t = int(i - (long long)co * T);
        const float* taps = cols_b + size_t(co) * K * ld;  // row co·K + k at taps + k·ld
        float* yrow = y + size_t(co) * y_ld + size_t(b) * emit;
        for (int r = 0; r < stride; ++r) {
            const int m = t * stride + r;
            float v = 0.0f;
            for (int j = 0, k = r; k < K && t - j >= 0; ++j, k += stride) v += taps[size_t(k) * ld + (t - j)];
            if (m < O) {
                // This thread owns overlap[co][m]: read the old spill-over, then store the new one
                // (output emit + m of this chunk, which exists since O <= emit).
                float* o = overlap + size_t(co) * O + m;
                v += *o;
                *o = overlap_sum(cols_b, co, K, stride, T, ld, emit + m);
            }
            yrow[m] = v + bias[co];
        }
    }
}

__global__ void depthwise_conv_kernel(const float* tail, int L, const float* x, int C, int T, int K, int dilation,
                                      const float* w, const float* b, float* y) {
    pdl_wait();
    pdl_trigger();
    const long long total = (long long)C * T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = int(i / T), t = int(i - (long long)c * T);
        float sum = 0.0f;
        for (int k = 0; k < K; ++k) {
            const int s = t + k * dilation;
            const float v = s < L ? tail[size_t(c) * L + s] : x[size_t(c) * T + (s - L)];
            sum += w[size_t(c) * K + k] * v;
        }
        y[i] = sum + (b ? b[c] : 0.0f);
    }
}

// One block per time column.
__global__ void layer_norm_channels_kernel(const float* x, int C, int T, const float* w, const float* b, float eps,
                                           float* y, int rows) {
    __shared__ float shared[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) s += x[size_t(c) * T + t];
    const float mean = block_reduce_sum(s, shared) / float(C);
    float v = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float d = x[size_t(c) * T + t] - mean;
        v += d * d;
    }
    const float var = block_reduce_sum(v, shared) / float(C);
    const float inv = 1.0f / sqrtf(var + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        y[size_t(c) * T + t] = (x[size_t(c) * T + t] - mean) * inv * w[c] + b[c];
    for (int r = C + int(threadIdx.x); r < rows; r += blockDim.x) y[size_t(r) * T + t] = r == C ? 1.0f : 0.0f;
}

__global__ void gelu_ones_kernel(float* h, int R, int T, int rows) {
    pdl_wait();
    pdl_trigger();
    const long long body = (long long)R * T, ones = body + T, total = (long long)rows * T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        h[i] = i < body ? gelu_erf_ref(h[i]) : i < ones ? 1.0f : 0.0f;
}

__global__ void scaled_add_channels_kernel(float* x, const float* y, const float* gamma, int C, int T) {
    pdl_wait();
    pdl_trigger();
    const long long total = (long long)C * T;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        x[i] += y[i] * gamma[i / T];
}

__global__ void bias_add_kernel(float* y, int rows, int cols, const float* bias, bool per_row) {
    pdl_wait();
    pdl_trigger();
    const long long total = (long long)rows * cols;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        y[i] += per_row ? bias[i / cols] : bias[i % cols];
}

__global__ void rms_norm_rows_kernel(const float* x, int C, const float* w, float eps, float* y) {
    __shared__ float shared[32];
    pdl_wait();
    pdl_trigger();
    const float* xr = x + size_t(blockIdx.x) * C;
    float* yr = y + size_t(blockIdx.x) * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_reduce_sum(ss, shared);
    const float inv = 1.0f / sqrtf(ss / float(C) + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = (xr[c] * inv) * w[c];
}

// rope_kv_store: threads per block, and blocks per row at most (grid.z).
constexpr int ROPE_THREADS = 128;
constexpr int ROPE_MAX_SLICES = 64;
// A row's work items: one per rotated pair of its q and k heads, then one per value copied.
__host__ __device__ constexpr int rope_kv_items(int heads, int kv_heads, int head_dim) {
    return (heads + kv_heads) * (head_dim / 2) + kv_heads * head_dim;
}

// grid (n, S, slices): row t of stream b.
__global__ void rope_kv_store_kernel(float* qkv, int heads, int kv_heads, int head_dim, const float* inv_freq,
                                     DecoderStates states, size_t k_at, size_t v_at, int ring) {
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, b = blockIdx.y, half = head_dim / 2;
    const int qd = heads * head_dim, kvd = kv_heads * head_dim, stride = qd + 2 * kvd;
    const int64_t p = *state_at<int64_t>(states, b, DECODER_STATE_POSITION_AT) + t;
    const int slot = int(p % ring);
    float* k_ring = state_at<float>(states, b, k_at);
    float* v_ring = state_at<float>(states, b, v_at);
    float* row = qkv + (size_t(b) * gridDim.x + t) * stride;
    const int rotations = (heads + kv_heads) * half;
    // grid.z blocks (up to ROPE_MAX_SLICES) share the row's rotations and value copies, about one
    // per thread, so that their loads are not one chain of dependent round trips.
    const int items = rope_kv_items(heads, kv_heads, head_dim);  // rotations, then kvd value copies
    for (int idx = blockIdx.z * blockDim.x + threadIdx.x; idx < items; idx += gridDim.z * blockDim.x) {
        if (idx < rotations) {
            const int hh = idx / half, i = idx - hh * half;
            float* v = row + size_t(hh) * head_dim;  // q heads, then k heads
            const float angle = inv_freq[i] * float(p);
            const float c = cosf(angle), s = sinf(angle);
            const float a = v[i], b = v[i + half];
            const float ra = a * c - b * s, rb = b * c + a * s;
            v[i] = ra;
            v[i + half] = rb;
            if (hh >= heads) {
                float* k = k_ring + size_t(slot) * kvd + size_t(hh - heads) * head_dim;
                k[i] = ra;
                k[i + half] = rb;
            }
        } else {
            const int j = idx - rotations;
            v_ring[size_t(slot) * kvd + j] = row[qd + kvd + j];
        }
    }
}

// The keys query row t sees: positions first .. p (p = pos0 + t), at most `window` of them.
struct WindowSpan {
    int64_t first;
    int count;
};
__device__ __forceinline__ WindowSpan window_span(int64_t pos0, int t, int window) {
    const int64_t p = pos0 + t;
    const int64_t first = p - window + 1 > 0 ? p - window + 1 : 0;
    return {first, int(p - first + 1)};
}

// scores[0..count) -> exp(score - max) in place; returns 1 / their sum. Block-wide (every thread
// calls it); the final reduction also orders the score writes before they are read.
__device__ __forceinline__ float window_softmax_unnormalised(float* scores, int count, float local_max, float* shared) {
    const float max_s = block_reduce_max(local_max, shared);
    float local_sum = 0.0f;
    for (int j = threadIdx.x; j < count; j += blockDim.x) {
        const float e = expf(scores[j] - max_s);
        scores[j] = e;
        local_sum += e;
    }
    return 1.0f / block_reduce_sum(local_sum, shared);
}

// One block per (query row, head).
// grid (n, heads, S).
__global__ void window_attention_kernel(const float* qkv, int heads, int kv_heads, int head_dim, DecoderStates states,
                                        size_t k_at, size_t v_at, int ring, int window, float* out) {
    __shared__ float scores[MAX_WINDOW];
    __shared__ float shared[32];
    pdl_wait();
    pdl_trigger();
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int qd = heads * head_dim, kvd = kv_heads * head_dim, stride = qd + 2 * kvd;
    const int kvh = h / (heads / kv_heads);
    const float* k_ring = state_at<const float>(states, b, k_at);
    const float* v_ring = state_at<const float>(states, b, v_at);
    const size_t row_index = size_t(b) * gridDim.x + t;
    const WindowSpan span = window_span(*state_at<const int64_t>(states, b, DECODER_STATE_POSITION_AT), t, window);
    const int64_t first = span.first;
    const int count = span.count;
    const float scale = 1.0f / sqrtf(float(head_dim));
    const float* q = qkv + row_index * stride + size_t(h) * head_dim;
    float local_max = -INFINITY;
    for (int j = threadIdx.x; j < count; j += blockDim.x) {
        const int slot = int((first + j) % ring);
        const float* k = k_ring + size_t(slot) * kvd + size_t(kvh) * head_dim;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q[d] * k[d];
        scores[j] = dot * scale;
        local_max = fmaxf(local_max, scores[j]);
    }
    const float inv = window_softmax_unnormalised(scores, count, local_max, shared);
    float* o = out + row_index * qd + size_t(h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < count; ++j) {
            const int slot = int((first + j) % ring);
            acc += scores[j] * v_ring[size_t(slot) * kvd + size_t(kvh) * head_dim + d];
        }
        o[d] = acc * inv;
    }
}

// Same as window_attention_kernel for a group of G consecutive query rows of one stream and head
// (grid (groups, heads, S)): the keys and values any of them sees (window - 1 + G rows at most)
// are staged in shared memory once (coalesced loads, all in flight at once), then each warp
// takes one query row at a time: a lane scores keys lane, lane + 32, ...; warp reductions make
// the softmax; a lane sums the values of dimensions lane, lane + 32, ... Staged rows are padded
// to head_dim + 1 floats so that lanes reading different keys at one dimension hit different banks.
constexpr int GROUP_ATTENTION_SMEM_FLOATS = 12288;  // 48 KB
constexpr int GROUP_ATTENTION_WARPS = 4;
constexpr int GROUP_ATTENTION_MAX_ROWS = 8;  // G: up to two query rows per warp

__host__ __device__ inline int group_attention_floats(int window, int head_dim, int group) {
    const int rows = window - 1 + group;
    return 2 * rows * (head_dim + 1) + GROUP_ATTENTION_WARPS * (head_dim + rows);
}

__global__ void __launch_bounds__(GROUP_ATTENTION_WARPS * 32)
    window_attention_group_kernel(const float* qkv, int n, int group, int heads, int kv_heads, int head_dim,
                                  DecoderStates states, size_t k_at, size_t v_at, int ring, int window, float* out) {
    extern __shared__ float smem[];
    pdl_wait();
    pdl_trigger();
    const int h = blockIdx.y, b = blockIdx.z, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = blockIdx.x * group, here = min(group, n - t0);
    const int qd = heads * head_dim, kvd = kv_heads * head_dim, stride = qd + 2 * kvd;
    const int kvh = h / (heads / kv_heads), row = head_dim + 1, max_rows = window - 1 + group;
    const float* k_ring = state_at<const float>(states, b, k_at);
    const float* v_ring = state_at<const float>(states, b, v_at);
    const int64_t pos0 = *state_at<const int64_t>(states, b, DECODER_STATE_POSITION_AT);
    // Keys of the group: from the first query's window start to the last query's position.
    const int64_t first = window_span(pos0, t0, window).first;
    const int rows = int(pos0 + t0 + here - first);
    float* ks = smem;                                  // [max_rows, row]
    float* vs = ks + max_rows * row;                   // [max_rows, row]
    float* qs = vs + max_rows * row + warp * head_dim;  // this warp's query [head_dim]
    float* probs = smem + 2 * max_rows * row + GROUP_ATTENTION_WARPS * head_dim + warp * max_rows;  // [max_rows]
    // rows <= ring (the host checks ring >= window - 1 + n), so a row's slot wraps at most once.
    const int first_slot = int(first % ring);
    auto slot_of = [&](int j) { return first_slot + j < ring ? first_slot + j : first_slot + j - ring; };
    if ((head_dim & 3) == 0 && (kvd & 3) == 0) {
        // 16 bytes at a time, four rows' loads in flight per thread before their stores: the copy
        // waits for L2 latency, not bandwidth (a scalar copy with a 64-bit modulo per value took
        // most of a 28 µs launch at 10 streams x 4 frames).
        const int vec = head_dim / 4;
#pragma unroll 4
        for (int idx = threadIdx.x; idx < rows * vec; idx += blockDim.x) {
            const int j = idx / vec, d = (idx - j * vec) * 4;
            const size_t src = size_t(slot_of(j)) * kvd + size_t(kvh) * head_dim + d;
            const float4 kv = *reinterpret_cast<const float4*>(k_ring + src);
            const float4 vv = *reinterpret_cast<const float4*>(v_ring + src);
            float* kd = ks + j * row + d;
            float* vd = vs + j * row + d;
            kd[0] = kv.x;
            kd[1] = kv.y;
            kd[2] = kv.z;
            kd[3] = kv.w;
            vd[0] = vv.x;
            vd[1] = vv.y;
            vd[2] = vv.z;
            vd[3] = vv.w;
        }
    } else {
        for (int idx = threadIdx.x; idx < rows * head_dim; idx += blockDim.x) {
            const int j = idx / head_dim, d = idx - j * head_dim;
            const size_t src = size_t(slot_of(j)) * kvd + size_t(kvh) * head_dim + d;
            ks[j * row + d] = k_ring[src];
            vs[j * row + d] = v_ring[src];
        }
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf(float(head_dim));
    for (int qi = warp; qi < here; qi += GROUP_ATTENTION_WARPS) {
        const int t = t0 + qi;
        const size_t row_index = size_t(b) * n + t;
        const WindowSpan span = window_span(pos0, t, window);
        const int off = int(span.first - first), count = span.count;
        const float* q = qkv + row_index * stride + size_t(h) * head_dim;
        for (int d = lane; d < head_dim; d += 32) qs[d] = q[d];
        __syncwarp();
        float local_max = -INFINITY;
        for (int j = lane; j < count; j += 32) {
            const float* k = ks + (off + j) * row;
            float dot = 0.0f;
            for (int d = 0; d < head_dim; ++d) dot += qs[d] * k[d];
            probs[j] = dot * scale;
            local_max = fmaxf(local_max, probs[j]);
        }
        const float max_s = warp_max(local_max);
        float local_sum = 0.0f;
        for (int j = lane; j < count; j += 32) {
            const float e = expf(probs[j] - max_s);
            probs[j] = e;
            local_sum += e;
        }
        const float inv = 1.0f / warp_sum(local_sum);
        __syncwarp();  // every lane's probabilities written before any lane reads them
        float* o = out + row_index * qd + size_t(h) * head_dim;
        for (int d = lane; d < head_dim; d += 32) {
            float acc = 0.0f;
            for (int j = 0; j < count; ++j) acc += probs[j] * vs[(off + j) * row + d];
            o[d] = acc * inv;
        }
        __syncwarp();  // qs and probs are rewritten by the next row
    }
}

__global__ void scaled_residual_rows_kernel(float* h, const float* y, const float* scale, int n, int D) {
    pdl_wait();
    pdl_trigger();
    const long long total = (long long)n * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        h[i] += scale[i % D] * y[i];
}

__global__ void swiglu_rows_kernel(const float* gu, int n, int I, float* out) {
    pdl_wait();
    pdl_trigger();
    const long long total = (long long)n * I;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / I, j = i - t * I;
        const float* row = gu + t * 2 * I;
        out[i] = silu_ref(row[j]) * row[I + j];
    }
}

__global__ void clamp_unit_kernel(float* y, int count) {
    pdl_wait();
    pdl_trigger();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x)
        y[i] = fminf(1.0f, fmaxf(-1.0f, y[i]));
}

__global__ void position_advance_kernel(DecoderStates states, int n) {
    pdl_wait();
    pdl_trigger();
    for (int b = threadIdx.x; b < states.count; b += blockDim.x) {
        *state_at<int64_t>(states, b, DECODER_STATE_POSITION_AT) += n;
        *state_at<int64_t>(states, b, DECODER_STATE_CHUNK_AT) += 1;
    }
}

// Value of column s of [tail | act(x)] for channel c (s < L + T); x is this stream's first
// column, ld the row length of the signal (S·T).
__device__ __forceinline__ float carried_input(const float* tail, int L, const float* x, int ld, int c, int s,
                                               SnakeParams snake) {
    if (s < L) return tail[size_t(c) * L + s];
    float v = x[size_t(c) * ld + (s - L)];
    if (snake.alpha) v = snake_eval(v, snake.alpha[c], snake.inv_beta[c]);
    return v;
}

// The tail slots of stream b: {read, write}.
struct TailSlots {
    const float* tail;
    float* next;
};
__device__ __forceinline__ TailSlots tail_slots(const DecoderStates& states, int b, size_t tails_at, int C, int L) {
    const int slot = int(*state_at<const int64_t>(states, b, DECODER_STATE_CHUNK_AT) & 1);
    float* tails = state_at<float>(states, b, tails_at);
    return {tails + size_t(slot) * C * L, tails + size_t(1 - slot) * C * L};
}

constexpr int IM2COL_THREADS = 128;

// im2col of one stream (grid.y; a single signal without `carry`): a block takes one input channel
// (or, as channel C, the ones row and the zero padding rows) and IM2COL_THREADS·V output columns
// (V per thread, im2col_columns_per_thread: 8 or 4 consecutive columns stored 16 or 8 bytes at a
// time, else 1), stages the window [tail | snake(x)] those columns read once in shared memory
// (each input value is activated once, not once per tap) and writes the channel's K rows from it. With `carry` the
// block holding the stream's last columns also writes the next tail (the window's last L values)
// into the other slot. x: this stream's columns at stride ld (S·T, or T alone).
template <bool CARRY, int V>
__global__ void __launch_bounds__(IM2COL_THREADS)
    conv_im2col_tiled_kernel(DecoderStates states, size_t tails_at, const float* plain_tail, int L, const float* x,
                             int C, int T, int K, int dilation, SnakeParams snake, ColumnSink col, int col_rows) {
    constexpr int TILE = IM2COL_THREADS * V;
    extern __shared__ float window[];  // [TILE + L]
    pdl_wait();
    pdl_trigger();
    const int tiles = (T + TILE - 1) / TILE;
    const int c = blockIdx.x / tiles, tile = blockIdx.x - c * tiles;
    const int t0 = tile * TILE, here = min(TILE, T - t0), j = int(threadIdx.x) * V;  // here: a multiple of V
    const int b = CARRY ? int(blockIdx.y) : 0, ld = CARRY ? states.count * T : T;
    const size_t first = size_t(b) * T + t0;  // this block's first output column
    auto row_put = [&](int r, const float* v) {
        const size_t at = size_t(r) * ld + first + j;
        if constexpr (V == 8)
            col.put8(at, v);
        else if constexpr (V == 4)
            col.put4(at, make_float4(v[0], v[1], v[2], v[3]));
        else
            col.put(at, v[0]);
    };
    if (c == C) {  // the bias row of ones, then the padding rows of zeros
        float one[V], zero[V];
        for (int q = 0; q < V; ++q) {
            one[q] = 1.0f;
            zero[q] = 0.0f;
        }
        if (j < here)
            for (int r = C * K; r < col_rows; ++r) row_put(r, r == C * K ? one : zero);
        return;
    }
    TailSlots slots{plain_tail, nullptr};
    if (CARRY) slots = tail_slots(states, b, tails_at, C, L);
    const float* xb = x + size_t(b) * T;
    for (int i = threadIdx.x; i < here + L; i += IM2COL_THREADS)
        window[i] = carried_input(slots.tail, L, xb, ld, c, t0 + i, snake);
    __syncthreads();
    if (j < here)
        for (int k = 0; k < K; ++k) {
            float v[V];
            for (int q = 0; q < V; ++q) v[q] = window[j + q + k * dilation];
            row_put(c * K + k, v);
        }
    if (CARRY && tile == tiles - 1)  // the window ends at column T + L of [tail | x]: the next tail
        for (int i = threadIdx.x; i < L; i += IM2COL_THREADS) slots.next[size_t(c) * L + i] = window[here + i];
}

// Columns per thread of the im2col: 8 (16-byte bf16 stores) for long signals whose length is a
// multiple of 8, 4 for other multiples of 4, else 1.
constexpr int IM2COL_WIDE_MIN_COLUMNS = 2048;
int im2col_columns_per_thread(int T) {
    return T % 8 == 0 && T >= IM2COL_WIDE_MIN_COLUMNS ? 8 : T % 4 == 0 ? 4 : 1;
}

template <bool CARRY>
cudaError_t im2col_dispatch(const Launch& l, dim3 grid, int V, size_t smem, DecoderStates states, size_t tails_at,
                            const float* tail, int L, const float* x, int C, int T, int K, int dilation,
                            SnakeParams snake, ColumnSink col, int col_rows) {
    const dim3 block(IM2COL_THREADS);
    if (V == 8)
        return launch_kernel(l, grid, block, smem, conv_im2col_tiled_kernel<CARRY, 8>, states, tails_at, tail, L, x, C,
                             T, K, dilation, snake, col, col_rows);
    if (V == 4)
        return launch_kernel(l, grid, block, smem, conv_im2col_tiled_kernel<CARRY, 4>, states, tails_at, tail, L, x, C,
                             T, K, dilation, snake, col, col_rows);
    return launch_kernel(l, grid, block, smem, conv_im2col_tiled_kernel<CARRY, 1>, states, tails_at, tail, L, x, C, T,
                         K, dilation, snake, col, col_rows);
}

// grid.y: the stream.
__global__ void depthwise_conv_carry_kernel(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T,
                                            int K, int dilation, const float* w, const float* b, float* y) {
    pdl_wait();
    pdl_trigger();
    const int s = blockIdx.y, ld = states.count * T;
    const TailSlots slots = tail_slots(states, s, tails_at, C, L);
    const float* xs = x + size_t(s) * T;
    const long long body = (long long)C * T, total = body + (long long)C * L;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        if (i < body) {
            const int c = int(i / T), t = int(i - (long long)c * T);
            float sum = 0.0f;
            for (int k = 0; k < K; ++k)
                sum += w[size_t(c) * K + k] * carried_input(slots.tail, L, xs, ld, c, t + k * dilation, {});
            y[size_t(c) * ld + size_t(s) * T + t] = sum + (b ? b[c] : 0.0f);
        } else {
            const long long j = i - body;
            const int c = int(j / L), jj = int(j - (long long)c * L);
            slots.next[j] = carried_input(slots.tail, L, xs, ld, c, T + jj, {});
        }
    }
}

constexpr int CONV_OUT_TILE = 64;         // output samples per block
constexpr int CONV_OUT_SMEM_FLOATS = 12288;  // 48 KB
constexpr int CONV_OUT_RUN = 4;           // consecutive output samples per thread
constexpr int CONV_OUT_SPLIT = 16;        // threads per run of outputs (channel split; consecutive lanes)
constexpr int CONV_OUT_THREADS = CONV_OUT_TILE / CONV_OUT_RUN * CONV_OUT_SPLIT;
constexpr int CONV_OUT_LOADS = 8;         // staged values a thread loads before storing them

// Block: CONV_OUT_TILE outputs; stage snake([tail | x]) for every channel over the tile's
// input window in shared memory, then CONV_OUT_SPLIT threads per run of CONV_OUT_RUN outputs
// split the channels: each weight is read once for the run's outputs, whose sums are
// independent (one output per thread, 4 threads a sample, ran a serial chain of loads and
// FMAs: 326 us for a 64 x 4 pass).
__global__ void __launch_bounds__(CONV_OUT_THREADS)
    conv_out_carry_kernel(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                          int dilation, SnakeParams snake, const float* w, float* y) {
    extern __shared__ float window[];  // [C, CONV_OUT_TILE + L]
    pdl_wait();
    pdl_trigger();
    const int b = blockIdx.y, ld = states.count * T;  // grid.y: the stream
    const TailSlots slots = tail_slots(states, b, tails_at, C, L);
    const float* xb = x + size_t(b) * T;
    const int t0 = blockIdx.x * CONV_OUT_TILE;
    const int width = CONV_OUT_TILE + L, n = C * width;
    // CONV_OUT_LOADS reads in flight per thread before their stores.
    for (int base = threadIdx.x; base < n; base += CONV_OUT_LOADS * blockDim.x) {
        float v[CONV_OUT_LOADS];
#pragma unroll
        for (int u = 0; u < CONV_OUT_LOADS; ++u) {
            const int idx = base + u * int(blockDim.x);
            const int c = idx / width, s = t0 + (idx - c * width);
            v[u] = idx < n && s < L + T ? carried_input(slots.tail, L, xb, ld, c, s, snake) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < CONV_OUT_LOADS; ++u) {
            const int idx = base + u * int(blockDim.x);
            if (idx < n) window[idx] = v[u];
        }
    }
    if (blockIdx.x == gridDim.x - 1) {
        for (int j = threadIdx.x; j < C * L; j += blockDim.x) {
            const int c = j / L, jj = j - c * L;
            slots.next[j] = carried_input(slots.tail, L, xb, ld, c, T + jj, snake);
        }
    }
    __syncthreads();
    const int run = threadIdx.x / CONV_OUT_SPLIT, part = threadIdx.x % CONV_OUT_SPLIT;
    const int local0 = run * CONV_OUT_RUN;
    float acc[CONV_OUT_RUN];
#pragma unroll
    for (int o = 0; o < CONV_OUT_RUN; ++o) acc[o] = 0.0f;
    for (int c = part; c < C; c += CONV_OUT_SPLIT) {
        const float* wc = w + size_t(c) * K;
        const float* xc = window + c * width + local0;
        for (int k = 0; k < K; ++k) {
            const float wk = wc[k];
            const float* xk = xc + k * dilation;
#pragma unroll
            for (int o = 0; o < CONV_OUT_RUN; ++o) acc[o] = fmaf(wk, xk[o], acc[o]);
        }
    }
#pragma unroll
    for (int o = 0; o < CONV_OUT_RUN; ++o) {
#pragma unroll
        for (int off = CONV_OUT_SPLIT / 2; off > 0; off >>= 1) acc[o] += __shfl_xor_sync(0xffffffffu, acc[o], off);
        const int t = t0 + local0 + o;
        if (part == o && t < T) y[size_t(b) * T + t] = fminf(1.0f, fmaxf(-1.0f, acc[o] + w[size_t(C) * K]));
    }
}

constexpr int SMALL_LINEAR_WARPS = 4;
constexpr int SMALL_LINEAR_SMEM_FLOATS = 12288;

__global__ void __launch_bounds__(SMALL_LINEAR_WARPS * 32)
    small_linear_kernel(const float* x, int n, int in, bool x_channel_major, const float* norm_w, float eps,
                        const float* W, int out, const float* bias, SmallLinearEpilogue epilogue, const float* scale,
                        float* y, bool y_channel_major) {
    extern __shared__ float xs[];  // [n, in]
    __shared__ float inv_rms[SMALL_LINEAR_MAX_ROWS];
    pdl_wait();
    pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int idx = threadIdx.x; idx < n * in; idx += blockDim.x) {
        const int t = idx / in, i = idx - t * in;
        xs[idx] = x_channel_major ? x[size_t(i) * n + t] : x[idx];
    }
    __syncthreads();
    if (norm_w) {
        for (int t = warp; t < n; t += SMALL_LINEAR_WARPS) {
            float ss = 0.0f;
            for (int i = lane; i < in; i += 32) ss += xs[t * in + i] * xs[t * in + i];
            ss = warp_sum(ss);
            if (lane == 0) inv_rms[t] = 1.0f / sqrtf(ss / float(in) + eps);
        }
        __syncthreads();
        for (int idx = threadIdx.x; idx < n * in; idx += blockDim.x) {
            const int t = idx / in, i = idx - t * in;
            xs[idx] = (xs[idx] * inv_rms[t]) * norm_w[i];
        }
        __syncthreads();
    }
    const int o = blockIdx.x * SMALL_LINEAR_WARPS + warp;
    if (o >= out) return;
    const bool swiglu = epilogue == SmallLinearEpilogue::SMALL_LINEAR_SWIGLU;
    const float4* w_row = reinterpret_cast<const float4*>(W + size_t(o) * in);
    const float4* u_row = reinterpret_cast<const float4*>(W + size_t(out + o) * in);
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    const int in4 = in / 4;
    float acc[SMALL_LINEAR_MAX_ROWS], acc_up[SMALL_LINEAR_MAX_ROWS];
#pragma unroll
    for (int t = 0; t < SMALL_LINEAR_MAX_ROWS; ++t) acc[t] = acc_up[t] = 0.0f;
    for (int i = lane; i < in4; i += 32) {
        const float4 wv = __ldg(w_row + i);
        float4 uv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (swiglu) uv = __ldg(u_row + i);
#pragma unroll
        for (int t = 0; t < SMALL_LINEAR_MAX_ROWS; ++t) {
            if (t < n) {
                const float4 xv = x4[t * in4 + i];
                acc[t] = fmaf(wv.x, xv.x, fmaf(wv.y, xv.y, fmaf(wv.z, xv.z, fmaf(wv.w, xv.w, acc[t]))));
                if (swiglu)
                    acc_up[t] = fmaf(uv.x, xv.x, fmaf(uv.y, xv.y, fmaf(uv.z, xv.z, fmaf(uv.w, xv.w, acc_up[t]))));
            }
        }
    }
#pragma unroll
    for (int t = 0; t < SMALL_LINEAR_MAX_ROWS; ++t) {
        if (t < n) {
            const float a = warp_sum(acc[t]);
            const float u = swiglu ? warp_sum(acc_up[t]) : 0.0f;
            if (lane == 0) {
                float* dst = y_channel_major ? y + size_t(o) * n + t : y + size_t(t) * out + o;
                switch (epilogue) {
                    case SmallLinearEpilogue::SMALL_LINEAR_STORE: *dst = a + (bias ? bias[o] : 0.0f); break;
                    case SmallLinearEpilogue::SMALL_LINEAR_SCALED_ADD: *dst += scale[o] * a; break;
                    case SmallLinearEpilogue::SMALL_LINEAR_SWIGLU: *dst = silu_ref(a) * u; break;
                }
            }
        }
    }
}

}  // namespace

void rvq_gather(const int32_t* codes, int n, int nq, const float* codebooks, int size, int half, float* g,
                const Launch& l) {
    if (n <= 0 || nq < 1 || half <= 0 || !codes || !codebooks || !g) bad_args("rvq_gather", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(n), dim3(std::min(THREADS, ((half + 31) / 32) * 32)), 0, rvq_gather_kernel, codes,
                             nq, codebooks, size, half, g));
}

namespace {

void im2col_launch(const float* tail, int L, const float* x, int C, int T, int K, int dilation, SnakeParams snake,
                   ColumnSink col, const Launch& l, int col_rows, const char* what) {
    if (col_rows == 0) col_rows = C * K + 1;
    if (T <= 0 || C <= 0 || K <= 0 || L < 0 || L > MAX_TAIL || L != (K - 1) * dilation || (L > 0 && !tail) || !x ||
        !(col.col || col.planes) || col_rows < C * K + 1)
        bad_args(what, __func__);
    const int V = im2col_columns_per_thread(T), tile = IM2COL_THREADS * V;
    const long long blocks = (long long)(C + 1) * ((T + tile - 1) / tile);
    if (blocks > 0x7fffffffLL) bad_args(what, __func__);
    const size_t smem = size_t(tile + L) * sizeof(float);
    KERNEL_CUDA_CHECK(im2col_dispatch<false>(l, dim3(unsigned(blocks)), V, smem, DecoderStates{}, size_t(0), tail, L, x,
                                             C, T, K, dilation, snake, col, col_rows));
}

}  // namespace

void conv_im2col(const float* tail, int L, const float* x, int C, int T, int K, int dilation, SnakeParams snake,
                 float* col, const Launch& l, int col_rows) {
    im2col_launch(tail, L, x, C, T, K, dilation, snake, ColumnSink{col, nullptr, 0}, l, col_rows, "conv_im2col");
}

void conv_im2col_split(const float* tail, int L, const float* x, int C, int T, int K, int dilation,
                       SnakeParams snake, bf16_t* planes, const Launch& l, int col_rows) {
    const size_t plane = size_t(col_rows == 0 ? C * K + 1 : col_rows) * size_t(T > 0 ? T : 0);
    im2col_launch(tail, L, x, C, T, K, dilation, snake, ColumnSink{nullptr, planes, plane}, l, col_rows,
                  "conv_im2col_split");
}

void split_planes(const float* x, int C, int T, SnakeParams snake, bf16_t* planes, const Launch& l) {
    if (C <= 0 || T <= 0 || !x || !planes || (snake.alpha && !snake.inv_beta)) bad_args("split_planes", __func__);
    const size_t plane = size_t(C) * T;
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for((long long)C * T)), dim3(THREADS), 0, split_planes_kernel, x, C, T,
                                    snake, ColumnSink{nullptr, planes, plane}));
}

void conv_tail_update(float* tail, int L, const float* x, int C, int T, SnakeParams snake, const Launch& l) {
    if (L == 0) return;
    if (L < 0 || L > MAX_TAIL || T <= 0 || C <= 0 || !tail || !x) bad_args("conv_tail_update", __func__);
    const int threads = ((L + 31) / 32) * 32;
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(C), dim3(threads), 0, conv_tail_update_kernel, tail, L, x, T, snake));
}

void snake_apply(const float* x, int C, int T, SnakeParams snake, float* y, const Launch& l) {
    if (C <= 0 || T <= 0 || !x || !y || !snake.alpha || !snake.inv_beta) bad_args("snake_apply", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for((long long)C * T)), dim3(THREADS), 0, snake_kernel, x, C, T, snake, y));
}

void trans_conv_overlap_add(const float* cols, int Cout, int K, int stride, int T, const float* bias,
                            DecoderStates states, size_t overlap_at, float* y, const Launch& l) {
    if (Cout <= 0 || T <= 0 || stride <= 0 || K < stride || K - stride > T * stride || !cols || !bias || !y ||
        !states_ok(states) || states.count > 65535)
        bad_args("trans_conv_overlap_add", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for((long long)Cout * T), states.count), dim3(THREADS), 0,
                                    trans_conv_overlap_add_kernel, cols, Cout, K, stride, T, bias, states, overlap_at,
                                    y));
}

void depthwise_conv(const float* tail, int L, const float* x, int C, int T, int K, int dilation, const float* w,
                    const float* b, float* y, const Launch& l) {
    if (C <= 0 || T <= 0 || L != (K - 1) * dilation || !x || !w || !y || (L > 0 && !tail))
        bad_args("depthwise_conv", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for((long long)C * T)), dim3(THREADS), 0, depthwise_conv_kernel, tail, L, x,
                             C, T, K, dilation, w, b, y));
}

void layer_norm_channels(const float* x, int C, int T, const float* w, const float* b, float eps, float* y,
                         const Launch& l, int rows) {
    if (rows == 0) rows = C + 1;
    if (C <= 0 || T <= 0 || !x || !w || !b || !y || rows < C + 1) bad_args("layer_norm_channels", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(THREADS), 0, layer_norm_channels_kernel, x, C, T, w, b, eps, y, rows));
}

void gelu_ones(float* h, int R, int T, const Launch& l, int rows) {
    if (rows == 0) rows = R + 1;
    if (R <= 0 || T <= 0 || !h || rows < R + 1) bad_args("gelu_ones", __func__);
    KERNEL_CUDA_CHECK(
        launch_kernel(l, dim3(grid_for((long long)rows * T)), dim3(THREADS), 0, gelu_ones_kernel, h, R, T, rows));
}

void scaled_add_channels(float* x, const float* y, const float* gamma, int C, int T, const Launch& l) {
    if (C <= 0 || T <= 0 || !x || !y || !gamma) bad_args("scaled_add_channels", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for((long long)C * T)), dim3(THREADS), 0, scaled_add_channels_kernel, x, y,
                             gamma, C, T));
}

void bias_add(float* y, int rows, int cols, const float* bias, bool per_row, const Launch& l) {
    if (rows <= 0 || cols <= 0 || !y || !bias) bad_args("bias_add", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for((long long)rows * cols)), dim3(THREADS), 0, bias_add_kernel, y, rows,
                             cols, bias, per_row));
}

void rms_norm_rows(const float* x, int T, int C, const float* w, float eps, float* y, const Launch& l) {
    if (T <= 0 || C <= 0 || !x || !w || !y) bad_args("rms_norm_rows", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(T), dim3(THREADS), 0, rms_norm_rows_kernel, x, C, w, eps, y));
}

void rope_kv_store(float* qkv, int n, int heads, int kv_heads, int head_dim, const float* inv_freq,
                   DecoderStates states, size_t k_at, size_t v_at, int ring, const Launch& l) {
    if (n <= 0 || heads <= 0 || kv_heads <= 0 || head_dim % 2 != 0 || ring < n || !qkv || !inv_freq ||
        !states_ok(states) || states.count > 65535)
        bad_args("rope_kv_store", __func__);
    const int items = rope_kv_items(heads, kv_heads, head_dim);
    const int slices = std::min(ROPE_MAX_SLICES, (items + ROPE_THREADS - 1) / ROPE_THREADS);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(n, states.count, slices), dim3(ROPE_THREADS), 0, rope_kv_store_kernel,
                                    qkv, heads, kv_heads, head_dim, inv_freq, states, k_at, v_at, ring));
}

void window_attention(const float* qkv, int n, int heads, int kv_heads, int head_dim, DecoderStates states,
                      size_t k_at, size_t v_at, int ring, int window, float* out, const Launch& l) {
    if (n <= 0 || heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 || window < 1 || window > MAX_WINDOW ||
        ring < window - 1 + n || !qkv || !states_ok(states) || states.count > 65535 || !out)
        bad_args("window_attention", __func__);
    // The grouped kernel with the largest group (up to GROUP_ATTENTION_MAX_ROWS rows) whose keys fit
    // in 48 KB of shared memory; one block per query row and head without staging otherwise.
    for (int group = std::min(n, GROUP_ATTENTION_MAX_ROWS); group >= 1; --group) {
        const int floats = group_attention_floats(window, head_dim, group);
        if (floats > GROUP_ATTENTION_SMEM_FLOATS) continue;
        const dim3 grid((n + group - 1) / group, heads, states.count);
        KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(GROUP_ATTENTION_WARPS * 32), size_t(floats) * sizeof(float),
                                        window_attention_group_kernel, qkv, n, group, heads, kv_heads, head_dim,
                                        states, k_at, v_at, ring, window, out));
        return;
    }
    const dim3 grid(n, heads, states.count);
    KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(128), 0, window_attention_kernel, qkv, heads, kv_heads, head_dim,
                                    states, k_at, v_at, ring, window, out));
}

void scaled_residual_rows(float* h, const float* y, const float* scale, int n, int D, const Launch& l) {
    if (n <= 0 || D <= 0 || !h || !y || !scale) bad_args("scaled_residual_rows", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for((long long)n * D)), dim3(THREADS), 0, scaled_residual_rows_kernel, h, y,
                             scale, n, D));
}

void swiglu_rows(const float* gu, int n, int I, float* out, const Launch& l) {
    if (n <= 0 || I <= 0 || !gu || !out) bad_args("swiglu_rows", __func__);
    KERNEL_CUDA_CHECK(
        launch_kernel(l, dim3(grid_for((long long)n * I)), dim3(THREADS), 0, swiglu_rows_kernel, gu, n, I, out));
}

void clamp_unit(float* y, int count, const Launch& l) {
    if (count <= 0 || !y) bad_args("clamp_unit", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for(count)), dim3(THREADS), 0, clamp_unit_kernel, y, count));
}

void position_advance(DecoderStates states, int n, const Launch& l) {
    if (!states_ok(states) || n < 0) bad_args("position_advance", __func__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(1), dim3(std::min(256, (states.count + 31) / 32 * 32)), 0,
                                    position_advance_kernel, states, n));
}

namespace {

void im2col_carry_launch(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                         int dilation, SnakeParams snake, ColumnSink col, const Launch& l, int col_rows,
                         const char* what) {
    if (col_rows == 0) col_rows = C * K + 1;
    if (T <= 0 || C <= 0 || K <= 0 || L <= 0 || L > MAX_TAIL || L != (K - 1) * dilation || !states_ok(states) ||
        states.count > 65535 || !x || !(col.col || col.planes) || col_rows < C * K + 1)
        bad_args(what, __func__);
    const int V = im2col_columns_per_thread(T), tile = IM2COL_THREADS * V;
    const long long blocks = (long long)(C + 1) * ((T + tile - 1) / tile);
    if (blocks > 0x7fffffffLL) bad_args(what, __func__);
    const dim3 grid(unsigned(blocks), unsigned(states.count));
    const size_t smem = size_t(tile + L) * sizeof(float);
    KERNEL_CUDA_CHECK(im2col_dispatch<true>(l, grid, V, smem, states, tails_at, nullptr, L, x, C, T, K, dilation, snake,
                                            col, col_rows));
}

}  // namespace

void conv_im2col_carry(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                       int dilation, SnakeParams snake, float* col, const Launch& l, int col_rows) {
    im2col_carry_launch(states, tails_at, L, x, C, T, K, dilation, snake, ColumnSink{col, nullptr, 0}, l, col_rows,
                        "conv_im2col_carry");
}

void conv_im2col_carry_split(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                             int dilation, SnakeParams snake, bf16_t* planes, const Launch& l, int col_rows) {
    const size_t plane = size_t(col_rows == 0 ? C * K + 1 : col_rows) * size_t(T > 0 ? T : 0) * size_t(states.count);
    im2col_carry_launch(states, tails_at, L, x, C, T, K, dilation, snake, ColumnSink{nullptr, planes, plane}, l,
                        col_rows, "conv_im2col_carry_split");
}

void depthwise_conv_carry(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K,
                          int dilation, const float* w, const float* b, float* y, const Launch& l) {
    if (C <= 0 || T <= 0 || L <= 0 || L != (K - 1) * dilation || !x || !w || !y || !states_ok(states) ||
        states.count > 65535)
        bad_args("depthwise_conv_carry", __func__);
    const long long total = (long long)C * T + (long long)C * L;
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(grid_for(total), states.count), dim3(THREADS), 0,
                                    depthwise_conv_carry_kernel, states, tails_at, L, x, C, T, K, dilation, w, b, y));
}

bool conv_out_direct_fits(int C, int L) { return (long long)C * (CONV_OUT_TILE + L) <= CONV_OUT_SMEM_FLOATS; }

void conv_out_carry(DecoderStates states, size_t tails_at, int L, const float* x, int C, int T, int K, int dilation,
                    SnakeParams snake, const float* w, float* y, const Launch& l) {
    if (C <= 0 || T <= 0 || L <= 0 || L != (K - 1) * dilation || !conv_out_direct_fits(C, L) || !x || !w || !y ||
        !states_ok(states) || states.count > 65535)
        bad_args("conv_out_carry", __func__);
    const int blocks = (T + CONV_OUT_TILE - 1) / CONV_OUT_TILE;
    const size_t smem = size_t(C) * (CONV_OUT_TILE + L) * sizeof(float);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(blocks, states.count), dim3(CONV_OUT_THREADS), smem,
                                    conv_out_carry_kernel, states, tails_at, L, x, C, T, K, dilation, snake, w, y));
}

bool small_linear_fits(int n, int in) {
    return n >= 1 && n <= SMALL_LINEAR_MAX_ROWS && in % 4 == 0 && (long long)n * in <= SMALL_LINEAR_SMEM_FLOATS;
}

void small_linear(const float* x, int n, int in, bool x_channel_major, const float* norm_w, float eps, const float* W,
                  int out, const float* bias, SmallLinearEpilogue epilogue, const float* scale, float* y,
                  bool y_channel_major, const Launch& l) {
    if (!small_linear_fits(n, in) || out <= 0 || !x || !W || !y ||
        (epilogue == SmallLinearEpilogue::SMALL_LINEAR_SCALED_ADD && !scale) ||
        (reinterpret_cast<uintptr_t>(W) & 15) != 0)
        bad_args("small_linear", __func__);
    const int blocks = (out + SMALL_LINEAR_WARPS - 1) / SMALL_LINEAR_WARPS;
    const size_t smem = size_t(n) * in * sizeof(float);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(blocks), dim3(SMALL_LINEAR_WARPS * 32), smem, small_linear_kernel, x, n, in,
                             x_channel_major, norm_w, eps, W, out, bias, epilogue, scale, y, y_channel_major));
}

}  // namespace qtts::kernels
