// Helpers shared by the gpu_lm_*.cpp files (internal to GpuLm): arena alignment and short
// builders for the kernel arguments the layers repeat, so that each layer reads top-down as the
// model (norm -> product -> attention -> residual ...). Every launcher call goes through
// CUDA_CHECK_KERNEL: a kernels::KernelError reaches the engine as qtts::Error(ERROR_CUDA).
#pragma once

#include <cstddef>

#include <cublas_v2.h>

#include "engine/common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/gpu_lm.h"
#include "kernels/attention.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemv.cuh"
#include "kernels/linear.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/sampling.cuh"

namespace qtts::cuda {

constexpr size_t LM_ALIGN = 256;  // every arena / state segment starts on this boundary
inline size_t align_up(size_t v) { return (v + LM_ALIGN - 1) / LM_ALIGN * LM_ALIGN; }

// y[rows, out] = W[out, in] · x[rows, in]  (x and y dense: ldx = in, ldy = out; x null for GATHER).
inline kernels::GemvArgs gemv_product(const bf16_t* w, int out, int in, int rows, const float* x, float* y) {
    kernels::GemvArgs a;
    a.w = w;
    a.out = out;
    a.in = in;
    a.rows = rows;
    a.x = x;
    a.ldx = x ? in : 0;
    a.y = y;
    a.ldy = out;
    return a;
}

// ... of rms_norm(x) * norm_w (the norm before a projection, fused into the product).
inline kernels::GemvArgs gemv_normed(kernels::GemvArgs a, const float* norm_w, float eps) {
    a.input = kernels::GemvInput::GEMV_INPUT_RMSNORM;
    a.norm_w = norm_w;
    a.eps = eps;
    return a;
}

// ... added to y (the residual stream).
inline kernels::GemvArgs gemv_residual(kernels::GemvArgs a) {
    a.output = kernels::GemvOutput::GEMV_OUTPUT_ADD;
    return a;
}

// y = silu(W_gate x) * (W_up x): W is the gate, `up` the second matrix.
inline kernels::GemvArgs gemv_swiglu(kernels::GemvArgs a, const bf16_t* up) {
    a.w2 = up;
    a.output = kernels::GemvOutput::GEMV_OUTPUT_SWIGLU;
    return a;
}

// Attention of stack layer `layer` for T new rows at positions pos_dev[0].. (device) or pos_host..:
// q/k norms, RoPE and the cache append inside the kernel; the layer's slice of the caches
// [layers, n_kv, max_ctx, head_dim]; split-K scratch in partial/counters.
inline kernels::AttentionArgs attention_args(const GpuStack& s, int layer, float* qkv, float* attn, float* k_cache, float* v_cache,
                                int max_ctx, int splits, float* partial, uint32_t* counters, int T,
                                const int32_t* pos_dev, int pos_host) {
    const GpuStack::Layer& L = s.layers[size_t(layer)];
    const size_t layer_stride = size_t(s.n_kv) * size_t(max_ctx) * size_t(s.head_dim);
    kernels::AttentionArgs a;
    a.qkv = qkv;
    a.ld_qkv = s.qkv_dim();
    a.T = T;
    a.n_heads = s.n_heads;
    a.n_kv = s.n_kv;
    a.head_dim = s.head_dim;
    a.q_norm = L.q_norm;
    a.k_norm = L.k_norm;
    a.eps = s.eps;
    a.inv_freq = s.inv_freq;
    a.k_cache = k_cache ? k_cache + layer_stride * size_t(layer) : nullptr;  // null: batched (seqs)
    a.v_cache = v_cache ? v_cache + layer_stride * size_t(layer) : nullptr;
    a.seq_layer_offset = layer_stride * size_t(layer);
    a.max_ctx = max_ctx;
    a.pos_dev = pos_dev;
    a.pos_host = pos_host;
    a.append = true;
    a.out = attn;
    a.ld_out = s.q_dim();
    a.splits = splits;
    a.partial = partial;
    a.counters = counters;
    return a;
}

inline void gemv_launch(const kernels::GemvArgs& a, const kernels::Launch& l) { CUDA_CHECK_KERNEL(kernels::gemv(a, l)); }

// Scratch of the split tensor-core path: xb [gemm rows, in] bf16, y2 [gemm rows, out] fp32.
struct SplitScratch {
    bf16_t* xb = nullptr;
    float* y2 = nullptr;
};

// The GEMM of the split path: y2 [gemm_rows, out] = xb [gemm_rows, in] · W[out, in]^T (row-major;
// column-major y2^T = W^T(op T) · xb^T), fp32 results of bf16 operands.
inline void split_gemm(cublasHandle_t cublas, const SplitScratch& s, const bf16_t* w, int out, int in, int gemm_rows) {
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, gemm_rows, in, &alpha, w, CUDA_R_16BF, in, s.xb,
                              CUDA_R_16BF, in, &beta, s.y2, CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// y[T, n] (epilogue) = W[out, in] · rmsnorm(x[T, in]) (norm_w null: x as given) on tensor
// cores at fp32-level accuracy: x split into bf16 hi rows [0, T) and lo rows [T, 2T) of xb, one
// cuBLAS GEMM y2 = xb · W^T over `gemm_rows` >= 2T rows (the rows past 2T read stale scratch and
// are never read: rounding the row count keeps cuBLAS to few problem shapes), then the halves
// summed under the output rule (kernels/linear.cuh). The prefill passes and wide batched
// products run through here.
inline void linear_split(const kernels::Launch& l, cublasHandle_t cublas, const SplitScratch& s, const float* x,
                         int T, int in, int ldx, const float* norm_w, float eps, const bf16_t* w, int out, int n,
                         const float* bias, kernels::LinearEpilogue epilogue, float* y, int ldy, int gemm_rows) {
    CUDA_CHECK_KERNEL(kernels::rmsnorm_split_bf16(x, T, in, ldx, norm_w, eps, s.xb, l));
    split_gemm(cublas, s, w, out, in, gemm_rows);
    CUDA_CHECK_KERNEL(kernels::linear_split_combine(s.y2, out, T, n, bias, epilogue, y, ldy, l));
}

// The same product under the STORE and ADD rules without bias, as two GEMMs straight into y:
// y (=, or += for ADD) W·x_hi, then y += W·x_lo; no fp32 [2T, out] scratch and no combine pass,
// whose traffic was a third of these products' time in the prefill passes. Both GEMMs run over
// gemm_rows / 2 >= T rows (few problem shapes, as above), so y must hold that many rows at ldy
// (those past T get values from scratch rows and are never read).
inline void linear_split_direct(const kernels::Launch& l, cublasHandle_t cublas, bf16_t* xb, const float* x, int T,
                                int in, int ldx, const float* norm_w, float eps, const bf16_t* w, int out,
                                kernels::LinearEpilogue epilogue, float* y, int ldy, int gemm_rows) {
    QTTS_ASSERT((epilogue == kernels::LinearEpilogue::LINEAR_EPILOGUE_STORE ||
                 epilogue == kernels::LinearEpilogue::LINEAR_EPILOGUE_ADD) &&
                gemm_rows >= 2 * T && gemm_rows % 2 == 0);
    CUDA_CHECK_KERNEL(kernels::rmsnorm_split_bf16(x, T, in, ldx, norm_w, eps, xb, l));
    const int rows = gemm_rows / 2;
    const float one = 1.0f, first = epilogue == kernels::LinearEpilogue::LINEAR_EPILOGUE_ADD ? 1.0f : 0.0f;
    // Row-major y [rows, out] (+)= xb_half [rows, in] · W[out, in]^T (column-major as in linear_split).
    CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w, CUDA_R_16BF, in, xb, CUDA_R_16BF,
                              in, &first, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    CUBLAS_CHECK(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &one, w, CUDA_R_16BF, in,
                              xb + size_t(T) * in, CUDA_R_16BF, in, &one, y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

// Activations of one decode pass over `rows` rows (each [rows, width], dense).
struct DecodeRows {
    float* x = nullptr;     // [rows, H] residual stream
    float* qkv = nullptr;   // [rows, qkv_dim]
    float* attn = nullptr;  // [rows, q_dim]
    float* mlp = nullptr;   // [rows, I]
    int rows = 1;
};

// One decode pass of stack `s` over the rows of `b`, layer by layer as the model reads:
// qkv = W_qkv · rmsnorm(x); attention (attend(layer) gives its arguments); x += W_o · attn;
// mlp = silu(W_gate · rmsnorm(x)) * (W_up · rmsnorm(x)); x += W_down · mlp. `product(GemvArgs)`
// runs each product (the gemv kernel, or tensor cores for wide batches: cuda/gpu_batch.cpp).
template <typename Product, typename Attend>
void stack_decode_pass(const GpuStack& s, const DecodeRows& b, Product&& product, Attend&& attend,
                       const kernels::Launch& l) {
    const int H = s.hidden, I = s.intermediate, R = b.rows;
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const GpuStack::Layer& L = s.layers[i];
        product(gemv_normed(gemv_product(L.qkv, s.qkv_dim(), H, R, b.x, b.qkv), L.input_norm, s.eps));
        CUDA_CHECK_KERNEL(kernels::attention(attend(int(i)), l));
        product(gemv_residual(gemv_product(L.o, H, s.q_dim(), R, b.attn, b.x)));
        product(gemv_swiglu(gemv_normed(gemv_product(L.gate_up, I, H, R, b.x, b.mlp), L.post_norm, s.eps),
                            L.gate_up + size_t(I) * H));
        product(gemv_residual(gemv_product(L.down, H, I, R, b.mlp, b.x)));
    }
}

// What stack_split_pass hands a layer's attention when that attention reads the qkv GEMM's
// halves and writes the o product's split itself (decode launches: AttentionArgs::qkv_lo and
// out_split): the halves ([R rows, qkv] hi, then lo) and the split scratch. Otherwise all null:
// the attention reads b.qkv and writes b.attn, and the pass combines and splits around it.
struct SplitAttentionIo {
    const float* qkv_hi = nullptr;
    const float* qkv_lo = nullptr;
    bf16_t* out_split = nullptr;
};

// The same pass with every product on the split tensor-core path (what linear_split does for
// each), the residual combines fused into the next product's split
// (kernels::combine_add_rmsnorm_split_bf16) and the SwiGLU combine writing its split
// (kernels::linear_split_combine_split_bf16): per layer [split x], GEMM qkv, [combine], attention,
// [split attn], GEMM o, combine + split, GEMM gate/up, SwiGLU combine + split, GEMM down, combine
// (+ the next layer's split): 10 launches instead of 13, 8 with attention_fused (the bracketed
// two inside the attention), the same bits as 4 linear_split calls. `attention(layer, io)`
// launches the layer's attention into b.attn (SplitAttentionIo above). The GEMMs run over
// gemm_rows >= 2 b.rows rows (as linear_split).
template <typename Attention>
void stack_split_pass(const GpuStack& s, const DecodeRows& b, cublasHandle_t cublas, const SplitScratch& scratch,
                      int gemm_rows, Attention&& attention, const kernels::Launch& l, bool attention_fused = false) {
    using E = kernels::LinearEpilogue;
    const int H = s.hidden, I = s.intermediate, QD = s.q_dim(), QKV = s.qkv_dim(), R = b.rows;
    QTTS_ASSERT(gemm_rows >= 2 * R);
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const GpuStack::Layer& L = s.layers[i];
        if (i == 0) CUDA_CHECK_KERNEL(kernels::rmsnorm_split_bf16(b.x, R, H, H, L.input_norm, s.eps, scratch.xb, l));
        split_gemm(cublas, scratch, L.qkv, QKV, H, gemm_rows);  // [gemm rows, QKV]
        if (attention_fused) {
            attention(int(i), SplitAttentionIo{scratch.y2, scratch.y2 + size_t(R) * QKV, scratch.xb});
        } else {
            CUDA_CHECK_KERNEL(kernels::linear_split_combine(scratch.y2, QKV, R, QKV, nullptr, E::LINEAR_EPILOGUE_STORE,
                                                            b.qkv, QKV, l));
            attention(int(i), SplitAttentionIo{});
            CUDA_CHECK_KERNEL(kernels::rmsnorm_split_bf16(b.attn, R, QD, QD, nullptr, 0.0f, scratch.xb, l));
        }
        split_gemm(cublas, scratch, L.o, H, QD, gemm_rows);  // [gemm rows, H]; x += o, then split rmsnorm(x)
        CUDA_CHECK_KERNEL(kernels::combine_add_rmsnorm_split_bf16(scratch.y2, H, R, H, b.x, H, L.post_norm, s.eps,
                                                                  scratch.xb, l));
        split_gemm(cublas, scratch, L.gate_up, 2 * I, H, gemm_rows);  // [gemm rows, 2I]; SwiGLU, split
        CUDA_CHECK_KERNEL(kernels::linear_split_combine_split_bf16(scratch.y2, 2 * I, R, I, nullptr,
                                                                   E::LINEAR_EPILOGUE_SWIGLU, nullptr, 0, scratch.xb, l));
        split_gemm(cublas, scratch, L.down, H, I, gemm_rows);  // [gemm rows, H]; x += down (+ the next split)
        if (i + 1 < s.layers.size())
            CUDA_CHECK_KERNEL(kernels::combine_add_rmsnorm_split_bf16(scratch.y2, H, R, H, b.x, H,
                                                                      s.layers[i + 1].input_norm, s.eps, scratch.xb, l));
        else
            CUDA_CHECK_KERNEL(kernels::linear_split_combine(scratch.y2, H, R, H, nullptr, E::LINEAR_EPILOGUE_ADD, b.x, H, l));
    }
}

// A draw of codebook `group` from `logits` under the model's rules (the caller adds the state
// buffers: one stream's, or a batch's slots).
inline kernels::SampleArgs sample_args(const GpuLmWeights& w, int group, const float* logits) {
    kernels::SampleArgs a;
    a.logits = logits;
    a.n = group == 0 ? w.codec_vocab : w.predictor_vocab;
    a.group = group;
    a.eos_id = w.config().talker.codec_eos_id;
    a.suppress_begin = w.codec_vocab - 1024;  // the reference masks the top 1024 control ids
    return a;
}

// The draw of predictor codebook `group` (1..G-2) also writes the next pass's input: rows of
// `ld` floats at `out`, each the projected row of the code drawn (GpuLmWeights::
// predictor_input_rows) or, without a projection, its embedding. The next pass then starts at
// its first layer: no gather or projection launch.
inline void draw_next_predictor_input(kernels::SampleArgs& a, const GpuLmWeights& w, int group, float* out, int ld) {
    QTTS_ASSERT(group >= 1 && group + 1 < w.num_code_groups);
    if (w.predictor_proj_w)
        a.embed_rows = w.predictor_input_rows[size_t(group - 1)];
    else
        a.embed_table = w.predictor_codec_embedding[size_t(group - 1)];
    a.embed_dim = w.predictor.hidden;
    a.embed_out = out;
    a.embed_ld = ld;
}

// The 16 codebook tables of a frame (talker codec embedding, then the predictor's 15) at width H.
inline kernels::FrameEmbedArgs frame_embed_tables(const GpuLmWeights& w) {
    kernels::FrameEmbedArgs f;
    f.tables[0] = w.codec_embedding;
    for (int g = 1; g < w.num_code_groups; ++g) f.tables[g] = w.predictor_codec_embedding[size_t(g - 1)];
    f.groups = w.num_code_groups;
    f.dim = w.talker.hidden;
    return f;
}

}  // namespace qtts::cuda
