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
// Channel pairs a thread stages per step (each of the window's rows holds 8 pairs).
constexpr int IC_PAIRS = window_rows(IMPLICIT_CONV_MAX_TAIL) * (IC_KC / 2) / IC_THREADS;
static_assert(window_rows(IMPLICIT_CONV_MAX_TAIL) * (IC_KC / 2) % IC_THREADS == 0, "whole pair groups per thread");

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

__device__ __forceinline__ void store_shared_u32(uint32_t address, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(address), "r"(v) : "memory");
}

// grid.x: streams x column tiles of IC_BN (stream-major), grid.y: output tiles of IC_BM.
__global__ void __launch_bounds__(IC_THREADS, 2)
    implicit_conv_kernel(DecoderStates states, size_t tails_at, ImplicitConvShape sh, const float* __restrict__ x,
                         SnakeParams snake, ImplicitConvWeights w, bool accumulate, float* __restrict__ y) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int L = sh.tail(), K = sh.K, C = sh.C, T = sh.T, M = sh.M;
    const int tiles = (T + IC_BN - 1) / IC_BN;
    const int b = int(blockIdx.x) / tiles, t0 = (int(blockIdx.x) - b * tiles) * IC_BN;
    const int m0 = int(blockIdx.y) * IC_BM;
    const int ld_signal = states.count * T;
    const int rows = window_rows(L), steps = C / IC_KC;
    const IcLayout lay(K, L);
    const uint32_t base = uint32_t(__cvta_generic_to_shared(smem));
    const int warp = int(threadIdx.x) >> 5, lane = int(threadIdx.x) & 31;

    // The weight tiles of channels 16·step .. (every tap, both planes) into buffer `buf`; rows past M are zeros.
    auto weights_load = [&](int step, int buf) {
        const int items = 2 * K * IC_BM * 2;  // plane, tap, row, half
        for (int i = int(threadIdx.x); i < items; i += IC_THREADS) {
            const int h = i & 1, r = (i >> 1) % IC_BM, tap_plane = (i >> 1) / IC_BM;
            const int j = tap_plane % K, p = tap_plane / K;
            const int o = m0 + r;
            const bool inside = o < M;
            const bf16_t* plane = p ? w.lo : w.hi;
            const bf16_t* src = inside ? plane + size_t(j) * w.tap_stride + size_t(o) * w.ld + step * IC_KC + h * 8 : plane;
            copy_async16(smem + size_t(buf) * lay.buffer + p * lay.a_plane + uint32_t(j) * IC_BM * IC_ROW_BYTES +
                             tile_at(r, h),
                         src, inside);
        }
    };
    // The window: row r is column t0 + r of [tail | snake(x)] (zeros past T + L), 8 channel pairs
    // per row; item f of a step is row 8·(f / 64) + f % 8, pair 4·((f / 32) % 2) + (f % 32) / 8, so
    // a warp reads 8 consecutive columns (32 bytes) of 4 channels at a time and its pair stores
    // fill the 32 banks once.
    auto item_row = [](int f) { return (f >> 6) * 8 + (f & 7); };
    auto item_pair = [](int f) { return ((f >> 5) & 1) * 4 + ((f & 31) >> 3); };
    TailSlots slots{nullptr, nullptr};
    float2 staged[IC_PAIRS];
    auto window_fetch = [&](int step) {
#pragma unroll
        for (int i = 0; i < IC_PAIRS; ++i) {
            const int f = int(threadIdx.x) + i * IC_THREADS;
            float2 v = make_float2(0.0f, 0.0f);
            if (f < rows * (IC_KC / 2)) {
                const int s = t0 + item_row(f), c = step * IC_KC + 2 * item_pair(f);
                if (s < L) {
                    v.x = slots.tail[size_t(c) * L + s];
                    v.y = slots.tail[size_t(c + 1) * L + s];
                } else if (s - L < T) {
                    const float* xc = x + size_t(c) * ld_signal + size_t(b) * T + (s - L);
                    v.x = xc[0];
                    v.y = xc[ld_signal];
                }
            }
            staged[i] = v;
        }
    };
    const bool tail_writer = L > 0 && blockIdx.y == 0 && t0 + IC_BN >= T;  // this stream's last columns
    auto window_store = [&](int step, int buf) {
        const uint32_t hi_at = base + uint32_t(buf) * lay.buffer + lay.a_bytes, lo_at = hi_at + lay.w_plane;
#pragma unroll
        for (int i = 0; i < IC_PAIRS; ++i) {
            const int f = int(threadIdx.x) + i * IC_THREADS;
            if (f >= rows * (IC_KC / 2)) continue;
            const int r = item_row(f), pair = item_pair(f), s = t0 + r, c = step * IC_KC + 2 * pair;
            float2 v = staged[i];
            if (s >= L && s - L < T && snake.alpha) {
                v.x = snake_eval(v.x, snake.alpha[c], snake.inv_beta[c]);
                v.y = snake_eval(v.y, snake.alpha[c + 1], snake.inv_beta[c + 1]);
            }
            if (tail_writer && s >= T && s < T + L) {
                slots.next[size_t(c) * L + (s - T)] = v.x;
                slots.next[size_t(c + 1) * L + (s - T)] = v.y;
            }
            uint32_t hi, lo;
            split_pair(v.x, v.y, hi, lo);
            const uint32_t at = tile_at(r, pair >> 2) + uint32_t(pair & 3) * 4;
            store_shared_u32(hi_at + at, hi);
            store_shared_u32(lo_at + at, lo);
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
#pragma unroll
            for (int mt = 0; mt < 4; ++mt)
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    mma_16816(acc[mt][nt], a_hi[mt][0], a_hi[mt][1], a_hi[mt][2], a_hi[mt][3], b_hi[nt][0], b_hi[nt][1]);
                    mma_16816(acc[mt][nt], a_hi[mt][0], a_hi[mt][1], a_hi[mt][2], a_hi[mt][3], b_lo[nt][0], b_lo[nt][1]);
                    mma_16816(acc[mt][nt], a_lo[mt][0], a_lo[mt][1], a_lo[mt][2], a_lo[mt][3], b_hi[nt][0], b_hi[nt][1]);
                }
        }
    };

    // The first weight tiles do not depend on the previous kernel: they stream in before the wait.
    weights_load(0, 0);
    copy_async_commit();
    pdl_wait();
    pdl_trigger();
    if (L > 0) slots = tail_slots(states, b, tails_at, C, L);
    window_fetch(0);
    window_store(0, 0);
    for (int step = 0; step < steps; ++step) {
        const int buf = step & 1;
        const bool more = step + 1 < steps;
        if (more) {
            weights_load(step + 1, buf ^ 1);
            copy_async_commit();
            window_fetch(step + 1);  // in flight while this step multiplies
            copy_async_wait<1>();
        } else {
            copy_async_wait<0>();
        }
        __syncthreads();  // this step's weights and window are in place
        multiply(buf);
        if (more) window_store(step + 1, buf ^ 1);
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

void implicit_conv(DecoderStates states, size_t tails_at, const ImplicitConvShape& sh, const float* x,
                   SnakeParams snake, const ImplicitConvWeights& w, bool accumulate, float* y, const Launch& l) {
    if (!implicit_conv_supported(w, sh) || !x || !y || states.count < 1 || (sh.tail() > 0 && !states.blocks) ||
        (snake.alpha && !snake.inv_beta))
        check_fail("implicit_conv", "unsupported arguments", __func__, __FILE__, __LINE__);
    const long long tiles = (sh.T + IC_BN - 1) / IC_BN, blocks_x = tiles * states.count;
    const int blocks_y = (sh.M + IC_BM - 1) / IC_BM;
    if (blocks_x > 0x7fffffffLL || blocks_y > 65535 || (long long)states.count * sh.T > 0x7fffffffLL)
        check_fail("implicit_conv", "too many columns or outputs", __func__, __FILE__, __LINE__);
    const size_t smem = IcLayout(sh.K, sh.tail()).bytes();
    static std::atomic<uint64_t> raised{0};
    smem_limit_raise(implicit_conv_kernel, smem, raised);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(unsigned(blocks_x), unsigned(blocks_y)), dim3(IC_THREADS), smem,
                                    implicit_conv_kernel, states, tails_at, sh, x, snake, w, accumulate, y));
}

}  // namespace qtts::kernels
