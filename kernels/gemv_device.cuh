// The device side of kernels/gemv.cu, shared with the kernel lab (apps/kernel-lab), which
// measures the kernel's instantiations (single- and double-buffered weight chunks) and retired
// variants against each other. Include from .cu files only.
#pragma once

#ifdef __CUDACC__

#include "kernels/gemv.cuh"

// An anonymous namespace: each including .cu file gets its own instantiations (whole-program
// CUDA compilation registers kernels per file).
namespace qtts::kernels {
namespace {

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_THREADS = GEMV_WARPS * 32;

// 16-byte weight columns of a row's chunk (the loads a warp has in flight at once): 8 loads a
// lane for one matrix, 4 a matrix for two.
template <int NMAT>
constexpr int gemv_step() {
    return 32 * (8 / NMAT);
}

// The most bytes a launch asks L2 for ahead of its wait: the rest of its rows, past the first
// chunk that every warp loads into registers. Launches that would ask for more skip the prefetch.
// Those requests are issued while the launch before still loads its input and residual, and
// queue ahead of them: with the 1.7B talker's gate/up (24 MiB ahead) and down (16 MiB) asking,
// its o product took 3.4 µs longer in the chain (kernel timeline). Measured on an H100
// ("Forty-sixth session", docs/performance.md), against the prefetch everywhere: without those
// two, the talker step -6.5% and the frame -3.0%; without gate/up's alone, the talker -3.6%. The
// 2 MiB of the predictor's down product (and of the 0.6B talker's) still pay: without any
// prefetch the predictor was ~1% slower, the 0.6B frame 0.8-1.0%.
constexpr size_t GEMV_PREFETCH_MAX_BYTES = size_t(8) << 20;

// Chunks a row of the launch takes (its 16-byte columns over gemv_step).
template <int NMAT>
int gemv_chunks(const GemvArgs& a) {
    return (a.in / 8 + gemv_step<NMAT>() - 1) / gemv_step<NMAT>();
}

template <int NMAT>
bool gemv_prefetches_rest(const GemvArgs& a) {
    if (gemv_chunks<NMAT>(a) < 2) return false;
    const size_t rest = size_t(a.in / 8 - gemv_step<NMAT>()) * 16u;  // bytes of a row past its first chunk
    return size_t(a.out) * rest * NMAT <= GEMV_PREFETCH_MAX_BYTES;
}

// NB: rows of x handled together (weights are read once for all of them).
// NMAT: weight matrices per output row (2 for SwiGLU: gate and up).

// Lane 0 of a row's warp writes the finished dot products acc[m][nb] (m: matrix, nb: input row):
// SwiGLU of the two matrices, or the product (+ bias), stored or added to y.
template <int NB, int NMAT>
__device__ __forceinline__ void gemv_row_store(const GemvArgs& a, int row, const float (&acc)[NMAT][NB]) {
    const float b = a.bias ? a.bias[row] : 0.0f;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        if (nb >= a.rows) break;
        float* y = a.y + size_t(nb) * a.ldy + row;
        if (NMAT == 2) {
            *y = silu_ref(acc[0][nb]) * acc[NMAT - 1][nb];
        } else if (a.output == GemvOutput::GEMV_OUTPUT_ADD) {
            *y += acc[0][nb] + b;
        } else {
            *y = acc[0][nb] + b;
        }
    }
}

// The decode gemv: the input staged once in shared memory, without serial round trips.
// Before griddepcontrol.wait each warp already issues the first chunk of its weight row into
// registers (weights never depend on the previous kernel) and, with prefetch_rest
// (gemv_prefetches_rest), asks L2 for the rest; after the wait the block stages the input rows
// once (times norm_w for RMSNORM, sum of squares kept aside) behind a single barrier, so the
// weight loads are in flight while the input arrives. The 1/rms factor scales the finished dot
// product. DB: double-buffer the weight chunks (the next chunk's loads are issued before the
// current one is used; more registers, so fewer blocks per SM: 3 for one-row launches, 4
// without it). The product launches DB = false ("vec1"), and DB = true ("vec") for one-row
// launches of three chunks or more without the prefetch (kernels/gemv.cu, gemv_launch).
// blockIdx.y: the group of NB rows this block computes (rows r0 = NB * blockIdx.y ..).
template <int NB, int NMAT, bool DB>
__global__ void __launch_bounds__(GEMV_THREADS, NB == 1 ? (DB ? 3 : 4) : 2)
    gemv_vec_kernel(const GemvArgs args, bool prefetch_rest) {
    GemvArgs a = args;
    if (blockIdx.y > 0) {
        const int r0 = NB * int(blockIdx.y);
        a.rows = args.rows - r0;
        a.x = args.x ? args.x + size_t(r0) * args.ldx : nullptr;
        a.index = args.index ? args.index + size_t(r0) * args.index_stride : nullptr;
        a.y = args.y + size_t(r0) * args.ldy;
    }
    extern __shared__ float4 gemv_vec_buf[];
    float* xs = reinterpret_cast<float*>(gemv_vec_buf);  // [NB, in]
    __shared__ float partial[GEMV_WARPS][NB];
    constexpr int U = 8 / NMAT;     // 16-byte loads per lane per matrix per chunk
    constexpr int STEP = gemv_step<NMAT>();  // 16-byte columns per chunk (32 * U)

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + warp;
    const int in = a.in, in8 = a.in >> 3;
    const bool active = row < a.out;
    const uint4* w0 = reinterpret_cast<const uint4*>(a.w) + size_t(active ? row : 0) * in8;
    const uint4* w1 = NMAT == 2 ? reinterpret_cast<const uint4*>(a.w2) + size_t(active ? row : 0) * in8 : w0;

    uint4 cur[NMAT][U];
    if (active) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = u * 32 + lane;
            if (k < in8) {
                cur[0][u] = __ldg(w0 + k);
                if (NMAT == 2) cur[NMAT - 1][u] = __ldg(w1 + k);
            }
        }
        if (prefetch_rest && lane == 0) {  // only launches with a rest (gemv_prefetches_rest)
            prefetch_l2(w0 + STEP, uint32_t(in8 - STEP) * 16u);
            if (NMAT == 2) prefetch_l2(w1 + STEP, uint32_t(in8 - STEP) * 16u);
        }
    }
    pdl_wait();
    // The next launch is released here, or, by a product that adds into y (o and down), once its
    // input is staged (kernels/common.cuh, pdl_trigger(): measured -0.8% a 1.7B frame, though
    // maybe for this form's registers, ptxas spilling 4 bytes where it spilled 24), or, by such a
    // product double-buffered, once it has asked for its last chunk (below).
    const bool release_after_staging = a.output == GemvOutput::GEMV_OUTPUT_ADD;
    if (!release_after_staging) pdl_trigger();

    const int rows = a.rows;
    const bool norm = a.input == GemvInput::GEMV_INPUT_RMSNORM;
    float sumsq[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        sumsq[nb] = 0.0f;
        float4* dst = reinterpret_cast<float4*>(xs + size_t(nb) * in);
        if (nb >= rows) {
            for (int i = threadIdx.x; i < in / 4; i += GEMV_THREADS) dst[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        } else if (a.input == GemvInput::GEMV_INPUT_GATHER) {
            const int32_t id = a.index[nb * a.index_stride];
            const uint4* src = reinterpret_cast<const uint4*>(a.table) + size_t(id) * in8;
            for (int i = threadIdx.x; i < in8; i += GEMV_THREADS) {
                const uint4 t = src[i];
                dst[2 * i] = make_float4(bf16_lo(t.x), bf16_hi(t.x), bf16_lo(t.y), bf16_hi(t.y));
                dst[2 * i + 1] = make_float4(bf16_lo(t.z), bf16_hi(t.z), bf16_lo(t.w), bf16_hi(t.w));
            }
        } else {
            const float4* src = reinterpret_cast<const float4*>(a.x + size_t(nb) * a.ldx);
            const float4* nw = reinterpret_cast<const float4*>(a.norm_w);
            for (int i = threadIdx.x; i < in / 4; i += GEMV_THREADS) {
                float4 v = src[i];
                if (norm) {
                    sumsq[nb] += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
                    const float4 n = nw[i];
                    v = make_float4(v.x * n.x, v.y * n.y, v.z * n.z, v.w * n.w);
                }
                dst[i] = v;
            }
        }
    }
    if (norm) {
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
            const float s = warp_sum(sumsq[nb]);
            if (lane == 0) partial[warp][nb] = s;
        }
    }
    __syncthreads();
    // A double-buffered launch that adds into y (the 1.7B talker's down) releases it later, once
    // it has asked for its last chunk (below): released here, the next launch's first loads
    // queued ahead of its later chunks (measured: the talker step -0.6 to -0.9%).
    if (release_after_staging && !DB) pdl_trigger();
    timeline_mark(0);  // profiling builds: the input staged (kernels/timeline.cuh)
    if (!active) return;  // no block-wide barrier below

    float acc[NMAT][NB];
#pragma unroll
    for (int m = 0; m < NMAT; ++m)
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) acc[m][nb] = 0.0f;

    for (int base = 0; base < in8; base += STEP) {
        const bool more = base + STEP < in8;
        uint4 nxt[NMAT][U];
        if (DB && more) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = base + STEP + u * 32 + lane;
                if (k < in8) {
                    nxt[0][u] = __ldg(w0 + k);
                    if (NMAT == 2) nxt[NMAT - 1][u] = __ldg(w1 + k);
                }
            }
            if (release_after_staging && base + 2 * STEP >= in8) pdl_trigger();  // the last chunk asked for
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = base + u * 32 + lane;
            if (k < in8) {
#pragma unroll
                for (int nb = 0; nb < NB; ++nb) {
                    const float4* xv = reinterpret_cast<const float4*>(xs + size_t(nb) * in) + 2 * k;
                    const float4 x0 = xv[0], x1 = xv[1];
#pragma unroll
                    for (int m = 0; m < NMAT; ++m) acc[m][nb] += dot8(cur[m][u], x0, x1);
                }
            }
        }
        if (more) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (DB) {
#pragma unroll
                    for (int m = 0; m < NMAT; ++m) cur[m][u] = nxt[m][u];
                } else {
                    const int k = base + STEP + u * 32 + lane;
                    if (k < in8) {
                        cur[0][u] = __ldg(w0 + k);
                        if (NMAT == 2) cur[NMAT - 1][u] = __ldg(w1 + k);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int m = 0; m < NMAT; ++m) acc[m][nb] = warp_sum(acc[m][nb]);
        if (norm) {
            float total = 0.0f;
#pragma unroll
            for (int w = 0; w < GEMV_WARPS; ++w) total += partial[w][nb];
            const float inv = 1.0f / sqrtf(total / float(in) + a.eps);
#pragma unroll
            for (int m = 0; m < NMAT; ++m) acc[m][nb] *= inv;
        }
    }
    timeline_mark(2);  // block 0's first row summed

    if (lane == 0) gemv_row_store<NB, NMAT>(a, row, acc);
    timeline_mark(1);  // block 0's rows stored
}

}  // namespace
}  // namespace qtts::kernels

#endif  // __CUDACC__
