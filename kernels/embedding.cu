#include "kernels/embedding.cuh"

#include <algorithm>

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int EMBED_THREADS = 256;

__global__ void __launch_bounds__(EMBED_THREADS)
    gather_kernel(const bf16_t* table, int dim, const int32_t* ids, float* out, int ldo, bool accumulate) {
    pdl_wait();
    pdl_trigger();
    const int r = blockIdx.y;
    const bf16_t* src = table + size_t(ids[r]) * dim;
    float* dst = out + size_t(r) * ldo;
    for (int i = blockIdx.x * EMBED_THREADS + threadIdx.x; i < dim; i += gridDim.x * EMBED_THREADS) {
        const float v = bf16_to_float(src[i]);
        dst[i] = accumulate ? dst[i] + v : v;
    }
}

__global__ void __launch_bounds__(EMBED_THREADS) frame_embed_kernel(const FrameEmbedArgs a) {
    const int r = blockIdx.y;
    StreamSlot slot;
    if (a.slots) slot = a.slots[r];  // written by the host before the step: read before the wait
    pdl_wait();
    pdl_trigger();
    const int32_t* codes = a.codes + size_t(r) * a.code_stride;
    const float* text = nullptr;
    if (a.slots) {
        const int index = slot.state ? slot.state->frame : -1;
        const bool has = slot.trailing && index >= 0 && index < slot.state->trailing_rows;
        text = has ? slot.trailing + size_t(index) * a.dim : slot.pad;
    } else if (a.pad) {
        const int index = *a.text_index;
        text = (a.trailing && index >= 0 && index < *a.trailing_rows) ? a.trailing + size_t(index) * a.dim : a.pad;
    }
    float* dst = a.out + size_t(r) * a.ldo;
    for (int i = blockIdx.x * EMBED_THREADS + threadIdx.x; i < a.dim; i += gridDim.x * EMBED_THREADS) {
        float sum = bf16_to_float(a.tables[0][size_t(codes[0]) * a.dim + i]);
        for (int g = 1; g < a.groups; ++g) sum += bf16_to_float(a.tables[g][size_t(codes[g]) * a.dim + i]);
        if (text) sum += text[i];
        dst[i] = a.accumulate ? dst[i] + sum : sum;
    }
}

// grid: (blocks, rows); row r of hidden -> rows 2r, 2r + 1 of out.
__global__ void __launch_bounds__(EMBED_THREADS) predictor_input_kernel(const float* hidden, const bf16_t* table,
                                                                         const int32_t* code0, int code_stride,
                                                                         int dim, float* out) {
    pdl_wait();
    pdl_trigger();
    const int r = blockIdx.y;
    const bf16_t* row = table + size_t(code0[size_t(r) * code_stride]) * dim;
    const float* h = hidden + size_t(r) * dim;
    float* o = out + size_t(2 * r) * dim;
    for (int i = blockIdx.x * EMBED_THREADS + threadIdx.x; i < dim; i += gridDim.x * EMBED_THREADS) {
        o[i] = h[i];
        o[dim + i] = bf16_to_float(row[i]);
    }
}

__global__ void __launch_bounds__(EMBED_THREADS)
    rows_add_kernel(const float* src, int ld_src, const int32_t* src_rows, int dim, const int32_t* dst_rows,
                    float* dst, int ldd) {
    pdl_wait();
    pdl_trigger();
    const int r = blockIdx.y;
    const float* s = src + size_t(src_rows ? src_rows[r] : r) * ld_src;
    float* d = dst + size_t(dst_rows[r]) * ldd;
    for (int i = blockIdx.x * EMBED_THREADS + threadIdx.x; i < dim; i += gridDim.x * EMBED_THREADS) d[i] += s[i];
}

int embed_blocks(int dim) { return std::min((dim + EMBED_THREADS - 1) / EMBED_THREADS, 32); }

}  // namespace

void embedding_gather(const bf16_t* table, int dim, const int32_t* ids, int n, float* out, int ldo, bool accumulate,
                      const Launch& l) {
    if (!table || !ids || !out || dim <= 0 || n <= 0)
        check_fail("embedding_gather", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(embed_blocks(dim), n), dim3(EMBED_THREADS), 0, gather_kernel, table, dim, ids,
                             out, ldo, accumulate));
}

void frame_embed(const FrameEmbedArgs& a, const Launch& l) {
    bool ok = a.groups >= 1 && a.groups <= EMBED_MAX_TABLES && a.dim > 0 && a.codes && a.rows >= 1 && a.out;
    for (int g = 0; g < a.groups && ok; ++g) ok = a.tables[g] != nullptr;
    if (a.pad && !a.slots) ok = ok && a.rows == 1 && a.text_index && (!a.trailing || a.trailing_rows);
    if (!ok) check_fail("frame_embed", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(embed_blocks(a.dim), a.rows), dim3(EMBED_THREADS), 0, frame_embed_kernel, a));
}

void predictor_input(const float* hidden, const bf16_t* table, const int32_t* code0, int dim, float* out,
                     const Launch& l) {
    predictor_input_rows(hidden, table, code0, 0, 1, dim, out, l);
}

void predictor_input_rows(const float* hidden, const bf16_t* table, const int32_t* code0, int code_stride, int rows,
                          int dim, float* out, const Launch& l) {
    if (!hidden || !table || !code0 || !out || dim <= 0 || rows < 1 || code_stride < 0)
        check_fail("predictor_input", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(embed_blocks(dim), rows), dim3(EMBED_THREADS), 0, predictor_input_kernel,
                                    hidden, table, code0, code_stride, dim, out));
}

void rows_add(const float* src, int ld_src, const int32_t* src_rows, int n, int dim, const int32_t* dst_rows,
              float* dst, int ldd, const Launch& l) {
    if (n <= 0) return;
    if (!src || !dst_rows || !dst || dim <= 0)
        check_fail("rows_add", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(launch_kernel(l, dim3(embed_blocks(dim), n), dim3(EMBED_THREADS), 0, rows_add_kernel, src, ld_src,
                             src_rows, dim, dst_rows, dst, ldd));
}

}  // namespace qtts::kernels
