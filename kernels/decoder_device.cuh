// Device helpers shared by the speech decoder's kernel files (kernels/decoder.cu,
// kernels/decoder_conv.cu): where a stream's carried state lives, the SnakeBeta activation, and
// the value of a causal conv's input [carried tail | activated x]. Device code only; see
// kernels/decoder.cuh for the layouts.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/decoder.cuh"

namespace qtts::kernels::decoder_device {

// Stream s's piece of carried state at byte offset `at` in its block.
template <typename T>
__device__ __forceinline__ T* state_at(const DecoderStates& states, int s, size_t at) {
    return reinterpret_cast<T*>(states.blocks[s] + at);
}

// y = x + inv_beta·sin²(alpha·x) (precise sinf: the CPU reference's arithmetic).
__device__ __forceinline__ float snake_eval(float v, float alpha, float inv_beta) {
    const float s = sinf(alpha * v);
    return v + inv_beta * (s * s);
}

// Value of column s of [tail | act(x)] for channel c (s < L + T); x is this stream's first
// column, ld the row length of the signal (S·T).
__device__ __forceinline__ float carried_input(const float* tail, int L, const float* x, int ld, int c, int s,
                                               SnakeParams snake) {
    if (s < L) return tail[size_t(c) * L + s];
    float v = x[size_t(c) * ld + (s - L)];
    if (snake.alpha) v = snake_eval(v, snake.alpha[c], snake.inv_beta[c]);
    return v;
}

// The tail slots of stream b: {read, write} (two slots [C, L] at tails_at, picked by the parity
// of the stream's chunk counter).
struct TailSlots {
    const float* tail;
    float* next;
};
__device__ __forceinline__ TailSlots tail_slots(const DecoderStates& states, int b, size_t tails_at, int C, int L) {
    const int slot = int(*state_at<const int64_t>(states, b, DECODER_STATE_CHUNK_AT) & 1);
    float* tails = state_at<float>(states, b, tails_at);
    return {tails + size_t(slot) * C * L, tails + size_t(1 - slot) * C * L};
}

}  // namespace qtts::kernels::decoder_device
