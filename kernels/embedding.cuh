// Embedding lookups: bf16 table rows gathered into fp32 activations by device-side ids, and the
// talker's per-frame input: the sum of the 16 codebook embeddings of a frame plus the text-track
// row (the next trailing text vector, or <tts_pad> once the text is used up).
#pragma once

#include "kernels/common.cuh"
#include "kernels/batch.cuh"

namespace qtts::kernels {

constexpr int EMBED_MAX_TABLES = 16;

// out[r] (+)= table[ids[r]] for r < n; ids in device memory; table [vocab, dim] bf16.
void embedding_gather(const bf16_t* table, int dim, const int32_t* ids, int n, float* out, int ldo, bool accumulate,
                      const Launch& launch);

struct FrameEmbedArgs {
    const bf16_t* tables[EMBED_MAX_TABLES] = {};  // codebook g's table [vocab_g, dim]
    int groups = 16;
    int dim = 0;
    const int32_t* codes = nullptr;  // device [rows, code_stride]
    int code_stride = 16;
    int rows = 1;
    // Text track (optional, rows == 1): + trailing[*text_index] when *text_index < *trailing_rows,
    // else + pad.
    const float* trailing = nullptr;         // device [capacity, dim]
    const int32_t* trailing_rows = nullptr;  // device
    const int32_t* text_index = nullptr;     // device
    const float* pad = nullptr;              // device [dim]
    float* out = nullptr;                    // [rows, ldo]
    int ldo = 0;
    bool accumulate = false;
    // Batched text track (any rows): row r adds its stream's text track (slots[r].trailing at
    // the state's frame while below trailing_rows, else slots[r].pad); trailing, trailing_rows,
    // text_index and pad above are unused. An idle row gets no text.
    const StreamSlot* slots = nullptr;
};

// out[r] (+)= Σ_g tables[g][codes[r, g]] (+ text track), summed in codebook order.
void frame_embed(const FrameEmbedArgs& args, const Launch& launch);

// The code predictor's first two inputs: out[0] = hidden, out[1] = table[*code0].
void predictor_input(const float* hidden, const bf16_t* table, const int32_t* code0, int dim, float* out,
                     const Launch& launch);
// The same for `rows` streams: out[2r] = hidden[r], out[2r + 1] = table[code0[r * code_stride]]
// (hidden [rows, dim], out [2 rows, dim]).
void predictor_input_rows(const float* hidden, const bf16_t* table, const int32_t* code0, int code_stride, int rows,
                          int dim, float* out, const Launch& launch);

// dst[dst_rows[r]] += src[src_rows ? src_rows[r] : r] for r < n (rows of `dim` floats);
// dst_rows must not repeat.
void rows_add(const float* src, int ld_src, const int32_t* src_rows, int n, int dim, const int32_t* dst_rows,
              float* dst, int ldd, const Launch& launch);

}  // namespace qtts::kernels
