// The kernel lab's one-launch product for 24-64 rows (see wide_product.h for the design).
#include "apps/kernel-lab/wide_product.h"

#include <cuda_pipeline.h>

#include "kernels/check.cuh"
#include "kernels/mma.cuh"

namespace qtts::kernel_lab {

namespace {

using namespace ::qtts::kernels;

constexpr int WD_WARPS = 8;
constexpr int WD_THREADS = WD_WARPS * 32;
constexpr int WD_CHUNK = 64;         // inputs per staged piece of the x rows
constexpr int WD_XS = WD_CHUNK + 4;  // row stride of the staged rows (floats): float4 reads without conflicts
constexpr int WD_PREFETCH = 4;       // 32-input weight steps a warp keeps in flight (two chunks)
constexpr int WD_TILE_ROWS = WD_WARPS * 16;  // mma tile rows of a block (features; gate + up for SwiGLU)

bool swiglu_of(const GemvArgs& a) { return a.output == GemvOutput::GEMV_OUTPUT_SWIGLU; }
// Output features of a block: 16 a warp, or 8 (their gate and up rows) for SwiGLU.
int block_features(const GemvArgs& a) { return WD_WARPS * (swiglu_of(a) ? 8 : 16); }
int feature_blocks(const GemvArgs& a) { return (a.out + block_features(a) - 1) / block_features(a); }
int row_tiles(const GemvArgs& a) { return (a.rows + 7) / 8; }

// NT: tiles of 8 x rows. grid (feature blocks, input slices).
template <int NT>
__global__ void __launch_bounds__(WD_THREADS, 2)
    wide_kernel(const GemvArgs a, const int splits, float* partial, uint32_t* counters) {
    constexpr int R = NT * 8;  // x rows the block's tiles hold (those past a.rows are zeros)
    __shared__ __align__(16) float xs[2][R][WD_XS];
    __shared__ float scale_s[R];
    __shared__ float ss_s[R];
    __shared__ int is_last_s;

    const int kw = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane / 4, q = lane % 4;
    const bool swiglu = a.output == GemvOutput::GEMV_OUTPUT_SWIGLU;
    const bool norm = a.input == GemvInput::GEMV_INPUT_RMSNORM;
    const int per_warp = swiglu ? 8 : 16;
    const int fb = blockIdx.x * WD_WARPS * per_warp;  // the block's first feature
    const int fw = fb + kw * per_warp;                // the warp's
    const size_t in = size_t(a.in);
    // This lane's weight rows: tile rows g and g + 8 (rows past `out` read the last row; their
    // sums are never stored).
    const bf16_t* w0 = a.w + size_t(min(fw + g, a.out - 1)) * in;
    const bf16_t* w8 = swiglu ? a.w2 + size_t(min(fw + g, a.out - 1)) * in
                              : a.w + size_t(min(fw + g + 8, a.out - 1)) * in;
    // This block's input slice: chunks [c0, c1) of 64 inputs, as 32-input steps.
    const int chunks = a.in / WD_CHUNK;
    const int kz = blockIdx.y;
    const int c0 = int((long long)kz * chunks / splits), c1 = int((long long)(kz + 1) * chunks / splits);
    const int steps = (c1 - c0) * 2;
    const int kbase = c0 * WD_CHUNK;
    // Within a step the inputs are taken in a permuted order, as in kernels/skinny.cu: lane (g, q)
    // holds inputs 8q .. 8q + 7 of its rows (A and B agree, so the products are the same).
    const auto load_step = [&](int j, uint4 (&dst)[2]) {
        const bool inside = j < steps;
        const int k = kbase + j * 32 + 8 * q;
        dst[0] = inside ? load_weights(w0 + k) : make_uint4(0u, 0u, 0u, 0u);
        dst[1] = inside ? load_weights(w8 + k) : make_uint4(0u, 0u, 0u, 0u);
    };
    const auto stage = [&](int c, int buf) {
        const int k0 = (c0 + c) * WD_CHUNK;
        for (int i = threadIdx.x; i < a.rows * (WD_CHUNK / 4); i += WD_THREADS) {
            const int r = i / (WD_CHUNK / 4), c4 = i % (WD_CHUNK / 4);
            __pipeline_memcpy_async(&xs[buf][r][c4 * 4], a.x + size_t(r) * size_t(a.ldx) + k0 + c4 * 4, 16);
        }
    };

    uint4 wr[WD_PREFETCH][2];
#pragma unroll
    for (int i = 0; i < WD_PREFETCH; ++i) load_step(i, wr[i]);  // constant: before the wait
    for (int i = threadIdx.x; i < (R - a.rows) * WD_XS; i += WD_THREADS) {
        const int r = a.rows + i / WD_XS, c = i % WD_XS;
        xs[0][r][c] = 0.0f;
        xs[1][r][c] = 0.0f;
    }
    pdl_wait();  // x comes from the previous kernel
    pdl_trigger();
    stage(0, 0);
    __pipeline_commit();

    float acc[NT][4];
    float sumsq[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        sumsq[n] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;
    }

    // Steps in groups of WD_PREFETCH (the register ring); a chunk is two steps: at its first the
    // next chunk's staging starts and this one's is waited for, after its second the buffer is free.
    for (int j0 = 0; j0 < steps; j0 += WD_PREFETCH) {
#pragma unroll
        for (int i = 0; i < WD_PREFETCH; ++i) {
            const int j = j0 + i;
            if (j >= steps) break;  // block-uniform, at a chunk boundary (steps is even)
            if ((i & 1) == 0) {
                if (j + 2 < steps) {
                    stage(j / 2 + 1, (j / 2 + 1) & 1);
                    __pipeline_commit();
                    __pipeline_wait_prior(1);
                } else {
                    __pipeline_wait_prior(0);
                }
                __syncthreads();
            }
            const float* xc = &xs[(j / 2) & 1][0][0] + (j & 1) * 32 + 8 * q;
            float4 n0 = make_float4(1.f, 1.f, 1.f, 1.f), n1 = n0;
            if (norm) {
                const int k = kbase + j * 32 + 8 * q;
                n0 = *reinterpret_cast<const float4*>(a.norm_w + k);
                n1 = *reinterpret_cast<const float4*>(a.norm_w + k + 4);
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const float* xr = xc + (n * 8 + g) * WD_XS;
                float4 x0 = *reinterpret_cast<const float4*>(xr);
                float4 x1 = *reinterpret_cast<const float4*>(xr + 4);
                if (norm) {
                    if (kw == 0)
                        sumsq[n] += x0.x * x0.x + x0.y * x0.y + x0.z * x0.z + x0.w * x0.w + x1.x * x1.x +
                                    x1.y * x1.y + x1.z * x1.z + x1.w * x1.w;
                    x0 = make_float4(x0.x * n0.x, x0.y * n0.y, x0.z * n0.z, x0.w * n0.w);
                    x1 = make_float4(x1.x * n1.x, x1.y * n1.y, x1.z * n1.z, x1.w * n1.w);
                }
                uint32_t hi[4], lo[4];
                split_pair(x0.x, x0.y, hi[0], lo[0]);
                split_pair(x0.z, x0.w, hi[1], lo[1]);
                split_pair(x1.x, x1.y, hi[2], lo[2]);
                split_pair(x1.z, x1.w, hi[3], lo[3]);
                const uint4& r0 = wr[i][0];
                const uint4& r8 = wr[i][1];
                mma_16816(acc[n], r0.x, r8.x, r0.y, r8.y, hi[0], hi[1]);
                mma_16816(acc[n], r0.z, r8.z, r0.w, r8.w, hi[2], hi[3]);
                mma_16816(acc[n], r0.x, r8.x, r0.y, r8.y, lo[0], lo[1]);
                mma_16816(acc[n], r0.z, r8.z, r0.w, r8.w, lo[2], lo[3]);
            }
            load_step(j + WD_PREFETCH, wr[i]);  // the ring: this slot takes the step WD_PREFETCH on
            if ((i & 1) == 1) __syncthreads();  // every warp is done with this chunk's buffer
        }
    }

    // Warp 0's sums of squares of this slice, per row (lanes 4g .. 4g + 3 hold row n * 8 + g).
    if (norm && kw == 0) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            float s = sumsq[n];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            if (q == 0) ss_s[n * 8 + g] = s;
        }
    }
    __syncthreads();

    // The C fragment of m16n8: lane (g, q) holds tile row g (elements 0, 1) and g + 8 (2, 3) for
    // x rows 2q and 2q + 1 of each 8-row tile.
    const auto rule = [&](float* y, float v, int f) {
        v += a.bias ? a.bias[f] : 0.0f;
        if (a.output == GemvOutput::GEMV_OUTPUT_ADD)
            *y += v;
        else
            *y = v;
    };
    if (splits == 1) {
        if (threadIdx.x < R) scale_s[threadIdx.x] = norm ? 1.0f / sqrtf(ss_s[threadIdx.x] / float(a.in) + a.eps) : 1.0f;
        __syncthreads();
#pragma unroll
        for (int n = 0; n < NT; ++n) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int r = n * 8 + 2 * q + e;
                if (r >= a.rows || fw + g >= a.out) continue;
                const float s = scale_s[r];
                float* yr = a.y + size_t(r) * size_t(a.ldy);
                if (swiglu) {
                    yr[fw + g] = silu_ref(acc[n][e] * s) * (acc[n][2 + e] * s);
                } else {
                    rule(yr + fw + g, acc[n][e] * s, fw + g);
                    if (fw + g + 8 < a.out) rule(yr + fw + g + 8, acc[n][2 + e] * s, fw + g + 8);
                }
            }
        }
        return;
    }

    // Split-K: this slice's sums to the scratch ([tile row][row], then the rows' sums of squares),
    // then the last block of the column adds the slices in order.
    const size_t slice_floats = size_t(WD_TILE_ROWS + 1) * R;
    float* mine = partial + (size_t(blockIdx.x) * splits + kz) * slice_floats;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int r = n * 8 + 2 * q + e;
            mine[size_t(kw * 16 + g) * R + r] = acc[n][e];
            mine[size_t(kw * 16 + g + 8) * R + r] = acc[n][2 + e];
        }
    }
    if (threadIdx.x < R) mine[size_t(WD_TILE_ROWS) * R + threadIdx.x] = norm ? ss_s[threadIdx.x] : 0.0f;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        const uint32_t before = atomicAdd(counters + blockIdx.x, 1u);
        is_last_s = before == uint32_t(splits - 1);
        if (is_last_s) counters[blockIdx.x] = 0u;  // every slice has arrived: reset for the next launch
    }
    __syncthreads();
    if (!is_last_s) return;
    __threadfence();
    const float* column = partial + size_t(blockIdx.x) * splits * slice_floats;
    const auto total = [&](int tile_row, int r) {
        float s = 0.0f;
        for (int z = 0; z < splits; ++z) s += __ldcg(column + size_t(z) * slice_floats + size_t(tile_row) * R + r);
        return s;
    };
    if (threadIdx.x < R)
        scale_s[threadIdx.x] = norm ? 1.0f / sqrtf(total(WD_TILE_ROWS, threadIdx.x) / float(a.in) + a.eps) : 1.0f;
    __syncthreads();
    const int features = WD_WARPS * per_warp;
    for (int o = threadIdx.x; o < features * a.rows; o += WD_THREADS) {
        const int fl = o % features, r = o / features, f = fb + fl;
        if (f >= a.out) continue;
        const float s = scale_s[r];
        float* y = a.y + size_t(r) * size_t(a.ldy) + f;
        if (swiglu) {
            const int tr = (fl / 8) * 16 + fl % 8;  // the warp's gate row; its up row is 8 on
            *y = silu_ref(total(tr, r) * s) * (total(tr + 8, r) * s);
        } else {
            rule(y, total(fl, r) * s, f);
        }
    }
}

template <int NT>
void wide_launch(const GemvArgs& a, int splits, float* partial, uint32_t* counters, const Launch& l) {
    const dim3 grid(feature_blocks(a), splits);
    KERNEL_CUDA_CHECK(launch_kernel(l, grid, dim3(WD_THREADS), 0, wide_kernel<NT>, a, splits, partial, counters));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool wide_supported(const GemvArgs& a) {
    if (a.rows < 1 || a.rows > WIDE_MAX_ROWS || a.in <= 0 || a.in % WD_CHUNK != 0 || a.out <= 0) return false;
    if (a.input == GemvInput::GEMV_INPUT_GATHER || !a.x || !a.w || !a.y) return false;
    if (swiglu_of(a) && (!a.w2 || !aligned16(a.w2))) return false;
    if (a.input == GemvInput::GEMV_INPUT_RMSNORM && (!a.norm_w || !aligned16(a.norm_w))) return false;
    return aligned16(a.w) && aligned16(a.x) && a.ldx % 4 == 0 && a.ldx >= a.in && a.ldy >= a.out;
}

int wide_splits(const GemvArgs& a, int sms) {
    const int blocks = feature_blocks(a), chunks = a.in / WD_CHUNK;
    int splits = 1;
    while (blocks * splits < 2 * sms && splits * 2 <= chunks) splits *= 2;
    return splits;
}

size_t wide_partial_floats(const GemvArgs& a, int splits) {
    return size_t(feature_blocks(a)) * size_t(splits) * size_t(WD_TILE_ROWS + 1) * size_t(row_tiles(a) * 8);
}

size_t wide_counter_count(const GemvArgs& a) { return size_t(feature_blocks(a)); }

void wide_product(const GemvArgs& a, int splits, float* partial, uint32_t* counters, const Launch& l) {
    if (!wide_supported(a))
        check_fail("wide_product",
                   "unsupported arguments (rows 1..64, in a positive multiple of 64, 16-byte aligned rows, plain or "
                   "RMSNorm input, pointers set)",
                   __func__, __FILE__, __LINE__);
    if (splits < 1 || splits > a.in / WD_CHUNK || (splits > 1 && (!partial || !counters)))
        check_fail("wide_product", "splits must be 1..in/64, and past 1 need the partial scratch and counters", __func__,
                   __FILE__, __LINE__);
    switch (row_tiles(a)) {
        case 1: return wide_launch<1>(a, splits, partial, counters, l);
        case 2: return wide_launch<2>(a, splits, partial, counters, l);
        case 3: return wide_launch<3>(a, splits, partial, counters, l);
        case 4: return wide_launch<4>(a, splits, partial, counters, l);
        case 5: return wide_launch<5>(a, splits, partial, counters, l);
        case 6: return wide_launch<6>(a, splits, partial, counters, l);
        case 7: return wide_launch<7>(a, splits, partial, counters, l);
        default: return wide_launch<8>(a, splits, partial, counters, l);
    }
}

}  // namespace qtts::kernel_lab
