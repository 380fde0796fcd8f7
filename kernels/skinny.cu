// One-launch tensor-core products over a few rows (see skinny.cuh for the design).
#include "kernels/skinny.cuh"

#include <atomic>

#include "kernels/check.cuh"
#include "kernels/mma.cuh"

namespace qtts::kernels {

namespace {

constexpr int SK_WARPS = 8;          // warps of a block, splitting the inputs (twice as many for few blocks)
constexpr int SK_FEW_BLOCKS = 256;   // products with fewer blocks (about 2 per SM) take 2 x SK_WARPS warps
constexpr int SK_FEATURES = 16;      // output features per tile (the m of m16n8k16)
constexpr int SK_STEP = 32;          // inputs per warp step: two m16n8k16 products per 8 rows
constexpr int SK_PREFETCH = 4;       // weight steps a warp keeps in flight with one tile (registers)
constexpr int SK_RING_STEPS = 8;     // the same through a shared-memory ring (twice the bytes in flight)
// Products of at least this many tiles take two per block by default. Measured on the H200 (1.7B,
// 4-32 rows): 192-768 tiles 8-32% faster with two, 64-128 tiles (the o, down and predictor
// head products: 16-warp blocks, 1 per SM or fewer) 10-40% slower.
constexpr int SK_TWO_TILES_MIN = 192;

// Weight steps a warp keeps in flight: the same bytes for one tile or two.
constexpr int skinny_depth(bool ring, int tiles) { return (ring ? SK_RING_STEPS : SK_PREFETCH) / tiles; }
// Shared memory: every warp's sums, [warps][nt][32 lanes][4] floats, then with the shared-memory
// ring every warp's weight steps, [warps][depth][tiles][2 halves][32 lanes] 16-byte pieces.
constexpr size_t skinny_smem(int nt, int warps, int tiles, bool ring) {
    return size_t(warps) * size_t(nt) * 32 * 4 * sizeof(float) +
           (ring ? size_t(warps) * size_t(skinny_depth(true, tiles)) * size_t(tiles) * 2 * 32 * 16 : 0);
}

// A 16-byte copy global -> shared that bypasses L1; `valid` false writes zeros (nothing is read).
__device__ __forceinline__ void copy_async16(void* dst, const void* src, bool valid) {
    const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most PENDING of this thread's newest copy groups are in flight.
template <int PENDING>
__device__ __forceinline__ void copy_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory");
}
// NT: n-tiles of 8 x rows (rows <= 8 NT). A tile's 16 weight rows are 16 features of W; with
// `features` 8, 8 features of W in tile rows 0-7 (rows 8-15 are zero: twice the blocks for
// products with few features); for SwiGLU, 8 gate rows of W (tile rows 0-7) and the same 8 up
// rows of W2 (tile rows 8-15), so a lane holds a feature's gate and up sums together.
// WARPS: warps per block (8, or 16 when the product has few blocks: more loads in flight per SM
// and half the steps per warp on long inputs).
// TILES: tiles per block (1 or 2), side by side over consecutive features: a warp splits and
// multiplies each x piece once for all of them, so the x rows are read from L2 once per TILES
// tiles (what grows with the rows) and a warp has TILES times the weight loads in flight. Every
// feature's sum is made by the same warps over the same steps in the same order for any TILES,
// so the results are the same bits.
// RING: where a warp keeps its weight steps in flight: registers (false: SK_PREFETCH steps, as
// many as the registers allow beside x), or a ring in shared memory filled by cp.async (true:
// SK_RING_STEPS steps, twice the bytes in flight per SM; each lane reads back only the pieces it
// copied itself, so a per-thread wait is the only synchronisation). The same sums either way.
// NORM: the input rule is RMSNorm (a.input; two kernels so that the plain one holds no norm
// weights in registers and loads x in longer groups, below). The same sums as one kernel.
template <int NT, int WARPS, int TILES, bool RING, bool NORM>
__global__ void __launch_bounds__(WARPS * 32, WARPS == 16 ? 1 : 2) skinny_kernel(GemvArgs a, int features) {
    extern __shared__ __align__(16) float sk_sums[];
    __shared__ float ss_part[WARPS][NT * 8];  // the warps' sums of squares of the rows
    __shared__ float row_scale[NT * 8];
    constexpr int PREFETCH = skinny_depth(RING, TILES);

    const int kw = threadIdx.x / 32, lane = threadIdx.x % 32;  // kw: the warp, = its first input step
    const int g = lane / 4, q = lane % 4;
    const bool swiglu = a.output == GemvOutput::GEMV_OUTPUT_SWIGLU;
    const bool upper = swiglu || features == SK_FEATURES;  // tile rows 8-15 hold weights
    const int f0 = blockIdx.x * features * TILES;

    // This lane's weight rows in each tile, tile rows g and g + 8 (rows past `out` read the last
    // row; their sums are never stored).
    const size_t in = size_t(a.in);
    const bf16_t* w0[TILES];
    const bf16_t* w8[TILES];
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        const int ft = f0 + t * features;
        w0[t] = a.w + size_t(min(ft + g, a.out - 1)) * in;
        w8[t] = swiglu ? a.w2 + size_t(min(ft + g, a.out - 1)) * in : a.w + size_t(min(ft + g + 8, a.out - 1)) * in;
    }
    const int steps = (a.in + SK_STEP - 1) / SK_STEP;
    const int mine = kw < steps ? (steps - 1 - kw) / WARPS + 1 : 0;  // this warp's: kw, kw + WARPS, ...
    // Input offset of this lane's 8-input piece in the warp's j-th step (>= in: past the end).
    const auto piece = [&](int j) { return (kw + j * WARPS) * SK_STEP + 8 * q; };
    // The weight ring: slot i holds a step's two 16-byte halves (tile rows g and g + 8) per tile,
    // in registers or in this warp's part of the shared memory (lane-contiguous pieces).
    uint4 wreg[RING ? 1 : PREFETCH][TILES][2];
    uint4* const wring = reinterpret_cast<uint4*>(sk_sums + skinny_smem(NT, WARPS, TILES, false) / sizeof(float)) +
                         size_t(kw) * PREFETCH * TILES * 2 * 32 + lane;
    const auto slot = [&](int i, int t, int half) { return wring + ((i * TILES + t) * 2 + half) * 32; };
    // Step j into slot i (zeros past the end); with the shared ring, one copy group per step.
    const auto load_step = [&](int j, int i) {
        const int k = piece(j);
        const bool inside = j < mine && k < a.in;
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
            if constexpr (RING) {
                copy_async16(slot(i, t, 0), inside ? w0[t] + k : a.w, inside);
                copy_async16(slot(i, t, 1), inside && upper ? w8[t] + k : a.w, inside && upper);
            } else {
                wreg[RING ? 0 : i][t][0] = inside ? load_weights(w0[t] + k) : make_uint4(0u, 0u, 0u, 0u);
                wreg[RING ? 0 : i][t][1] = inside && upper ? load_weights(w8[t] + k) : make_uint4(0u, 0u, 0u, 0u);
            }
        }
        if constexpr (RING) copy_async_commit();
    };

    // No L2 prefetch of the block's rows before the wait: those requests (the whole matrix) queued
    // ahead of the previous kernel's own loads; without them a 4-row step took 5% less, 16 rows
    // up to 2% ("Forty-sixth session", docs/performance.md; gemv_device.cuh, GEMV_PREFETCH_MAX_BYTES).
#pragma unroll
    for (int i = 0; i < PREFETCH; ++i) load_step(i, i);
    pdl_wait();  // the weights above are constant; x comes from the previous kernel
    pdl_trigger();

    float acc[TILES][NT][4];
    float sumsq[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        sumsq[n] = 0.0f;
#pragma unroll
        for (int t = 0; t < TILES; ++t)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[t][n][e] = 0.0f;
    }

    // x (and the norm weight) for XG steps at a time, all loads issued before their products, so
    // a warp waits for L2 once per group rather than once per step (XG shrinks as rows grow, to
    // stay within the registers; without the norm weights twice as long, which measured ~1.2 us
    // a launch saved per group a warp no longer waits for: docs/performance.md). The same sums
    // for any XG.
    constexpr int XG_ROWS = NT == 1 ? (NORM ? 4 : 8) : (NT == 2 ? (NORM ? 2 : 4) : 1);
    constexpr int XG = XG_ROWS < PREFETCH ? XG_ROWS : PREFETCH;
    static_assert(PREFETCH % XG == 0, "x groups must tile the weight ring");
    for (int j0 = 0; j0 < mine; j0 += PREFETCH) {
#pragma unroll
        for (int h = 0; h < PREFETCH; h += XG) {
            float4 xv[XG][NT][2];
            float4 nw[XG][2];
#pragma unroll
            for (int s = 0; s < XG; ++s) {
                const int k = piece(j0 + h + s);
                const bool inside = j0 + h + s < mine && k < a.in;
                nw[s][0] = nw[s][1] = make_float4(1.f, 1.f, 1.f, 1.f);
                if (NORM && inside) {
                    nw[s][0] = *reinterpret_cast<const float4*>(a.norm_w + k);
                    nw[s][1] = *reinterpret_cast<const float4*>(a.norm_w + k + 4);
                }
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    const int r = n * 8 + g;
                    xv[s][n][0] = xv[s][n][1] = make_float4(0.f, 0.f, 0.f, 0.f);
                    if (inside && r < a.rows) {
                        const float* xr = a.x + size_t(r) * size_t(a.ldx) + k;
                        xv[s][n][0] = *reinterpret_cast<const float4*>(xr);
                        xv[s][n][1] = *reinterpret_cast<const float4*>(xr + 4);
                    }
                }
            }
#pragma unroll
            for (int s = 0; s < XG; ++s) {
                const int i = h + s;
                if (j0 + i >= mine) break;  // warp-uniform: every lane runs the mma below
                // Slot i's step: the oldest of the PREFETCH copy groups in flight (shared ring).
                uint4 wi[TILES][2];
                if constexpr (RING) copy_async_wait<PREFETCH - 1>();
#pragma unroll
                for (int t = 0; t < TILES; ++t)
#pragma unroll
                    for (int half = 0; half < 2; ++half)
                        wi[t][half] = RING ? *slot(i, t, half) : wreg[RING ? 0 : i][t][half];
#pragma unroll
                for (int n = 0; n < NT; ++n) {
                    float4 x0 = xv[s][n][0], x1 = xv[s][n][1];
                    if constexpr (NORM) {
                        sumsq[n] += x0.x * x0.x + x0.y * x0.y + x0.z * x0.z + x0.w * x0.w + x1.x * x1.x +
                                    x1.y * x1.y + x1.z * x1.z + x1.w * x1.w;
                        const float4 n0 = nw[s][0], n1 = nw[s][1];
                        x0 = make_float4(x0.x * n0.x, x0.y * n0.y, x0.z * n0.z, x0.w * n0.w);
                        x1 = make_float4(x1.x * n1.x, x1.y * n1.y, x1.z * n1.z, x1.w * n1.w);
                    }
                    uint32_t hi[4], lo[4];
                    split_pair(x0.x, x0.y, hi[0], lo[0]);
                    split_pair(x0.z, x0.w, hi[1], lo[1]);
                    split_pair(x1.x, x1.y, hi[2], lo[2]);
                    split_pair(x1.z, x1.w, hi[3], lo[3]);
#pragma unroll
                    for (int t = 0; t < TILES; ++t) {
                        const uint4& r0 = wi[t][0];
                        const uint4& r8 = wi[t][1];
                        mma_16816(acc[t][n], r0.x, r8.x, r0.y, r8.y, hi[0], hi[1]);
                        mma_16816(acc[t][n], r0.z, r8.z, r0.w, r8.w, hi[2], hi[3]);
                        mma_16816(acc[t][n], r0.x, r8.x, r0.y, r8.y, lo[0], lo[1]);
                        mma_16816(acc[t][n], r0.z, r8.z, r0.w, r8.w, lo[2], lo[3]);
                    }
                }
                load_step(j0 + i + PREFETCH, i);  // a ring: this slot takes the step PREFETCH on
            }
        }
    }

    if constexpr (RING) copy_async_wait<0>();  // the copies past the last step (zeros) have landed

    // Tile 0's sums of squares (a row's: lanes 4g .. 4g + 3 of each warp), then each row's scale.
    if constexpr (NORM) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            float s = sumsq[n];
            s += __shfl_xor_sync(0xffffffffu, s, 1);
            s += __shfl_xor_sync(0xffffffffu, s, 2);
            if (q == 0) ss_part[kw][n * 8 + g] = s;
        }
    }
    __syncthreads();
    if (int(threadIdx.x) < a.rows) {
        float scale = 1.0f;
        if (NORM) {
            float s = 0.0f;
#pragma unroll
            for (int v = 0; v < WARPS; ++v) s += ss_part[v][threadIdx.x];
            scale = 1.0f / sqrtf(s / float(a.in) + a.eps);
        }
        row_scale[threadIdx.x] = scale;
    }

    // The full sum of tile row m (0..15) and x row r: the C fragment of m16n8 holds (m, r) at
    // lane (m % 8) * 4 + (r % 8) / 2, element (m / 8) * 2 + r % 2; warps added in order.
    const auto full_sum = [&](int m, int r) {
        const int idx = ((r / 8) * 32 + (m % 8) * 4 + (r % 8) / 2) * 4 + (m / 8) * 2 + r % 2;
        float sum = 0.0f;
#pragma unroll
        for (int v = 0; v < WARPS; ++v) sum += sk_sums[v * NT * 32 * 4 + idx];
        return sum;
    };
    // One tile at a time through the shared sums (the shared memory of one tile, for any TILES).
#pragma unroll
    for (int t = 0; t < TILES; ++t) {
        if (t > 0) __syncthreads();  // the previous tile's sums are read
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<float4*>(sk_sums + ((kw * NT + n) * 32 + lane) * 4) =
                make_float4(acc[t][n][0], acc[t][n][1], acc[t][n][2], acc[t][n][3]);
        __syncthreads();
        const int ft = f0 + t * features;
        for (int o = threadIdx.x; o < features * a.rows; o += blockDim.x) {
            const int m = o % features, r = o / features, f = ft + m;
            if (f >= a.out) continue;
            float* y = a.y + size_t(r) * size_t(a.ldy) + f;
            const float scale = row_scale[r];
            if (swiglu) {
                *y = silu_ref(full_sum(m, r) * scale) * (full_sum(m + 8, r) * scale);
            } else {
                const float v = full_sum(m, r) * scale + (a.bias ? a.bias[f] : 0.0f);
                if (a.output == GemvOutput::GEMV_OUTPUT_ADD)
                    *y += v;
                else
                    *y = v;
            }
        }
    }
}

template <int NT, int WARPS, int TILES, bool RING, bool NORM>
void skinny_launch_kernel(const GemvArgs& a, int features, dim3 grid, size_t smem, const Launch& l) {
    static std::atomic<uint64_t> raised{0};  // one flag word per kernel
    smem_limit_raise(skinny_kernel<NT, WARPS, TILES, RING, NORM>, smem, raised);
    KERNEL_CUDA_CHECK(
        launch_kernel(l, grid, dim3(WARPS * 32), smem, skinny_kernel<NT, WARPS, TILES, RING, NORM>, a, features));
}

template <int NT, int WARPS, int TILES, bool RING>
void skinny_launch(const GemvArgs& a, int features, const Launch& l) {
    constexpr size_t smem = skinny_smem(NT, WARPS, TILES, RING);
    // The blocks an SM should hold (the launch bounds: two of 8 warps, one of 16) fit an sm_90 SM's
    // shared memory; GPUs with less (sm_80: 163 KiB a block, sm_86 / sm_89: 99 KiB) keep the
    // weights in registers where the ring would cost them a block per SM (the same bits).
    constexpr size_t per_sm = (WARPS == 16 ? 1 : 2) * (smem + SMEM_STATIC_ALLOWANCE);
    static_assert(per_sm <= 227 * 1024, "the SM's blocks fit");
    if constexpr (RING) {
        if (per_sm > smem_block_limit()) return skinny_launch<NT, WARPS, TILES, false>(a, features, l);
    }
    const dim3 grid((a.out + features * TILES - 1) / (features * TILES));
    if (a.input == GemvInput::GEMV_INPUT_RMSNORM)
        skinny_launch_kernel<NT, WARPS, TILES, RING, true>(a, features, grid, smem, l);
    else
        skinny_launch_kernel<NT, WARPS, TILES, RING, false>(a, features, grid, smem, l);
}

// 16 warps when the product has few tiles (the choice depends on the shape of W only, never on
// the rows or the tiles per block, so a row's result does not depend on how many rows share the
// launch or how the tiles are grouped).
template <int NT, int TILES, bool RING>
void skinny_launch_warps(const GemvArgs& a, int features, const Launch& l) {
    const int tiles = (a.out + features - 1) / features;
    if (tiles < SK_FEW_BLOCKS)
        skinny_launch<NT, 2 * SK_WARPS, TILES, RING>(a, features, l);
    else
        skinny_launch<NT, SK_WARPS, TILES, RING>(a, features, l);
}

template <int NT, bool RING>
void skinny_launch_tiles(const GemvArgs& a, int features, int tiles, const Launch& l) {
    if (tiles == 2)
        skinny_launch_warps<NT, 2, RING>(a, features, l);
    else
        skinny_launch_warps<NT, 1, RING>(a, features, l);
}

template <int NT>
void skinny_launch_weights(const GemvArgs& a, int features, int tiles, SkinnyWeights weights, const Launch& l) {
    if (weights == SkinnyWeights::SKINNY_WEIGHTS_REGISTERS)
        skinny_launch_tiles<NT, false>(a, features, tiles, l);
    else
        skinny_launch_tiles<NT, true>(a, features, tiles, l);
}


}  // namespace

bool skinny_supported(const GemvArgs& a) {
    if (a.rows < 1 || a.rows > SKINNY_MAX_ROWS || a.in <= 0 || a.in % 8 != 0 || a.out <= 0) return false;
    if (a.input == GemvInput::GEMV_INPUT_GATHER || !a.x || !a.w || !a.y) return false;
    if (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU && !a.w2) return false;
    if (a.input == GemvInput::GEMV_INPUT_RMSNORM && (!a.norm_w || !is_aligned(a.norm_w, 16))) return false;
    // 16-byte loads of weight rows and input rows.
    return is_aligned(a.w, 16) && (!a.w2 || is_aligned(a.w2, 16)) && is_aligned(a.x, 16) && a.ldx % 4 == 0 && a.ldx >= a.in &&
           a.ldy >= a.out;
}

void skinny_product(const GemvArgs& a, const Launch& l, int features, int tiles, SkinnyWeights weights) {
    if (!skinny_supported(a))
        check_fail("skinny_product",
                   "unsupported arguments (rows 1..32, in a positive multiple of 8, 16-byte aligned rows, no "
                   "gathered input, pointers set)",
                   __func__, __FILE__, __LINE__);
    if (features != 0 && features != SK_FEATURES / 2 && features != SK_FEATURES)
        check_fail("skinny_product", "features per block must be 0 (the default), 8 or 16", __func__, __FILE__,
                   __LINE__);
    if (tiles < 0 || tiles > 2)
        check_fail("skinny_product", "tiles per block must be 0 (the default), 1 or 2", __func__, __FILE__, __LINE__);
    if (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU)
        features = SK_FEATURES / 2;
    else if (features == 0)
        features = SK_FEATURES;
    if (tiles == 0) tiles = (a.out + features - 1) / features >= SK_TWO_TILES_MIN ? 2 : 1;
    switch ((a.rows + 7) / 8) {
        case 1: return skinny_launch_weights<1>(a, features, tiles, weights, l);
        case 2: return skinny_launch_weights<2>(a, features, tiles, weights, l);
        case 3: return skinny_launch_weights<3>(a, features, tiles, weights, l);
        default: return skinny_launch_weights<4>(a, features, tiles, weights, l);
    }
}

}  // namespace qtts::kernels
