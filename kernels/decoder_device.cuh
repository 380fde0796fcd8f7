// Device helpers shared by the decoder's kernels (kernels/decoder.cu, kernels/implicit_conv.cu):
// a stream's carried state in its block (kernels/decoder.cuh DecoderStates) and SnakeBeta.
// Device code only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/decoder.cuh"

namespace qtts::kernels {

// Stream s's piece of carried state at byte offset `at` in its block.
template <typename T>
__device__ __forceinline__ T* state_at(const DecoderStates& states, int s, size_t at) {
    return reinterpret_cast<T*>(states.blocks[s] + at);
}

// y = x + inv_beta·sin²(alpha·x), the CPU's arithmetic.
__device__ __forceinline__ float snake_eval(float v, float alpha, float inv_beta) {
    const float s = sinf(alpha * v);
    return v + inv_beta * (s * s);
}

// The tail slots of stream b, tails [2, C, L] at tails_at: {read (slot chunk & 1), write (the other)}.
struct TailSlots {
    const float* tail;
    float* next;
};
__device__ __forceinline__ TailSlots tail_slots(const DecoderStates& states, int b, size_t tails_at, int C, int L) {
    const int slot = int(*state_at<const int64_t>(states, b, DECODER_STATE_CHUNK_AT) & 1);
    float* tails = state_at<float>(states, b, tails_at);
    return {tails + size_t(slot) * C * L, tails + size_t(1 - slot) * C * L};
}

}  // namespace qtts::kernels
