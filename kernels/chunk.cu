#include "kernels/chunk.cuh"

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int BRIDGE_THREADS = 256;

// Code g of frame `row` in the LM's code buffer [capacity, SAMPLE_MAX_GROUPS]; -1 past its rows.
__device__ __forceinline__ int32_t code_at(const int32_t* codes, int capacity, int row, int g) {
    return (row >= 0 && row < capacity) ? codes[size_t(row) * SAMPLE_MAX_GROUPS + g] : -1;
}

__global__ void __launch_bounds__(BRIDGE_THREADS) chunk_bridge_kernel(const ChunkBridgeArgs a) {
    __shared__ int undecodable;
    if (threadIdx.x == 0) undecodable = 0;
    __syncthreads();
    const int first = a.state->frame - a.frames + (a.talker_pending ? 1 : 0);  // first frame of the chunk
    const int rows = a.frames + 1;
    for (int i = threadIdx.x; i < rows * SAMPLE_MAX_GROUPS; i += BRIDGE_THREADS) {
        const int f = i / SAMPLE_MAX_GROUPS, g = i % SAMPLE_MAX_GROUPS;
        const int row = first + f;
        const bool drawn = f < a.frames || !a.talker_pending;
        const int32_t code = drawn ? code_at(a.lm_codes, a.code_capacity, row, g) : -1;
        a.staged[i] = code;
        if (f < a.frames && g < a.groups) {
            a.decoder_codes[f * a.groups + g] = code;
            if (code < 0 || code >= a.codebook_size) atomicOr(&undecodable, 1);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        const int decodable = undecodable ? 0 : 1;
        a.staged[rows * SAMPLE_MAX_GROUPS] = decodable;
        if (a.condition) cudaGraphSetConditional(a.condition, unsigned(decodable));
    }
}

__global__ void chunk_row_stage_kernel(const GenerationDeviceState* state, const int32_t* lm_codes, int code_capacity,
                                       int32_t* out) {
    const int g = int(threadIdx.x);
    if (g < SAMPLE_MAX_GROUPS) out[g] = code_at(lm_codes, code_capacity, state->frame, g);
}

}  // namespace

void chunk_bridge(const ChunkBridgeArgs& a, cudaStream_t stream) {
    if (!a.state || !a.lm_codes || !a.staged || !a.decoder_codes || a.frames < 1 || a.frames > CHUNK_MAX_FRAMES ||
        a.groups < 1 || a.groups > SAMPLE_MAX_GROUPS || a.codebook_size < 1 || a.code_capacity < 1)
        check_fail("chunk_bridge", "invalid arguments", __func__, __FILE__, __LINE__);
    chunk_bridge_kernel<<<1, BRIDGE_THREADS, 0, stream>>>(a);
    KERNEL_CUDA_CHECK(cudaGetLastError());
}

void chunk_row_stage(const GenerationDeviceState* state, const int32_t* lm_codes, int code_capacity, int32_t* out,
                     cudaStream_t stream) {
    if (!state || !lm_codes || !out || code_capacity < 1)
        check_fail("chunk_row_stage", "invalid arguments", __func__, __FILE__, __LINE__);
    chunk_row_stage_kernel<<<1, 32, 0, stream>>>(state, lm_codes, code_capacity, out);
    KERNEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtts::kernels
