// The kernel lab's one-launch product for 24-64 rows (see wide_product.h for the design).
#include "apps/kernel-lab/wide_product.h"

#include "kernels/check.cuh"
#include "kernels/mma.cuh"

namespace qtts::kernel_lab {

namespace {

using namespace ::qtts::kernels;

constexpr int WD_WARPS = 8;
constexpr int WD_THREADS = WD_WARPS * 32;
constexpr int WD_CHUNK = 64;                 // inputs per staged piece of the x rows
constexpr int WD_HL = 2 * WD_CHUNK + 32;     // bf16 per staged row: hi[64] | lo[64] | pad (320 bytes,
                                             // = 64 mod 128: 16-byte fragment reads without conflicts)
constexpr int WD_PREFETCH = 4;               // 32-input weight steps a warp keeps in flight (two chunks)
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
    constexpr int PIECES = R * (WD_CHUNK / 4);                     // float4 pieces of a chunk of x
    constexpr int XPT = (PIECES + WD_THREADS - 1) / WD_THREADS;  // a thread's (whole warps: PIECES % 128 == 0)
    __shared__ __align__(16) bf16_t hl[2][R][WD_HL];
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
    const int my_chunks = c1 - c0, steps = 2 * my_chunks;
    const int kbase = c0 * WD_CHUNK;
    // Within a step the inputs are taken in a permuted order, as in kernels/skinny.cu: lane (g, q)
    // holds inputs 8q .. 8q + 7 of its rows (A and B agree, so the products are the same).
    const auto load_step = [&](int j, uint4 (&dst)[2]) {
        const bool inside = j < steps;
        const int k = kbase + j * 32 + 8 * q;
        dst[0] = inside ? load_weights(w0 + k) : make_uint4(0u, 0u, 0u, 0u);
        dst[1] = inside ? load_weights(w8 + k) : make_uint4(0u, 0u, 0u, 0u);
    };
    // The x rows of a chunk: each thread reads its float4 pieces (piece p = thread + i x threads:
    // row p / 16, inputs 4 (p % 16) ..; the same rows every chunk) into registers a chunk ahead,
    // then normalises (RMSNorm input: the norm weight now, the row's 1/rms at the end), splits
    // them into bf16 hi + lo and stores them once for every warp of the block.
    const auto fetch = [&](int c, float4 (&v)[XPT]) {
        const int k0 = kbase + c * WD_CHUNK;
#pragma unroll
        for (int i = 0; i < XPT; ++i) {
            const int p = threadIdx.x + i * WD_THREADS, r = p / (WD_CHUNK / 4), c4 = p % (WD_CHUNK / 4);
            v[i] = p < PIECES && r < a.rows
                       ? *reinterpret_cast<const float4*>(a.x + size_t(r) * size_t(a.ldx) + k0 + 4 * c4)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    float sq[XPT];
#pragma unroll
    for (int i = 0; i < XPT; ++i) sq[i] = 0.0f;
    const auto put = [&](int c, const float4 (&v)[XPT], int buf) {
        const int k0 = kbase + c * WD_CHUNK;
#pragma unroll
        for (int i = 0; i < XPT; ++i) {
            const int p = threadIdx.x + i * WD_THREADS, r = p / (WD_CHUNK / 4), c4 = p % (WD_CHUNK / 4);
            if (p >= PIECES) continue;
            float4 x = v[i];
            if (norm) {
                sq[i] += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
                const float4 nw = *reinterpret_cast<const float4*>(a.norm_w + k0 + 4 * c4);
                x = make_float4(x.x * nw.x, x.y * nw.y, x.z * nw.z, x.w * nw.w);
            }
            uint32_t h0, l0, h1, l1;
            split_pair(x.x, x.y, h0, l0);
            split_pair(x.z, x.w, h1, l1);
            *reinterpret_cast<uint2*>(&hl[buf][r][4 * c4]) = make_uint2(h0, h1);
            *reinterpret_cast<uint2*>(&hl[buf][r][WD_CHUNK + 4 * c4]) = make_uint2(l0, l1);
        }
    };

    uint4 wr[WD_PREFETCH][2];
#pragma unroll
    for (int i = 0; i < WD_PREFETCH; ++i) load_step(i, wr[i]);  // constant: before the wait
    pdl_wait();  // x comes from the previous kernel
    pdl_trigger();
    float4 xv[XPT];
    fetch(0, xv);
    put(0, xv, 0);
    if (my_chunks > 1) fetch(1, xv);
    __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[n][e] = 0.0f;

    // Steps in groups of WD_PREFETCH (the register ring); a chunk is two steps. At the end of
    // chunk c the next one goes into the other buffer (read last during chunk c - 1, which every
    // warp finished before the previous barrier) and the one after is fetched into registers.
    for (int j0 = 0; j0 < steps; j0 += WD_PREFETCH) {
#pragma unroll
        for (int i = 0; i < WD_PREFETCH; ++i) {
            const int j = j0 + i;
            if (j >= steps) break;  // block-uniform, at a chunk boundary (steps is even)
            const bf16_t* xc = &hl[(j / 2) & 1][0][0] + (j & 1) * 32 + 8 * q;
            const uint4& r0 = wr[i][0];
            const uint4& r8 = wr[i][1];
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                const bf16_t* xr = xc + (n * 8 + g) * WD_HL;
                const uint4 h = *reinterpret_cast<const uint4*>(xr);
                const uint4 l = *reinterpret_cast<const uint4*>(xr + WD_CHUNK);
                mma_16816(acc[n], r0.x, r8.x, r0.y, r8.y, h.x, h.y);
                mma_16816(acc[n], r0.z, r8.z, r0.w, r8.w, h.z, h.w);
                mma_16816(acc[n], r0.x, r8.x, r0.y, r8.y, l.x, l.y);
                mma_16816(acc[n], r0.z, r8.z, r0.w, r8.w, l.z, l.w);
            }
            load_step(j + WD_PREFETCH, wr[i]);  // the ring: this slot takes the step WD_PREFETCH on
            if ((i & 1) == 1) {
                const int c = j / 2;
                if (c + 1 < my_chunks) {
                    put(c + 1, xv, (c + 1) & 1);
                    if (c + 2 < my_chunks) fetch(c + 2, xv);
                }
                __syncthreads();
            }
        }
    }

    // The rows' sums of squares of this slice: the 16 threads of a row are 16 consecutive lanes.
    if (norm) {
#pragma unroll
        for (int i = 0; i < XPT; ++i) {
            const int p = threadIdx.x + i * WD_THREADS;
            if (p >= PIECES) continue;  // whole warps
            float s = sq[i];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            s += __shfl_xor_sync(0xffffffffu, s, 4);
            s += __shfl_xor_sync(0xffffffffu, s, 8);
            if (p % (WD_CHUNK / 4) == 0) ss_s[p / (WD_CHUNK / 4)] = s;
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
