#include "engine/cuda/gpu_decoder_pool.h"

#include <algorithm>
#include <thread>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cuda {

// One utterance's lease on a pooled decoder: forwards decode() and, when the utterance is
// destroyed, resets the state and gives it back.
class GpuDecoderLease final : public DecoderStream {
public:
    GpuDecoderLease(std::shared_ptr<GpuDecoderPool> pool, std::unique_ptr<GpuSpeechDecoder> state)
        : pool_(std::move(pool)), state_(std::move(state)) {}
    ~GpuDecoderLease() override { pool_->state_release(std::move(state_)); }
    GpuDecoderLease(const GpuDecoderLease&) = delete;
    GpuDecoderLease& operator=(const GpuDecoderLease&) = delete;

    void decode(const int32_t* codes, int n, std::vector<float>* pcm) override { state_->decode(codes, n, pcm); }

private:
    std::shared_ptr<GpuDecoderPool> pool_;  // keeps the weights and the context alive
    std::unique_ptr<GpuSpeechDecoder> state_;
};

GpuDecoderPool::GpuDecoderPool(std::shared_ptr<GpuGeneratorPool> backend, const BackendOptions& options)
    : backend_(std::move(backend)), states_(options.fused_chunks ? 1 : options.states) {
    decoder_options_.cuda_graphs = options.cuda_graphs;
    // Scratch for 8 frames (~66 MB at release size, vs ~205 MB for 25) per stream: the engine's
    // chunks fit it and replay their graphs; longer calls (ICL reference codes, bigger chunks)
    // are split into chunks of max_chunk_frames.
    decoder_options_.max_chunk_frames = 8;
    decoder_options_.graph_chunk_sizes.clear();
    for (const int n : options.chunk_sizes) {
        decoder_options_.max_chunk_frames = std::max(decoder_options_.max_chunk_frames, n);
        if (std::find(decoder_options_.graph_chunk_sizes.begin(), decoder_options_.graph_chunk_sizes.end(), n) ==
            decoder_options_.graph_chunk_sizes.end())
            decoder_options_.graph_chunk_sizes.push_back(n);
    }
}

GpuDecoderPool::~GpuDecoderPool() {
    // Decoders go before the weights; the context (held by backend_) goes last.
    idle_.clear();
}

std::shared_ptr<GpuDecoderPool> GpuDecoderPool::create(std::shared_ptr<GpuGeneratorPool> backend,
                                                       const Checkpoint& checkpoint,
                                                       const BackendOptions& options) {
    QTTS_ASSERT(backend);
    backend->context().guard().check("GpuDecoderPool::create");
    std::shared_ptr<GpuDecoderPool> pool(new GpuDecoderPool(std::move(backend), options));
    pool->weights_ = GpuSpeechDecoderWeights::upload(checkpoint, pool->backend_->device(), {});
    // One scratch for every decoder of the pool: they all run on the context's one stream, one
    // chunk after another, so a scratch per stream (~66 MB at release size) would only cost memory.
    pool->pass_ = std::make_shared<DecoderPass>(
        pool->weights_, pool->backend_->context(),
        DecoderStateLayout::make(*pool->weights_, pool->decoder_options_.max_chunk_frames),
        pool->decoder_options_.max_chunk_frames, pool->decoder_options_);
    for (int i = 0; i < pool->states_; ++i) pool->idle_.push_back(pool->state_new());
    QTTS_LOG_INFO("GPU speech decoder on device {}: weights {:.1f} MB, {} stream state(s), one shared scratch of "
                  "{:.1f} MB, graphs {}",
                  pool->backend_->device(), pool->weights_->device_bytes() / 1e6, pool->created_,
                  pool->pass_->scratch_bytes() / 1e6, pool->graphs_enabled_ ? "on" : "off");
    return pool;
}

std::unique_ptr<GpuSpeechDecoder> GpuDecoderPool::state_new() {
    auto state = std::make_unique<GpuSpeechDecoder>(weights_, backend_->context(), decoder_options_, pass_);
    graphs_enabled_ = state->graphs_enabled();
    ++created_;
    return state;
}

std::unique_ptr<GpuSpeechDecoder> GpuDecoderPool::state_take() {
    backend_->context().guard().check("GpuDecoderPool::state_take");
    if (idle_.empty()) {
        auto state = state_new();
        if (created_ > states_)
            QTTS_LOG_DEBUG("GPU speech decoder: all {} states busy, created one more", created_ - 1);
        return state;
    }
    std::unique_ptr<GpuSpeechDecoder> state = std::move(idle_.back());
    idle_.pop_back();
    return state;
}

std::unique_ptr<DecoderStream> GpuDecoderPool::acquire() {
    return std::make_unique<GpuDecoderLease>(shared_from_this(), state_take());
}

void GpuDecoderPool::state_release(std::unique_ptr<GpuSpeechDecoder> state) {
    if (!state) return;
    if (backend_->context().guard().owner() != std::this_thread::get_id()) {
        QTTS_LOG_WARN("a GPU speech decoder state was released off its owner thread; it is freed, not reused");
        return;
    }
    try {
        state->reset();  // position 0, zero tails and rings: the next utterance starts clean
    } catch (const std::exception& e) {
        QTTS_LOG_WARN("a GPU speech decoder state could not be reset ({}); it is freed, not reused", e.what());
        return;
    }
    idle_.push_back(std::move(state));
}

}  // namespace qtts::cuda
