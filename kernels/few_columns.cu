// The decoder's weight products over a few columns (see few_columns.cuh for the design).
#include "kernels/few_columns.cuh"

#include "kernels/check.cuh"
#include "kernels/mma.cuh"

namespace qtts::kernels {

namespace {

constexpr int FC_WARPS = 8;     // warps of a block, taking the inputs in turn
constexpr int FC_ROWS = 16;     // rows of W per block (the m of m16n8k16)
constexpr int FC_STEP = 32;     // inputs per warp step over W rows: two m16n8k16 products
constexpr int FC_OUTPUTS = 64;  // outputs per block over stacked W: two per lane

// One 32-bit word of weights (two bf16), kept out of L1 as load_weights does.
__device__ __forceinline__ uint32_t load_weights32(const bf16_t* p) {
    uint32_t v;
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// The 16-byte pieces of one warp step: rows g and g + 8, hi and lo, inputs k .. k + 7.
struct RowPieces {
    uint4 hi_g, hi_g8, lo_g, lo_g8;
};

__device__ __forceinline__ RowPieces load_pieces(const bf16_t* hi_g, const bf16_t* hi_g8, const bf16_t* lo_g,
                                                 const bf16_t* lo_g8, int k, int K) {
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    if (k >= K) return {zero, zero, zero, zero};
    return {load_weights(hi_g + k), load_weights(hi_g8 + k), load_weights(lo_g + k), load_weights(lo_g8 + k)};
}

// W rows [M, K] on tensor cores. NT: 8-column tiles (N <= 8·NT). Lane (g, q) holds inputs
// k0 + 8q .. k0 + 8q + 7 of a step (the skinny kernel's permutation: the first four make one
// m16n8k16 product, the last four the next), for W rows g and g + 8 and for x column 8·t + g of
// each tile t.
template <int NT>
__global__ void __launch_bounds__(FC_WARPS * 32) few_rows_kernel(SplitWeights w, int M, int N, int K, const float* x,
                                                                 bool accumulate, float* y) {
    __shared__ float sums[FC_WARPS][FC_ROWS][8 * NT];  // each warp's sums
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5, g = lane >> 2, q = lane & 3;
    const int row0 = int(blockIdx.x) * FC_ROWS;
    const size_t ra = size_t(min(row0 + g, M - 1)), rb = size_t(min(row0 + g + 8, M - 1));  // rows past M: discarded
    const bf16_t *hi_g = w.hi + ra * w.ld, *hi_g8 = w.hi + rb * w.ld;
    const bf16_t *lo_g = w.lo + ra * w.ld, *lo_g8 = w.lo + rb * w.ld;
    constexpr int STRIDE = FC_WARPS * FC_STEP;
    // The first step's weights before the wait: they are not written by earlier kernels.
    RowPieces cur = load_pieces(hi_g, hi_g8, lo_g, lo_g8, warp * FC_STEP + 8 * q, K);
    pdl_wait();
    pdl_trigger();
    float acc[NT][4] = {};
    for (int step = warp * FC_STEP; step < K; step += STRIDE) {  // the same steps for every lane of the warp
        const int k = step + 8 * q;
        const RowPieces next = load_pieces(hi_g, hi_g8, lo_g, lo_g8, k + STRIDE, K);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const int n = 8 * t + g;
            float v[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] = (k < K && n < N) ? __ldg(x + size_t(k + j) * N + n) : 0.0f;
            uint32_t xh[4], xl[4];
#pragma unroll
            for (int p = 0; p < 4; ++p) split_pair(v[2 * p], v[2 * p + 1], xh[p], xl[p]);
            // W_hi·x_hi + W_hi·x_lo + W_lo·x_hi, inputs 8q .. 8q + 3 then 8q + 4 .. 8q + 7.
            mma_16816(acc[t], cur.hi_g.x, cur.hi_g8.x, cur.hi_g.y, cur.hi_g8.y, xh[0], xh[1]);
            mma_16816(acc[t], cur.hi_g.z, cur.hi_g8.z, cur.hi_g.w, cur.hi_g8.w, xh[2], xh[3]);
            mma_16816(acc[t], cur.hi_g.x, cur.hi_g8.x, cur.hi_g.y, cur.hi_g8.y, xl[0], xl[1]);
            mma_16816(acc[t], cur.hi_g.z, cur.hi_g8.z, cur.hi_g.w, cur.hi_g8.w, xl[2], xl[3]);
            mma_16816(acc[t], cur.lo_g.x, cur.lo_g8.x, cur.lo_g.y, cur.lo_g8.y, xh[0], xh[1]);
            mma_16816(acc[t], cur.lo_g.z, cur.lo_g8.z, cur.lo_g.w, cur.lo_g8.w, xh[2], xh[3]);
        }
        cur = next;
    }
    // Accumulator (t, i): row g (i < 2) or g + 8, column 8t + 2q + (i & 1).
#pragma unroll
    for (int t = 0; t < NT; ++t)
#pragma unroll
        for (int i = 0; i < 4; ++i) sums[warp][g + 8 * (i >> 1)][8 * t + 2 * q + (i & 1)] = acc[t][i];
    __syncthreads();
    for (int o = int(threadIdx.x); o < FC_ROWS * 8 * NT; o += int(blockDim.x)) {
        const int r = o / (8 * NT), c = o % (8 * NT), row = row0 + r;
        if (row >= M || c >= N) continue;
        float s = 0.0f;
        for (int v = 0; v < FC_WARPS; ++v) s += sums[v][r][c];  // warp order: deterministic
        float* out = y + size_t(row) * N + c;
        *out = accumulate ? *out + s : s;
    }
}

// W stacked [K, M] on CUDA cores. NC: columns (N <= NC); VEC: N % 4 == 0 (x rows read as float4).
// Lane l owns outputs m0 + 2l and m0 + 2l + 1; warp v takes inputs v, v + FC_WARPS, ...
template <int NC, bool VEC>
__global__ void __launch_bounds__(FC_WARPS * 32) few_stacked_kernel(SplitWeights w, int M, int N, int K,
                                                                    const float* x, bool accumulate, float* y) {
    __shared__ float2 sums[NC][FC_OUTPUTS / 2];  // [column][output pair]: the warps' sums added in turn
    const int lane = int(threadIdx.x) & 31, warp = int(threadIdx.x) >> 5;
    const int m0 = int(blockIdx.x) * FC_OUTPUTS;
    const size_t m = size_t(min(m0 + 2 * lane, M - 2));  // pairs past M: discarded
    pdl_wait();
    pdl_trigger();
    float a0[NC] = {}, a1[NC] = {};
#pragma unroll 4
    for (int k = warp; k < K; k += FC_WARPS) {
        const uint32_t h = load_weights32(w.hi + size_t(k) * w.ld + m), l = load_weights32(w.lo + size_t(k) * w.ld + m);
        const float w0 = bf16_lo(h) + bf16_lo(l), w1 = bf16_hi(h) + bf16_hi(l);  // hi + lo: exact in fp32
        const float* xr = x + size_t(k) * N;
        if constexpr (VEC) {
#pragma unroll
            for (int c = 0; c < NC; c += 4) {
                if (c >= N) break;
                const float4 v = __ldg(reinterpret_cast<const float4*>(xr + c));
                a0[c] += w0 * v.x, a1[c] += w1 * v.x;
                a0[c + 1] += w0 * v.y, a1[c + 1] += w1 * v.y;
                a0[c + 2] += w0 * v.z, a1[c + 2] += w1 * v.z;
                a0[c + 3] += w0 * v.w, a1[c + 3] += w1 * v.w;
            }
        } else {
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                if (c >= N) break;
                const float v = __ldg(xr + c);
                a0[c] += w0 * v, a1[c] += w1 * v;
            }
        }
    }
    for (int v = 0; v < FC_WARPS; ++v) {  // warp order: deterministic
        if (warp == v)
#pragma unroll
            for (int c = 0; c < NC; ++c) {
                const float2 prev = v == 0 ? make_float2(0.0f, 0.0f) : sums[c][lane];
                sums[c][lane] = make_float2(prev.x + a0[c], prev.y + a1[c]);
            }
        __syncthreads();
    }
    for (int o = int(threadIdx.x); o < FC_OUTPUTS * NC; o += int(blockDim.x)) {
        const int c = o / FC_OUTPUTS, j = o % FC_OUTPUTS, out_m = m0 + j;
        if (out_m >= M || c >= N) continue;
        const float2 pair = sums[c][j >> 1];
        const float s = (j & 1) ? pair.y : pair.x;
        float* out = y + size_t(out_m) * N + c;
        *out = accumulate ? *out + s : s;
    }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <int NC>
cudaError_t launch_stacked(const Launch& l, const SplitWeights& w, int M, int N, int K, const float* x,
                           bool accumulate, float* y) {
    const dim3 grid(unsigned((M + FC_OUTPUTS - 1) / FC_OUTPUTS)), block(FC_WARPS * 32);
    if (N % 4 == 0) return launch_kernel(l, grid, block, 0, few_stacked_kernel<NC, true>, w, M, N, K, x, accumulate, y);
    return launch_kernel(l, grid, block, 0, few_stacked_kernel<NC, false>, w, M, N, K, x, accumulate, y);
}

template <int NT>
cudaError_t launch_rows(const Launch& l, const SplitWeights& w, int M, int N, int K, const float* x, bool accumulate,
                        float* y) {
    const dim3 grid(unsigned((M + FC_ROWS - 1) / FC_ROWS)), block(FC_WARPS * 32);
    return launch_kernel(l, grid, block, 0, few_rows_kernel<NT>, w, M, N, K, x, accumulate, y);
}

}  // namespace

bool few_columns_supported(const SplitWeights& w, int M, int N, int K) {
    if (!w.hi || !w.lo || M < 1 || N < 1 || N > FEW_COLUMNS_MAX || K < 1) return false;
    if (w.stacked) return M % 2 == 0 && w.ld % 2 == 0 && w.ld >= M && aligned(w.hi, 4) && aligned(w.lo, 4);
    return K % 8 == 0 && w.ld % 8 == 0 && w.ld >= K && aligned(w.hi, 16) && aligned(w.lo, 16);
}

void few_columns_product(const SplitWeights& w, int M, int N, int K, const float* x, bool accumulate, float* y,
                         const Launch& l) {
    if (!few_columns_supported(w, M, N, K) || !x || !y)
        check_fail("few_columns_product", "invalid arguments", __func__, __FILE__, __LINE__);
    if (w.stacked) {
        if (N <= 4)
            KERNEL_CUDA_CHECK(launch_stacked<4>(l, w, M, N, K, x, accumulate, y));
        else if (N <= 8)
            KERNEL_CUDA_CHECK(launch_stacked<8>(l, w, M, N, K, x, accumulate, y));
        else if (N <= 16)
            KERNEL_CUDA_CHECK(launch_stacked<16>(l, w, M, N, K, x, accumulate, y));
        else
            KERNEL_CUDA_CHECK(launch_stacked<32>(l, w, M, N, K, x, accumulate, y));
        return;
    }
    switch ((N + 7) / 8) {
        case 1: KERNEL_CUDA_CHECK(launch_rows<1>(l, w, M, N, K, x, accumulate, y)); break;
        case 2: KERNEL_CUDA_CHECK(launch_rows<2>(l, w, M, N, K, x, accumulate, y)); break;
        case 3: KERNEL_CUDA_CHECK(launch_rows<3>(l, w, M, N, K, x, accumulate, y)); break;
        default: KERNEL_CUDA_CHECK(launch_rows<4>(l, w, M, N, K, x, accumulate, y)); break;
    }
}

}  // namespace qtts::kernels
