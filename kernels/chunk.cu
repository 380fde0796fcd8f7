#include "kernels/chunk.cuh"

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int BRIDGE_THREADS = 256;

__global__ void __launch_bounds__(BRIDGE_THREADS) chunk_bridge_kernel(const ChunkBridgeArgs a) {
    __shared__ int undecodable;
    if (threadIdx.x == 0) undecodable = 0;
    __syncthreads();
    const int first = a.state->frame - a.frames;  // first frame of the chunk
    const int rows = a.frames + 1;
    for (int i = threadIdx.x; i < rows * SAMPLE_MAX_GROUPS; i += BRIDGE_THREADS) {
        const int f = i / SAMPLE_MAX_GROUPS, g = i % SAMPLE_MAX_GROUPS;
        const int row = first + f;
        const int32_t code = (row >= 0 && row < a.code_capacity) ? a.lm_codes[size_t(row) * SAMPLE_MAX_GROUPS + g] : -1;
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

}  // namespace

void chunk_bridge(const ChunkBridgeArgs& a, cudaStream_t stream) {
    if (!a.state || !a.lm_codes || !a.staged || !a.decoder_codes || a.frames < 1 || a.frames > CHUNK_MAX_FRAMES ||
        a.groups < 1 || a.groups > SAMPLE_MAX_GROUPS || a.codebook_size < 1 || a.code_capacity < 1)
        check_fail("chunk_bridge", "invalid arguments", __func__, __FILE__, __LINE__);
    chunk_bridge_kernel<<<1, BRIDGE_THREADS, 0, stream>>>(a);
    KERNEL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace qtts::kernels
