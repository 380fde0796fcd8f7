// The decoder's causal convolutions without an im2col (see implicit_conv.cuh for the design).
#include "kernels/implicit_conv.cuh"

#include <atomic>

#include "kernels/arch.cuh"
#include "kernels/check.cuh"
#include "kernels/decoder_device.cuh"
#include "kernels/mma.cuh"

namespace qtts::kernels {

namespace {

constexpr int IC_BM = IMPLICIT_CONV_TILE_OUTPUTS;  // outputs per block: four m16 tiles, every warp all of them
constexpr int IC_BN = IMPLICIT_CONV_TILE_COLUMNS;  // columns per block: 32 per warp (four n8 tiles)
constexpr int IC_WARPS = 4;
constexpr int IC_THREADS = 32 * IC_WARPS;
constexpr int IC_KC = 16;        // input channels per step (the k of m16n8k16)
constexpr int IC_ROW_BYTES = 32;  // a tile row: 16 bf16 values (one output's or one column's 16 channels)
static_assert(IC_BN == 32 * IC_WARPS, "a warp owns 32 columns");
// The window of a block's columns: IC_BN + tail rows, padded to whole groups of 8 rows.
constexpr int window_rows(int tail) { return (IC_BN + tail + 7) / 8 * 8; }

// Shared memory: two buffers (the step being multiplied and the next one), each the weight tiles
// [plane hi/lo][tap][IC_BM rows][32 bytes] and the window [plane hi/lo][rows][32 bytes].
struct IcLayout {
    uint32_t a_plane, a_bytes, w_plane, buffer;
    __host__ __device__ IcLayout(int K, int tail) {
        a_plane = uint32_t(K) * IC_BM * IC_ROW_BYTES;
        a_bytes = 2 * a_plane;
        w_plane = uint32_t(window_rows(tail)) * IC_ROW_BYTES;
        buffer = a_bytes + 2 * w_plane;
    }
    size_t bytes() const { return 2 * size_t(buffer); }
};

// Byte offset of the 16-byte half h (channels 8h .. 8h + 7) of tile row r. The halves of rows
// 4-7 of every 8 swap places, so that ldmatrix over any 8 consecutive rows (a tap's shifted
// columns start anywhere) touches each bank once.
__device__ __forceinline__ uint32_t tile_at(int r, int h) {
    return uint32_t(r) * IC_ROW_BYTES + uint32_t((h ^ (r >> 2)) & 1) * 16;
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// The first launch: window [2 planes][S][L + T][C] bf16, row u of stream s = column u of its
// [tail | snake(x)] split into hi and lo (time-major: a row's 16 channels of a step are 32
// contiguous bytes, which the product's cp.async copies take as they are). The block holding a
// stream's last columns also writes the next tail (fp32, the other slot), as conv_im2col_carry
// does. A block transposes 32 columns x 32 channels through shared memory, so that both the
// reads of x (along time) and the writes of the planes (along channels) are coalesced.
// grid (columns / 32, C / 32, S), block (32, 8).
constexpr int WP_TILE = 32;
__global__ void __launch_bounds__(WP_TILE * 8)
    implicit_conv_window_kernel(DecoderStates states, size_t tails_at, ImplicitConvShape sh, const float* __restrict__ x,
                                SnakeParams snake, bf16_t* __restrict__ window) {
    __shared__ float tile[WP_TILE][WP_TILE + 1];  // [channel][column]
    pdl_wait();
    pdl_trigger();
    const int L = sh.tail(), T = sh.T, C = sh.C, U = L + T, b = int(blockIdx.z);
    const int u0 = int(blockIdx.x) * WP_TILE, c0 = int(blockIdx.y) * WP_TILE;
    const int ld_signal = states.count * T;
    TailSlots slots{nullptr, nullptr};
    if (L > 0) slots = tail_slots(states, b, tails_at, C, L);
    const int u = u0 + int(threadIdx.x);
    for (int i = int(threadIdx.y); i < WP_TILE; i += 8) {
        const int c = c0 + i;
        float v = 0.0f;
        if (u < U && c < C) {
            if (u < L) {
                v = slots.tail[size_t(c) * L + u];
            } else {
                v = x[size_t(c) * ld_signal + size_t(b) * T + (u - L)];
                if (snake.alpha) v = snake_eval(v, snake.alpha[c], snake.inv_beta[c]);
            }
            if (L > 0 && u >= T) slots.next[size_t(c) * L + (u - T)] = v;  // the last L columns: the next tail
        }
        tile[i][threadIdx.x] = v;
    }
    __syncthreads();
    const size_t plane = size_t(states.count) * U * C;
    const int c = c0 + int(threadIdx.x);
    for (int i = int(threadIdx.y); i < WP_TILE; i += 8) {
        const int uu = u0 + i;
        if (uu >= U || c >= C) continue;
        bf16_t hi, lo;
        bf16_split(tile[threadIdx.x][i], &hi, &lo);
        const size_t at = (size_t(b) * U + uu) * C + c;
        window[at] = hi;
        window[plane + at] = lo;
    }
}

// The product. grid.x: streams x column tiles of IC_BN (stream-major), grid.y: output tiles of IC_BM.
// Each step (16 channels) copies its weight tiles and its window rows into one of two buffers
// while the other is multiplied; thread t copies rows t / 2 (+ 64 i) of both planes, half t % 2.
__global__ void __launch_bounds__(IC_THREADS, 2)
    implicit_conv_kernel(int streams, ImplicitConvShape sh, const bf16_t* __restrict__ window, ImplicitConvWeights w,
                         bool accumulate, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int L = sh.tail(), K = sh.K, C = sh.C, T = sh.T, M = sh.M, U = L + T;
    const int tiles = (T + IC_BN - 1) / IC_BN;
    const int b = int(blockIdx.x) / tiles, t0 = (int(blockIdx.x) - b * tiles) * IC_BN;
    const int m0 = int(blockIdx.y) * IC_BM;
    const int ld_signal = streams * T;
    const int rows = window_rows(L), steps = C / IC_KC;
    const IcLayout lay(K, L);
    const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;
    const int my_row = int(threadIdx.x) >> 1, my_half = int(threadIdx.x) & 1;
    static_assert(IC_THREADS == 2 * IC_BM, "a thread copies one half row of every weight tile");

    // The weight tiles of channels 16·step .. (every tap, both planes); rows past M are zeros.
    const bool row_inside = m0 + my_row < M;
    const size_t my_weights = row_inside ? size_t(m0 + my_row) * w.ld + my_half * 8 : 0;
    auto weights_load = [&](int step, int buf) {
        unsigned char* dst = smem + size_t(buf) * lay.buffer + tile_at(my_row, my_half);
        for (int j = 0; j < K; ++j) {
            const size_t at = row_inside ? my_weights + size_t(j) * w.tap_stride + step * IC_KC : 0;
            copy_async16(dst + uint32_t(j) * IC_BM * IC_ROW_BYTES, w.hi + at, row_inside);
            copy_async16(dst + lay.a_plane + uint32_t(j) * IC_BM * IC_ROW_BYTES, w.lo + at, row_inside);
        }
    };
    // The window rows t0 .. t0 + rows - 1 of this stream (zeros past U).
    const size_t plane = size_t(streams) * U * C;
    const bf16_t* my_window = window + size_t(b) * U * C + my_half * 8;
    auto window_load = [&](int step, int buf) {
        unsigned char* dst = smem + size_t(buf) * lay.buffer + lay.a_bytes;
        for (int r = my_row; r < rows; r += IC_BM) {
            const int u = t0 + r;
            const bool inside = u < U;
            const bf16_t* src = inside ? my_window + size_t(u) * C + step * IC_KC : window;
            copy_async16(dst + tile_at(r, my_half), src, inside);
            copy_async16(dst + lay.w_plane + tile_at(r, my_half), inside ? src + plane : window, inside);
        }
    };

    float acc[4][4][4];  // [m16 tile][n8 tile][fragment]
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int nt = 0; nt < 4; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;
    // Every tap of one step: W_hi·x_hi + W_hi·x_lo + W_lo·x_hi for the warp's 64 x 32 outputs.
    auto multiply = [&](int buf) {
        const uint32_t a_at = base + uint32_t(buf) * lay.buffer, w_at = a_at + lay.a_bytes;
        const int mat = lane >> 3, mat_row = lane & 7;
        for (int j = 0; j < K; ++j) {
            uint32_t a_hi[4][4], a_lo[4][4], b_hi[4][2], b_lo[4][2];
#pragma unroll
            for (int mt = 0; mt < 4; ++mt) {
                const uint32_t at = uint32_t(j) * IC_BM * IC_ROW_BYTES + tile_at(mt * 16 + (mat & 1) * 8 + mat_row, mat >> 1);
                ldmatrix_x4(a_hi[mt], a_at + at);
                ldmatrix_x4(a_lo[mt], a_at + lay.a_plane + at);
            }
#pragma unroll
            for (int np = 0; np < 2; ++np) {
                const int r = warp * 32 + np * 16 + (mat >> 1) * 8 + mat_row + j * sh.dilation;
                uint32_t h[4], l[4];
                ldmatrix_x4(h, w_at + tile_at(r, mat & 1));
                ldmatrix_x4(l, w_at + lay.w_plane + tile_at(r, mat & 1));
                b_hi[2 * np][0] = h[0];
                b_hi[2 * np][1] = h[1];
                b_hi[2 * np + 1][0] = h[2];
                b_hi[2 * np + 1][1] = h[3];
                b_lo[2 * np][0] = l[0];
                b_lo[2 * np][1] = l[1];
                b_lo[2 * np + 1][0] = l[2];
                b_lo[2 * np + 1][1] = l[3];
            }
            // The three products in three passes over the 16 tiles: an mma waits for the one before it
            // into the same sums, and the products are issued in program order, so each one of a
            // tile is 16 issues after the last.
#pragma unroll
            for (int term = 0; term < 3; ++term)
#pragma unroll
                for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                    for (int nt = 0; nt < 4; ++nt) {
                        const uint32_t(&a)[4] = term == 2 ? a_lo[mt] : a_hi[mt];
                        const uint32_t(&bb)[2] = term == 1 ? b_lo[nt] : b_hi[nt];
                        mma_16816(acc[mt][nt], a[0], a[1], a[2], a[3], bb[0], bb[1]);
                    }
        }
    };

    // The first weight tiles do not depend on the previous kernel: they stream in before the wait.
    weights_load(0, 0);
    pdl_wait();
    pdl_trigger();
    window_load(0, 0);
    copy_async_commit();
    for (int step = 0; step < steps; ++step) {
        const int buf = step & 1;
        if (step + 1 < steps) {
            weights_load(step + 1, buf ^ 1);
            window_load(step + 1, buf ^ 1);
            copy_async_commit();
            copy_async_wait<1>();
        } else {
            copy_async_wait<0>();
        }
        __syncthreads();  // this step's weights and window are in place
        multiply(buf);
        __syncthreads();  // nobody reads this buffer any more: the next step may refill it
    }

    // y[o, b·T + t] (+)= bias[o] + sums; fragment e: row g (e < 2) or g + 8, column 2q + (e & 1).
    const int g = lane >> 2, q = lane & 3;
    const bool pairs = T % 2 == 0;  // then two neighbouring columns are one aligned 8-byte store
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int o = m0 + mt * 16 + g + half * 8;
            if (o >= M) continue;
            const float bias = w.bias ? w.bias[o] : 0.0f;
            float* row = y + size_t(o) * ld_signal + size_t(b) * T;
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) {
                const int t = t0 + warp * 32 + nt * 8 + 2 * q;
                float v0 = acc[mt][nt][2 * half] + bias, v1 = acc[mt][nt][2 * half + 1] + bias;
                if (pairs && t + 1 < T) {
                    float2* p = reinterpret_cast<float2*>(row + t);
                    if (accumulate) {
                        const float2 old = *p;
                        v0 += old.x;
                        v1 += old.y;
                    }
                    *p = make_float2(v0, v1);
                } else {
                    if (t < T) row[t] = accumulate ? row[t] + v0 : v0;
                    if (t + 1 < T) row[t + 1] = accumulate ? row[t + 1] + v1 : v1;
                }
            }
        }
}

}  // namespace

bool implicit_conv_supported(const ImplicitConvWeights& w, const ImplicitConvShape& sh) {
    return sh.C > 0 && sh.C % IC_KC == 0 && sh.M > 0 && sh.T > 0 && sh.K >= 1 && sh.K <= IMPLICIT_CONV_MAX_TAPS &&
           sh.dilation >= 1 && sh.tail() <= IMPLICIT_CONV_MAX_TAIL && w.hi && w.lo && w.ld >= sh.C && w.ld % 8 == 0 &&
           w.tap_stride % 8 == 0 && (sh.K == 1 || w.tap_stride >= size_t(sh.M) * size_t(w.ld)) &&
           is_aligned(w.hi, 16) && is_aligned(w.lo, 16);
}

size_t implicit_conv_window_elements(const ImplicitConvShape& sh, int streams) {
    return 2 * size_t(streams) * size_t(sh.tail() + sh.T) * size_t(sh.C);
}

void implicit_conv(DecoderStates states, size_t tails_at, const ImplicitConvShape& sh, const float* x,
                   SnakeParams snake, const ImplicitConvWeights& w, bool accumulate, float* y,
                   const ImplicitConvScratch& scratch, const Launch& l) {
    if (!implicit_conv_supported(w, sh) || !x || !y || states.count < 1 || (sh.tail() > 0 && !states.blocks) ||
        (snake.alpha && !snake.inv_beta) || !scratch.window || !is_aligned(scratch.window, 16) ||
        scratch.elements < implicit_conv_window_elements(sh, states.count))
        check_fail("implicit_conv", "unsupported arguments", __func__, __FILE__, __LINE__);
    const long long tiles = (sh.T + IC_BN - 1) / IC_BN, blocks_x = tiles * states.count;
    const int blocks_y = (sh.M + IC_BM - 1) / IC_BM, U = sh.tail() + sh.T;
    if (blocks_x > 0x7fffffffLL || blocks_y > 65535 || states.count > 65535 ||
        (long long)states.count * sh.T > 0x7fffffffLL)
        check_fail("implicit_conv", "too many columns or outputs", __func__, __FILE__, __LINE__);
    const dim3 window_grid(unsigned((U + WP_TILE - 1) / WP_TILE), unsigned((sh.C + WP_TILE - 1) / WP_TILE),
                           unsigned(states.count));
    KERNEL_CUDA_CHECK(launch_kernel(l, window_grid, dim3(WP_TILE, 8), 0, implicit_conv_window_kernel, states,
                                    tails_at, sh, x, snake, scratch.window));
    const size_t smem = IcLayout(sh.K, sh.tail()).bytes();
    static std::atomic<uint64_t> raised{0};
    smem_limit_raise(implicit_conv_kernel, smem, raised);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(unsigned(blocks_x), unsigned(blocks_y)), dim3(IC_THREADS), smem,
                                    implicit_conv_kernel, states.count, sh, scratch.window, w, accumulate, y));
}

}  // namespace qtts::kernels
