// The decoder's weight products over a few columns (see few_columns.cuh for the design).
#include "kernels/few_columns.cuh"

#include <algorithm>

#include "kernels/check.cuh"
#include "kernels/mma.cuh"

namespace qtts::kernels {

namespace {

constexpr int FC_WARPS = 8;             // warps of a block over W rows, taking the steps in turn
constexpr int FC_ROWS = 16;             // rows of W per block (the m of m16n8k16)
constexpr int FC_STEP = 32;             // inputs per warp step over W rows: two m16n8k16 products
constexpr int FC_STACKED_WARPS = 16;    // warps of a block over stacked W, taking the inputs in turn
constexpr int FC_STACKED_OUTPUTS = 128;  // outputs per block over stacked W: four per lane
constexpr int FC_STACKED_MAX = 8;       // columns the stacked kernel takes (its sums: 4 x N registers)
constexpr int FC_STACKED_DEPTH = 4;     // inputs a lane has in flight over stacked W
// Products with fewer tiles than this split K into slices (grid.y), as many as fit in this many
// blocks (about two per SM of the H200's 132); the last block of a tile adds the slices' sums.
// Whole slices within the target, not rounded up: measured with ncu on a one-frame chunk, the
// ConvNeXt pw1 (256 tiles) took 9.8 µs in one block per tile and 13.8 µs in two slices.
constexpr int FC_TARGET_BLOCKS = 264;

// Where a block's sums go: straight to y (one slice), or to its slice's partial sums, the last
// block of the tile to arrive (its ticket) adding every slice's in slice order: the same bits
// whichever block arrives last. The ticket is left at zero for the next launch.
struct SliceOutput {
    float* partials = nullptr;  // [slices, M, N]
    uint32_t* tickets = nullptr;  // [tiles]
    int slices = 1;
};

// Every thread of the block calls this after __syncthreads(): outputs m_first .. m_first + m_count - 1
// (all N columns) of the tile, `block_sum(r, c)` the block's sum for row m_first + r, column c.
template <typename BlockSum>
__device__ __forceinline__ void finish_tile(const SliceOutput& out, int M, int N, int m_first, int m_count,
                                            BlockSum block_sum, bool accumulate, float* y) {
    const int outputs = m_count * N;
    if (out.slices == 1) {
        for (int o = int(threadIdx.x); o < outputs; o += int(blockDim.x)) {
            const int r = o / N, c = o % N, m = m_first + r;
            if (m >= M) continue;
            const float s = block_sum(r, c);
            float* dst = y + size_t(m) * N + c;
            *dst = accumulate ? *dst + s : s;
        }
        return;
    }
    float* mine = out.partials + size_t(blockIdx.y) * size_t(M) * N;
    for (int o = int(threadIdx.x); o < outputs; o += int(blockDim.x)) {
        const int r = o / N, c = o % N, m = m_first + r;
        if (m < M) mine[size_t(m) * N + c] = block_sum(r, c);
    }
    if (!block_arrive_last(out.tickets + blockIdx.x, uint32_t(out.slices))) return;
    for (int o = int(threadIdx.x); o < outputs; o += int(blockDim.x)) {
        const int r = o / N, c = o % N, m = m_first + r;
        if (m >= M) continue;
        float s = 0.0f;
        for (int sl = 0; sl < out.slices; ++sl) s += __ldcg(out.partials + (size_t(sl) * M + m) * N + c);
        float* dst = y + size_t(m) * N + c;
        *dst = accumulate ? *dst + s : s;
    }
}

// Eight bytes of weights (four bf16), kept out of L1 as load_weights does. p 8-byte aligned.
__device__ __forceinline__ uint2 load_weights8(const bf16_t* p) {
    uint2 v;
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "l"(p));
    return v;
}

// The 16-byte pieces of one warp step: rows g and g + 8, hi and lo, inputs k .. k + 7.
struct RowPieces {
    uint4 hi_g, hi_g8, lo_g, lo_g8;
};

struct RowPointers {
    const bf16_t *hi_g, *hi_g8, *lo_g, *lo_g8;
    __device__ __forceinline__ RowPieces load(int k, int K) const {
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        if (k >= K) return {zero, zero, zero, zero};
        return {load_weights(hi_g + k), load_weights(hi_g8 + k), load_weights(lo_g + k), load_weights(lo_g8 + k)};
    }
};

// x rows k .. k + 7 of column 8t + g for each tile t (zeros past K or N).
template <int NT>
struct XPieces {
    float v[NT][8];
    __device__ __forceinline__ void load(const float* x, int N, int K, int k, int g) {
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int n = 8 * t + g;
#pragma unroll
            for (int j = 0; j < 8; ++j) v[t][j] = (k < K && n < N) ? __ldg(x + size_t(k + j) * N + n) : 0.0f;
        }
    }
};

// W rows [M, K] on tensor cores. NT: 8-column tiles (N <= 8·NT). Lane (g, q) holds inputs
// k0 + 8q .. k0 + 8q + 7 of a step (the skinny kernel's permutation: the first four make one
// m16n8k16 product, the last four the next), for W rows g and g + 8 and for x column 8·t + g of
// each tile t. A warp has its next two steps' weights and its next step's x in flight while it
// multiplies the current one.
template <int NT>
__global__ void __launch_bounds__(FC_WARPS * 32, 2) few_rows_kernel(SplitWeights w, int M, int N, int K, const float* x,
                                                                 bool accumulate, float* y, SliceOutput out,
                                                                 int slice_steps) {
    __shared__ float sums[FC_WARPS][FC_ROWS][8 * NT];  // each warp's sums
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, q = lane & 3;
    const int row0 = int(blockIdx.x) * FC_ROWS;
    const size_t ra = size_t(min(row0 + g, M - 1)), rb = size_t(min(row0 + g + 8, M - 1));  // rows past M: discarded
    const RowPointers rows{w.hi + ra * w.ld, w.hi + rb * w.ld, w.lo + ra * w.ld, w.lo + rb * w.ld};
    constexpr int STRIDE = FC_WARPS * FC_STEP;
    // This block's slice of K: inputs k_begin .. k_end - 1.
    const int k_begin = int(blockIdx.y) * slice_steps * FC_STEP, k_end = min(K, k_begin + slice_steps * FC_STEP);
    K = k_end;  // loads stop at the slice's end
    const int k0 = k_begin + warp * FC_STEP + 8 * q;
    // The first steps' weights before the wait: they are not written by earlier kernels.
    RowPieces w_cur = rows.load(k0, K), w_next = rows.load(k0 + STRIDE, K);
    pdl_wait();
    pdl_trigger();
    XPieces<NT> x_cur;
    x_cur.load(x, N, K, k0, g);
    float acc[NT][4] = {};
    for (int step = k_begin + warp * FC_STEP; step < K; step += STRIDE) {  // the same steps for every lane of the warp
        const int k = step + 8 * q;
        const RowPieces w_after = rows.load(k + 2 * STRIDE, K);
        XPieces<NT> x_next;
        x_next.load(x, N, K, k + STRIDE, g);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            uint32_t xh[4], xl[4];
#pragma unroll
            for (int p = 0; p < 4; ++p) split_pair(x_cur.v[t][2 * p], x_cur.v[t][2 * p + 1], xh[p], xl[p]);
            // W_hi·x_hi + W_hi·x_lo + W_lo·x_hi, inputs 8q .. 8q + 3 then 8q + 4 .. 8q + 7.
            const RowPieces& c = w_cur;
            mma_16816(acc[t], c.hi_g.x, c.hi_g8.x, c.hi_g.y, c.hi_g8.y, xh[0], xh[1]);
            mma_16816(acc[t], c.hi_g.z, c.hi_g8.z, c.hi_g.w, c.hi_g8.w, xh[2], xh[3]);
            mma_16816(acc[t], c.hi_g.x, c.hi_g8.x, c.hi_g.y, c.hi_g8.y, xl[0], xl[1]);
            mma_16816(acc[t], c.hi_g.z, c.hi_g8.z, c.hi_g.w, c.hi_g8.w, xl[2], xl[3]);
            mma_16816(acc[t], c.lo_g.x, c.lo_g8.x, c.lo_g.y, c.lo_g8.y, xh[0], xh[1]);
            mma_16816(acc[t], c.lo_g.z, c.lo_g8.z, c.lo_g.w, c.lo_g8.w, xh[2], xh[3]);
        }
        w_cur = w_next;
        w_next = w_after;
        x_cur = x_next;
    }
    // Accumulator (t, i): row g (i < 2) or g + 8, column 8t + 2q + (i & 1).
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) sums[warp][g + 8 * (i >> 1)][8 * t + 2 * q + (i & 1)] = acc[t][i];
    __syncthreads();
    finish_tile(
        out, M, N, row0, FC_ROWS,
        [&](int r, int c) {
            float s = 0.0f;
            for (int v = 0; v < FC_WARPS; ++v) s += sums[v][r][c];  // warp order: deterministic
            return s;
        },
        accumulate, y);
}

// W stacked [K, M] on CUDA cores. NC: columns (N <= NC <= FC_STACKED_MAX); VEC: N % 4 == 0 (x rows
// read as float4). Lane l owns outputs m0 + 4l .. m0 + 4l + 3 (8 bytes of hi, 8 of lo per input);
// warp v takes inputs v, v + FC_STACKED_WARPS, ..., FC_STACKED_DEPTH of them loaded at a time.
template <int NC, bool VEC>
__global__ void __launch_bounds__(FC_STACKED_WARPS * 32) few_stacked_kernel(SplitWeights w, int M, int N, int K,
                                                                            const float* x, bool accumulate, float* y,
                                                                            SliceOutput out, int slice_inputs) {
    __shared__ float4 sums[NC][FC_STACKED_OUTPUTS / 4];  // [column][lane]: the warps' sums added in turn
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const int m0 = int(blockIdx.x) * FC_STACKED_OUTPUTS;
    const size_t m = size_t(min(m0 + 4 * lane, M - 4));  // outputs past M: discarded
    pdl_wait();
    pdl_trigger();
    float acc[4][NC] = {};
    constexpr int STRIDE = FC_STACKED_WARPS;
    // This block's slice of K: inputs k_begin .. K - 1.
    const int k_begin = int(blockIdx.y) * slice_inputs;
    K = min(K, k_begin + slice_inputs);
    for (int k0 = k_begin + warp; k0 < K; k0 += STRIDE * FC_STACKED_DEPTH) {
        uint2 h[FC_STACKED_DEPTH], l[FC_STACKED_DEPTH];
#pragma unroll
        for (int d = 0; d < FC_STACKED_DEPTH; ++d) {
            const int k = min(k0 + d * STRIDE, K - 1);  // past K: loaded, multiplied by zero x below
            h[d] = load_weights8(w.hi + size_t(k) * w.ld + m);
            l[d] = load_weights8(w.lo + size_t(k) * w.ld + m);
        }
#pragma unroll
        for (int d = 0; d < FC_STACKED_DEPTH; ++d) {
            const int k = k0 + d * STRIDE;
            if (k >= K) break;
            // hi + lo: exact in fp32.
            const float wv[4] = {bf16_lo(h[d].x) + bf16_lo(l[d].x), bf16_hi(h[d].x) + bf16_hi(l[d].x),
                                 bf16_lo(h[d].y) + bf16_lo(l[d].y), bf16_hi(h[d].y) + bf16_hi(l[d].y)};
            const float* xr = x + size_t(k) * N;
            float xv[NC];
            if constexpr (VEC) {
#pragma unroll
                for (int c = 0; c < NC; c += 4) {
                    const float4 v = c < N ? __ldg(reinterpret_cast<const float4*>(xr + c)) : make_float4(0, 0, 0, 0);
                    xv[c] = v.x, xv[c + 1] = v.y, xv[c + 2] = v.z, xv[c + 3] = v.w;
                }
            } else {
#pragma unroll
                for (int c = 0; c < NC; ++c) xv[c] = c < N ? __ldg(xr + c) : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int c = 0; c < NC; ++c) acc[i][c] += wv[i] * xv[c];
        }
    }
    for (int v = 0; v < FC_STACKED_WARPS; ++v) {  // warp order: deterministic
        if (warp == v)
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const float4 prev = v == 0 ? make_float4(0.0f, 0.0f, 0.0f, 0.0f) : sums[c][lane];
                sums[c][lane] =
                    make_float4(prev.x + acc[0][c], prev.y + acc[1][c], prev.z + acc[2][c], prev.w + acc[3][c]);
            }
        __syncthreads();
    }
    const float* flat = reinterpret_cast<const float*>(sums);
    finish_tile(
        out, M, N, m0, FC_STACKED_OUTPUTS, [&](int r, int c) { return flat[c * FC_STACKED_OUTPUTS + r]; }, accumulate,
        y);
}

// How K is cut into slices: `count` slices of `length` units (steps or inputs), none empty.
struct Slicing {
    int count = 1, length = 0;
};

// Slices of K for a product of `tiles` tiles over `units` units of K, each slice at least
// `min_units` long, as far as the workspace holds their partial sums.
Slicing k_slices(int tiles, int units, int min_units, size_t outputs, const FewColumnsWorkspace& ws) {
    int slices = 1;
    if (2 * tiles <= FC_TARGET_BLOCKS && ws.partials && ws.tickets && tiles <= ws.ticket_count) {
        slices = std::min(FC_TARGET_BLOCKS / tiles, std::max(1, units / min_units));
        while (slices > 1 && size_t(slices) * outputs > ws.partial_floats) --slices;
    }
    const int length = (units + slices - 1) / slices;
    return {(units + length - 1) / length, length};
}

template <int NC>
cudaError_t launch_stacked(const Launch& l, const SplitWeights& w, int M, int N, int K, const float* x,
                           bool accumulate, float* y, const FewColumnsWorkspace& ws) {
    const int tiles = (M + FC_STACKED_OUTPUTS - 1) / FC_STACKED_OUTPUTS;
    // Slices of at least two rounds of loads per warp.
    const Slicing s = k_slices(tiles, K, 2 * FC_STACKED_WARPS * FC_STACKED_DEPTH, size_t(M) * N, ws);
    const SliceOutput out{ws.partials, ws.tickets, s.count};
    const dim3 grid{unsigned(tiles), unsigned(s.count)}, block{unsigned(FC_STACKED_WARPS * 32)};
    if (N % 4 == 0)
        return launch_kernel(l, grid, block, 0, few_stacked_kernel<NC, true>, w, M, N, K, x, accumulate, y, out,
                             s.length);
    return launch_kernel(l, grid, block, 0, few_stacked_kernel<NC, false>, w, M, N, K, x, accumulate, y, out,
                         s.length);
}

template <int NT>
cudaError_t launch_rows(const Launch& l, const SplitWeights& w, int M, int N, int K, const float* x, bool accumulate,
                        float* y, const FewColumnsWorkspace& ws) {
    const int tiles = (M + FC_ROWS - 1) / FC_ROWS, steps = (K + FC_STEP - 1) / FC_STEP;
    // Slices of at least two steps per warp.
    const Slicing s = k_slices(tiles, steps, 2 * FC_WARPS, size_t(M) * N, ws);
    const SliceOutput out{ws.partials, ws.tickets, s.count};
    const dim3 grid{unsigned(tiles), unsigned(s.count)}, block{unsigned(FC_WARPS * 32)};
    return launch_kernel(l, grid, block, 0, few_rows_kernel<NT>, w, M, N, K, x, accumulate, y, out, s.length);
}

}  // namespace

bool few_columns_supported(const SplitWeights& w, int M, int N, int K) {
    if (!w.hi || !w.lo || M < 1 || N < 1 || N > FEW_COLUMNS_MAX || K < 1) return false;
    if (w.stacked)
        return N <= FC_STACKED_MAX && M % 4 == 0 && w.ld % 4 == 0 && w.ld >= M && is_aligned(w.hi, 8) && is_aligned(w.lo, 8);
    return K % 8 == 0 && w.ld % 8 == 0 && w.ld >= K && is_aligned(w.hi, 16) && is_aligned(w.lo, 16);
}

void few_columns_product(const SplitWeights& w, int M, int N, int K, const float* x, bool accumulate, float* y,
                         const FewColumnsWorkspace& ws, const Launch& l) {
    if (!few_columns_supported(w, M, N, K) || !x || !y)
        check_fail("few_columns_product", "invalid arguments", __func__, __FILE__, __LINE__);
    if (w.stacked) {
        if (N <= 4)
            KERNEL_CUDA_CHECK(launch_stacked<4>(l, w, M, N, K, x, accumulate, y, ws));
        else
            KERNEL_CUDA_CHECK(launch_stacked<FC_STACKED_MAX>(l, w, M, N, K, x, accumulate, y, ws));
        return;
    }
    if (N <= 8)
        KERNEL_CUDA_CHECK(launch_rows<1>(l, w, M, N, K, x, accumulate, y, ws));
    else
        KERNEL_CUDA_CHECK(launch_rows<2>(l, w, M, N, K, x, accumulate, y, ws));
}

}  // namespace qtts::kernels
