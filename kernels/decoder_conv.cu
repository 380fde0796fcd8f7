// The implicit-GEMM convolution of the speech decoder (kernels/decoder.cuh, "implicit-GEMM
// convolutions"): y = conv([tail | act(x)]) on tensor cores in split-bf16 arithmetic, without an
// im2col.
//
// Block: 8 warps, 2 along the output channels (MT m16 tiles each: BM = 32·MT channels) x 4 along
// time (32 columns each: BN = 128 columns of one stream). The reduction runs over stages of 32
// input channels; a stage stages the window [t0, t0 + BN + L) of [tail | act(x)] for its channels
// in shared memory, time-major (one row of 32 channels per column, hi and lo planes), so that the
// B operand of tap k is the same rows shifted by k·dilation: ldmatrix takes a row address per
// lane, and the shift costs nothing. The next stage's inputs are loaded into registers while the
// current one computes. A operands (weights) come as ready-made fragments from global memory
// (L1/L2: every block reads the same few hundred KB), one step ahead of their use.
#include "kernels/decoder.cuh"

#include "kernels/check.cuh"
#include "kernels/decoder_device.cuh"
#include "kernels/mma.cuh"

namespace qtts::kernels {

namespace {

using namespace decoder_device;

constexpr int CONV_THREADS = 256;
constexpr int CONV_BN = 128;        // output columns per block
constexpr int CONV_CK = 32;         // input channels per stage
constexpr int CONV_ROW = 40;        // bf16 per staged row: 32 channels + 8 padding (80 bytes: the 8 rows
                                    // one ldmatrix phase reads fall in distinct banks)
constexpr int CONV_MAX_TAIL = 64;
constexpr int CONV_MAX_ROWS = CONV_BN + CONV_MAX_TAIL;
constexpr int CONV_PAIRS = CONV_CK / 2;  // a staged value pair: two channels at one column
constexpr int CONV_PREFETCH = (CONV_PAIRS * CONV_MAX_ROWS + CONV_THREADS - 1) / CONV_THREADS;

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const bf16_t* smem_row) {
    const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ uint4 fragment_load(const uint32_t* words, size_t at) {
    return __ldg(reinterpret_cast<const uint4*>(words + at));
}

// grid (Cout / BM, ceil(T / BN), S); x: [Cin, ld] with stream b's columns from b·T (ld = S·T).
template <int MT>
__global__ void __launch_bounds__(CONV_THREADS, 1)
    conv_implicit_kernel(DecoderStates states, size_t tails_at, int L, const float* x, int ld, int Cin, int T, int K,
                         int dilation, SnakeParams snake, ConvFragments w, int Cout, float beta, float* y) {
    __shared__ __align__(16) bf16_t slab[2 * CONV_MAX_ROWS * CONV_ROW];  // hi plane, lo plane [rows][CONV_ROW]
    pdl_wait();
    pdl_trigger();
    const int rows = CONV_BN + L;
    bf16_t* const slab_hi = slab;
    bf16_t* const slab_lo = slab + CONV_MAX_ROWS * CONV_ROW;
    const int b = blockIdx.z, t0 = blockIdx.y * CONV_BN;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wm = warp >> 2, wn = warp & 3;
    const int m16_0 = blockIdx.x * 2 * MT + wm * MT;  // this warp's first m16 tile
    const TailSlots slots = L > 0 ? tail_slots(states, b, tails_at, Cin, L) : TailSlots{nullptr, nullptr};
    const float* xb = x + size_t(b) * T;

    // Staging: value pair e = pair p (channels 2p, 2p + 1 of the stage) x row r (column t0 + r of
    // [tail | x]); thread i takes e = i, i + 256, ... (consecutive threads: consecutive columns).
    float raw[CONV_PREFETCH][2];
    auto fetch = [&](int c0) {
#pragma unroll
        for (int i = 0; i < CONV_PREFETCH; ++i) {
            const int e = int(threadIdx.x) + i * CONV_THREADS, p = e / rows, r = e - p * rows;
            const int s = t0 + r, c = c0 + 2 * p;
            float v0 = 0.0f, v1 = 0.0f;
            if (p < CONV_PAIRS) {
                if (s < L) {
                    v0 = slots.tail[size_t(c) * L + s];
                    v1 = slots.tail[size_t(c + 1) * L + s];
                } else if (s - L < T) {
                    v0 = xb[size_t(c) * ld + (s - L)];
                    v1 = xb[size_t(c + 1) * ld + (s - L)];
                }
            }
            raw[i][0] = v0;
            raw[i][1] = v1;
        }
    };
    auto stage = [&](int c0) {  // activation of the x values, hi/lo split, into shared memory
#pragma unroll
        for (int i = 0; i < CONV_PREFETCH; ++i) {
            const int e = int(threadIdx.x) + i * CONV_THREADS, p = e / rows, r = e - p * rows;
            if (p >= CONV_PAIRS) continue;
            const int s = t0 + r, c = c0 + 2 * p;
            float v0 = raw[i][0], v1 = raw[i][1];
            if (snake.alpha && s >= L && s - L < T) {
                v0 = snake_eval(v0, snake.alpha[c], snake.inv_beta[c]);
                v1 = snake_eval(v1, snake.alpha[c + 1], snake.inv_beta[c + 1]);
            }
            bf16_t h0, l0, h1, l1;
            bf16_split(v0, &h0, &l0);
            bf16_split(v1, &h1, &l1);
            *reinterpret_cast<uint32_t*>(slab_hi + r * CONV_ROW + 2 * p) = h0 | uint32_t(h1) << 16;
            *reinterpret_cast<uint32_t*>(slab_lo + r * CONV_ROW + 2 * p) = l0 | uint32_t(l1) << 16;
        }
    };

    float acc[MT][4][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][j][q] = 0.0f;

    // The reduction steps: stage cs, tap k, half g (16 channels) -> c16 = 2·cs + g.
    const int stages = Cin / CONV_CK, steps = stages * K * 2;
    auto fragment_at = [&](int step, int i) {
        const int cs = step / (2 * K), rest = step - cs * 2 * K, k = rest >> 1, g = rest & 1;
        return conv_fragment_word(2 * cs + g, k, m16_0 + i, lane, 0, K, Cout);
    };
    uint4 a_hi[MT], a_lo[MT];
#pragma unroll
    for (int i = 0; i < MT; ++i) {
        a_hi[i] = fragment_load(w.hi, fragment_at(0, i));
        a_lo[i] = fragment_load(w.lo, fragment_at(0, i));
    }
    fetch(0);
    stage(0);
    __syncthreads();
    // ldmatrix.x4 lanes: 0-7 hi channels 0-7 of the half, 8-15 hi 8-15, 16-23 lo 0-7, 24-31 lo 8-15.
    const bf16_t* const lane_plane = (lane >> 4) ? slab_lo : slab_hi;
    const int lane_col = ((lane >> 3) & 1) * 8, lane_row = wn * 32 + (lane & 7);
    int step = 0;
    for (int cs = 0; cs < stages; ++cs) {
        if (cs + 1 < stages) fetch((cs + 1) * CONV_CK);
        for (int k = 0; k < K; ++k)
#pragma unroll
            for (int g = 0; g < 2; ++g, ++step) {
                uint4 n_hi[MT], n_lo[MT];
                if (step + 1 < steps) {
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        n_hi[i] = fragment_load(w.hi, fragment_at(step + 1, i));
                        n_lo[i] = fragment_load(w.lo, fragment_at(step + 1, i));
                    }
                }
                const bf16_t* base = lane_plane + (lane_row + k * dilation) * CONV_ROW + g * 16 + lane_col;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    uint32_t bf[4];  // b0, b1 of the hi plane, then of the lo plane
                    ldmatrix_x4(bf, base + j * 8 * CONV_ROW);
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        mma_16816(acc[i][j], a_hi[i].x, a_hi[i].y, a_hi[i].z, a_hi[i].w, bf[0], bf[1]);
                        mma_16816(acc[i][j], a_hi[i].x, a_hi[i].y, a_hi[i].z, a_hi[i].w, bf[2], bf[3]);
                        mma_16816(acc[i][j], a_lo[i].x, a_lo[i].y, a_lo[i].z, a_lo[i].w, bf[0], bf[1]);
                    }
                }
                if (step + 1 < steps) {
#pragma unroll
                    for (int i = 0; i < MT; ++i) {
                        a_hi[i] = n_hi[i];
                        a_lo[i] = n_lo[i];
                    }
                }
            }
        if (cs + 1 < stages) {
            __syncthreads();  // every warp is done with this stage's rows
            stage((cs + 1) * CONV_CK);
            __syncthreads();
        }
    }

    // Accumulator (i, j): rows 16·(m16_0 + i) + gid (+ 8), columns t0 + 32·wn + 8·j + 2·tig (+ 1).
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int co = 16 * (m16_0 + i) + gid + 8 * half;
            const float bias = w.bias ? w.bias[co] : 0.0f;
            float* yrow = y + size_t(co) * ld + size_t(b) * T;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int t = t0 + 32 * wn + 8 * j + 2 * tig;
#pragma unroll
                for (int q = 0; q < 2; ++q) {
                    if (t + q >= T) continue;
                    float v = acc[i][j][2 * half + q] + bias;
                    if (beta != 0.0f) v += beta * yrow[t + q];
                    yrow[t + q] = v;
                }
            }
        }

    // The next tail (the last L columns of [tail | act(x)]) into the other slot: one block a stream.
    if (L > 0 && blockIdx.x == 0 && blockIdx.y == 0)
        for (int idx = threadIdx.x; idx < Cin * L; idx += CONV_THREADS) {
            const int c = idx / L, j = idx - c * L;
            slots.next[idx] = carried_input(slots.tail, L, xb, ld, c, T + j, snake);
        }
}

[[noreturn]] void bad_args(const char* what) { check_fail(what, "invalid arguments", "conv_implicit", __FILE__, __LINE__); }

}  // namespace

bool conv_implicit_fits(int Cin, int Cout, int L) {
    return Cin > 0 && Cin % CONV_CK == 0 && Cout > 0 && (Cout % 128 == 0 || Cout % 96 == 0) && L >= 0 &&
           L <= CONV_MAX_TAIL;
}

long long conv_implicit_blocks(int Cout, int T, int streams, int L) {
    const int bm = Cout % 128 == 0 ? 128 : 96;
    const long long per_stream = L > 0 ? T : (long long)streams * T, signals = L > 0 ? streams : 1;
    return (long long)(Cout / bm) * ((per_stream + CONV_BN - 1) / CONV_BN) * signals;
}

void conv_implicit(DecoderStates states, size_t tails_at, int L, const float* x, int Cin, int T, int K, int dilation,
                   SnakeParams snake, ConvFragments w, int Cout, float beta, float* y, const Launch& l) {
    if (!conv_implicit_fits(Cin, Cout, L) || T <= 0 || K <= 0 || dilation <= 0 || L != (K - 1) * dilation ||
        states.count < 1 || states.count > 65535 || (L > 0 && !states.blocks) || !x || !y || !w.hi || !w.lo ||
        (beta != 0.0f && beta != 1.0f) || (snake.alpha && !snake.inv_beta))
        bad_args("conv_implicit");
    // Nothing carried: the streams' columns are one signal.
    const int streams = L > 0 ? states.count : 1, per_stream = L > 0 ? T : states.count * T;
    const int ld = states.count * T;
    const bool wide = Cout % 128 == 0;
    const int bm = wide ? 128 : 96;
    const dim3 grid(unsigned(Cout / bm), unsigned((per_stream + CONV_BN - 1) / CONV_BN), unsigned(streams));
    if ((long long)grid.x * grid.y * grid.z != conv_implicit_blocks(Cout, T, states.count, L)) bad_args("conv_implicit");
    KERNEL_CUDA_CHECK(wide ? launch_kernel(l, grid, dim3(CONV_THREADS), 0, conv_implicit_kernel<4>, states, tails_at, L,
                                           x, ld, Cin, per_stream, K, dilation, snake, w, Cout, beta, y)
                           : launch_kernel(l, grid, dim3(CONV_THREADS), 0, conv_implicit_kernel<3>, states, tails_at, L,
                                           x, ld, Cin, per_stream, K, dilation, snake, w, Cout, beta, y));
}

}  // namespace qtts::kernels
