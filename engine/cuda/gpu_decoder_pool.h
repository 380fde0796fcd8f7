// The GPU speech decoder as the runtime uses it: the decoder weights uploaded once to the CUDA
// backend's device, and a pool of per-stream GpuSpeechDecoder states on the backend's context
// (same stream, cuBLAS handle and owner thread as the generator pool it is built on).
//
// The decoders share one scratch (DecoderPass): they run one chunk after another on the context's
// stream, so each stream costs only its state block (7.4 MB at release size).
// Like the generator pool, BackendOptions::states decoders are created up front (the engine asks
// for max_streams), each with its CUDA graphs captured for BackendOptions::chunk_sizes, so
// starting a stream allocates and captures nothing; a stream takes one for its whole utterance and the
// lease resets it (one memset) and gives it back when the utterance is destroyed. More streams
// at once than states make a new one on demand, which is kept.
//
// Threading: everything belongs to the owner thread of the generator pool's context.
#pragma once

#include <memory>
#include <vector>

#include "engine/cuda/gpu_generator_pool.h"
#include "engine/cuda/gpu_speech_decoder.h"
#include "engine/generation/decoder_stream.h"

namespace qtts::cuda {

class GpuDecoderPool : public std::enable_shared_from_this<GpuDecoderPool> {
public:
    // Uploads the decoder weights to the backend's device and creates the decoders up front, on
    // the calling thread (which must own the backend's context): options.states of them, or one
    // with fused chunks (each generator state then takes its own from state_take() as it is
    // made, so the generator pool's free-memory check sees both). Graphs (options.cuda_graphs)
    // for each of options.chunk_sizes. `options` was validated where it entered.
    static std::shared_ptr<GpuDecoderPool> create(std::shared_ptr<GpuGeneratorPool> backend, const Checkpoint& checkpoint,
                                                  const BackendOptions& options);
    ~GpuDecoderPool();
    GpuDecoderPool(const GpuDecoderPool&) = delete;
    GpuDecoderPool& operator=(const GpuDecoderPool&) = delete;

    // A fresh decoder stream (position 0) for one utterance, owner thread only.
    std::unique_ptr<DecoderStream> acquire();
    // A decoder handed over for good (an idle one, else a new one): the generator states that
    // decode their own frames own theirs (GpuGeneratorPool::decoders_attach). Owner thread only.
    std::unique_ptr<GpuSpeechDecoder> state_take();

    int states_created() const { return created_; }
    int states_idle() const { return int(idle_.size()); }
    bool graphs_enabled() const { return graphs_enabled_; }
    const GpuSpeechDecoderWeights& weights() const { return *weights_; }

private:
    friend class GpuDecoderLease;
    GpuDecoderPool(std::shared_ptr<GpuGeneratorPool> backend, const BackendOptions& options);
    std::unique_ptr<GpuSpeechDecoder> state_new();
    void state_release(std::unique_ptr<GpuSpeechDecoder> state);  // from a finished utterance

    std::shared_ptr<GpuGeneratorPool> backend_;  // first member: its context outlives the decoders
    GpuSpeechDecoderOptions decoder_options_;  // from the BackendOptions, for every state
    int states_ = 1;                          // made up front
    std::shared_ptr<const GpuSpeechDecoderWeights> weights_;
    std::shared_ptr<DecoderPass> pass_;  // the scratch every decoder of the pool shares
    std::vector<std::unique_ptr<GpuSpeechDecoder>> idle_;
    int created_ = 0;
    bool graphs_enabled_ = false;
};

}  // namespace qtts::cuda
