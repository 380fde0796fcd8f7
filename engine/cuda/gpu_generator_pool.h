// The CUDA backend as the runtime uses it: one GpuContext (device, stream, cuBLAS, owner guard),
// the talker + code predictor weights uploaded once, and a pool of per-stream generator states.
//
// Each state is a GpuGenerator: its own KV caches, activations, sampling state and captured frame
// graphs (~1 GB for the 1.7B talker at a 4096-position context, mostly the fp32 KV cache). A
// stream takes a state for its whole utterance and gives it back when the utterance is destroyed;
// the next stream reuses it (GpuGenerator::start resets everything an utterance depends on).
// BackendOptions::states of them are created up front (the engine asks for max_streams, so
// starting a stream never allocates or captures graphs on the engine thread while other streams
// are speaking); when more are in use at once than were created, a new one is made on demand
// and kept.
//
// acquire() hands out a ChunkGenerator (engine/generation/chunk_generator.h) that owns its
// decoder: the state's own GPU decoder (fused chunks, decoders_attach), else the DecoderStream
// the caller passes (a GPU decoder lease, or the CPU decoder with gpu_decoder = false).
//
// Threading: the pool and every state belong to the thread that created the pool (the engine
// thread); acquire() and the generators check the context's owner guard.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/api/qtts.h"
#include "engine/cuda/gpu_batch.h"
#include "engine/cuda/gpu_batch_decoder.h"
#include "engine/cuda/gpu_generator.h"
#include "engine/cuda/gpu_prefill_batch.h"
#include "engine/generation/chunk_generator.h"
#include "engine/generation/decoder_stream.h"

namespace qtts::cuda {

class GpuGeneratorPool : public std::enable_shared_from_this<GpuGeneratorPool> {
public:
    // Opens options.device on the calling thread (which becomes the owner) and uploads the
    // weights; no generator state yet (states_grow makes them, after the decoder weights are on
    // the device, so each is fitted to the memory left and measured whole). Keeps its own copy of
    // `options` (validated by the caller, backend_options_validate) and hands it to every state
    // by const reference. Throws qtts::Error (ERROR_CUDA, out of memory, ...) with the device's
    // message.
    static std::shared_ptr<GpuGeneratorPool> create(std::shared_ptr<const Checkpoint> checkpoint,
                                                    const BackendOptions& options);
    ~GpuGeneratorPool();
    GpuGeneratorPool(const GpuGeneratorPool&) = delete;
    GpuGeneratorPool& operator=(const GpuGeneratorPool&) = delete;

    // Creates states (with their decoders, once attached) until `total` exist. The memory they
    // may take is min(the device's free memory, BackendOptions::gpu_memory_limit less what qtts
    // holds) less a 256 MiB margin (graph, library and driver growth). Before the first state,
    // when one stream of max_context positions would not fit, the context is lowered (logged; at
    // least 256 positions, else ERROR_CUDA saying what is missing). Before each later one it
    // checks the room against the measured cost of the state before; when it does not fit it
    // stops (BackendOptions::states_fit: as many as fit) or throws ERROR_CUDA naming how many
    // concurrent streams fit, instead of failing in the middle of an allocation. Logs the slots,
    // their size and what is left.
    void states_grow(int total);
    // A generator for one utterance (owner thread only): an idle state, else a new one. `decoder`
    // decodes its chunks when the states have no decoder of their own (decoders_attached()
    // false; it must then be given) and is dropped with the generator.
    std::unique_ptr<ChunkGenerator> acquire(std::unique_ptr<DecoderStream> decoder);

    GpuContext& context() { return *context_; }
    const GpuLmWeights& weights() const { return *weights_; }
    int device() const { return options_.device; }
    int states_created() const { return created_; }
    int states_idle() const { return int(idle_.size()); }
    bool graphs_enabled() const { return graphs_enabled_; }
    size_t state_bytes() const { return state_bytes_; }
    // Device memory one stream slot took (its LM state, graphs and decoder), as measured.
    size_t slot_bytes() const { return slot_bytes_; }
    int max_context() const { return options_.max_context; }  // after states_grow: the one in use
    // What qtts holds on the device: the device's used memory since the context was made (weights,
    // states, graphs, libraries), at least what the tracked allocations add up to.
    size_t memory_used() const;

    // Gives every state (the idle ones now, later ones when created) its own speech decoder from
    // `make`, so that each generator decodes its frames itself, in fused chunk graphs where it
    // can (GpuGenerator::decoder_attach). Owner thread.
    using DecoderFactory = std::function<std::unique_ptr<GpuSpeechDecoder>()>;
    void decoders_attach(const DecoderFactory& make);
    bool decoders_attached() const { return bool(decoder_factory_); }
    const std::vector<int>& fused_sizes() const { return fused_sizes_; }  // chunk sizes fused (states alike)

    // Batched steps (BackendOptions::batching; cuda/gpu_batch.h): a GpuBatch for up to `streams`
    // streams, with a graph per bucket (2, 4, 8, 10, 12, 16, 24, 32, 48, 64 up to `streams`, and
    // `streams`) and chunk size, captured now; with the states' own decoders attached, also a
    // GpuBatchDecoder (cuda/gpu_batch_decoder.h) with a graph per stream count up to 16, then
    // every fourth, and chunk size. Owner thread; called once at load, after decoders_attach and
    // states_grow. What the batch takes was not in the room states_grow fitted the slots to: when
    // the memory (limit or device) is now short of the margin, idle slots are given back
    // (states_fit; at least one stays, logged), else ERROR_CUDA says what is missing.
    void batch_enable(int streams);
    int batch_max() const { return batch_ ? batch_->max_streams() : 0; }
    bool batch_decoding() const { return bool(batch_decoder_); }
    // The next chunk of each generator (from acquire(), each batch_ready(frames), at most
    // batch_max()) computed in one device step, then every stream's codes brought to the host at
    // once and the frames each keeps decoded in batched passes: one for the streams that keep the
    // whole chunk, one for each set of two or more that keep as many fewer frames (an
    // end-of-speech or the frame limit inside the chunk); their chunk(frames) calls then emit
    // those frames (decoding any the passes did not). Owner thread.
    // Returns the number of streams the batched decoder passes decoded (0: none).
    // With `defer_audio`, a step whose streams all keep the whole chunk leaves its pass running
    // on the decoder's own stream: their chunk() calls emit the codes with the samples owed
    // (ChunkGenerator::audio_owed), and the pass overlaps whatever the engine does next on the
    // LM stream (its next step). The samples land at the next batch_run, at an audio_take that
    // needs them, or when a state that is in the pass is released.
    // `meanwhile` (when set) runs once the step is launched and an earlier deferred pass's samples
    // have landed, before the host waits for the step: the engine publishes the chunks owed
    // (audio_take) there, while the device runs the step.
    int batch_run(const std::vector<ChunkGenerator*>& generators, int frames, bool defer_audio = false,
                  const std::function<void()>& meanwhile = {});
    // Waits for a deferred pass, if one is in flight, and hands its samples to its streams. Owner thread.
    void batch_audio_land();
    // Segment starts of several generators (from acquire()) with their prompts prefilled together
    // (cuda/gpu_prefill_batch.h) instead of one after another: each start's prompt and parameters
    // are checked first, and one that is refused gets its `error` and is left out (its generator
    // unchanged) while the others start; each started generator is then where start() leaves it.
    // Throws (ERROR_CUDA) when the device step fails: every generator's state is then unknown.
    // With BackendOptions::batch_exact the prompts are prefilled one by one (the arithmetic of a
    // start alone). Owner thread; after batch_enable.
    void batch_start(std::vector<GenerationStart>& starts);

    // After start-up work that takes device memory the slot plan did not see (the warm-up's first
    // kernel and library loads), gives idle slots back until the memory is within the limit and
    // margin again (states_fit, at least one stays; logged). When that cannot be (a given stream
    // count), it only warns: the margin is there for such growth, and load already succeeded.
    // Owner thread.
    void memory_settle();

    // Hands the context and every state to the calling thread (a model loaded on one thread and
    // driven from another). Refused while a replay is in progress.
    void owner_adopt();
    // After a failed call (GpuContext::recover on the LM context and the decoder passes' one):
    // false when the device can no longer be used.
    bool recover();

private:
    friend class GpuChunkGenerator;
    explicit GpuGeneratorPool(const BackendOptions& options);
    std::unique_ptr<GpuGenerator> state_new();
    void batch_decoder_enable();  // batch_enable's decoder half
    void state_release(std::unique_ptr<GpuGenerator> state);  // from a finished utterance
    GpuGenerator& leased_state(ChunkGenerator* generator) const;  // the state behind one of acquire()'s generators

    size_t memory_room() const;  // what states may take now (memory_plan.h gpu_memory_room)
    size_t memory_over() const;  // how far the memory in use is past the limit or margin (0: within)
    // Idle slots given back while memory_over() > 0 (states_fit; at least one stays; logged);
    // `what` took the memory. states_trim then fails with ERROR_CUDA if still over.
    void slots_give_back(const char* what);
    void states_trim(const char* what);
    std::string limit_text() const;
    size_t context_bytes_per_position() const;
    void context_fit_first();  // lowers options_.max_context when one stream would not fit

    BackendOptions options_;  // max_context may be lowered before the first state (context_fit_first)
    size_t memory_base_ = 0;   // device memory in use before this pool allocated (its context included)
    size_t tracked_base_ = 0;  // tracked allocations on the device before this pool's
    size_t slot_bytes_ = 0;
    std::unique_ptr<GpuContext> context_;  // first member: destroyed after everything built on it
    std::shared_ptr<const GpuLmWeights> weights_;
    std::vector<std::unique_ptr<GpuGenerator>> idle_;
    int created_ = 0;
    bool graphs_enabled_ = false;
    size_t state_bytes_ = 0;
    DecoderFactory decoder_factory_;
    std::vector<int> fused_sizes_;
    std::unique_ptr<GpuBatch> batch_;  // null without batching
    std::unique_ptr<GpuContext> side_;  // the batched decoder passes' stream (null without them)
    std::unique_ptr<GpuBatchDecoder> batch_decoder_;  // null without batching or own decoders, on side_
    std::vector<GpuGenerator*> deferred_;  // the streams of the pass in flight beside the next step
    std::unique_ptr<GpuPrefillBatch> prefill_batch_;  // null without batching
    std::vector<int32_t> batch_codes_;  // [streams, frames, nq] for the batched decoder pass
    std::vector<float> batch_pcm_;      // [streams, frames · spf]
};

}  // namespace qtts::cuda
