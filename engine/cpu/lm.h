// fp32 CPU reference of the talker and the code predictor (model doc §4, §5).
//
// LmWeights is read-only after load and may be shared by any number of streams; every mutable
// thing (KV caches, activations, outputs) lives in TalkerState / PredictorState, one per stream.
// All weights are converted to fp32 once, except the 151936-row text embedding, which stays
// bf16 in the mapped checkpoint and is converted one row at a time when a text token is embedded.
// Dimension-generic: hidden sizes, head counts, GQA ratio, head size and layer counts all come
// from the config.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model/weight_prep.h"
#include "engine/model/weights.h"
#include "engine/text/prompt.h"

namespace qtts::cpu {

// One Qwen3 decoder layer in fp32; matrices are [out, in] row-major.
struct LayerF32 {
    std::vector<float> input_norm;  // [H]
    std::vector<float> q_proj;      // [n_heads*head_dim, H]
    std::vector<float> k_proj;      // [n_kv*head_dim, H]
    std::vector<float> v_proj;      // [n_kv*head_dim, H]
    std::vector<float> o_proj;      // [H, n_heads*head_dim]
    std::vector<float> q_norm;      // [head_dim]
    std::vector<float> k_norm;      // [head_dim]
    std::vector<float> post_norm;   // [H]
    std::vector<float> gate_proj;   // [I, H]
    std::vector<float> up_proj;     // [I, H]
    std::vector<float> down_proj;   // [H, I]
};

// A decoder stack (talker or code predictor) and its shape.
struct StackF32 : StackShape {
    // RoPE frequencies [head_dim / 2], computed from rope_theta at load. The talker's interleaved
    // MRoPE reduces to this 1-D table because its three position components are always equal.
    std::vector<float> rope_inv_freq;
    std::vector<LayerF32> layers;
    std::vector<float> norm;  // [H] final RMSNorm
};

// The talker's and code predictor's embedding tables in fp32 (the 151936-row text embedding stays
// bf16 in the mapped checkpoint) and the text projection: what prompts and frames are embedded
// with. The fp32 reference (LmWeights) and the fast backend's packed weights
// (cpu_fast::FastLmWeights) both hold them this way.
class LmEmbeddings : public EmbeddingTables {
public:
    int hidden_size() const override { return hidden_; }
    int num_code_groups() const { return num_code_groups_; }
    int codec_vocab() const { return codec_vocab_; }          // talker head size (3072)
    int predictor_vocab() const { return predictor_vocab_; }  // per-codebook size (2048)

    void text_vector(int32_t id, float* out) const override;
    void codec_vector(int codebook, int32_t id, float* out) const override;

    std::vector<float> codec_embedding;  // [codec_vocab, H]
    std::vector<float> text_fc1_w;       // [Ht, Ht]
    std::vector<float> text_fc1_b;       // [Ht]
    std::vector<float> text_fc2_w;       // [H, Ht]
    std::vector<float> text_fc2_b;       // [H]
    const TensorView* text_embedding = nullptr;                 // [text_vocab, Ht] bf16, mapped
    std::vector<std::vector<float>> predictor_codec_embedding;  // (G-1) x [predictor_vocab, H]

protected:
    // Converts the tables of a loaded checkpoint (which must outlive them: the text embedding
    // stays mapped) and reads the sizes.
    void embeddings_load(const Checkpoint& checkpoint);

    int hidden_ = 0;
    int num_code_groups_ = 16;
    int codec_vocab_ = 3072;
    int predictor_vocab_ = 2048;
    int text_hidden_ = 0;
    int text_vocab_ = 0;
};

class LmWeights final : public LmEmbeddings {
public:
    // Converts the talker and code-predictor tensors of a loaded checkpoint to fp32.
    static std::shared_ptr<const LmWeights> load(std::shared_ptr<const Checkpoint> checkpoint);

    const ModelConfig& config() const { return checkpoint_->config; }
    const GenerationConfig& generation_config() const { return checkpoint_->generation; }

    StackF32 talker;
    std::vector<float> codec_head;  // [codec_vocab, H]

    StackF32 predictor;
    std::vector<std::vector<float>> predictor_head;  // (G-1) x [predictor_vocab, Hc]
    std::vector<float> predictor_proj_w;  // [Hc, H] small_to_mtp_projection; empty = identity
    std::vector<float> predictor_proj_b;  // [Hc]

private:
    std::shared_ptr<const Checkpoint> checkpoint_;  // keeps the text embedding mapped
};

// KV cache and activation buffers of one stack. Buffers only grow (capacity doubles), so a
// decode step allocates nothing once the stream is warm.
struct StackState {
    int length = 0;    // positions already in the cache (= the next absolute position)
    int capacity = 0;  // rows allocated per layer
    int rows = 0;      // activation rows allocated
    std::vector<std::vector<float>> k_cache;  // per layer [capacity, n_kv*head_dim] (post-norm, post-RoPE)
    std::vector<std::vector<float>> v_cache;  // per layer [capacity, n_kv*head_dim]
    std::vector<float> x;        // [rows, H] residual stream
    std::vector<float> x_norm;   // [rows, H]
    std::vector<float> q;        // [rows, n_heads*head_dim]
    std::vector<float> attn;     // [rows, n_heads*head_dim]
    std::vector<float> proj;     // [rows, H]
    std::vector<float> gate;     // [rows, I]
    std::vector<float> up;       // [rows, I]
    std::vector<int64_t> positions;  // [rows]
};

// Makes room for `capacity` cached positions and `rows` new positions per call.
void stack_reserve(const StackF32& w, StackState& s, int capacity, int rows);
// Runs T new positions (input [T, H]) through every layer at absolute positions
// length..length+T-1 and appends them to the cache. The pre-norm output is left in s.x [T, H].
void stack_forward(const StackF32& w, StackState& s, const float* input, int T);

struct TalkerState {
    StackState stack;
    std::vector<float> hidden;  // [H] final-normed hidden state of the last position
    std::vector<float> logits;  // [codec_vocab] codec_head(hidden)
};

// Sizes the state for `capacity` positions (it grows past that if needed) and empties it.
void talker_state_init(const LmWeights& w, TalkerState& s, int capacity);
// Prefill: embeds [L, H] → s.hidden, s.logits of the last position.
void talker_prefill(const LmWeights& w, TalkerState& s, const float* embeds, int L);
// One decode step: input [H] at the next position → s.hidden, s.logits.
void talker_step(const LmWeights& w, TalkerState& s, const float* input);

struct PredictorState {
    StackState stack;
    std::vector<float> talker_rows;  // [2, H] predictor inputs before the projection
    std::vector<float> input;        // [2, Hc] projected inputs
    std::vector<float> hidden;       // [Hc] final-normed last position
    std::vector<float> logits;       // [predictor_vocab]
};

void predictor_state_init(const LmWeights& w, PredictorState& s);
// Starts a frame with a fresh cache: positions 0,1 = [P(talker_hidden), P(E_talker[code0])];
// s.logits = lm_head[0] → codebook 1.
void predictor_prefill(const LmWeights& w, PredictorState& s, const float* talker_hidden, int32_t code0);
// Codebook `group` (2..G-1): input P(predictor_codec_embedding[group-2][previous_code]);
// s.logits = lm_head[group-1].
void predictor_step(const LmWeights& w, PredictorState& s, int group, int32_t previous_code);

}  // namespace qtts::cpu
