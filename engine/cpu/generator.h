// The frame-by-frame generation loop of the CPU backends (model doc §2.1, §7).
//
// One Generator is one utterance in flight: it owns an LmSession (the talker and predictor state
// on one backend's shared, read-only weights), the text track queue, the sampling history and the
// RNG. The loop (sampling, text track, stop rules, hooks) is written once; what runs the networks
// is the session: the fp32 reference here (Generator(LmWeights)), the packed bf16/int8 networks of
// the fast backend (cpu_fast::FastGenerator). Same seed, same session results -> same codes.
//
//   gen.start(prefill, L, trailing, T, params, seed);
//   std::array<int32_t, 16> codes;
//   while (gen.next_frame(codes) == FrameStatus::FRAME_STATUS_FRAME) decode(codes);
//   gen.stop_reason();   // EOS, frame budget or max_frames
//
// Each next_frame() runs the talker step for the previous frame (if any), samples codebook 0,
// stops at EOS (the EOS frame is never returned) or at the frame limit, and otherwise runs the
// 15 code-predictor passes and returns the complete frame. Text may keep arriving while
// generating (streaming text layout): text_append() queues ids for the text track,
// text_close() ends the text. While the text is open and the queue is empty, next_frame()
// returns FRAME_STATUS_WAITING_FOR_TEXT without doing anything; call it again after appending.
// Not thread-safe: one thread drives a generator.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/lm.h"
#include "engine/generation/frame.h"
#include "engine/generation/sampling.h"

namespace qtts::cpu {

// One utterance's talker and code predictor, as the frame loop drives them: a backend's weights
// (shared) and this utterance's state (owned). Pointers returned stay valid until the next call.
class LmSession {
public:
    virtual ~LmSession() = default;
    virtual const EmbeddingTables& tables() const = 0;  // text and codec embeddings, hidden size
    virtual const ModelConfig& config() const = 0;
    virtual int num_code_groups() const = 0;
    virtual int codec_vocab() const = 0;      // talker head size
    virtual int predictor_vocab() const = 0;  // per-codebook size

    // Empties the talker cache (room for `capacity` positions, grown past that when needed) and
    // runs the prefill embeds [L, H].
    virtual void talker_prefill(const float* embeds, int L, int capacity) = 0;
    virtual void talker_step(const float* input) = 0;  // one position, input [H]
    // A prefill in parts (Generator::start_open): T more prompt rows [T, H] after the cached
    // ones, leaving hidden/logits as talker_prefill of all the rows would. Only on sessions whose
    // rows come out bitwise those of one prefill (prefill_slices(): cpu-fast, whose every product
    // row is computed alone); the fp32 reference's BLAS products depend on the row count.
    virtual bool prefill_slices() const { return false; }
    virtual void talker_prefill_more(const float* embeds, int T) {
        (void)embeds;
        (void)T;
        QTTS_ASSERT(false && "talker_prefill_more on a session without prefill_slices()");
    }
    virtual const float* talker_hidden() const = 0;    // [H] final-normed last position
    virtual const float* talker_logits() const = 0;    // [codec_vocab]
    virtual int context_length() const = 0;            // talker positions cached

    // Codebook 1 of a frame from the talker's hidden state and codebook 0; then codebooks 2..G-1.
    virtual void predictor_prefill(const float* talker_hidden, int32_t code0) = 0;
    virtual void predictor_step(int group, int32_t previous_code) = 0;
    virtual const float* predictor_logits() const = 0;  // [predictor_vocab]
};

// Observation points for tests and debugging (all optional; pointers valid during the call).
struct GeneratorHooks {
    // Talker output row r (r = 0 after the prefill, r = k+1 after decode step k): hidden [H]
    // after the final norm, raw logits [codec_vocab] before any processor.
    std::function<void(int row, const float* hidden, const float* logits)> on_talker_row;
    // Raw code-predictor logits [predictor_vocab] for codebook `group` (1..15) of frame `frame`.
    std::function<void(int frame, int group, const float* logits)> on_predictor_logits;
    // The talker input [H] of decode step k (frame embedding sum + text track).
    std::function<void(int step, const float* input)> on_step_input;
};

class Generator {
public:
    // The fp32 reference networks.
    explicit Generator(std::shared_ptr<const LmWeights> weights);
    // Any backend's networks.
    explicit Generator(std::unique_ptr<LmSession> lm);
    virtual ~Generator() = default;

    // Starts an utterance. prefill [L, H] and trailing [T, H] are prompt_embed() /
    // prompt_embed_trailing() output; text_tokens is Prompt::text_tokens (frame budget);
    // text_closed = false when more text will be appended (streaming layout only).
    // Runs the talker prefill.
    void start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
               uint64_t seed, int text_tokens, bool text_closed = true);
    // Convenience: embeds a built prompt with the generator's weights and starts.
    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed);
    // A start in parts (the engine's sliced starts, EngineOptions::prefill_slice), on sessions
    // with lm().prefill_slices(): start_open() does what start() does except the talker prefill,
    // keeps the prompt's embeds and returns their rows; start_advance(rows) runs up to `rows`
    // more of them and returns how many are left. At 0 the utterance has started, in the state
    // start() leaves, bitwise. Nothing else may be called on the generator in between.
    int start_open(const Prompt& prompt, const GenerationParams& params, uint64_t seed);
    int start_advance(int rows);
    int start_rows_left() const { return open_rows_ - open_done_; }  // 0 when no start is open

    FrameStatus next_frame(FrameCodes& codes);

    // Streaming text: queue more text ids (projected now), or end the text (queues <tts_text_eod>).
    // Throws ERROR_INVALID_ARGUMENT after text_close() or when the utterance was started closed.
    void text_append(const int32_t* ids, size_t n);
    void text_close();
    bool text_closed() const { return text_closed_; }

    void hooks_set(GeneratorHooks hooks) { hooks_ = std::move(hooks); }

    StopReason stop_reason() const { return stop_reason_; }
    int frames_emitted() const { return frames_; }
    int frame_limit() const { return frame_limit_; }   // frames this utterance may emit at most
    int context_length() const { return lm_->context_length(); }
    const LmSession& lm() const { return *lm_; }

    // True when the next `frames` next_frame() calls can all run without waiting for text: started,
    // not stopped, a frame left before the limit, and the text track reaching past them (what a
    // batched step asks before it makes a chunk for this utterance; cpu_fast::FastBatchStep).
    bool batch_ready(int frames) const;

protected:
    // next_frame() in phases, for a driver that runs the sessions of several generators together
    // (cpu_fast::FastBatchStep::run) and must give each the same arithmetic and draws
    // as next_frame():
    //   if (step_pending()) { session.talker_step(step_input_make()); talker_stepped(); }
    //   if (!code0_draw(&code0)) -> stopped (stop_reason() says why)
    //   codes[0] = code0; for g in 1..G-1: session.predictor_prefill / predictor_step; group_draw(g, codes)
    //   frame_close(codes)
    LmSession& session() { return *lm_; }
    bool step_pending() const { return step_pending_; }
    const float* step_input_make();  // the talker input [H] of decode step frames_-1
    void talker_stepped();           // after the session's talker_step
    bool code0_draw(int32_t* code0); // samples codebook 0; false at a stop (EOS, frame limit)
    void group_draw(int group, FrameCodes& codes);  // samples codebook `group` from the session's logits
    void frame_close(const FrameCodes& codes);       // the frame is emitted

private:
    // start()'s state for a new utterance, before the talker prefill of L rows; returns the
    // talker cache's capacity to reserve.
    int start_reset(int L, const float* trailing, int T, const GenerationParams& params, uint64_t seed,
                    int text_tokens, bool text_closed);
    void start_done();  // after the whole prefill
    void frame_limit_update();
    // The talker step of the next frame needs a text-track row that has not been appended yet.
    bool step_waits() const { return frames_ - 1 >= trailing_rows_ && !text_closed_; }

    std::unique_ptr<LmSession> lm_;
    GenerationParams params_;
    Codebook0Rules rules_;
    SamplingRng rng_;
    TokenHistory history_;
    SamplerScratch scratch_;
    GeneratorHooks hooks_;

    std::vector<float> trailing_;   // [queued, H] text track rows, consumed by decode step index
    // An open start (start_open): the prompt's embeds [open_rows_, H], open_done_ of them prefilled.
    std::vector<float> open_prefill_;
    int open_rows_ = 0;
    int open_done_ = 0;
    int open_capacity_ = 0;
    int trailing_rows_ = 0;
    std::vector<float> pad_vector_; // [H] projected <tts_pad>
    std::vector<float> step_input_; // [H]
    std::vector<float> frame_sum_;  // [H]
    std::vector<float> row_;        // [H]
    FrameCodes pending_{};          // codes of the last emitted frame, not yet fed to the talker
    bool step_pending_ = false;
    bool started_ = false;
    bool done_ = false;
    bool text_closed_ = true;
    int text_tokens_ = 0;
    int frames_ = 0;                // frames emitted
    int frame_limit_ = 0;
    bool limit_is_explicit_ = false;
    StopReason stop_reason_ = StopReason::STOP_NONE;
};

}  // namespace qtts::cpu
