// Timing GPU work with CUDA events, for benchmarks and the kernel lab (never on the engine's
// hot path: it synchronises). Owner thread of the stream's context.
#pragma once

#include <cuda_runtime_api.h>

#include "engine/cuda/cuda_check.h"

namespace qtts::cuda {

// Enqueues `count` calls of `body` on `stream` between two events and waits; returns the GPU
// time per call in milliseconds.
template <typename F>
double time_on_stream(cudaStream_t stream, int count, F body) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < count; ++i) body();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return double(ms) / count;
}

}  // namespace qtts::cuda
