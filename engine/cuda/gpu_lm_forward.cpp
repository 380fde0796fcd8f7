// GpuLm's forward passes: the decoder stacks (decode: gemv kernels; prefill: split-bf16 cuBLAS
// GEMMs), the talker head, the predictor passes, on-device sampling, and the frame step built from
// them (graph-capturable), plus the step-by-step calls that mirror cpu/lm.h.
#include "engine/cuda/gpu_lm.h"

#include <algorithm>

#include "engine/common/error.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "kernels/attention.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemv.cuh"
#include "kernels/linear.cuh"
#include "kernels/rmsnorm.cuh"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

// ---- building blocks ------------------------------------------------------------------------

// y[T, n] (epilogue) = W[out, in] · rmsnorm(x[T, in]) (norm_w null: x as given), through split
// bf16 activations (hi + lo) and one cuBLAS GEMM: fp32-level accuracy at prefill sizes.
void GpuLm::linear_prefill(const float* x, int T, int in, const float* norm_w, float eps, const bf16_t* w, int out,
                           int n, const float* bias, kernels::LinearEpilogue epilogue, float* y, int ldy) {
    linear_split(launch(), context_.cublas(), SplitScratch{xb_, y2_}, x, T, in, in, norm_w, eps, w, out, n, bias,
                 epilogue, y, ldy, prefill_gemm_rows(T));
}

// cuBLAS picks a kernel per problem shape, and the first product of a shape in a process costs
// milliseconds (measured: +4..14 ms on the first request of each new prompt length, 1.7B), so the
// GEMM's row count is rounded up to a multiple of 32 within the scratch's 2C rows. Prefill then
// meets at most 2C/32 shapes, all of which the load-time warm-up runs.
int GpuLm::prefill_gemm_rows(int T) const { return std::min((2 * T + 31) / 32 * 32, 2 * options_.prefill_chunk); }

void GpuLm::stack_decode(const GpuStack& s, const StackBuffers& b, int T, const int32_t* pos_dev, int pos_host) {
    const k::Launch l = launch();
    stack_decode_pass(
        s, DecodeRows{b.x, b.qkv, b.attn, b.mlp, T}, [&l](const k::GemvArgs& a) { gemv_launch(a, l); },
        [&](int layer) {
            k::AttentionArgs a = attention_args(s, layer, b.qkv, b.attn, b.k_cache, b.v_cache, b.max_ctx, b.splits,
                                                partial_, counters_, T, pos_dev, pos_host);
            // A device position is the frame step's (talker_frame_enqueue), advanced by the
            // previous frame's sampler: final before this launch's wait.
            a.pos_settled = pos_dev != nullptr;
            return a;
        },
        l);
}

void GpuLm::stack_prefill(const GpuStack& s, const StackBuffers& b, int T, int pos0) {
    // linear_prefill's products, with the combines fused into the next splits.
    stack_split_pass(
        s, DecodeRows{b.x, b.qkv, b.attn, b.mlp, T}, context_.cublas(), SplitScratch{xb_, y2_}, prefill_gemm_rows(T),
        [&](int layer, const SplitAttentionIo&) { prefill_attention(layer, b.qkv, b.attn, T, pos0); }, launch());
}

void GpuLm::prefill_attention(int layer, float* qkv, float* attn, int T, int pos0) {
    const k::Launch l = launch();
    const StackBuffers& b = talker_buf_;
    k::AttentionArgs a = attention_args(weights_->talker, layer, qkv, attn, b.k_cache, b.v_cache, b.max_ctx, b.splits,
                                        partial_, counters_, T, nullptr, pos0);
    a.append = false;
    a.splits = k::attention_splits(pos0 + T);
    CUDA_CHECK_KERNEL(k::kv_append(a, l));
    CUDA_CHECK_KERNEL(k::attention(a, l));
}

void GpuLm::talker_head(const float* x_row) {
    const k::Launch l = launch();
    const GpuStack& s = weights_->talker;
    const int H = s.hidden;
    CUDA_CHECK_KERNEL(k::rmsnorm(x_row, 1, H, H, s.norm, s.eps, hidden_, H, l));
    gemv_launch(gemv_product(weights_->codec_head, weights_->codec_vocab, H, 1, hidden_, talker_logits_), l);
}

void GpuLm::predictor_pass(int group, bool input_drawn) {
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
        CUDA_CHECK_KERNEL(k::predictor_input(hidden_, w.codec_embedding, &state_->current[0], H,
                                             project ? predictor_in_ : predictor_buf_.x, l));
        if (project) {
            k::GemvArgs proj = gemv_product(w.predictor_proj_w, Hc, H, 2, predictor_in_, predictor_buf_.x);
            proj.bias = w.predictor_proj_b;
            gemv_launch(proj, l);
        }
    } else if (!input_drawn) {  // else: predictor_buf_.x row 0 holds it
        const bf16_t* table = w.predictor_codec_embedding[size_t(group - 2)];
        if (project) {
            k::GemvArgs proj = gemv_product(w.predictor_proj_w, Hc, H, 1, nullptr, predictor_buf_.x);
            proj.bias = w.predictor_proj_b;
            proj.input = k::GemvInput::GEMV_INPUT_GATHER;
            proj.table = table;
            proj.index = &state_->current[group - 1];
            gemv_launch(proj, l);
        } else {
            CUDA_CHECK_KERNEL(k::embedding_gather(table, H, &state_->current[group - 1], 1, predictor_buf_.x, H, false, l));
        }
    }
    stack_decode(P, predictor_buf_, T, nullptr, pos);
    gemv_launch(gemv_normed(gemv_product(w.predictor_head[size_t(group - 1)], w.predictor_vocab, Hc, 1,
                                         predictor_buf_.x + size_t(row) * Hc, predictor_logits_),
                            P.norm, P.eps),
                l);
}

void GpuLm::sample_enqueue(int group, int frame_offset, bool advance, bool next_input) {
    k::SampleArgs a = sample_args(*weights_, group, group == 0 ? talker_logits_ : predictor_logits_);
    if (next_input) draw_next_predictor_input(a, *weights_, group, predictor_buf_.x, weights_->predictor.hidden);
    a.state = state_;
    a.frame_offset = frame_offset;
    a.advance = advance;
    a.seen = seen_;
    a.codes = codes_;
    CUDA_CHECK_KERNEL(k::sample(a, launch()));
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
    talker_head(talker_buf_.x + size_t(last) * H);
    talker_length_ = L;
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
    talker_head(talker_buf_.x);
    ++talker_length_;
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

void GpuLm::predictor_prefill(int32_t code0) {
    check("GpuLm::predictor_prefill");
    DeviceScope scope(context_.device());
    if (code0 < 0 || code0 >= weights_->codec_vocab)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "codebook-0 code {} is outside [0, {})", code0, weights_->codec_vocab);
    upload_ints(&code0, 1, &state_->current[0]);
    predictor_pass(1, false);
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
    predictor_pass(group, false);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

// Each draw but the last writes the next pass's input itself.
void GpuLm::predictor_frame_enqueue() {
    const int G = weights_->num_code_groups;
    for (int g = 1; g < G; ++g) {
        predictor_pass(g, g > 1);
        sample_enqueue(g, 0, false, g + 1 < G);
    }
}

void GpuLm::talker_frame_enqueue(bool after_non_kernel) {
    const GpuLmWeights& w = *weights_;
    k::FrameEmbedArgs f = frame_embed_tables(w);
    f.codes = state_->current;
    f.code_stride = k::SAMPLE_MAX_GROUPS;
    f.rows = 1;
    f.trailing = trailing_;
    f.trailing_rows = &state_->trailing_rows;
    f.text_index = &state_->frame;
    f.pad = pad_;
    f.out = talker_buf_.x;
    f.ldo = w.talker.hidden;
    k::Launch first = launch();
    if (after_non_kernel) first.pdl = false;
    CUDA_CHECK_KERNEL(k::frame_embed(f, first));
    stack_decode(w.talker, talker_buf_, 1, &state_->position, 0);
    talker_head(talker_buf_.x);
    sample_enqueue(0, 1, true);
}

void GpuLm::frame_step_enqueue() {
    check("GpuLm::frame_step_enqueue");
    DeviceScope scope(context_.device());
    predictor_frame_enqueue();
    talker_frame_enqueue();
}

}  // namespace qtts::cuda
