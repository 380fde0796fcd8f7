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
// Products of at least this many tiles take two per block by default. Measured on the H200 (1.7B,
// 4-32 rows): 192-768 tiles 8-32% faster with two, 64-128 tiles (the o, down and predictor
// head products: 16-warp blocks, 1 per SM or fewer) 10-40% slower.
constexpr int SK_TWO_TILES_MIN = 192;

// Deepest x ring (steps a warp keeps in flight); the launcher takes less where shared memory is short.
constexpr int SK_X_STAGES_MAX = 8;

// Shared memory: every warp's sums, [warps][nt][32 lanes][4] floats, then every warp's x ring,
// [warps][stages][pieces][32 lanes] float4 (pieces: two per 8-row n-tile, two of the norm weight).
constexpr int sk_pieces(int nt) { return 2 * nt + 2; }
constexpr size_t skinny_sums_bytes(int nt, int warps) { return size_t(warps) * size_t(nt) * 32 * 4 * sizeof(float); }
constexpr size_t skinny_smem(int nt, int warps, int stages) {
    return skinny_sums_bytes(nt, warps) + size_t(warps) * size_t(stages) * size_t(sk_pieces(nt)) * 32 * sizeof(float4);
}

// 16-byte copy global -> shared that bypasses L1; src_bytes 0 writes zeros (nothing is read).
__device__ __forceinline__ void copy_async16(float4* dst, const float* src, bool valid) {
    const uint32_t d = uint32_t(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Waits until at most `pending` of this thread's newest copy groups are still in flight
// (an immediate operand: one case per ring depth).
__device__ __forceinline__ void copy_async_wait(int pending) {
    switch (pending) {
        case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
        case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
        case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
        case 3: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
        case 4: asm volatile("cp.async.wait_group 4;" ::: "memory"); break;
        case 5: asm volatile("cp.async.wait_group 5;" ::: "memory"); break;
        case 6: asm volatile("cp.async.wait_group 6;" ::: "memory"); break;
        default: asm volatile("cp.async.wait_group 7;" ::: "memory"); break;
    }
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
// stages: the depth of each warp's x ring (1..SK_X_STAGES_MAX, from the shared memory the launch
// has): the x pieces (and norm weights) of that many steps are in flight at once, copied straight
// into shared memory, so a warp waits for L2 about once per `stages` steps at any row count.
template <int NT, int WARPS, int TILES>
__global__ void __launch_bounds__(WARPS * 32, WARPS == 16 ? 1 : 2) skinny_kernel(GemvArgs a, int features, int stages) {
    extern __shared__ __align__(16) float sk_sums[];
    __shared__ float ss_part[WARPS][NT * 8];  // the warps' sums of squares of the rows
    __shared__ float row_scale[NT * 8];
    // Weight steps in flight per warp: the same bytes for one tile or two.
    constexpr int PREFETCH = SK_PREFETCH / TILES;

    const int kw = threadIdx.x / 32, lane = threadIdx.x % 32;  // kw: the warp, = its first input step
    const int g = lane / 4, q = lane % 4;
    const bool swiglu = a.output == GemvOutput::GEMV_OUTPUT_SWIGLU;
    const bool upper = swiglu || features == SK_FEATURES;  // tile rows 8-15 hold weights
    const int f0 = blockIdx.x * features * TILES;
    const bool norm = a.input == GemvInput::GEMV_INPUT_RMSNORM;

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
    const auto load_step = [&](int j, uint4 (&dst)[TILES][2]) {
        const int k = piece(j);
        const bool inside = j < mine && k < a.in;
#pragma unroll
        for (int t = 0; t < TILES; ++t) {
            dst[t][0] = inside ? load_weights(w0[t] + k) : make_uint4(0u, 0u, 0u, 0u);
            dst[t][1] = inside && upper ? load_weights(w8[t] + k) : make_uint4(0u, 0u, 0u, 0u);
        }
    };

    // The block's weight rows stream into L2 while the previous kernel finishes (contiguous rows:
    // one range, two for SwiGLU), so the loads below mostly hit L2.
    if (threadIdx.x == 0) {
        const uint32_t bytes = uint32_t(size_t(min(features * TILES, a.out - f0)) * in * sizeof(bf16_t));
        prefetch_l2(a.w + size_t(f0) * in, bytes);
        if (swiglu) prefetch_l2(a.w2 + size_t(f0) * in, bytes);
    }
    uint4 wcur[PREFETCH][TILES][2];
#pragma unroll
    for (int i = 0; i < PREFETCH; ++i) load_step(i, wcur[i]);

    // This warp's x ring: step j in slot j % stages, one copy group per step. The norm weights
    // (constant) of the first `stages` steps are copied before the wait, in a group of their own.
    constexpr int PIECES = sk_pieces(NT);
    float4* ring = reinterpret_cast<float4*>(sk_sums + skinny_sums_bytes(NT, WARPS) / sizeof(float)) +
                   size_t(kw) * stages * PIECES * 32 + lane;
    const auto copy_norm = [&](int j) {
        const int k = piece(j);
        const bool inside = norm && j < mine && k < a.in;
        float4* slot = ring + (j % stages) * PIECES * 32;
        copy_async16(slot + (2 * NT) * 32, inside ? a.norm_w + k : a.norm_w, inside);
        copy_async16(slot + (2 * NT + 1) * 32, inside ? a.norm_w + k + 4 : a.norm_w, inside);
    };
    const auto copy_x = [&](int j) {
        const int k = piece(j);
        const bool inside = j < mine && k < a.in;
        float4* slot = ring + (j % stages) * PIECES * 32;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int r = n * 8 + g;
            const bool valid = inside && r < a.rows;
            const float* xr = valid ? a.x + size_t(r) * size_t(a.ldx) + k : a.x;
            copy_async16(slot + (2 * n) * 32, xr, valid);
            copy_async16(slot + (2 * n + 1) * 32, valid ? xr + 4 : a.x, valid);
        }
    };
    if (norm)
        for (int j = 0; j < stages && j < mine; ++j) copy_norm(j);
    copy_async_commit();
    pdl_wait();  // the weights above are constant; x comes from the previous kernel
    pdl_trigger();
    for (int j = 0; j < stages; ++j) {
        if (j < mine) copy_x(j);
        copy_async_commit();
    }

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

    // Step j: wait for its copy group (the `stages` - 1 newer ones may still be in flight), take
    // its x pieces into registers, multiply, then refill its slot with step j + stages.
    for (int j0 = 0; j0 < mine; j0 += PREFETCH) {
#pragma unroll
        for (int i = 0; i < PREFETCH; ++i) {
            const int j = j0 + i;
            if (j >= mine) break;  // warp-uniform: every lane runs the mma below
            copy_async_wait(stages - 1);
            const float4* slot = ring + (j % stages) * PIECES * 32;
            float4 nw0 = make_float4(1.f, 1.f, 1.f, 1.f), nw1 = nw0;
            if (norm) {
                nw0 = slot[(2 * NT) * 32];
                nw1 = slot[(2 * NT + 1) * 32];
            }
#pragma unroll
            for (int n = 0; n < NT; ++n) {
                float4 x0 = slot[(2 * n) * 32], x1 = slot[(2 * n + 1) * 32];
                if (norm) {
                    sumsq[n] += x0.x * x0.x + x0.y * x0.y + x0.z * x0.z + x0.w * x0.w + x1.x * x1.x +
                                x1.y * x1.y + x1.z * x1.z + x1.w * x1.w;
                    x0 = make_float4(x0.x * nw0.x, x0.y * nw0.y, x0.z * nw0.z, x0.w * nw0.w);
                    x1 = make_float4(x1.x * nw1.x, x1.y * nw1.y, x1.z * nw1.z, x1.w * nw1.w);
                }
                uint32_t hi[4], lo[4];
                split_pair(x0.x, x0.y, hi[0], lo[0]);
                split_pair(x0.z, x0.w, hi[1], lo[1]);
                split_pair(x1.x, x1.y, hi[2], lo[2]);
                split_pair(x1.z, x1.w, hi[3], lo[3]);
#pragma unroll
                for (int t = 0; t < TILES; ++t) {
                    const uint4& r0 = wcur[i][t][0];
                    const uint4& r8 = wcur[i][t][1];
                    mma_16816(acc[t][n], r0.x, r8.x, r0.y, r8.y, hi[0], hi[1]);
                    mma_16816(acc[t][n], r0.z, r8.z, r0.w, r8.w, hi[2], hi[3]);
                    mma_16816(acc[t][n], r0.x, r8.x, r0.y, r8.y, lo[0], lo[1]);
                    mma_16816(acc[t][n], r0.z, r8.z, r0.w, r8.w, lo[2], lo[3]);
                }
            }
            // The slot's values are in registers and used above; refill it.
            if (j + stages < mine) {
                if (norm) copy_norm(j + stages);
                copy_x(j + stages);
            }
            copy_async_commit();
            load_step(j + PREFETCH, wcur[i]);  // a ring: this slot takes the step PREFETCH on
        }
    }

    // Tile 0's sums of squares (a row's: lanes 4g .. 4g + 3 of each warp), then each row's scale.
    if (norm) {
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
        if (norm) {
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

// The x ring's depth: as deep as SK_X_STAGES_MAX allows within the shared memory a block may
// have, shared by the blocks an SM should hold (1 with 16 warps, 2 with 8, as the launch bounds
// say); at least 1.
template <int NT, int WARPS>
int skinny_stages() {
    constexpr int blocks_per_sm = WARPS == 16 ? 1 : 2;
    const size_t per_sm = smem_block_limit() + SMEM_STATIC_ALLOWANCE;  // about the SM's shared memory
    const size_t budget = per_sm / blocks_per_sm - 2 * SMEM_STATIC_ALLOWANCE;
    int stages = SK_X_STAGES_MAX;
    while (stages > 1 && skinny_smem(NT, WARPS, stages) > budget) --stages;
    return stages;
}

template <int NT, int WARPS, int TILES>
void skinny_launch(const GemvArgs& a, int features, const Launch& l) {
    static std::atomic<uint64_t> raised{0};
    const int stages = skinny_stages<NT, WARPS>();
    const size_t smem = skinny_smem(NT, WARPS, stages);
    smem_limit_raise(skinny_kernel<NT, WARPS, TILES>, smem, raised);
    const dim3 grid((a.out + features * TILES - 1) / (features * TILES));
    KERNEL_CUDA_CHECK(
        launch_kernel(l, grid, dim3(WARPS * 32), smem, skinny_kernel<NT, WARPS, TILES>, a, features, stages));
}

// 16 warps when the product has few tiles (the choice depends on the shape of W only, never on
// the rows or the tiles per block, so a row's result does not depend on how many rows share the
// launch or how the tiles are grouped).
template <int NT, int TILES>
void skinny_launch_warps(const GemvArgs& a, int features, const Launch& l) {
    const int tiles = (a.out + features - 1) / features;
    if (tiles < SK_FEW_BLOCKS)
        skinny_launch<NT, 2 * SK_WARPS, TILES>(a, features, l);
    else
        skinny_launch<NT, SK_WARPS, TILES>(a, features, l);
}

template <int NT>
void skinny_launch_tiles(const GemvArgs& a, int features, int tiles, const Launch& l) {
    if (tiles == 2)
        skinny_launch_warps<NT, 2>(a, features, l);
    else
        skinny_launch_warps<NT, 1>(a, features, l);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool skinny_supported(const GemvArgs& a) {
    if (a.rows < 1 || a.rows > SKINNY_MAX_ROWS || a.in <= 0 || a.in % 8 != 0 || a.out <= 0) return false;
    if (a.input == GemvInput::GEMV_INPUT_GATHER || !a.x || !a.w || !a.y) return false;
    if (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU && !a.w2) return false;
    if (a.input == GemvInput::GEMV_INPUT_RMSNORM && (!a.norm_w || !aligned16(a.norm_w))) return false;
    // 16-byte loads of weight rows and input rows.
    if (!aligned16(a.w) || (a.w2 && !aligned16(a.w2)) || !aligned16(a.x) || a.ldx % 4 != 0 || a.ldx < a.in ||
        a.ldy < a.out)
        return false;
    // A 16-warp block with a one-step x ring fits the device's shared memory (32 rows do not on
    // GPUs with 99 KiB a block: their caller takes another path).
    const int nt = (a.rows + 7) / 8;
    return skinny_smem(nt, 2 * SK_WARPS, 1) + SMEM_STATIC_ALLOWANCE <= smem_block_limit();
}

void skinny_product(const GemvArgs& a, const Launch& l, int features, int tiles) {
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
        case 1: return skinny_launch_tiles<1>(a, features, tiles, l);
        case 2: return skinny_launch_tiles<2>(a, features, tiles, l);
        case 3: return skinny_launch_tiles<3>(a, features, tiles, l);
        default: return skinny_launch_tiles<4>(a, features, tiles, l);
    }
}

}  // namespace qtts::kernels
