// GpuLmWeights: the talker and code predictor laid out in one device arena (bf16 weights, fp32
// norms, biases and RoPE tables), planned on the host, copied once.
#include "engine/cuda/gpu_lm.h"

#include <algorithm>
#include <chrono>
#include <numeric>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "engine/model/weight_prep.h"
#include "kernels/attention.cuh"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

namespace {

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
    s.inv_freq = plan.add_f32(rope_inv_freq(c.head_dim, c.rope_theta));
    return s;
}

GpuStack resolve_stack(const StackOffsets& o, const TransformerConfig& c, const uint8_t* base) {
    auto f32 = [base](size_t off) { return reinterpret_cast<const float*>(base + off); };
    auto b16 = [base](size_t off) { return reinterpret_cast<const bf16_t*>(base + off); };
    GpuStack s;
    static_cast<StackShape&>(s) = stack_shape(c);
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

// GpuLmWeights::predictor_input_rows into `out`: every code's projected embedding, by the gemv
// launch a pass would make for it (gathering the code's row), 256 codes a launch.
void project_predictor_inputs(const GpuLmWeights& w, float* out) {
    const int V = w.predictor_vocab, H = w.talker.hidden, Hc = w.predictor.hidden;
    std::vector<int32_t> codes(size_t(V), 0);
    std::iota(codes.begin(), codes.end(), 0);
    DeviceArray<int32_t> d_codes(codes.size());
    CUDA_CHECK(cudaMemcpy(d_codes.get(), codes.data(), codes.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    const k::Launch l{cudaStreamPerThread, false};
    for (int t = 0; t + 2 < w.num_code_groups; ++t) {
        for (int c0 = 0; c0 < V; c0 += k::GEMV_MAX_BATCH_ROWS) {
            k::GemvArgs a = gemv_product(w.predictor_proj_w, Hc, H, std::min(k::GEMV_MAX_BATCH_ROWS, V - c0), nullptr,
                                         out + (size_t(t) * V + c0) * Hc);
            a.bias = w.predictor_proj_b;
            a.input = k::GemvInput::GEMV_INPUT_GATHER;
            a.table = w.predictor_codec_embedding[size_t(t)];
            a.index = d_codes.get() + c0;
            gemv_launch(a, l);
        }
    }
    CUDA_CHECK(cudaStreamSynchronize(cudaStreamPerThread));
}

}  // namespace

size_t GpuStack::layer_weight_bytes() const {
    const size_t per_layer = size_t(qkv_dim()) * hidden + size_t(hidden) * q_dim() + 3 * size_t(intermediate) * hidden;
    return per_layer * 2 * layers.size();
}

size_t GpuLmWeights::talker_step_bytes() const {
    return talker.layer_weight_bytes() + size_t(codec_vocab) * talker.hidden * 2;
}

size_t GpuLmWeights::predictor_frame_bytes() const {
    const size_t pass = predictor.layer_weight_bytes() + size_t(predictor_vocab) * predictor.hidden * 2;
    size_t bytes = size_t(num_code_groups - 1) * pass;
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
        const size_t per_pass = size_t(w->predictor_vocab) * size_t(w->predictor.hidden);
        w->input_rows_.allocate(size_t(w->num_code_groups - 2) * per_pass * sizeof(float));
        float* rows = w->input_rows_.as<float>();
        project_predictor_inputs(*w, rows);
        for (int t = 0; t + 2 < w->num_code_groups; ++t) w->predictor_input_rows.push_back(rows + size_t(t) * per_pass);
    }
    w->upload_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    QTTS_LOG_INFO("uploaded talker + code predictor to CUDA device {}: {:.1f} MB in {:.2f} s", device,
                  w->device_bytes() / 1e6, w->upload_seconds_);
    return w;
}

}  // namespace qtts::cuda
