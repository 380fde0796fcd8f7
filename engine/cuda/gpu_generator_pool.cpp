#include "engine/cuda/gpu_generator_pool.h"

#include <algorithm>
#include <thread>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cuda {

// One utterance's lease on a pooled state: drives the GpuGenerator, decodes its chunks when the
// state has no decoder of its own, and gives the state back to the pool when the utterance is
// destroyed (the decoder lease, if any, goes back to its own pool right after).
class GpuChunkGenerator final : public ChunkGenerator {
public:
    GpuChunkGenerator(std::shared_ptr<GpuGeneratorPool> pool, std::unique_ptr<GpuGenerator> state,
                      std::unique_ptr<DecoderStream> decoder)
        : pool_(std::move(pool)), state_(std::move(state)), decoder_(std::move(decoder)) {
        // Exactly one decoder: the state's own (fused chunks) or the one handed over.
        QTTS_ASSERT((state_->decoder() != nullptr) != (decoder_ != nullptr));
    }
    ~GpuChunkGenerator() override { pool_->state_release(std::move(state_)); }
    GpuChunkGenerator(const GpuChunkGenerator&) = delete;
    GpuChunkGenerator& operator=(const GpuChunkGenerator&) = delete;

    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) override {
        state_->start(prompt, params, seed);
    }
    ChunkStatus chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) override {
        QTTS_ASSERT(codes && pcm);
        const size_t before = codes->size();
        const ChunkStatus status = state_->chunk(frames, codes, pcm);
        if (decoder_) decoder_->frames_decode(codes->data() + before, int(codes->size() - before), pcm);
        return status;
    }
    void text_append(const int32_t* ids, size_t n) override { state_->text_append(ids, n); }
    void text_close() override { state_->text_close(); }
    StopReason stop_reason() const override { return state_->stop_reason(); }
    int frames_emitted() const override { return state_->frames_emitted(); }
    bool batch_ready(int frames) const override { return state_->batch_ready(frames); }
    void reference_decode(const int32_t* codes, int frames) override {
        std::vector<float> discarded;
        discarded.reserve(size_t(frames) * SAMPLES_PER_FRAME);
        if (decoder_) decoder_->decode(codes, frames, &discarded);
        else state_->decoder()->decode(codes, frames, &discarded);
    }

private:
    friend class GpuGeneratorPool;  // batch_run reaches the state
    std::shared_ptr<GpuGeneratorPool> pool_;  // keeps the context alive while the state exists
    std::unique_ptr<GpuGenerator> state_;
    std::unique_ptr<DecoderStream> decoder_;  // null when the state decodes its own frames
};

GpuGeneratorPool::GpuGeneratorPool(const BackendOptions& options) : options_(options) {}

GpuGeneratorPool::~GpuGeneratorPool() {
    // Idle states go before the weights and the context (member order), on whatever thread drops
    // the last reference; the engine makes that its own thread.
    idle_.clear();
}

std::shared_ptr<GpuGeneratorPool> GpuGeneratorPool::create(std::shared_ptr<const Checkpoint> checkpoint,
                                                           const BackendOptions& options) {
    std::shared_ptr<GpuGeneratorPool> pool(new GpuGeneratorPool(options));
    pool->context_ = std::make_unique<GpuContext>(options.device);
    pool->weights_ = GpuLmWeights::upload(std::move(checkpoint), options.device);
    pool->states_grow(1);
    return pool;
}

void GpuGeneratorPool::states_grow(int total) {
    context_->guard().check("GpuGeneratorPool::states_grow");
    constexpr size_t kMargin = size_t(256) << 20;  // graph instantiation, cuBLAS and driver growth
    DeviceScope scope(options_.device);
    size_t per_state = 0;  // device memory the last state took, its decoder included
    while (created_ < total) {
        const size_t free_before = device_free_bytes();
        if (per_state > 0 && free_before < per_state + kMargin)
            fail(ErrorCode::ERROR_CUDA,
                 "GPU {} has room for {} concurrent stream(s) ({:.0f} MB each with a {}-position context, {:.0f} MB "
                 "free), not {}: lower the stream count (--max-streams {}) or the context",
                 options_.device, created_, per_state / 1e6, options_.max_context, free_before / 1e6, total,
                 created_);
        idle_.push_back(state_new());
        const size_t free_after = device_free_bytes();
        per_state = free_before > free_after ? free_before - free_after : state_bytes_;
    }
    QTTS_LOG_INFO("CUDA backend on device {}: {} generator state(s) of {:.1f} MB (context {} positions), graphs {}",
                  options_.device, created_, per_state / 1e6, options_.max_context,
                  graphs_enabled_ ? "on" : "off");
}

void GpuGeneratorPool::decoders_attach(const DecoderFactory& make) {
    context_->guard().check("GpuGeneratorPool::decoders_attach");
    if (!make) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "decoders_attach: no decoder factory");
    decoder_factory_ = make;
    for (auto& state : idle_) state->decoder_attach(decoder_factory_());
    if (!idle_.empty()) fused_sizes_ = idle_.front()->fused_sizes();
}

std::unique_ptr<GpuGenerator> GpuGeneratorPool::state_new() {
    auto state = std::make_unique<GpuGenerator>(weights_, *context_, options_);
    if (decoder_factory_) state->decoder_attach(decoder_factory_());
    graphs_enabled_ = state->graphs_enabled();
    state_bytes_ = state->lm().state_bytes();
    ++created_;
    return state;
}

std::unique_ptr<ChunkGenerator> GpuGeneratorPool::acquire(std::unique_ptr<DecoderStream> decoder) {
    context_->guard().check("GpuGeneratorPool::acquire");
    std::unique_ptr<GpuGenerator> state;
    if (!idle_.empty()) {
        state = std::move(idle_.back());
        idle_.pop_back();
    } else {
        // More streams at once than states were made for: this one pays the set-up here.
        state = state_new();
        QTTS_LOG_INFO("CUDA backend: all {} generator states busy, created one more", created_ - 1);
    }
    return std::make_unique<GpuChunkGenerator>(shared_from_this(), std::move(state), std::move(decoder));
}

void GpuGeneratorPool::state_release(std::unique_ptr<GpuGenerator> state) {
    if (!state) return;
    if (context_->guard().owner() != std::this_thread::get_id()) {
        // Not the owner: the pool must not be touched from here; the state is freed instead.
        QTTS_LOG_WARN("a GPU generator state was released off its owner thread; it is freed, not reused");
        return;
    }
    try {
        state->decoder_reset();  // the next utterance's audio starts at position 0
    } catch (const std::exception& e) {
        QTTS_LOG_WARN("a GPU generator state's decoder could not be reset ({}); the state is freed, not reused",
                      e.what());
        return;
    }
    idle_.push_back(std::move(state));
}

void GpuGeneratorPool::batch_enable(int streams) {
    context_->guard().check("GpuGeneratorPool::batch_enable");
    if (streams < 2 || batch_) return;
    GpuBatchOptions o;
    std::vector<int> buckets;
    for (const int b : {2, 4, 8, 12, 16, 24, 32, 48, 64})
        if (b < streams) buckets.push_back(b);
    buckets.push_back(std::min(streams, kernels::GEMV_MAX_BATCH_ROWS / 2));
    o.buckets = buckets;
    o.chunk_frames = options_.chunk_sizes;
    o.cuda_graphs = options_.cuda_graphs;
    DeviceScope scope(options_.device);
    const size_t free_before = device_free_bytes();
    batch_ = std::make_unique<GpuBatch>(weights_, *context_, options_.max_context, o);
    batch_->capture();
    const size_t free_after = device_free_bytes();
    QTTS_LOG_INFO("CUDA backend on device {}: batched steps for up to {} streams ({} buckets x {} chunk sizes), "
                  "{:.1f} MB",
                  options_.device, batch_->max_streams(), buckets.size(), o.chunk_frames.size(),
                  free_before > free_after ? (free_before - free_after) / 1e6 : 0.0);
    batch_decoder_enable();
}

void GpuGeneratorPool::batch_decoder_enable() {
    if (!decoder_factory_ || idle_.empty() || !idle_.front()->decoder()) return;  // chunks decoded elsewhere
    const GpuSpeechDecoder& any = *idle_.front()->decoder();
    GpuBatchDecoderOptions o;
    o.max_streams = batch_->max_streams();
    for (const int n : options_.chunk_sizes)
        if (n <= any.max_chunk_frames()) o.chunk_frames.push_back(n);
    if (o.chunk_frames.empty()) return;
    // A graph for every stream count up to 16, then every fourth: at most 3 idle rows (decoding
    // zeros) past 16 streams, and few enough graphs to capture in a fraction of a second.
    for (int b = 2; b <= o.max_streams; ++b)
        if (b <= 16 || b % 4 == 0 || b == o.max_streams) o.buckets.push_back(b);
    o.cuda_graphs = options_.cuda_graphs;
    o.tf32 = any.options().tf32;
    batch_decoder_ = std::make_unique<GpuBatchDecoder>(any.weights(), *context_, any.layout(), o);
}

int GpuGeneratorPool::batch_run(const std::vector<ChunkGenerator*>& generators, int frames) {
    context_->guard().check("GpuGeneratorPool::batch_run");
    QTTS_ASSERT(batch_ && !generators.empty() && int(generators.size()) <= batch_->max_streams());
    std::vector<GpuLm*> lms;
    std::vector<GpuGenerator*> states;
    for (ChunkGenerator* g : generators) {
        auto* lease = dynamic_cast<GpuChunkGenerator*>(g);
        QTTS_ASSERT(lease && lease->pool_.get() == this && lease->state_->batch_ready(frames));
        states.push_back(lease->state_.get());
        lms.push_back(&lease->state_->lm());
    }
    batch_->bind(lms);
    batch_->run(frames);
    for (GpuGenerator* s : states) s->batch_computed(frames);
    if (!batch_decoder_) return 0;  // each chunk() reads and decodes its own frames

    // Every stream's codes in one synchronisation, then one decoder pass for the whole chunks.
    for (GpuGenerator* s : states) s->batch_codes_enqueue(frames);
    context_->synchronize();
    std::vector<GpuGenerator*> whole;
    std::vector<GpuSpeechDecoder*> decoders;
    for (GpuGenerator* s : states)
        if (s->batch_codes_land(frames) == frames && s->decoder()) {
            whole.push_back(s);
            decoders.push_back(s->decoder());
        }
    if (whole.size() < 2) return 0;  // a lone stream decodes in its chunk() with its own graph
    const int nq = decoders.front()->config().num_quantizers, spf = decoders.front()->samples_per_frame();
    batch_codes_.resize(whole.size() * size_t(frames) * nq);
    batch_pcm_.resize(whole.size() * size_t(frames) * spf);
    for (size_t i = 0; i < whole.size(); ++i) whole[i]->batch_decode_codes(frames, batch_codes_.data() + i * frames * nq);
    batch_decoder_->decode(decoders, batch_codes_.data(), frames, batch_pcm_.data());
    for (size_t i = 0; i < whole.size(); ++i) whole[i]->batch_pcm_set(batch_pcm_.data() + i * frames * spf, frames);
    return int(whole.size());
}

void GpuGeneratorPool::owner_adopt() { context_->guard().adopt(); }

}  // namespace qtts::cuda
