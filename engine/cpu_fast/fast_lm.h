// The fast CPU talker and code predictor (model doc §4, §5): the reference's structure
// (engine/cpu/lm.h: read-only weights apart from per-stream state, one function per stage), with
// every matrix packed in bf16 or int8 (matvec.h) and each product split across a persistent
// thread pool. Norms, RoPE and attention are the reference's fp32 ops on fp32 activations; the KV
// caches are fp32.
//
// Fusions: q/k/v are one packed matrix [q + 2·kv, H] and gate/up one [2·I, H], so a layer is four
// parallel products. Embedding tables stay fp32 (rows are looked up, never streamed); the text
// projection (run once per text token, not per frame) is the reference's fp32 product.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/cpu/lm.h"
#include "engine/cpu_fast/matvec.h"
#include "engine/cpu_fast/pack_cache.h"
#include "engine/cpu_fast/thread_pool.h"
#include "engine/model/weight_prep.h"
#include "engine/model/weights.h"
#include "engine/text/prompt.h"

namespace qtts::cpu_fast {

struct FastLayer {
    std::vector<float> input_norm;  // [H]
    std::vector<float> q_norm;      // [head_dim]
    std::vector<float> k_norm;      // [head_dim]
    std::vector<float> post_norm;   // [H]
    PackedMatrix qkv;               // [n_heads·hd + 2·n_kv·hd, H]: q_proj, k_proj, v_proj stacked
    PackedMatrix o_proj;            // [H, n_heads·hd]
    PackedMatrix gate_up;           // [2·I, H]: gate_proj, up_proj stacked
    PackedMatrix down_proj;         // [H, I]
};

struct FastStack : StackShape {
    std::vector<float> rope_inv_freq;  // [head_dim / 2]
    std::vector<FastLayer> layers;
    std::vector<float> norm;  // [H]
    size_t bytes() const;     // packed bytes one position reads
};

class FastLmWeights final : public cpu::LmEmbeddings {
public:
    // Packs the talker and code predictor of a loaded checkpoint in `format`. With a cache
    // directory, the packed matrices are read from its file for this checkpoint and format when
    // that file is valid, else packed and written there (pack_cache.h).
    static std::shared_ptr<const FastLmWeights> load(std::shared_ptr<const Checkpoint> checkpoint, WeightFormat format,
                                                     const std::string& cache_dir = "");

    const ModelConfig& config() const { return checkpoint_->config; }
    WeightFormat format() const { return format_; }
    PackCacheStatus cache_status() const { return cache_status_; }  // how load() got the packed matrices

    // Packed bytes one frame reads: a talker step, the predictor's 2-row prefill and G-2 steps,
    // and their heads (what the benchmark divides by the frame time).
    size_t frame_bytes() const;
    size_t packed_bytes() const;  // all packed matrices

    FastStack talker;
    PackedMatrix codec_head;  // [codec_vocab, H]

    FastStack predictor;
    std::vector<PackedMatrix> predictor_head;                   // (G-1) x [predictor_vocab, Hc]
    PackedMatrix predictor_proj;                                // [Hc, H]; empty = identity
    std::vector<float> predictor_proj_b;                        // [Hc]

private:
    static std::shared_ptr<FastLmWeights> load_from(const std::shared_ptr<const Checkpoint>& checkpoint,
                                                    PackSource& source);

    std::shared_ptr<const Checkpoint> checkpoint_;
    WeightFormat format_ = WeightFormat::WEIGHT_FORMAT_BF16;
    PackCacheStatus cache_status_ = PackCacheStatus::PACK_CACHE_OFF;
};

class FastSpeechDecoder;  // fast_speech_decoder.h

// The packed weights with the pool that runs their products: what a model shares with its streams.
struct FastLm {
    std::shared_ptr<const FastLmWeights> weights;
    std::shared_ptr<ThreadPool> pool;
    size_t parallel_min = MATMUL_PARALLEL_MIN;  // matmul's threshold (tests set 0 to split tiny models)
    // The fast speech decoder, on the same pool; null: streams decode with the fp32 reference's.
    std::shared_ptr<const FastSpeechDecoder> decoder = nullptr;
};

// KV caches and activations of one stack; buffers only grow, so a warm step allocates nothing.
struct FastStackState {
    int length = 0;
    int capacity = 0;
    int rows = 0;
    std::vector<std::vector<float>> k_cache;  // per layer [capacity, n_kv·hd]
    std::vector<std::vector<float>> v_cache;
    std::vector<float> x;       // [rows, H] residual stream
    std::vector<float> x_norm;  // [rows, H]
    std::vector<float> qkv;     // [rows, q + 2·kv]
    std::vector<float> q;       // [rows, q]
    std::vector<float> attn;    // [rows, q]
    std::vector<float> proj;    // [rows, H]
    std::vector<float> gate_up; // [rows, 2·I]
    std::vector<float> act;     // [rows, I]
    std::vector<int64_t> positions;
};

void fast_stack_reserve(const FastStack& w, FastStackState& s, int capacity, int rows);
// T new positions (input [T, H]) through every layer; the pre-norm output is left in s.x.
void fast_stack_forward(const FastLm& lm, const FastStack& w, FastStackState& s, const float* input, int T);

struct FastTalkerState {
    FastStackState stack;
    std::vector<float> hidden;  // [H]
    std::vector<float> logits;  // [codec_vocab]
};
void fast_talker_state_init(const FastLmWeights& w, FastTalkerState& s, int capacity);
void fast_talker_prefill(const FastLm& lm, FastTalkerState& s, const float* embeds, int L);
void fast_talker_step(const FastLm& lm, FastTalkerState& s, const float* input);
// T more prefill positions (embeds [T, H]) after the cached ones; hidden/logits of the last. A
// prefill of L rows run as fast_talker_prefill of its first rows and fast_talker_extend of the
// rest is bitwise the prefill of all L at once (every row's products and attention are its own).
void fast_talker_extend(const FastLm& lm, FastTalkerState& s, const float* embeds, int T);

struct FastPredictorState {
    FastStackState stack;
    std::vector<float> talker_rows;  // [2, H]
    std::vector<float> input;        // [2, Hc]
    std::vector<float> hidden;       // [Hc]
    std::vector<float> logits;       // [predictor_vocab]
};
void fast_predictor_state_init(const FastLmWeights& w, FastPredictorState& s);
void fast_predictor_prefill(const FastLm& lm, FastPredictorState& s, const float* talker_hidden, int32_t code0);
void fast_predictor_step(const FastLm& lm, FastPredictorState& s, int group, int32_t previous_code);

// Batched steps (issue 18 on the CPU: several streams' frames made together,
// cpu_fast::FastBatchStep): the calls above for n streams at once, each product over all their
// rows (the weights streamed once for all of them), each stream's attention over its own cache.
// Every row gets the operations it gets alone, so each state ends bitwise as after its own
// call. The activations live in the scratch (grown to the largest n, then reused).
struct FastBatchScratch {
    FastStackState talker;     // activations of a batched talker step (its caches stay empty)
    FastStackState predictor;  // the same for the predictor
    std::vector<FastStackState*> stacks;
    std::vector<float> rows;    // [2n, H] the predictor's inputs before its projection
    std::vector<float> input;   // [2n, Hc]
    std::vector<float> hidden;  // [n, hidden]
    std::vector<float> logits;  // [n, vocab]
};
// inputs [n, H]: one new position for each talker state.
void fast_talker_step_batch(const FastLm& lm, FastTalkerState* const* states, int n, const float* inputs,
                            FastBatchScratch& b);
void fast_predictor_prefill_batch(const FastLm& lm, FastPredictorState* const* states, int n,
                                  const float* const* talker_hidden, const int32_t* code0, FastBatchScratch& b);
void fast_predictor_step_batch(const FastLm& lm, FastPredictorState* const* states, int n, int group,
                               const int32_t* previous_code, FastBatchScratch& b);

}  // namespace qtts::cpu_fast
