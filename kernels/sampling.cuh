// On-device token sampling, reproducing engine/runtime/sampling.h step for step:
//   codebook 0: repetition penalty over the codebook-0 ids generated so far (a seen-flag array
//               in device memory) → EOS mask while fewer than min_new_tokens were generated →
//               suppression of [suppress_begin, n) except EOS → [sampling] temperature → top-k →
//               top-p → softmax → draw;   greedy: argmax after the first three steps.
//   codebooks 1..15: temperature → top-k → top-p → softmax → draw (or argmax).
// The uniform number of a draw is Philox4x32-10 (seed, stream = codebook, index = frame), the
// same pure function the CPU uses, so the GPU reproduces the CPU's random stream. The frame
// index, the seed, the parameters and the history live in device memory (GenerationDeviceState)
// and are advanced by the kernel itself, so graph replays keep drawing fresh numbers.
#pragma once

#include "kernels/common.cuh"

namespace qtts::kernels {

constexpr int SAMPLE_MAX_VOCAB = 4096;
constexpr int SAMPLE_MAX_GROUPS = 16;

struct SamplingDeviceParams {
    int32_t greedy = 0;
    float temperature = 1.0f;
    int32_t top_k = 0;
    float top_p = 1.0f;
    float repetition_penalty = 1.0f;
};

// One utterance's generation state in device memory.
struct GenerationDeviceState {
    uint64_t seed = 0;
    int32_t frame = 0;           // frame whose codes are being completed (its codebook 0 is known)
    int32_t position = 0;        // talker positions in the KV cache
    int32_t history_count = 0;   // codebook-0 tokens sampled so far
    int32_t min_new_tokens = 2;
    int32_t trailing_rows = 0;   // text-track rows available
    int32_t code_capacity = 0;   // rows of the codes buffer
    // Batched steps (engine/cuda/gpu_batch.h): a stream stops advancing once `stopped` is set.
    // The codebook-0 draw sets it to 1 on end-of-speech and to 2 when `frame` reaches
    // frame_end or `position` reaches position_end (the KV cache is full).
    int32_t stopped = 0;
    int32_t frame_end = 0x7fffffff;
    int32_t position_end = 0x7fffffff;
    SamplingDeviceParams talker;
    SamplingDeviceParams predictor;
    int32_t current[SAMPLE_MAX_GROUPS] = {};  // codes of the frame in progress
};

struct StreamSlot;  // kernels/batch.cuh

struct SampleArgs {
    const float* logits = nullptr;  // [n] raw logits (batched: [rows, ld_logits])
    int n = 0;                      // <= SAMPLE_MAX_VOCAB
    GenerationDeviceState* state = nullptr;
    int group = 0;         // 0: codebook 0 (talker rules); 1..15: code predictor
    int frame_offset = 0;  // the draw belongs to frame state->frame + frame_offset
    bool advance = false;  // after storing: frame += 1, position += 1 (codebook 0 after a talker step)
    int eos_id = 2150;     // codebook-0 rules
    int suppress_begin = 2048;
    int32_t* seen = nullptr;   // [n] codebook-0 repetition flags
    int32_t* codes = nullptr;  // [code_capacity, SAMPLE_MAX_GROUPS]
    // Batched: one block per row r < rows draws for slots[r] (state, seen and codes above are
    // ignored) from logits row r, and also writes the code to batch_codes[r, group]. Rows that
    // are idle or stopped are skipped.
    const StreamSlot* slots = nullptr;
    int rows = 1;
    int ld_logits = 0;
    int32_t* batch_codes = nullptr;  // [rows, SAMPLE_MAX_GROUPS]
    // Optional (embed_out set): the draw also writes the next predictor pass's input row,
    // embed_out[r, 0 .. embed_dim) = row `code` of embed_table (bf16, widened to fp32) or of
    // embed_rows (fp32, as they are: GpuLmWeights::predictor_input_rows, the embedding already
    // projected); exactly one of the two is set, [vocab >= n, embed_dim]. `code` is the one the
    // draw picked or, for an idle or stopped batch row, the one batch_codes[r, group] holds (what a
    // gather of batch_codes would read). A single-sequence draw writes row 0.
    const bf16_t* embed_table = nullptr;
    const float* embed_rows = nullptr;
    int embed_dim = 0;
    float* embed_out = nullptr;  // [rows, embed_ld]
    int embed_ld = 0;
};

void sample(const SampleArgs& args, const Launch& launch);

// Host mirror of the device Philox draw (for tests): uniform in [0, 1).
float philox_uniform_host(uint64_t seed, uint32_t stream, uint64_t index);

// Tests: the top-k threshold (the k-th largest of values[0..n), device memory) as a draw finds
// it, out[3] (device): [0] by the bracket of buckets below the max (NaN where it hands over to
// the radix passes), [1] by the radix passes, [2] the max the bracket found (NaN likewise).
void top_k_threshold_probe(const float* values, int n, int k, float* out, const Launch& launch);

// Tests: the id a draw picks from probabilities[0..count) (device memory; id i for entry i) at the
// uniform u, into *out (device): the first entry whose running sum in index order exceeds u * total,
// else the last nonzero one (probs_pick() on the CPU, engine/generation/sampling.h).
void draw_probe(const float* probabilities, int count, float u, int* out, const Launch& launch);

}  // namespace qtts::kernels
