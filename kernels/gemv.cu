#include "kernels/gemv.cuh"

#include "cuda/cuda_check.h"

namespace qtts::kernels {

namespace {

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_THREADS = GEMV_WARPS * 32;
constexpr int GEMV_LOADS = 4;  // 16-byte weight loads per lane per chunk (two chunks in flight)

// NB: rows of x handled together (weights are read once for all of them).
// NMAT: weight matrices per output row (2 for SwiGLU: gate and up).
//
// One warp per output row, no shared memory and no block barrier: the first chunk of the
// warp's weight row is loaded into registers BEFORE griddepcontrol.wait (weights never depend
// on the previous kernel), the rest is prefetched into L2; after the wait each lane reads the
// input values it needs straight from global memory (L1/L2 resident, a few KB). For RMSNORM
// the warp accumulates sum(x^2) alongside sum(w * x * norm_w) and scales the dot product by
// 1/rms at the end: the same product as normalising first.
template <int NB, int NMAT>
__global__ void __launch_bounds__(GEMV_THREADS, NB == 1 ? 4 : 2) gemv_kernel(const GemvArgs a) {
    constexpr int U = GEMV_LOADS / NMAT;  // 16-byte loads per lane per matrix per chunk
    constexpr int STEP = 32 * U;          // 16-byte columns per chunk
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row = blockIdx.x * GEMV_WARPS + warp;
    const int in8 = a.in >> 3;
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
        if (lane == 0 && in8 > STEP) {
            prefetch_l2(w0 + STEP, uint32_t(in8 - STEP) * 16u);
            if (NMAT == 2) prefetch_l2(w1 + STEP, uint32_t(in8 - STEP) * 16u);
        }
    }
    pdl_wait();
    pdl_trigger();
    if (!active) return;

    const int rows = a.rows;
    const bool gather = a.input == GemvInput::GEMV_INPUT_GATHER;
    const bool norm = a.input == GemvInput::GEMV_INPUT_RMSNORM;
    const float* xr[NB];
    const uint4* tr[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        const int r = nb < rows ? nb : 0;
        xr[nb] = gather ? nullptr : a.x + size_t(r) * a.ldx;
        tr[nb] = gather ? reinterpret_cast<const uint4*>(a.table) + size_t(a.index[r * a.index_stride]) * in8 : nullptr;
    }

    float acc[NMAT][NB];
    float sumsq[NB];
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        sumsq[nb] = 0.0f;
#pragma unroll
        for (int m = 0; m < NMAT; ++m) acc[m][nb] = 0.0f;
    }

    for (int base = 0; base < in8; base += STEP) {
        // Software pipeline: the next chunk's weights are in flight while this one is used.
        uint4 nxt[NMAT][U];
        const bool more = base + STEP < in8;
        if (more) {
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int k = base + STEP + u * 32 + lane;
                if (k < in8) {
                    nxt[0][u] = __ldg(w0 + k);
                    if (NMAT == 2) nxt[NMAT - 1][u] = __ldg(w1 + k);
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int k = base + u * 32 + lane;
            if (k >= in8) continue;
            float4 n0 = make_float4(1.f, 1.f, 1.f, 1.f), n1 = n0;
            if (norm) {
                const float4* nw = reinterpret_cast<const float4*>(a.norm_w) + 2 * k;
                n0 = nw[0];
                n1 = nw[1];
            }
#pragma unroll
            for (int nb = 0; nb < NB; ++nb) {
                float4 x0, x1;
                if (gather) {
                    const uint4 t = tr[nb][k];
                    x0 = make_float4(bf16_lo(t.x), bf16_hi(t.x), bf16_lo(t.y), bf16_hi(t.y));
                    x1 = make_float4(bf16_lo(t.z), bf16_hi(t.z), bf16_lo(t.w), bf16_hi(t.w));
                } else {
                    const float4* xv = reinterpret_cast<const float4*>(xr[nb]) + 2 * k;
                    x0 = xv[0];
                    x1 = xv[1];
                }
                if (norm) {
                    sumsq[nb] += x0.x * x0.x + x0.y * x0.y + x0.z * x0.z + x0.w * x0.w + x1.x * x1.x +
                                 x1.y * x1.y + x1.z * x1.z + x1.w * x1.w;
                    x0 = make_float4(x0.x * n0.x, x0.y * n0.y, x0.z * n0.z, x0.w * n0.w);
                    x1 = make_float4(x1.x * n1.x, x1.y * n1.y, x1.z * n1.z, x1.w * n1.w);
                }
#pragma unroll
                for (int m = 0; m < NMAT; ++m) acc[m][nb] += dot8(cur[m][u], x0, x1);
            }
        }
        if (more) {
#pragma unroll
            for (int m = 0; m < NMAT; ++m)
#pragma unroll
                for (int u = 0; u < U; ++u) cur[m][u] = nxt[m][u];
        }
    }
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
        for (int m = 0; m < NMAT; ++m) acc[m][nb] = warp_sum(acc[m][nb]);
        if (norm) {
            const float inv = 1.0f / sqrtf(warp_sum(sumsq[nb]) / float(a.in) + a.eps);
#pragma unroll
            for (int m = 0; m < NMAT; ++m) acc[m][nb] *= inv;
        }
    }

    if (lane != 0) return;
    const float b = a.bias ? a.bias[row] : 0.0f;
#pragma unroll
    for (int nb = 0; nb < NB; ++nb) {
        if (nb >= rows) break;
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

template <int NB, int NMAT>
void gemv_launch(const GemvArgs& a, const Launch& l) {
    const dim3 grid((a.out + GEMV_WARPS - 1) / GEMV_WARPS);
    CUDA_CHECK(launch_kernel(l, grid, dim3(GEMV_THREADS), 0, gemv_kernel<NB, NMAT>, a));
}

template <int NMAT>
void gemv_dispatch(const GemvArgs& a, const Launch& l) {
    if (a.rows <= 1)
        gemv_launch<1, NMAT>(a, l);
    else if (a.rows <= 2)
        gemv_launch<2, NMAT>(a, l);
    else if (a.rows <= 4)
        gemv_launch<4, NMAT>(a, l);
    else
        gemv_launch<8, NMAT>(a, l);
}

}  // namespace

void gemv(const GemvArgs& a, const Launch& l) {
    if (a.rows < 1 || a.rows > GEMV_MAX_ROWS || a.in <= 0 || a.in % 8 != 0 || a.out <= 0 || !a.w || !a.y ||
        (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU && !a.w2) ||
        (a.input == GemvInput::GEMV_INPUT_GATHER && (!a.table || !a.index)) ||
        (a.input != GemvInput::GEMV_INPUT_GATHER && !a.x) || (a.input == GemvInput::GEMV_INPUT_RMSNORM && !a.norm_w))
        cuda::check_fail("gemv", "invalid arguments (rows 1..8, in a positive multiple of 8, pointers set)", __func__,
                   __FILE__, __LINE__);
    if (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU)
        gemv_dispatch<2>(a, l);
    else
        gemv_dispatch<1>(a, l);
}

}  // namespace qtts::kernels
