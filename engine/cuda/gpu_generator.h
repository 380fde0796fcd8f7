// The generation loop on the CUDA backend: the same stop rules and the same codes as
// cpu::Generator (cpu/generator.h), one chunk per call (engine/generation/chunk_generator.h).
//
// chunk(K) computes exactly K frames (fewer only at the frame limit or where incremental text
// runs dry): one replay of the K-frame graph when K is one of BackendOptions::chunk_sizes (eager
// steps otherwise), then ONE device-to-host copy of the chunk's codes and one sync. There is no
// chunk count of its own: the caller (the engine) picks every K, and nothing is computed past
// the chunk, except frames after an end-of-speech token inside it, which are dropped.
//
// Audio (issue 7, "one chunk, one launch"): with a speech decoder attached (decoder_attach),
// chunk() also appends every emitted frame's samples. A chunk whose size has a fused graph
// (cuda/fused_chunks.h) is ONE replay: frame steps, the device-side hand-off of the codes, the
// decoder under a graph condition, the copies; one sync. A chunk that holds the end-of-speech
// token skips the decoder inside that replay, and only the frames before the stop are then
// decoded (ordinary decoder call); chunk sizes without a fused graph decode right after their
// codes arrive. Either way the decoder sees exactly the emitted frames, in order, and continues
// across start() calls (the segments of one utterance). Without a decoder, chunk() gives codes
// only and the caller decodes (cuda/gpu_generator_pool.cpp).
//
// Streaming text: the talker step of frame k needs text-track row k while the text is open, so
// chunk() reports WAITING_FOR_TEXT one frame earlier than the CPU generator does (the codes are
// the same).
// Threading: the owner thread of the context.
#pragma once

#include <memory>
#include <vector>

#include "engine/api/qtts.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/fused_chunks.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/cuda/gpu_speech_decoder.h"
#include "engine/generation/chunk_generator.h"
#include "engine/generation/frame.h"

namespace qtts::cuda {

// The LM state options a generator of `options` makes (its context, its prefill chunk).
GpuLmOptions gpu_lm_options(const BackendOptions& options);

class GpuGenerator {
public:
    // Allocates the GPU state and captures one frame graph per options.chunk_sizes (when
    // options.cuda_graphs; start-up cost, logged). Reads max_context, prefill_chunk,
    // cuda_graphs, fused_chunks and chunk_sizes; `options` was validated where it entered (backend_options_validate).
    GpuGenerator(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, const BackendOptions& options);

    void start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
               uint64_t seed, int text_tokens, bool text_closed = true);
    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed);
    // start(prompt, params, seed) in two halves around a prefill run elsewhere (several streams'
    // prompts together: GpuGeneratorPool::batch_start): start_load() checks the parameters and the
    // prompt (throws ERROR_INVALID_ARGUMENT with the state unchanged) and loads the prompt
    // (GpuLm::prompt_load); after the prefill of its rows, start_finish() begins the segment: it
    // enqueues the first draw and the read of its code, and start_land(), after the caller has
    // synchronised the context (once for every stream started together), takes the code in.
    GpuLm::PromptRows start_load(const Prompt& prompt, const GenerationParams& params);
    void start_finish(const Prompt& prompt, const GpuLm::PromptRows& rows, const GenerationParams& params,
                      uint64_t seed);
    void start_land();

    // Up to `frames` (>= 1) frames: codes appended to *codes and, with a decoder attached, their
    // samples to *pcm (untouched without one; may then be null). See ChunkGenerator::chunk.
    ChunkStatus chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm);

    void text_append(const int32_t* ids, size_t n);
    void text_close();
    bool text_closed() const { return text_closed_; }

    // Batched steps (cuda/gpu_batch.h, GpuGeneratorPool::batch_run): whether the next chunk(frames)
    // can take its frames from a step of `frames` frames (ChunkGenerator::batch_ready); after a
    // batch computed them on the device, batch_computed(frames) makes that chunk() take them
    // instead of replaying its own graph (it then reads the codes and decodes them as usual). A
    // stream with fewer than `frames` frames left before its frame limit joins too, when the
    // device has room for all of them: the frames past the limit are made and dropped, as frames
    // after an end-of-speech are (the last chunk of a capped stream would otherwise run alone).
    bool batch_ready(int frames);
    void batch_computed(int frames);
    // Frames the segment can still make before its frame limit (ChunkGenerator::frames_left): a
    // step of all capped streams' last chunks needs no more than the largest of these.
    int frames_left() const { return frame_limit_ - computed_; }
    // Batched decoding (GpuGeneratorPool::batch_run): after batch_computed, the chunk's codes are
    // copied to the host for every stream of the step at once — batch_codes_enqueue (asynchronous),
    // one synchronisation by the caller, then batch_codes_land, which returns how many of the
    // chunk's frames the next chunk() keeps (`frames` when the chunk is whole; fewer before an
    // end-of-speech or the frame limit). Those `kept` frames' codes [kept, nq] (batch_decode_codes)
    // may then be decoded in a batched pass with other streams that keep as many;
    // batch_pcm_set hands their samples over and chunk() emits them as they are. A chunk whose
    // samples were not set is decoded by chunk() itself, its kept frames only (either way the
    // decoder state goes on from the kept frames into the next segment).
    void batch_codes_enqueue(int frames);
    int batch_codes_land(int frames);
    void batch_decode_codes(int kept, int32_t* out) const;
    void batch_pcm_set(const float* pcm, int kept);
    // Or the pass runs beside the next step (GpuGeneratorPool::batch_run, deferred audio):
    // batch_pcm_defer(kept) makes the next chunk() emit the kept frames' codes without their
    // samples (audio_owed() frames then), audio_deliver() brings the samples when the pass has
    // landed and audio_take() appends them; the next chunk() needs them taken. audio_clear() drops
    // what is owed (a stream that ended; its decoder is reset before the state is used again).
    void batch_pcm_defer(int kept);
    int audio_owed() const { return audio_owed_; }
    bool audio_delivered() const { return !owed_pcm_.empty(); }
    void audio_deliver(const float* pcm, int frames);
    void audio_take(std::vector<float>* pcm);
    void audio_clear();

    StopReason stop_reason() const { return stop_reason_; }
    int frames_emitted() const { return frames_; }
    int frame_limit() const { return frame_limit_; }
    int context_length() const { return prompt_length_ + frames_; }

    // ---- audio ---------------------------------------------------------------------------
    // Gives the generator its speech decoder (same GPU context; its graph sizes should include
    // the chunk sizes) and captures the fused chunk graphs.
    void decoder_attach(std::unique_ptr<GpuSpeechDecoder> decoder);
    GpuSpeechDecoder* decoder() { return decoder_.get(); }
    // A new audio stream: the decoder back to position 0 (between utterances).
    void decoder_reset();
    // Chunk sizes replayed as one fused graph (empty without a decoder or with fusion off).
    std::vector<int> fused_sizes() const;
    bool graphs_enabled() const { return graphs_.enabled(); }
    // True after an early-audio fused chunk until the next call lands its tail (cuda/fused_chunks.h; tests).
    bool tail_pending() const { return fused_ && fused_->pending(); }
    GpuLm& lm() { return lm_; }
    FrameGraphs& graphs() { return graphs_; }

private:
    void begin(const GenerationParams& params, int L, int text_tokens, bool text_closed);
    void frame_limit_update();
    bool stop_check();                                    // at frames_: end-of-speech or frame limit
    // Frames whose samples it appended to *pcm (the fused replay's whole chunk, or the kept frames
    // a batched pass decoded), 0 when chunk() must decode them.
    int chunk_compute(int frames, std::vector<float>* pcm);
    // After a fused replay, its tail (the talker step after the chunk's audio) may still run:
    // waits for it and takes the row after the chunk into host_codes_. Every entry point calls
    // it first, so no other code sees a pending tail.
    void tail_land();
    void frames_decode(int first, int frames, std::vector<float>* pcm);  // host codes -> decoder

    GpuContext& context_;
    const std::vector<int> chunk_sizes_;  // sizes with captured graphs (BackendOptions::chunk_sizes)
    const bool fused_chunks_;             // BackendOptions::fused_chunks
    GpuLm lm_;
    FrameGraphs graphs_;
    GenerationParams params_;
    int32_t eos_id_ = 2150;
    int prompt_length_ = 0;
    int text_tokens_ = 0;
    bool text_closed_ = true;
    bool started_ = false;
    bool start_landed_ = true;  // false between start_finish() and start_land(): host_codes_[0] not in
    bool done_ = false;
    int frames_ = 0;    // frames emitted (== frames computed, but for those dropped after an end-of-speech)
    int computed_ = 0;  // frames whose 16 codes are on the host (codebook 0 of frame computed_ too)
    int precomputed_ = 0;  // frames after computed_ that a batched step made on the device
    bool batch_codes_landed_ = false;  // ... whose codes are on the host already (batch_codes_land)
    bool batch_pcm_ready_ = false;     // ... and decoded in a batched pass (batch_pcm_)
    std::vector<float> batch_pcm_;     // the kept frames' samples
    int batch_pcm_deferred_ = 0;       // ... or how many a pass beside the next step decodes
    int audio_owed_ = 0;               // frames emitted without their samples (batch_pcm_defer)
    std::vector<float> owed_pcm_;      // ... their samples once the pass landed (empty: not yet)
    int frame_limit_ = 0;
    int frame_room_ = 0;  // frames the device buffers hold after the prompt (>= frame_limit_)
    bool limit_is_explicit_ = false;
    StopReason stop_reason_ = StopReason::STOP_NONE;
    std::vector<int32_t> host_codes_;  // [code_capacity, 16]
    PinnedArray<int32_t> chunk_codes_; // [largest chunk so far + 1, 16]

    std::unique_ptr<GpuSpeechDecoder> decoder_;  // before fused_, which refers to it
    std::unique_ptr<FusedChunkGraphs> fused_;
    std::vector<int32_t> decode_codes_;  // [frames, nq] packed for the decoder
};

}  // namespace qtts::cuda
