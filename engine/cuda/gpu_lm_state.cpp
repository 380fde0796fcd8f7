// GpuLm's per-stream state: one device allocation carved into the KV caches, activations,
// prompt / text-track rows and the generation state; its reset (state_upload), the staging of
// host ids and the host reads of results.
#include "engine/cuda/gpu_lm.h"

#include <algorithm>
#include <cstring>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "kernels/attention.cuh"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

GpuLm::GpuLm(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, GpuLmOptions options)
    : weights_(std::move(weights)), context_(context), options_(options) {
    QTTS_ASSERT(weights_);
    check("GpuLm::GpuLm");
    if (weights_->device() != context_.device())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuLm: weights live on CUDA device {} but the context uses device {}",
             weights_->device(), context_.device());
    constexpr int kMaxContext = k::ATTN_KEYS_PER_SPLIT * k::ATTN_KEYS_PER_SPLIT;  // attention's split limit
    if (options_.max_context < 16 || options_.max_context > kMaxContext || options_.prefill_chunk < 1)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "GpuLm: max_context {} (16..{} positions) / prefill_chunk {} (>= 1) out of range", options_.max_context,
             kMaxContext, options_.prefill_chunk);
    DeviceScope scope(context_.device());
    const GpuLmWeights& w = *weights_;
    const GpuStack& T = w.talker;
    const GpuStack& P = w.predictor;
    const int M = options_.max_context, C = options_.prefill_chunk, G = w.num_code_groups;
    const int H = T.hidden, Ht = w.text_hidden;
    code_capacity_ = M + 1;
    talker_buf_.max_ctx = M;
    talker_buf_.splits = k::attention_splits(M);
    predictor_buf_.max_ctx = G;
    predictor_buf_.splits = 1;

    const int max_in = std::max({H, T.q_dim(), T.intermediate, Ht});
    const int max_out = std::max({T.qkv_dim(), H, 2 * T.intermediate, Ht});
    const size_t talker_kv = T.layers.size() * size_t(T.n_kv) * size_t(M) * size_t(T.head_dim);
    const size_t predictor_kv = P.layers.size() * size_t(P.n_kv) * size_t(G) * size_t(P.head_dim);
    const size_t partial =
        std::max(k::attention_partial_floats(T.n_heads, C, talker_buf_.splits, T.head_dim),
                 k::attention_partial_floats(T.n_heads, 1, talker_buf_.splits, T.head_dim));
    const size_t counters = std::max(k::attention_counter_count(T.n_kv, C), k::attention_counter_count(P.n_kv, 2));

    struct Carve {
        size_t offset;
        size_t bytes;
    };
    size_t total = 0;
    auto carve = [&total](size_t bytes) {
        const size_t off = align_up(total);
        total = off + bytes;
        return Carve{off, bytes};
    };
    const Carve c_tx = carve(size_t(C) * H * 4), c_tqkv = carve(size_t(C) * T.qkv_dim() * 4),
                c_tattn = carve(size_t(C) * T.q_dim() * 4), c_tmlp = carve(size_t(C) * T.intermediate * 4),
                c_tk = carve(talker_kv * 4), c_tv = carve(talker_kv * 4);
    const Carve c_px = carve(2 * size_t(P.hidden) * 4), c_pqkv = carve(2 * size_t(P.qkv_dim()) * 4),
                c_pattn = carve(2 * size_t(P.q_dim()) * 4), c_pmlp = carve(2 * size_t(P.intermediate) * 4),
                c_pk = carve(predictor_kv * 4), c_pv = carve(predictor_kv * 4);
    const Carve c_hidden = carve(size_t(H) * 4), c_tlogits = carve(size_t(w.codec_vocab) * 4),
                c_pin = carve(2 * size_t(H) * 4), c_plogits = carve(size_t(w.predictor_vocab) * 4),
                c_partial = carve(partial * 4), c_counters = carve(counters * 4),
                c_xb = carve(2 * size_t(C) * max_in * 2), c_y2 = carve(2 * size_t(C) * max_out * 4),
                c_text_in = carve(size_t(C) * Ht * 4), c_text_mid = carve(size_t(C) * Ht * 4),
                c_embeds = carve(size_t(M) * H * 4), c_scratch = carve(size_t(M) * H * 4),
                c_trailing = carve(size_t(M) * H * 4), c_pad = carve(size_t(H) * 4),
                c_ints = carve((24 * size_t(M) + 64) * 4), c_seen = carve(size_t(w.codec_vocab) * 4),
                c_codes = carve(size_t(code_capacity_) * k::SAMPLE_MAX_GROUPS * 4),
                c_state = carve(sizeof(k::GenerationDeviceState));
    memory_.allocate(total);
    state_bytes_ = total;
    uint8_t* base = memory_.as<uint8_t>();
    auto f32 = [base](const Carve& c) { return reinterpret_cast<float*>(base + c.offset); };
    talker_buf_.x = f32(c_tx);
    talker_buf_.qkv = f32(c_tqkv);
    talker_buf_.attn = f32(c_tattn);
    talker_buf_.mlp = f32(c_tmlp);
    talker_buf_.k_cache = f32(c_tk);
    talker_buf_.v_cache = f32(c_tv);
    predictor_buf_.x = f32(c_px);
    predictor_buf_.qkv = f32(c_pqkv);
    predictor_buf_.attn = f32(c_pattn);
    predictor_buf_.mlp = f32(c_pmlp);
    predictor_buf_.k_cache = f32(c_pk);
    predictor_buf_.v_cache = f32(c_pv);
    hidden_ = f32(c_hidden);
    talker_logits_ = f32(c_tlogits);
    predictor_in_ = f32(c_pin);
    predictor_logits_ = f32(c_plogits);
    partial_ = f32(c_partial);
    counters_ = reinterpret_cast<uint32_t*>(base + c_counters.offset);
    xb_ = reinterpret_cast<bf16_t*>(base + c_xb.offset);
    y2_ = f32(c_y2);
    text_in_ = f32(c_text_in);
    text_mid_ = f32(c_text_mid);
    embeds_ = f32(c_embeds);
    scratch_rows_ = f32(c_scratch);
    trailing_ = f32(c_trailing);
    pad_ = f32(c_pad);
    ints_ = reinterpret_cast<int32_t*>(base + c_ints.offset);
    seen_ = reinterpret_cast<int32_t*>(base + c_seen.offset);
    codes_ = reinterpret_cast<int32_t*>(base + c_codes.offset);
    state_ = reinterpret_cast<k::GenerationDeviceState*>(base + c_state.offset);

    // Deterministic contents everywhere (no stale NaNs in any buffer), counters at zero.
    CUDA_CHECK(cudaMemsetAsync(memory_.get(), 0, total, context_.stream()));
    pinned_ints_ = PinnedArray<int32_t>(24 * size_t(M) + 64);
    pinned_floats_ = PinnedArray<float>(size_t(std::max({H, w.codec_vocab, w.predictor_vocab, P.hidden})));
    pinned_state_ = PinnedArray<k::GenerationDeviceState>(1);

    // The <tts_pad> text-track vector, used by every decode step once the text is used up.
    const int32_t pad_id = w.config().tts_pad_token_id;
    upload_ints(&pad_id, 1, ints_);
    text_project(ints_, 1, pad_, H);
    state_upload(0, 0, GpuGenerationSetup{});
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    QTTS_LOG_INFO("GPU LM state on device {}: {:.1f} MB (context {} positions, prefill chunk {}, attention splits {})",
                  context_.device(), total / 1e6, M, C, talker_buf_.splits);
}

kernels::StreamSlot GpuLm::batch_slot() const {
    kernels::StreamSlot slot;
    slot.state = state_;
    slot.seen = seen_;
    slot.codes = codes_;
    slot.trailing = trailing_;
    slot.hidden = hidden_;
    slot.pad = pad_;
    return slot;
}

kernels::AttentionSeq GpuLm::batch_talker_seq() const {
    kernels::AttentionSeq seq;
    seq.k_cache = talker_buf_.k_cache;
    seq.v_cache = talker_buf_.v_cache;
    seq.pos = &state_->position;
    seq.stopped = &state_->stopped;
    return seq;
}

GpuLm::~GpuLm() {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(context_.device());
    cudaStreamSynchronize(context_.stream());
    if (previous >= 0) cudaSetDevice(previous);
}

void GpuLm::check(const char* what) const { context_.guard().check(what); }

void GpuLm::upload_ints(const int32_t* host, size_t n, int32_t* dev) {
    if (n == 0) return;
    if (n > pinned_ints_.size())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuLm: {} ids exceed the staging capacity {}", n, pinned_ints_.size());
    staged_.wait();  // the staging buffer may still feed the previous upload
    std::memcpy(pinned_ints_.get(), host, n * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(dev, pinned_ints_.get(), n * sizeof(int32_t), cudaMemcpyHostToDevice,
                               context_.stream()));
    staged_.record(context_.stream());
}

void GpuLm::state_upload(int L, int trailing, const GpuGenerationSetup& setup) {
    staged_.wait();  // the pinned mirror may still feed the previous upload
    k::GenerationDeviceState& s = pinned_state_[0];
    s = k::GenerationDeviceState{};
    s.seed = setup.seed;
    s.frame = 0;
    s.position = L;
    s.history_count = 0;
    s.min_new_tokens = setup.min_new_tokens;
    s.trailing_rows = trailing;
    s.code_capacity = code_capacity_;
    s.frame_end = setup.frame_end;
    s.position_end = options_.max_context;  // a batched step stops the stream before the cache overflows
    s.talker.greedy = setup.talker.greedy ? 1 : 0;
    s.talker.temperature = setup.talker.temperature;
    s.talker.top_k = setup.talker.top_k;
    s.talker.top_p = setup.talker.top_p;
    s.talker.repetition_penalty = setup.talker.repetition_penalty;
    s.predictor.greedy = setup.predictor.greedy ? 1 : 0;
    s.predictor.temperature = setup.predictor.temperature;
    s.predictor.top_k = setup.predictor.top_k;
    s.predictor.top_p = setup.predictor.top_p;
    s.predictor.repetition_penalty = 1.0f;
    CUDA_CHECK(cudaMemcpyAsync(state_, &s, sizeof(s), cudaMemcpyHostToDevice, context_.stream()));
    staged_.record(context_.stream());
    CUDA_CHECK(cudaMemsetAsync(seen_, 0, size_t(weights_->codec_vocab) * 4, context_.stream()));
    CUDA_CHECK(cudaMemsetAsync(codes_, 0xff, size_t(code_capacity_) * k::SAMPLE_MAX_GROUPS * 4, context_.stream()));
    trailing_rows_ = trailing;
}

namespace {
void read_floats(const float* dev, size_t n, float* pinned, float* out, cudaStream_t stream) {
    CUDA_CHECK(cudaMemcpyAsync(pinned, dev, n * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    std::memcpy(out, pinned, n * 4);
}
}  // namespace

void GpuLm::talker_hidden_read(float* out) {
    check("GpuLm::talker_hidden_read");
    DeviceScope scope(context_.device());
    read_floats(hidden_, size_t(weights_->talker.hidden), pinned_floats_.get(), out, context_.stream());
}

void GpuLm::talker_logits_read(float* out) {
    check("GpuLm::talker_logits_read");
    DeviceScope scope(context_.device());
    read_floats(talker_logits_, size_t(weights_->codec_vocab), pinned_floats_.get(), out, context_.stream());
}

void GpuLm::predictor_logits_read(float* out) {
    check("GpuLm::predictor_logits_read");
    DeviceScope scope(context_.device());
    read_floats(predictor_logits_, size_t(weights_->predictor_vocab), pinned_floats_.get(), out, context_.stream());
}

void GpuLm::codes_read_async(int first, int count, int32_t* pinned_out) {
    check("GpuLm::codes_read");
    if (first < 0 || count < 0 || first + count > code_capacity_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codes [{}, {}) are outside the device buffer of {} frames", first,
             first + count, code_capacity_);
    if (count == 0) return;
    DeviceScope scope(context_.device());
    CUDA_CHECK(cudaMemcpyAsync(pinned_out, codes_ + size_t(first) * k::SAMPLE_MAX_GROUPS,
                               size_t(count) * k::SAMPLE_MAX_GROUPS * 4, cudaMemcpyDeviceToHost, context_.stream()));
}

void GpuLm::codes_read(int first, int count, int32_t* out) {
    // Landing rows kept from call to call: not a pinned allocation and its free (which waits for
    // the whole device) in every start.
    const size_t values = size_t(std::max(count, 1)) * k::SAMPLE_MAX_GROUPS;
    pinned_codes_.ensure(values);
    codes_read_async(first, count, pinned_codes_.get());
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    std::memcpy(out, pinned_codes_.get(), size_t(count) * k::SAMPLE_MAX_GROUPS * 4);
}
}  // namespace qtts::cuda
