#include "engine/cuda/gpu_lm.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <cublas_v2.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cpu/ops.h"
#include "kernels/attention.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemv.cuh"
#include "kernels/linear.cuh"
#include "kernels/rmsnorm.cuh"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

namespace {

constexpr size_t ALIGN = 256;
size_t align_up(size_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

// Lays out the weight arena: segments (offset, host source) copied once after one allocation.
class ArenaPlan {
public:
    size_t add_bf16(std::initializer_list<Tensor> parts) {
        size_t bytes = 0;
        for (const Tensor t : parts) bytes += size_t(t->numel()) * 2;
        const size_t offset = reserve(bytes);
        size_t at = offset;
        for (const Tensor t : parts) {
            const size_t n = size_t(t->numel()) * 2;
            if (t->dtype == DType::DTYPE_BF16) {
                segments_.push_back({at, t->data, n});
            } else {
                const std::vector<float> f = tensor_to_f32(*t);
                std::vector<uint16_t> b(f.size());
                for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
                owned_.push_back(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(b.data()),
                                                      reinterpret_cast<const uint8_t*>(b.data()) + n));
                segments_.push_back({at, owned_.back().data(), n});
            }
            at += n;
        }
        return offset;
    }
    size_t add_f32(std::vector<float> values) {
        const size_t n = values.size() * sizeof(float);
        const size_t offset = reserve(n);
        owned_.push_back(std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(values.data()),
                                              reinterpret_cast<const uint8_t*>(values.data()) + n));
        segments_.push_back({offset, owned_.back().data(), n});
        return offset;
    }
    size_t add_f32(Tensor t) { return add_f32(tensor_to_f32(*t)); }
    size_t size() const { return size_; }

    void copy_to(void* device_base) const {
        for (const Segment& s : segments_)
            CUDA_CHECK(cudaMemcpy(static_cast<uint8_t*>(device_base) + s.offset, s.src, s.bytes,
                                  cudaMemcpyHostToDevice));
    }

private:
    struct Segment {
        size_t offset;
        const void* src;
        size_t bytes;
    };
    size_t reserve(size_t bytes) {
        const size_t offset = align_up(size_);
        size_ = offset + bytes;
        return offset;
    }
    std::vector<Segment> segments_;
    std::vector<std::vector<uint8_t>> owned_;  // converted data (stable addresses: vectors are moved, not copied)
    size_t size_ = 0;
};

// Offsets of one stack while the arena is planned.
struct StackOffsets {
    struct Layer {
        size_t input_norm, qkv, o, q_norm, k_norm, post_norm, gate_up, down;
    };
    std::vector<Layer> layers;
    size_t norm = 0, inv_freq = 0;
};

StackOffsets plan_stack(ArenaPlan& plan, const TransformerConfig& c, const std::vector<TransformerLayerWeights>& layers,
                        Tensor norm) {
    StackOffsets s;
    for (const TransformerLayerWeights& l : layers) {
        StackOffsets::Layer o{};
        o.input_norm = plan.add_f32(l.input_norm);
        o.qkv = plan.add_bf16({l.q_proj, l.k_proj, l.v_proj});
        o.o = plan.add_bf16({l.o_proj});
        o.q_norm = plan.add_f32(l.q_norm);
        o.k_norm = plan.add_f32(l.k_norm);
        o.post_norm = plan.add_f32(l.post_norm);
        o.gate_up = plan.add_bf16({l.gate_proj, l.up_proj});
        o.down = plan.add_bf16({l.down_proj});
        s.layers.push_back(o);
    }
    s.norm = plan.add_f32(norm);
    s.inv_freq = plan.add_f32(cpu::rope_inv_freq(c.head_dim, c.rope_theta));
    return s;
}

GpuStack resolve_stack(const StackOffsets& o, const TransformerConfig& c, const uint8_t* base) {
    auto f32 = [base](size_t off) { return reinterpret_cast<const float*>(base + off); };
    auto b16 = [base](size_t off) { return reinterpret_cast<const bf16_t*>(base + off); };
    GpuStack s;
    s.hidden = c.hidden_size;
    s.intermediate = c.intermediate_size;
    s.n_heads = c.num_heads;
    s.n_kv = c.num_kv_heads;
    s.head_dim = c.head_dim;
    s.eps = c.rms_norm_eps;
    for (const auto& l : o.layers) {
        GpuStack::Layer L;
        L.input_norm = f32(l.input_norm);
        L.qkv = b16(l.qkv);
        L.o = b16(l.o);
        L.q_norm = f32(l.q_norm);
        L.k_norm = f32(l.k_norm);
        L.post_norm = f32(l.post_norm);
        L.gate_up = b16(l.gate_up);
        L.down = b16(l.down);
        s.layers.push_back(L);
    }
    s.norm = f32(o.norm);
    s.inv_freq = f32(o.inv_freq);
    return s;
}

void stack_check(const GpuStack& s, const char* name) {
    const bool ok = s.n_kv > 0 && s.n_heads % s.n_kv == 0 && s.n_heads / s.n_kv <= k::ATTN_MAX_GROUP &&
                    s.head_dim % 2 == 0 && s.head_dim <= k::ATTN_MAX_HEAD_DIM && s.hidden % 8 == 0 &&
                    s.intermediate % 8 == 0 && s.q_dim() % 8 == 0;
    if (!ok)
        fail(ErrorCode::ERROR_UNSUPPORTED,
             "the CUDA backend does not support this {} shape (hidden {}, intermediate {}, heads {}/{} kv, head_dim "
             "{}): it needs head_dim even and <= 128, at most 4 query heads per KV head and widths divisible by 8",
             name, s.hidden, s.intermediate, s.n_heads, s.n_kv, s.head_dim);
}

}  // namespace

size_t GpuStack::layer_weight_bytes() const {
    const size_t per_layer = size_t(qkv_dim()) * hidden + size_t(hidden) * q_dim() + 3 * size_t(intermediate) * hidden;
    return per_layer * 2 * layers.size();
}

size_t GpuLmWeights::talker_step_bytes() const {
    return talker.layer_weight_bytes() + size_t(codec_vocab) * talker.hidden * 2;
}

size_t GpuLmWeights::predictor_pass_bytes() const {
    size_t bytes = predictor.layer_weight_bytes() + size_t(predictor_vocab) * predictor.hidden * 2;
    if (predictor_proj_w) bytes += size_t(predictor.hidden) * talker.hidden * 2;
    return bytes;
}

std::shared_ptr<const GpuLmWeights> GpuLmWeights::upload(std::shared_ptr<const Checkpoint> checkpoint, int device) {
    QTTS_ASSERT(checkpoint);
    const auto t0 = std::chrono::steady_clock::now();
    DeviceScope scope(device);
    auto w = std::shared_ptr<GpuLmWeights>(new GpuLmWeights());
    w->checkpoint_ = checkpoint;
    w->device_ = device;
    const TalkerConfig& tc = checkpoint->config.talker;
    const TalkerWeights& tw = checkpoint->talker;
    const CodePredictorWeights& pw = checkpoint->code_predictor;
    w->num_code_groups = tc.num_code_groups;
    w->codec_vocab = tc.vocab_size;
    w->predictor_vocab = tc.code_predictor.vocab_size;
    w->text_hidden = tc.text_hidden_size;
    w->text_vocab = tc.text_vocab_size;
    if (w->num_code_groups < 2 || w->num_code_groups > k::SAMPLE_MAX_GROUPS)
        fail(ErrorCode::ERROR_UNSUPPORTED, "num_code_groups {} is not supported by the CUDA backend (2..16)",
             w->num_code_groups);
    if (w->codec_vocab > k::SAMPLE_MAX_VOCAB || w->predictor_vocab > k::SAMPLE_MAX_VOCAB || w->codec_vocab < 1024)
        fail(ErrorCode::ERROR_UNSUPPORTED, "codec vocabularies {} / {} are not supported by the CUDA backend (1024..{})",
             w->codec_vocab, w->predictor_vocab, k::SAMPLE_MAX_VOCAB);
    if (tc.text_hidden_size % 8 != 0)
        fail(ErrorCode::ERROR_UNSUPPORTED, "text_hidden_size {} must be a multiple of 8 for the CUDA backend",
             tc.text_hidden_size);

    ArenaPlan plan;
    const StackOffsets talker = plan_stack(plan, tc, tw.layers, tw.norm);
    const size_t codec_embedding = plan.add_bf16({tw.codec_embedding});
    const size_t codec_head = plan.add_bf16({tw.codec_head});
    const size_t text_embedding = plan.add_bf16({tw.text_embedding});
    const size_t fc1_w = plan.add_bf16({tw.text_fc1_w});
    const size_t fc1_b = plan.add_f32(tw.text_fc1_b);
    const size_t fc2_w = plan.add_bf16({tw.text_fc2_w});
    const size_t fc2_b = plan.add_f32(tw.text_fc2_b);
    const StackOffsets predictor = plan_stack(plan, tc.code_predictor, pw.layers, pw.norm);
    std::vector<size_t> pred_embed, pred_head;
    for (const Tensor t : pw.codec_embedding) pred_embed.push_back(plan.add_bf16({t}));
    for (const Tensor t : pw.lm_head) pred_head.push_back(plan.add_bf16({t}));
    size_t proj_w = 0, proj_b = 0;
    if (pw.proj_w) {
        proj_w = plan.add_bf16({pw.proj_w});
        proj_b = plan.add_f32(pw.proj_b);
    } else if (tc.code_predictor.hidden_size != tc.hidden_size) {
        fail(ErrorCode::ERROR_FORMAT,
             "checkpoint: code predictor width {} differs from the talker width {} but small_to_mtp_projection is "
             "missing",
             tc.code_predictor.hidden_size, tc.hidden_size);
    }

    w->arena_.allocate(plan.size());
    plan.copy_to(w->arena_.get());
    const uint8_t* base = w->arena_.as<uint8_t>();
    auto b16 = [base](size_t off) { return reinterpret_cast<const bf16_t*>(base + off); };
    auto f32 = [base](size_t off) { return reinterpret_cast<const float*>(base + off); };
    w->talker = resolve_stack(talker, tc, base);
    w->predictor = resolve_stack(predictor, tc.code_predictor, base);
    stack_check(w->talker, "talker");
    stack_check(w->predictor, "code predictor");
    w->codec_embedding = b16(codec_embedding);
    w->codec_head = b16(codec_head);
    w->text_embedding = b16(text_embedding);
    w->text_fc1_w = b16(fc1_w);
    w->text_fc1_b = f32(fc1_b);
    w->text_fc2_w = b16(fc2_w);
    w->text_fc2_b = f32(fc2_b);
    for (size_t off : pred_embed) w->predictor_codec_embedding.push_back(b16(off));
    for (size_t off : pred_head) w->predictor_head.push_back(b16(off));
    if (pw.proj_w) {
        w->predictor_proj_w = b16(proj_w);
        w->predictor_proj_b = f32(proj_b);
    }
    w->upload_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    QTTS_LOG_INFO("uploaded talker + code predictor to CUDA device {}: {:.1f} MB in {:.2f} s", device,
                  plan.size() / 1e6, w->upload_seconds_);
    return w;
}

// ---------------------------------------------------------------------------------------------
// GpuLm
// ---------------------------------------------------------------------------------------------

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
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));  // the staging buffer may still be in use
    std::memcpy(pinned_ints_.get(), host, n * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(dev, pinned_ints_.get(), n * sizeof(int32_t), cudaMemcpyHostToDevice,
                               context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

// ---- building blocks ------------------------------------------------------------------------

void GpuLm::gemm_split(const bf16_t* w, int out, int in, int T) {
    // Row-major y2 [2T, out] = xb [2T, in] · W[out, in]^T, i.e. column-major y2^T = W^T(op T) · xb^T.
    // cuBLAS picks a kernel per problem shape, and the first product of a shape in a process costs
    // milliseconds (measured: +4..14 ms on the first request of each new prompt length, 1.7B), so
    // the row count is rounded up to a multiple of 32 within the scratch's 2C rows: the rows past
    // 2T read stale scratch and their results are never read. Prefill then meets at most 2C/32
    // shapes, all of which the load-time warm-up runs.
    const int rows = std::min((2 * T + 31) / 32 * 32, 2 * options_.prefill_chunk);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(context_.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, out, rows, in, &alpha, w, CUDA_R_16BF, in,
                              xb_, CUDA_R_16BF, in, &beta, y2_, CUDA_R_32F, out, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

namespace {
k::AttentionArgs attention_args(const GpuStack& s, int layer, float* qkv, float* attn, float* k_cache, float* v_cache,
                                int max_ctx, int splits, float* partial, uint32_t* counters, int T,
                                const int32_t* pos_dev, int pos_host) {
    const GpuStack::Layer& L = s.layers[size_t(layer)];
    const size_t layer_stride = size_t(s.n_kv) * size_t(max_ctx) * size_t(s.head_dim);
    k::AttentionArgs a;
    a.qkv = qkv;
    a.ld_qkv = s.qkv_dim();
    a.T = T;
    a.n_heads = s.n_heads;
    a.n_kv = s.n_kv;
    a.head_dim = s.head_dim;
    a.q_norm = L.q_norm;
    a.k_norm = L.k_norm;
    a.eps = s.eps;
    a.inv_freq = s.inv_freq;
    a.k_cache = k_cache + layer_stride * size_t(layer);
    a.v_cache = v_cache + layer_stride * size_t(layer);
    a.max_ctx = max_ctx;
    a.pos_dev = pos_dev;
    a.pos_host = pos_host;
    a.append = true;
    a.out = attn;
    a.ld_out = s.q_dim();
    a.splits = splits;
    a.partial = partial;
    a.counters = counters;
    return a;
}
}  // namespace

void GpuLm::stack_decode(const GpuStack& s, const StackBuffers& b, int T, const int32_t* pos_dev, int pos_host) {
    const k::Launch l = launch();
    const int H = s.hidden, I = s.intermediate;
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const GpuStack::Layer& L = s.layers[i];
        k::GemvArgs qkv;
        qkv.w = L.qkv;
        qkv.out = s.qkv_dim();
        qkv.in = H;
        qkv.rows = T;
        qkv.input = k::GemvInput::GEMV_INPUT_RMSNORM;
        qkv.x = b.x;
        qkv.ldx = H;
        qkv.norm_w = L.input_norm;
        qkv.eps = s.eps;
        qkv.y = b.qkv;
        qkv.ldy = s.qkv_dim();
        k::gemv(qkv, l);

        k::attention(attention_args(s, int(i), b.qkv, b.attn, b.k_cache, b.v_cache, b.max_ctx, b.splits, partial_,
                                    counters_, T, pos_dev, pos_host),
                     l);

        k::GemvArgs o;
        o.w = L.o;
        o.out = H;
        o.in = s.q_dim();
        o.rows = T;
        o.x = b.attn;
        o.ldx = s.q_dim();
        o.output = k::GemvOutput::GEMV_OUTPUT_ADD;
        o.y = b.x;
        o.ldy = H;
        k::gemv(o, l);

        k::GemvArgs up;
        up.w = L.gate_up;
        up.w2 = L.gate_up + size_t(I) * H;
        up.out = I;
        up.in = H;
        up.rows = T;
        up.input = k::GemvInput::GEMV_INPUT_RMSNORM;
        up.x = b.x;
        up.ldx = H;
        up.norm_w = L.post_norm;
        up.eps = s.eps;
        up.output = k::GemvOutput::GEMV_OUTPUT_SWIGLU;
        up.y = b.mlp;
        up.ldy = I;
        k::gemv(up, l);

        k::GemvArgs down;
        down.w = L.down;
        down.out = H;
        down.in = I;
        down.rows = T;
        down.x = b.mlp;
        down.ldx = I;
        down.output = k::GemvOutput::GEMV_OUTPUT_ADD;
        down.y = b.x;
        down.ldy = H;
        k::gemv(down, l);
    }
}

void GpuLm::stack_prefill(const GpuStack& s, const StackBuffers& b, int T, int pos0) {
    const k::Launch l = launch();
    const int H = s.hidden, I = s.intermediate, QD = s.q_dim(), QKV = s.qkv_dim();
    using E = k::LinearEpilogue;
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const GpuStack::Layer& L = s.layers[i];
        k::rmsnorm_split_bf16(b.x, T, H, H, L.input_norm, s.eps, xb_, l);
        gemm_split(L.qkv, QKV, H, T);
        k::linear_split_combine(y2_, QKV, T, QKV, nullptr, E::LINEAR_EPILOGUE_STORE, b.qkv, QKV, l);

        k::AttentionArgs a = attention_args(s, int(i), b.qkv, b.attn, b.k_cache, b.v_cache, b.max_ctx, b.splits,
                                            partial_, counters_, T, nullptr, pos0);
        a.append = false;
        a.splits = k::attention_splits(pos0 + T);
        k::kv_append(a, l);
        k::attention(a, l);

        k::rmsnorm_split_bf16(b.attn, T, QD, QD, nullptr, 0.0f, xb_, l);
        gemm_split(L.o, H, QD, T);
        k::linear_split_combine(y2_, H, T, H, nullptr, E::LINEAR_EPILOGUE_ADD, b.x, H, l);

        k::rmsnorm_split_bf16(b.x, T, H, H, L.post_norm, s.eps, xb_, l);
        gemm_split(L.gate_up, 2 * I, H, T);
        k::linear_split_combine(y2_, 2 * I, T, I, nullptr, E::LINEAR_EPILOGUE_SWIGLU, b.mlp, I, l);

        k::rmsnorm_split_bf16(b.mlp, T, I, I, nullptr, 0.0f, xb_, l);
        gemm_split(L.down, H, I, T);
        k::linear_split_combine(y2_, H, T, H, nullptr, E::LINEAR_EPILOGUE_ADD, b.x, H, l);
    }
}

void GpuLm::talker_head(int row) {
    const k::Launch l = launch();
    const GpuStack& s = weights_->talker;
    const int H = s.hidden;
    k::rmsnorm(talker_buf_.x + size_t(row) * H, 1, H, H, s.norm, s.eps, hidden_, H, l);
    k::GemvArgs head;
    head.w = weights_->codec_head;
    head.out = weights_->codec_vocab;
    head.in = H;
    head.x = hidden_;
    head.ldx = H;
    head.y = talker_logits_;
    head.ldy = weights_->codec_vocab;
    k::gemv(head, l);
}

void GpuLm::predictor_pass(int group) {
    const k::Launch l = launch();
    const GpuLmWeights& w = *weights_;
    const GpuStack& P = w.predictor;
    const int H = w.talker.hidden, Hc = P.hidden;
    const bool project = w.predictor_proj_w != nullptr;
    int T = 1, pos = group, row = 0;
    if (group == 1) {
        T = 2;
        pos = 0;
        row = 1;
        k::predictor_input(hidden_, w.codec_embedding, &state_->current[0], H, project ? predictor_in_ : predictor_buf_.x,
                           l);
        if (project) {
            k::GemvArgs proj;
            proj.w = w.predictor_proj_w;
            proj.bias = w.predictor_proj_b;
            proj.out = Hc;
            proj.in = H;
            proj.rows = 2;
            proj.x = predictor_in_;
            proj.ldx = H;
            proj.y = predictor_buf_.x;
            proj.ldy = Hc;
            k::gemv(proj, l);
        }
    } else {
        const bf16_t* table = w.predictor_codec_embedding[size_t(group - 2)];
        if (project) {
            k::GemvArgs proj;
            proj.w = w.predictor_proj_w;
            proj.bias = w.predictor_proj_b;
            proj.out = Hc;
            proj.in = H;
            proj.rows = 1;
            proj.input = k::GemvInput::GEMV_INPUT_GATHER;
            proj.table = table;
            proj.index = &state_->current[group - 1];
            proj.y = predictor_buf_.x;
            proj.ldy = Hc;
            k::gemv(proj, l);
        } else {
            k::embedding_gather(table, H, &state_->current[group - 1], 1, predictor_buf_.x, H, false, l);
        }
    }
    stack_decode(P, predictor_buf_, T, nullptr, pos);
    k::GemvArgs head;
    head.w = w.predictor_head[size_t(group - 1)];
    head.out = w.predictor_vocab;
    head.in = Hc;
    head.input = k::GemvInput::GEMV_INPUT_RMSNORM;
    head.x = predictor_buf_.x + size_t(row) * Hc;
    head.ldx = Hc;
    head.norm_w = P.norm;
    head.eps = P.eps;
    head.y = predictor_logits_;
    head.ldy = w.predictor_vocab;
    k::gemv(head, l);
}

void GpuLm::sample_enqueue(int group, int frame_offset, bool advance) {
    const GpuLmWeights& w = *weights_;
    k::SampleArgs a;
    a.logits = group == 0 ? talker_logits_ : predictor_logits_;
    a.n = group == 0 ? w.codec_vocab : w.predictor_vocab;
    a.state = state_;
    a.group = group;
    a.frame_offset = frame_offset;
    a.advance = advance;
    a.eos_id = w.config().talker.codec_eos_id;
    a.suppress_begin = w.codec_vocab - 1024;  // the reference masks the top 1024 control ids
    a.seen = seen_;
    a.codes = codes_;
    k::sample(a, launch());
}

void GpuLm::text_project(const int32_t* ids_dev, int n, float* out, int ldo) {
    const k::Launch l = launch();
    const GpuLmWeights& w = *weights_;
    const int Ht = w.text_hidden, H = w.talker.hidden, C = options_.prefill_chunk;
    using E = k::LinearEpilogue;
    for (int c0 = 0; c0 < n; c0 += C) {
        const int t = std::min(C, n - c0);
        k::embedding_gather(w.text_embedding, Ht, ids_dev + c0, t, text_in_, Ht, false, l);
        k::rmsnorm_split_bf16(text_in_, t, Ht, Ht, nullptr, 0.0f, xb_, l);
        gemm_split(w.text_fc1_w, Ht, Ht, t);
        k::linear_split_combine(y2_, Ht, t, Ht, w.text_fc1_b, E::LINEAR_EPILOGUE_SILU_BIAS, text_mid_, Ht, l);
        k::rmsnorm_split_bf16(text_mid_, t, Ht, Ht, nullptr, 0.0f, xb_, l);
        gemm_split(w.text_fc2_w, H, Ht, t);
        k::linear_split_combine(y2_, H, t, H, w.text_fc2_b, E::LINEAR_EPILOGUE_STORE, out + size_t(c0) * ldo, ldo, l);
    }
}

void GpuLm::prefill_device(const float* embeds_dev, int L) {
    if (L < 1 || L >= options_.max_context)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "prompt of {} positions does not fit the GPU context of {} (1..{})", L,
             options_.max_context, options_.max_context - 1);
    const int H = weights_->talker.hidden, C = options_.prefill_chunk;
    int last = 0;
    for (int c0 = 0; c0 < L; c0 += C) {
        const int T = std::min(C, L - c0);
        CUDA_CHECK(cudaMemcpyAsync(talker_buf_.x, embeds_dev + size_t(c0) * H, size_t(T) * H * 4,
                                   cudaMemcpyDeviceToDevice, context_.stream()));
        stack_prefill(weights_->talker, talker_buf_, T, c0);
        last = T - 1;
    }
    talker_head(last);
    talker_length_ = L;
}

void GpuLm::state_upload(int L, int trailing, const GpuGenerationSetup& setup) {
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));  // the pinned mirror may still be in flight
    k::GenerationDeviceState& s = pinned_state_[0];
    s = k::GenerationDeviceState{};
    s.seed = setup.seed;
    s.frame = 0;
    s.position = L;
    s.history_count = 0;
    s.min_new_tokens = setup.min_new_tokens;
    s.trailing_rows = trailing;
    s.code_capacity = code_capacity_;
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
    CUDA_CHECK(cudaMemsetAsync(seen_, 0, size_t(weights_->codec_vocab) * 4, context_.stream()));
    CUDA_CHECK(cudaMemsetAsync(codes_, 0xff, size_t(code_capacity_) * k::SAMPLE_MAX_GROUPS * 4, context_.stream()));
    trailing_rows_ = trailing;
}

// ---- EmbeddingTables ------------------------------------------------------------------------

void GpuLm::text_vector(int32_t id, float* out) const {
    auto* self = const_cast<GpuLm*>(this);  // device scratch only; the observable state does not change
    check("GpuLm::text_vector");
    if (id < 0 || id >= weights_->text_vocab)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text id {} is outside the text vocabulary [0, {})", id,
             weights_->text_vocab);
    DeviceScope scope(context_.device());
    const int H = weights_->talker.hidden;
    self->upload_ints(&id, 1, ints_);
    self->text_project(ints_, 1, scratch_rows_, H);
    CUDA_CHECK(cudaMemcpyAsync(pinned_floats_.get(), scratch_rows_, size_t(H) * 4, cudaMemcpyDeviceToHost,
                               context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    std::memcpy(out, pinned_floats_.get(), size_t(H) * 4);
}

void GpuLm::codec_vector(int codebook, int32_t id, float* out) const {
    const Checkpoint& c = weights_->checkpoint();
    if (codebook == 0) {
        if (id < 0 || id >= weights_->codec_vocab)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codec id {} is outside [0, {})", id, weights_->codec_vocab);
        tensor_rows_to_f32(*c.talker.codec_embedding, id, 1, out);
        return;
    }
    if (codebook < 0 || codebook >= weights_->num_code_groups)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codebook {} is outside [0, {})", codebook, weights_->num_code_groups);
    if (id < 0 || id >= weights_->predictor_vocab)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "code {} of codebook {} is outside [0, {})", id, codebook,
             weights_->predictor_vocab);
    tensor_rows_to_f32(*c.code_predictor.codec_embedding[size_t(codebook - 1)], id, 1, out);
}

// ---- step by step ---------------------------------------------------------------------------

void GpuLm::talker_prefill(const float* embeds, int L) {
    check("GpuLm::talker_prefill");
    DeviceScope scope(context_.device());
    if (L < 1 || L >= options_.max_context)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "prompt of {} positions does not fit the GPU context of {} (1..{})", L,
             options_.max_context, options_.max_context - 1);
    CUDA_CHECK(cudaMemcpyAsync(embeds_, embeds, size_t(L) * weights_->talker.hidden * 4, cudaMemcpyHostToDevice,
                               context_.stream()));
    prefill_device(embeds_, L);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

void GpuLm::prefill_enqueue(int L) {
    check("GpuLm::prefill_enqueue");
    DeviceScope scope(context_.device());
    prefill_device(embeds_, L);
}

void GpuLm::talker_step(const float* input) {
    check("GpuLm::talker_step");
    DeviceScope scope(context_.device());
    if (talker_length_ < 1 || talker_length_ >= options_.max_context)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "talker_step at position {}: prefill first; the context holds {}",
             talker_length_, options_.max_context);
    CUDA_CHECK(cudaMemcpyAsync(talker_buf_.x, input, size_t(weights_->talker.hidden) * 4, cudaMemcpyHostToDevice,
                               context_.stream()));
    stack_decode(weights_->talker, talker_buf_, 1, nullptr, talker_length_);
    talker_head(0);
    ++talker_length_;
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

void GpuLm::predictor_prefill(int32_t code0) {
    check("GpuLm::predictor_prefill");
    DeviceScope scope(context_.device());
    if (code0 < 0 || code0 >= weights_->codec_vocab)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codebook-0 code {} is outside [0, {})", code0, weights_->codec_vocab);
    upload_ints(&code0, 1, &state_->current[0]);
    predictor_pass(1);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

void GpuLm::predictor_step(int group, int32_t previous_code) {
    check("GpuLm::predictor_step");
    DeviceScope scope(context_.device());
    if (group < 2 || group >= weights_->num_code_groups)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "predictor_step group {} is outside [2, {})", group,
             weights_->num_code_groups);
    if (previous_code < 0 || previous_code >= weights_->predictor_vocab)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "code {} is outside [0, {})", previous_code, weights_->predictor_vocab);
    upload_ints(&previous_code, 1, &state_->current[group - 1]);
    predictor_pass(group);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
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

// ---- device-resident generation --------------------------------------------------------------

void GpuLm::generation_start(const float* prefill, int L, const float* trailing, int T,
                             const GpuGenerationSetup& setup) {
    check("GpuLm::generation_start");
    DeviceScope scope(context_.device());
    const int H = weights_->talker.hidden;
    if (L < 1 || L >= options_.max_context)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "prompt of {} positions does not fit the GPU context of {} (1..{})", L,
             options_.max_context, options_.max_context - 1);
    if (T < 0 || T > options_.max_context)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{} trailing text rows exceed the GPU text capacity {}", T,
             options_.max_context);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(embeds_, prefill, size_t(L) * H * 4, cudaMemcpyHostToDevice, context_.stream()));
    if (T > 0)
        CUDA_CHECK(cudaMemcpyAsync(trailing_, trailing, size_t(T) * H * 4, cudaMemcpyHostToDevice, context_.stream()));
    prefill_device(embeds_, L);
    state_upload(L, T, setup);
    sample_enqueue(0, 0, false);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

void GpuLm::generation_start(const Prompt& prompt, const GpuGenerationSetup& setup) {
    check("GpuLm::generation_start");
    DeviceScope scope(context_.device());
    const k::Launch l = launch();
    const GpuLmWeights& w = *weights_;
    const int H = w.talker.hidden, G = w.num_code_groups, M = options_.max_context;
    const int L = int(prompt.positions.size());
    const int T = int(prompt.trailing_ids.size());
    if (L < 1 || L >= M)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "prompt of {} positions does not fit the GPU context of {} (1..{})", L,
             M, M - 1);
    if (T > M)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{} trailing text ids exceed the GPU text capacity {}", T, M);
    if (prompt.ref_frames < 0 || prompt.ref_frames > M ||
        prompt.ref_codes.size() != size_t(prompt.ref_frames) * size_t(G))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "prompt reference codes: {} values for {} frames of {} codebooks",
             prompt.ref_codes.size(), prompt.ref_frames, G);

    // Host-side lists, packed into one upload: [text ids | text rows | codec ids | codec rows |
    // ref rows | ref frame index | ref codes | trailing ids].
    std::vector<int32_t> text_ids, text_rows, codec_ids, codec_rows, ref_rows, ref_index, xvec_rows;
    for (int i = 0; i < L; ++i) {
        const PromptPosition& p = prompt.positions[size_t(i)];
        if (p.text_id >= 0) {
            if (p.text_id >= w.text_vocab)
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text id {} is outside the text vocabulary [0, {})", p.text_id,
                     w.text_vocab);
            text_ids.push_back(p.text_id);
            text_rows.push_back(i);
        }
        switch (p.codec) {
            case CodecSource::CODEC_SOURCE_NONE: break;
            case CodecSource::CODEC_SOURCE_ID:
                if (p.value < 0 || p.value >= w.codec_vocab)
                    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codec id {} is outside [0, {})", p.value, w.codec_vocab);
                codec_ids.push_back(p.value);
                codec_rows.push_back(i);
                break;
            case CodecSource::CODEC_SOURCE_X_VECTOR:
                if (prompt.x_vector.size() != size_t(H))
                    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "x-vector has {} values, the talker width is {}",
                         prompt.x_vector.size(), H);
                xvec_rows.push_back(i);
                break;
            case CodecSource::CODEC_SOURCE_REF_FRAME:
                if (p.value < 0 || p.value >= prompt.ref_frames)
                    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "reference frame {} is outside [0, {})", p.value,
                         prompt.ref_frames);
                ref_rows.push_back(i);
                ref_index.push_back(p.value);
                break;
        }
    }
    for (const int32_t id : prompt.trailing_ids)
        if (id < 0 || id >= w.text_vocab)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text id {} is outside the text vocabulary [0, {})", id,
                 w.text_vocab);
    for (const int32_t code : prompt.ref_codes)
        if (code < 0 || code >= w.predictor_vocab)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "reference code {} is outside [0, {})", code, w.predictor_vocab);

    std::vector<int32_t> packed;
    auto append = [&packed](const std::vector<int32_t>& v) {
        const size_t at = packed.size();
        packed.insert(packed.end(), v.begin(), v.end());
        return at;
    };
    const size_t o_text_ids = append(text_ids), o_text_rows = append(text_rows), o_codec_ids = append(codec_ids),
                 o_codec_rows = append(codec_rows), o_ref_rows = append(ref_rows), o_ref_index = append(ref_index),
                 o_ref_codes = append(prompt.ref_codes), o_trailing = append(prompt.trailing_ids),
                 o_xvec_rows = append(xvec_rows);
    upload_ints(packed.data(), packed.size(), ints_);

    CUDA_CHECK(cudaMemsetAsync(embeds_, 0, size_t(L) * H * 4, context_.stream()));
    if (!text_ids.empty()) {
        text_project(ints_ + o_text_ids, int(text_ids.size()), scratch_rows_, H);
        k::rows_add(scratch_rows_, H, nullptr, int(text_ids.size()), H, ints_ + o_text_rows, embeds_, H, l);
    }
    if (!codec_ids.empty()) {
        k::embedding_gather(w.codec_embedding, H, ints_ + o_codec_ids, int(codec_ids.size()), scratch_rows_, H, false,
                            l);
        k::rows_add(scratch_rows_, H, nullptr, int(codec_ids.size()), H, ints_ + o_codec_rows, embeds_, H, l);
    }
    if (!xvec_rows.empty()) {
        CUDA_CHECK(cudaMemcpyAsync(scratch_rows_, prompt.x_vector.data(), size_t(H) * 4, cudaMemcpyHostToDevice,
                                   context_.stream()));
        for (size_t r = 0; r < xvec_rows.size(); ++r)
            k::rows_add(scratch_rows_, H, nullptr, 1, H, ints_ + o_xvec_rows + r, embeds_, H, l);
    }
    if (!ref_rows.empty()) {
        k::FrameEmbedArgs f;
        f.tables[0] = w.codec_embedding;
        for (int g = 1; g < G; ++g) f.tables[g] = w.predictor_codec_embedding[size_t(g - 1)];
        f.groups = G;
        f.dim = H;
        f.codes = ints_ + o_ref_codes;
        f.code_stride = G;
        f.rows = prompt.ref_frames;
        f.out = scratch_rows_;
        f.ldo = H;
        k::frame_embed(f, l);
        k::rows_add(scratch_rows_, H, ints_ + o_ref_index, int(ref_rows.size()), H, ints_ + o_ref_rows, embeds_, H, l);
    }
    if (T > 0) text_project(ints_ + o_trailing, T, trailing_, H);

    prefill_device(embeds_, L);
    state_upload(L, T, setup);
    sample_enqueue(0, 0, false);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

void GpuLm::trailing_append(const int32_t* text_ids, size_t n) {
    check("GpuLm::trailing_append");
    DeviceScope scope(context_.device());
    if (n == 0) return;
    if (trailing_rows_ + n > size_t(options_.max_context))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text track full: {} + {} rows exceed the GPU capacity {}",
             trailing_rows_, n, options_.max_context);
    for (size_t i = 0; i < n; ++i)
        if (text_ids[i] < 0 || text_ids[i] >= weights_->text_vocab)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text id {} is outside the text vocabulary [0, {})", text_ids[i],
                 weights_->text_vocab);
    const int H = weights_->talker.hidden;
    upload_ints(text_ids, n, ints_);
    text_project(ints_, int(n), trailing_ + size_t(trailing_rows_) * H, H);
    trailing_rows_ += int(n);
    const int32_t rows = trailing_rows_;
    upload_ints(&rows, 1, &state_->trailing_rows);
}

void GpuLm::predictor_frame_enqueue() {
    for (int g = 1; g < weights_->num_code_groups; ++g) {
        predictor_pass(g);
        sample_enqueue(g, 0, false);
    }
}

void GpuLm::talker_frame_enqueue() {
    const GpuLmWeights& w = *weights_;
    k::FrameEmbedArgs f;
    f.tables[0] = w.codec_embedding;
    for (int g = 1; g < w.num_code_groups; ++g) f.tables[g] = w.predictor_codec_embedding[size_t(g - 1)];
    f.groups = w.num_code_groups;
    f.dim = w.talker.hidden;
    f.codes = state_->current;
    f.code_stride = k::SAMPLE_MAX_GROUPS;
    f.rows = 1;
    f.trailing = trailing_;
    f.trailing_rows = &state_->trailing_rows;
    f.text_index = &state_->frame;
    f.pad = pad_;
    f.out = talker_buf_.x;
    f.ldo = w.talker.hidden;
    k::frame_embed(f, launch());
    stack_decode(w.talker, talker_buf_, 1, &state_->position, 0);
    talker_head(0);
    sample_enqueue(0, 1, true);
}

void GpuLm::frame_step_enqueue() {
    check("GpuLm::frame_step_enqueue");
    DeviceScope scope(context_.device());
    predictor_frame_enqueue();
    talker_frame_enqueue();
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
    PinnedArray<int32_t> pinned(size_t(std::max(count, 1)) * k::SAMPLE_MAX_GROUPS);
    codes_read_async(first, count, pinned.get());
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    std::memcpy(out, pinned.get(), size_t(count) * k::SAMPLE_MAX_GROUPS * 4);
}

}  // namespace qtts::cuda
