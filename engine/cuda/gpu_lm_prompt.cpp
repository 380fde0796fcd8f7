// GpuLm's prompt side: the text projection, the embedding tables, the prompt embedded on the GPU
// and the generation start (prefill, state reset, first draw), and text-track rows appended
// while streaming.
#include "engine/cuda/gpu_lm.h"

#include <algorithm>
#include <cstring>

#include "engine/common/error.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "kernels/embedding.cuh"
#include "kernels/linear.cuh"
#include "kernels/rmsnorm.cuh"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

void GpuLm::text_project(const int32_t* ids_dev, int n, float* out, int ldo) {
    const k::Launch l = launch();
    const GpuLmWeights& w = *weights_;
    const int Ht = w.text_hidden, H = w.talker.hidden, C = options_.prefill_chunk;
    using E = k::LinearEpilogue;
    for (int c0 = 0; c0 < n; c0 += C) {
        const int t = std::min(C, n - c0);
        CUDA_CHECK_KERNEL(k::embedding_gather(w.text_embedding, Ht, ids_dev + c0, t, text_in_, Ht, false, l));
        linear_prefill(text_in_, t, Ht, nullptr, 0.0f, w.text_fc1_w, Ht, Ht, w.text_fc1_b,
                       E::LINEAR_EPILOGUE_SILU_BIAS, text_mid_, Ht);
        linear_prefill(text_mid_, t, Ht, nullptr, 0.0f, w.text_fc2_w, H, H, w.text_fc2_b, E::LINEAR_EPILOGUE_STORE,
                       out + size_t(c0) * ldo, ldo);
    }
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
    generation_begin_device(PromptRows{L, T}, setup);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

void GpuLm::generation_start(const Prompt& prompt, const GpuGenerationSetup& setup) {
    check("GpuLm::generation_start");
    DeviceScope scope(context_.device());
    const PromptRows rows = prompt_embed_device(prompt);
    prefill_device(embeds_, rows.positions);
    generation_begin_device(rows, setup);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

GpuLm::PromptRows GpuLm::prompt_load(const Prompt& prompt) {
    check("GpuLm::prompt_load");
    DeviceScope scope(context_.device());
    return prompt_embed_device(prompt);
}

void GpuLm::generation_begin(const PromptRows& rows, const GpuGenerationSetup& setup) {
    check("GpuLm::generation_begin");
    DeviceScope scope(context_.device());
    QTTS_ASSERT(talker_length_ == rows.positions);  // the prefill of these rows ran
    generation_begin_device(rows, setup);
}

void GpuLm::generation_begin_device(const PromptRows& rows, const GpuGenerationSetup& setup) {
    state_upload(rows.positions, rows.trailing, setup);
    sample_enqueue(0, 0, false);
}

GpuLm::PromptRows GpuLm::prompt_embed_device(const Prompt& prompt) {
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
        CUDA_CHECK_KERNEL(k::rows_add(scratch_rows_, H, nullptr, int(text_ids.size()), H, ints_ + o_text_rows, embeds_, H, l));
    }
    if (!codec_ids.empty()) {
        CUDA_CHECK_KERNEL(k::embedding_gather(w.codec_embedding, H, ints_ + o_codec_ids, int(codec_ids.size()), scratch_rows_, H, false,
                            l));
        CUDA_CHECK_KERNEL(k::rows_add(scratch_rows_, H, nullptr, int(codec_ids.size()), H, ints_ + o_codec_rows, embeds_, H, l));
    }
    if (!xvec_rows.empty()) {
        CUDA_CHECK(cudaMemcpyAsync(scratch_rows_, prompt.x_vector.data(), size_t(H) * 4, cudaMemcpyHostToDevice,
                                   context_.stream()));
        for (size_t r = 0; r < xvec_rows.size(); ++r)
            CUDA_CHECK_KERNEL(k::rows_add(scratch_rows_, H, nullptr, 1, H, ints_ + o_xvec_rows + r, embeds_, H, l));
    }
    if (!ref_rows.empty()) {
        k::FrameEmbedArgs f = frame_embed_tables(w);
        f.codes = ints_ + o_ref_codes;
        f.code_stride = G;
        f.rows = prompt.ref_frames;
        f.out = scratch_rows_;
        f.ldo = H;
        CUDA_CHECK_KERNEL(k::frame_embed(f, l));
        CUDA_CHECK_KERNEL(k::rows_add(scratch_rows_, H, ints_ + o_ref_index, int(ref_rows.size()), H, ints_ + o_ref_rows, embeds_, H, l));
    }
    if (T > 0) text_project(ints_ + o_trailing, T, trailing_, H);
    talker_length_ = 0;  // until the prefill of these rows has run
    return PromptRows{L, T};
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

}  // namespace qtts::cuda
