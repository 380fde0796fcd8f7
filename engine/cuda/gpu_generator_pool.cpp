#include "engine/cuda/gpu_generator_pool.h"

#include <algorithm>
#include <map>
#include <thread>

#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/memory_plan.h"

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
    bool batch_ready(int frames) override { return state_->batch_ready(frames); }
    int frames_left() const override { return state_->frames_left(); }
    int audio_owed() const override { return state_->audio_owed(); }
    void audio_take(std::vector<float>* pcm) override {
        QTTS_ASSERT(pcm && state_->audio_owed() > 0);
        if (!state_->audio_delivered()) pool_->batch_audio_land();
        // A pass whose wait failed (a device error, reported where it happened) delivers nothing.
        if (!state_->audio_delivered())
            fail(ErrorCode::ERROR_CUDA, "the batched decoder pass of this stream's last chunk failed");
        state_->audio_take(pcm);
    }
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

namespace {

constexpr size_t MIB = size_t(1) << 20;
// A first stream slot's bytes beside its context-sized buffers (prefill activations, graphs, its
// decoder's scratch), before any slot was measured; only used to pick a context that fits.
constexpr size_t SLOT_FIXED_ESTIMATE = 192 * MIB;
// The smallest context a lowered one may take (prompt + ~15 s of audio), and its step.
constexpr int CONTEXT_MIN = 256;
constexpr int CONTEXT_STEP = 128;

double mib(size_t bytes) { return double(bytes) / double(MIB); }

}  // namespace

std::shared_ptr<GpuGeneratorPool> GpuGeneratorPool::create(std::shared_ptr<const Checkpoint> checkpoint,
                                                           const BackendOptions& options) {
    std::shared_ptr<GpuGeneratorPool> pool(new GpuGeneratorPool(options));
    {
        // What the device holds from here on beyond this baseline is this pool's (memory_used): its
        // context's stream, cuBLAS handle and workspace and the first kernel loads included (the
        // CUDA context itself exists once cuda_memory has asked). Other objects of the process
        // (another model in a test) are in the baseline. (No device scope yet: the context checks
        // the device number and says what is wrong with it.)
        pool->memory_base_ = cuda_memory(options.device).used_bytes;
        pool->tracked_base_ = gpu_memory_use(options.device).current_bytes;
    }
    pool->context_ = std::make_unique<GpuContext>(options.device, /*high_priority=*/true);
    pool->weights_ = GpuLmWeights::upload(std::move(checkpoint), options.device);
    QTTS_LOG_INFO("GPU memory on device {}: LM weights {:.0f} MiB; qtts holds {:.0f} MiB, {:.0f} MiB free{}",
                  options.device, mib(pool->weights_->device_bytes()), mib(pool->memory_used()),
                  mib(device_free_bytes()), pool->limit_text());
    return pool;
}

size_t GpuGeneratorPool::memory_used() const {
    const DeviceMemory now = cuda_memory(options_.device);
    const size_t device_view = now.used_bytes > memory_base_ ? now.used_bytes - memory_base_ : 0;
    const size_t tracked = gpu_memory_use(options_.device).current_bytes;
    return std::max(device_view, tracked > tracked_base_ ? tracked - tracked_base_ : size_t(0));
}

size_t GpuGeneratorPool::memory_room() const {
    return gpu_memory_room(device_free_bytes(), options_.gpu_memory_limit, memory_used(),
                           gpu_memory_margin(options_.gpu_memory_limit));
}

std::string GpuGeneratorPool::limit_text() const {
    if (options_.gpu_memory_limit == 0) return " (no --gpu-memory-limit)";
    return fmt::format(" (limit {:.0f} MiB)", mib(options_.gpu_memory_limit));
}

size_t GpuGeneratorPool::context_bytes_per_position() const {
    // What GpuLm sizes by max_context: the talker's K and V caches, three [max_context, hidden]
    // prompt buffers, the per-position integers and codes, and the split-K partials (one split
    // per 128 positions, a prefill chunk of 128 rows).
    const GpuStack& t = weights_->talker;
    return 2 * t.layers.size() * size_t(t.n_kv) * size_t(t.head_dim) * 4 + 3 * size_t(t.hidden) * 4 + 24 * 4 +
           16 * 4 + size_t(t.n_heads) * size_t(t.head_dim + 2) * 4;
}

void GpuGeneratorPool::context_fit_first() {
    const size_t room = memory_room();
    const size_t per_position = context_bytes_per_position();
    const int wanted = options_.max_context;
    const int context = context_fit(room, SLOT_FIXED_ESTIMATE, per_position, wanted, CONTEXT_STEP);
    if (context == wanted) return;
    if (context < CONTEXT_MIN)
        fail(ErrorCode::ERROR_CUDA,
             "GPU {} has {:.0f} MiB left for stream state after the weights and a {:.0f} MiB margin{}: not enough for "
             "one stream (a {}-position context needs ~{:.0f} MiB); raise --gpu-memory-limit, free the device or "
             "take a smaller model",
             options_.device, mib(room), mib(gpu_memory_margin(options_.gpu_memory_limit)), limit_text(), CONTEXT_MIN,
             mib(SLOT_FIXED_ESTIMATE + size_t(CONTEXT_MIN) * per_position));
    QTTS_LOG_WARN("GPU memory on device {}: one stream with a {}-position context needs ~{:.0f} MiB but {:.0f} MiB "
                  "are left{}; the context per stream is lowered to {} positions (~{:.0f} MiB, {:.1f} s of audio "
                  "after a 50-token prompt)",
                  options_.device, wanted, mib(SLOT_FIXED_ESTIMATE + size_t(wanted) * per_position), mib(room),
                  limit_text(), context, mib(SLOT_FIXED_ESTIMATE + size_t(context) * per_position),
                  (context - 50) * double(SAMPLES_PER_FRAME) / SAMPLE_RATE);
    options_.max_context = context;
}

void GpuGeneratorPool::states_grow(int total) {
    context_->guard().check("GpuGeneratorPool::states_grow");
    QTTS_ASSERT(total >= 1);
    DeviceScope scope(options_.device);
    if (created_ == 0) context_fit_first();
    while (created_ < total) {
        const size_t room = memory_room();
        if (slot_bytes_ > 0 && room < slot_bytes_) {
            if (options_.states_fit) break;  // as many as fit: the engine takes what was made
            fail(ErrorCode::ERROR_CUDA,
                 "GPU {} has room for {} concurrent stream(s) ({:.0f} MiB each with a {}-position context, {:.0f} MiB "
                 "left beside a {:.0f} MiB margin{}), not {}: lower the stream count (--max-streams {}), leave it "
                 "out (as many as fit), or raise --gpu-memory-limit",
                 options_.device, created_, mib(slot_bytes_), options_.max_context, mib(room), mib(gpu_memory_margin(options_.gpu_memory_limit)),
                 limit_text(), total, created_);
        }
        const size_t free_before = device_free_bytes();
        idle_.push_back(state_new());
        const size_t free_after = device_free_bytes();
        // What the slot took, its graphs and decoder included (the first one's decoder may have
        // been made beforehand by the decoder pool: the next measurement is whole).
        slot_bytes_ = std::max(free_before > free_after ? free_before - free_after : size_t(0), state_bytes_);
    }
    const StreamSlotPlan more = stream_slots_plan(memory_room(), slot_bytes_, 1 << 20);
    QTTS_LOG_INFO("GPU memory on device {}: {} stream slot(s) of {:.0f} MiB (context {} positions, graphs {}); qtts "
                  "holds {:.0f} MiB, {:.0f} MiB left beside the {:.0f} MiB margin (room for {} more){}",
                  options_.device, created_, mib(slot_bytes_), options_.max_context, graphs_enabled_ ? "on" : "off",
                  mib(memory_used()), mib(more.slots * slot_bytes_ + more.left_bytes), mib(gpu_memory_margin(options_.gpu_memory_limit)), more.slots,
                  limit_text());
}

void GpuGeneratorPool::decoders_attach(const DecoderFactory& make) {
    context_->guard().check("GpuGeneratorPool::decoders_attach");
    if (!make) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "decoders_attach: no decoder factory");
    decoder_factory_ = make;
    for (auto& state : idle_) state->decoder_attach(decoder_factory_());
    if (!idle_.empty()) fused_sizes_ = idle_.front()->fused_sizes();
    // The batched decoder passes' stream (batch_decoder_enable) is made now, before the slots are
    // fitted to the memory left (states_grow): its cuBLAS handle and workspace are in that plan.
    if (options_.batching && options_.states >= 2 && !side_) {
        DeviceScope scope(options_.device);
        side_ = std::make_unique<GpuContext>(options_.device);
    }
}

std::unique_ptr<GpuGenerator> GpuGeneratorPool::state_new() {
    auto state = std::make_unique<GpuGenerator>(weights_, *context_, options_);
    if (decoder_factory_) state->decoder_attach(decoder_factory_());
    graphs_enabled_ = state->graphs_enabled();
    state_bytes_ = state->lm().state_bytes();
    if (decoder_factory_ && fused_sizes_.empty()) fused_sizes_ = state->fused_sizes();
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
        // A pass beside the next step may still advance its decoder: wait for it, drop what the
        // stream was owed, then start the next utterance's audio at position 0.
        if (std::find(deferred_.begin(), deferred_.end(), state.get()) != deferred_.end()) batch_audio_land();
        state->audio_clear();
        state->decoder_reset();
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
    for (const int b : {2, 4, 8, 10, 12, 16, 24, 32, 48, 64})
        if (b < streams) buckets.push_back(b);
    buckets.push_back(std::min(streams, kernels::GEMV_MAX_BATCH_ROWS / 2));
    o.buckets = buckets;
    o.chunk_frames = options_.chunk_sizes;
    o.cuda_graphs = options_.cuda_graphs;
    if (options_.batch_exact) o.wide_rows = kernels::GEMV_MAX_BATCH_ROWS + 1;  // every product on the one-row kernels
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
    const int chunk = gpu_lm_options(options_).prefill_chunk;
    prefill_batch_ = std::make_unique<GpuPrefillBatch>(weights_, *context_, chunk, std::max(PREFILL_BATCH_ROWS, chunk));
    prefill_batch_->warm_up();
    states_trim("the batched steps");
}

size_t GpuGeneratorPool::memory_over() const {
    const size_t margin = gpu_memory_margin(options_.gpu_memory_limit);
    const size_t free = device_free_bytes();
    size_t over = free < margin ? margin - free : 0;
    if (options_.gpu_memory_limit > 0) {
        const size_t wanted = memory_used() + margin;
        if (wanted > options_.gpu_memory_limit) over = std::max(over, wanted - options_.gpu_memory_limit);
    }
    return over;
}

void GpuGeneratorPool::slots_give_back(const char* what) {
    const int before = created_;
    while (memory_over() > 0 && idle_.size() > 1 && options_.states_fit) {
        idle_.pop_back();  // its buffers, graphs and decoder go back to the device now
        --created_;
    }
    if (created_ < before)
        QTTS_LOG_WARN("GPU memory on device {}: {} left less than the {:.0f} MiB margin{}; {} of {} stream slots "
                      "given back, {} left",
                      options_.device, what, mib(gpu_memory_margin(options_.gpu_memory_limit)), limit_text(),
                      before - created_, before, created_);
}

void GpuGeneratorPool::states_trim(const char* what) {
    slots_give_back(what);
    if (const size_t over = memory_over(); over > 0)
        fail(ErrorCode::ERROR_CUDA,
             "GPU {} is {:.0f} MiB short for {} stream slot(s) after {} beside a {:.0f} MiB margin{}: lower the "
             "stream count (--max-streams), leave it out (as many as fit), turn batching off or raise "
             "--gpu-memory-limit",
             options_.device, mib(over), created_, what, mib(gpu_memory_margin(options_.gpu_memory_limit)),
             limit_text());
}

void GpuGeneratorPool::memory_settle() {
    context_->guard().check("GpuGeneratorPool::memory_settle");
    DeviceScope scope(options_.device);
    slots_give_back("the warm-up");
    if (const size_t over = memory_over(); over > 0)
        QTTS_LOG_WARN("GPU memory on device {}: {:.0f} MiB into the {:.0f} MiB margin after the warm-up{} with {} "
                      "stream slot(s){}",
                      options_.device, mib(over), mib(gpu_memory_margin(options_.gpu_memory_limit)), limit_text(),
                      created_, options_.states_fit ? "" : " (the stream count was given: none given back)");
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
    // Past 16 streams a pass's GEMMs take at most two thirds of the SMs (88 of 132 on an H100 or
    // H200): beside the LM step that paid at 32 and 64 streams (+1.2-1.7%); at 10-16 it did not.
    o.narrow_from_streams = 17;
    o.narrow_sms = context_->sm_count() * 2 / 3;
    // The passes run on a second stream (side_, made by decoders_attach before the slots were
    // planned: its own stream, cuBLAS handle and workspace), so that a steady step's pass can run
    // beside the next step (batch_run, defer_audio). The LM stream has the device's highest
    // priority (create()): its blocks go first, the pass takes what they leave
    // (docs/performance.md, "The decoder pass beside the next step").
    if (!side_) side_ = std::make_unique<GpuContext>(options_.device);
    batch_decoder_ = std::make_unique<GpuBatchDecoder>(any.weights(), *side_, any.layout(), o);
}

void GpuGeneratorPool::batch_audio_land() {
    context_->guard().check("GpuGeneratorPool::batch_audio_land");
    if (!batch_decoder_ || !batch_decoder_->in_flight()) return;
    const std::vector<GpuGenerator*> states = std::move(deferred_);
    deferred_.clear();
    QTTS_ASSERT(!states.empty());  // only deferred passes stay in flight
    const int spf = states.front()->decoder()->samples_per_frame();
    const int frames = batch_decoder_->in_flight_frames();  // land() clears it
    batch_pcm_.resize(states.size() * size_t(frames) * spf);
    batch_decoder_->land(batch_pcm_.data());
    for (size_t i = 0; i < states.size(); ++i) states[i]->audio_deliver(batch_pcm_.data() + i * frames * spf, frames);
}

GpuGenerator& GpuGeneratorPool::leased_state(ChunkGenerator* generator) const {
    auto* lease = dynamic_cast<GpuChunkGenerator*>(generator);
    QTTS_ASSERT(lease && lease->pool_.get() == this);
    return *lease->state_;
}

int GpuGeneratorPool::batch_run(const std::vector<ChunkGenerator*>& generators, int frames, bool defer_audio,
                                const std::function<void()>& meanwhile) {
    context_->guard().check("GpuGeneratorPool::batch_run");
    QTTS_ASSERT(batch_ && !generators.empty() && int(generators.size()) <= batch_->max_streams());
    std::vector<GpuLm*> lms;
    std::vector<GpuGenerator*> states;
    for (ChunkGenerator* g : generators) {
        GpuGenerator& state = leased_state(g);
        QTTS_ASSERT(state.batch_ready(frames));
        states.push_back(&state);
        lms.push_back(&state.lm());
    }
    batch_->bind(lms);
    batch_->run(frames);
    for (GpuGenerator* s : states) s->batch_computed(frames);
    if (!batch_decoder_) {  // each chunk() reads and decodes its own frames
        if (meanwhile) meanwhile();
        return 0;
    }

    // Every stream's codes in one synchronisation, then one decoder pass for the streams that keep
    // the whole chunk, and one for each set of two or more that keep as many fewer frames (the
    // last chunk of streams ending at an end-of-speech or their frame limit; without it each
    // would be decoded alone in its chunk()).
    for (GpuGenerator* s : states) s->batch_codes_enqueue(frames);
    // While the step runs: the pass that ran beside it (a step before deferred its audio) lands
    // (its pinned buffers are the next pass's), and the caller hands those samples on.
    batch_audio_land();
    if (meanwhile) meanwhile();
    context_->synchronize();
    std::map<int, std::vector<GpuGenerator*>> by_kept;  // frames kept -> streams
    for (GpuGenerator* s : states) {
        const int kept = s->batch_codes_land(frames);
        if (kept > 0 && s->decoder()) by_kept[kept].push_back(s);
    }
    // Deferred: one pass for every stream of the step, each keeping the whole chunk; it runs on the
    // second stream while the engine goes on to its next step, and each chunk() emits its codes
    // with the samples owed (audio_take). Steps with partial chunks (ends) decode at once.
    const bool defer = defer_audio && by_kept.size() == 1 && by_kept.begin()->first == frames &&
                       by_kept.begin()->second.size() == states.size() && states.size() >= 2;
    int decoded = 0;
    for (const auto& [kept, group] : by_kept) {
        if (group.size() < 2) continue;  // a lone stream decodes in its chunk() with its own graph
        std::vector<GpuSpeechDecoder*> decoders;
        for (GpuGenerator* s : group) decoders.push_back(s->decoder());
        const int nq = decoders.front()->config().num_quantizers, spf = decoders.front()->samples_per_frame();
        batch_codes_.resize(group.size() * size_t(kept) * nq);
        for (size_t i = 0; i < group.size(); ++i) group[i]->batch_decode_codes(kept, batch_codes_.data() + i * kept * nq);
        batch_decoder_->launch(decoders, batch_codes_.data(), kept);
        decoded += int(group.size());
        if (defer) {
            deferred_ = group;
            for (GpuGenerator* s : group) s->batch_pcm_defer(kept);
            continue;
        }
        batch_pcm_.resize(group.size() * size_t(kept) * spf);
        batch_decoder_->land(batch_pcm_.data());
        for (size_t i = 0; i < group.size(); ++i) group[i]->batch_pcm_set(batch_pcm_.data() + i * kept * spf, kept);
    }
    return decoded;
}

void GpuGeneratorPool::batch_start(std::vector<GenerationStart>& starts) {
    context_->guard().check("GpuGeneratorPool::batch_start");
    QTTS_ASSERT(prefill_batch_);
    if (options_.batch_exact) {  // each prompt prefilled alone: its arithmetic as on an unbatched engine
        for (const GenerationStart& s : starts) leased_state(s.generator);  // asserts each is this pool's
        generation_starts_each(starts);
        return;
    }
    struct Loaded {
        GenerationStart* start;
        GpuGenerator* state;
        GpuLm::PromptRows rows;
    };
    std::vector<Loaded> loaded;
    for (GenerationStart& s : starts) {
        GpuGenerator& state = leased_state(s.generator);
        try {
            loaded.push_back(Loaded{&s, &state, state.start_load(s.prompt, s.params)});
        } catch (const Error& e) {
            if (e.code() != ErrorCode::ERROR_INVALID_ARGUMENT) throw;  // the device, not this request
            s.error = e.what();
        }
    }
    if (loaded.empty()) return;
    std::vector<GpuLm*> lms;
    std::vector<int> positions;
    for (const Loaded& l : loaded) {
        lms.push_back(&l.state->lm());
        positions.push_back(l.rows.positions);
    }
    prefill_batch_->run(lms, positions);
    // Every first draw enqueued behind the prefill, then one synchronisation for all their codes
    // (not a host-device round trip per stream).
    for (const Loaded& l : loaded) l.state->start_finish(l.start->prompt, l.rows, l.start->params, l.start->seed);
    context_->synchronize();
    for (const Loaded& l : loaded) l.state->start_land();
}

void GpuGeneratorPool::owner_adopt() {
    context_->guard().adopt();
    if (side_) side_->guard().adopt();
}

bool GpuGeneratorPool::recover() {
    const bool side_ok = !side_ || side_->recover();
    return context_->recover() && side_ok;
}

}  // namespace qtts::cuda
