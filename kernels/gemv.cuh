// Matrix-vector products for decoding: y[r] = W · x[r] for a few rows r (1..8 per block; more
// rows take more blocks),
// W bf16 [out, in] row-major, x and y fp32, fp32 accumulation. One warp per output row; each
// lane streams 16-byte weight loads, several in flight. The input can be RMS-normalised on the
// fly (the norm that precedes every projection) or gathered from a bf16 embedding table by a
// device-side index; the output can be stored, added to (residual) or combined as SwiGLU.
// Prefill-sized products go through cuBLAS (kernels/linear.cuh).
#pragma once

#include "kernels/common.cuh"

namespace qtts::kernels {

constexpr int GEMV_MAX_ROWS = 8;         // rows one block computes together (weights read once for them)
constexpr int GEMV_MAX_BATCH_ROWS = 256; // rows one launch takes: groups of GEMV_MAX_ROWS on grid.y

enum class GemvInput {
    GEMV_INPUT_PLAIN,    // x rows as given
    GEMV_INPUT_RMSNORM,  // rms_norm(x row) * norm_w
    GEMV_INPUT_GATHER,   // x row r = table[index[r * index_stride]] (bf16 rows of length in)
};

enum class GemvOutput {
    GEMV_OUTPUT_STORE,   // y = W x (+ bias)
    GEMV_OUTPUT_ADD,     // y += W x (+ bias)            (residual stream)
    GEMV_OUTPUT_SWIGLU,  // y = silu(W x) * (W2 x)        (W = gate, W2 = up)
};

struct GemvArgs {
    const bf16_t* w = nullptr;     // [out, in]
    const bf16_t* w2 = nullptr;    // [out, in] SWIGLU only
    const float* bias = nullptr;   // [out] or null (STORE / ADD)
    int out = 0;
    int in = 0;                    // multiple of 8
    int rows = 1;                  // 1..GEMV_MAX_BATCH_ROWS (more than 8: groups of 8 rows, each
                                   // computed exactly as alone; the weights come from L2 again)
    GemvInput input = GemvInput::GEMV_INPUT_PLAIN;
    const float* x = nullptr;      // [rows, ldx]   PLAIN / RMSNORM
    int ldx = 0;
    const float* norm_w = nullptr; // [in]          RMSNORM
    float eps = 1e-6f;
    const bf16_t* table = nullptr; // [vocab, in]   GATHER
    const int32_t* index = nullptr;
    int index_stride = 1;
    GemvOutput output = GemvOutput::GEMV_OUTPUT_STORE;
    float* y = nullptr;            // [rows, ldy]
    int ldy = 0;
};

// Throws kernels::KernelError (kernels/check.cuh) on a bad launch or bad arguments.
void gemv(const GemvArgs& args, const Launch& launch);

}  // namespace qtts::kernels
