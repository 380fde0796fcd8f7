// The hand-off between the LM's frame steps and the speech decoder inside one fused chunk graph
// (engine/cuda/fused_chunks.h): the chunk's codes go from the LM's code buffer to the decoder's
// input on the device, and the chunk is only decoded there when every one of its codes is a
// codebook entry (no end-of-speech token, which the decoder must never see).
#pragma once

#include "kernels/common.cuh"
#include "kernels/sampling.cuh"

namespace qtts::kernels {

constexpr int CHUNK_MAX_FRAMES = 64;

struct ChunkBridgeArgs {
    // The LM side: the generation state (its `frame` is the first frame after the chunk once the
    // chunk's frame steps ran) and the code buffer [code_capacity, SAMPLE_MAX_GROUPS].
    const GenerationDeviceState* state = nullptr;
    const int32_t* lm_codes = nullptr;
    int code_capacity = 0;
    int frames = 0;         // K: the chunk is frames [state->frame - K, state->frame) ...
    // ... or [state->frame - K + 1, state->frame + 1) when its last frame's talker step has not
    // run yet (the fused graph decodes a chunk before that step, so its audio comes out sooner):
    // the row after the chunk is then not drawn, and is staged as -1 (chunk_row_stage, later).
    bool talker_pending = false;
    int groups = 16;        // codes per frame the decoder reads (<= SAMPLE_MAX_GROUPS)
    int codebook_size = 0;  // a decodable code is in [0, codebook_size)
    // Out: staged [K + 1, SAMPLE_MAX_GROUPS] (the chunk's rows and the row after it, whose
    // codebook 0 is already drawn; -1 past the buffer), then one int: 1 when the chunk was
    // decodable. decoder_codes [K, groups]: the decoder's input.
    int32_t* staged = nullptr;
    int32_t* decoder_codes = nullptr;
    // The graph's conditional handle set to the decodable flag (0: none, e.g. outside a graph).
    cudaGraphConditionalHandle condition = 0;
};

// One small block. Launched without programmatic dependent launch: it reads what the frame
// steps before it wrote.
void chunk_bridge(const ChunkBridgeArgs& args, cudaStream_t stream);

// out[0, SAMPLE_MAX_GROUPS) = the code row of frame state->frame (-1 past code_capacity): the row
// after a chunk whose bridge ran with talker_pending, once that talker step has drawn its
// codebook 0. One small block, launched without programmatic dependent launch.
void chunk_row_stage(const GenerationDeviceState* state, const int32_t* lm_codes, int code_capacity, int32_t* out,
                     cudaStream_t stream);

}  // namespace qtts::kernels
