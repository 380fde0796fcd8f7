// The rows of a batched frame step (engine/cuda/gpu_batch.h): each row is one stream, whose
// generation state, history, codes, text track and talker output stay in that stream's own
// device buffers. The host writes a table of StreamSlot records (device memory) whenever the
// batch changes; the kernels of a step read each row's buffers through it, so one captured
// graph serves any set of streams of the bucket's size.
#pragma once

#include "kernels/common.cuh"
#include "kernels/sampling.cuh"

namespace qtts::kernels {

// One row's stream. state == nullptr: an idle row (the bucket is larger than the batch).
struct StreamSlot {
    GenerationDeviceState* state = nullptr;
    int32_t* seen = nullptr;          // [codec vocab] codebook-0 repetition flags
    int32_t* codes = nullptr;         // [code_capacity, SAMPLE_MAX_GROUPS]
    const float* trailing = nullptr;  // [capacity, dim] text track
    float* hidden = nullptr;          // [dim] the talker's last output (after the final norm)
    const float* pad = nullptr;       // [dim] text-track row once the text is used up
};

// Start of a step, r < rows: batch_codes[r, :] = the stream's frame in progress
// (state->current; zeros for an idle row) and hidden_rows[r] = its talker output (zeros idle).
void slots_load(const StreamSlot* slots, int rows, int dim, int32_t* batch_codes, float* hidden_rows,
                const Launch& launch);

// End of a step: each stream's talker output back into its own buffer (rows that advanced).
void slots_store_hidden(const StreamSlot* slots, int rows, int dim, const float* hidden_rows, const Launch& launch);

}  // namespace qtts::kernels
