// GpuBatch: the batched frame step (see gpu_batch.h). Reads like GpuLm's frame step
// (gpu_lm_forward.cpp) with B rows: predictor passes 1..15 with their draws, then the talker step
// and the codebook-0 draw; the layers are the same stack_decode_pass.
#include "engine/cuda/gpu_batch.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "kernels/embedding.cuh"
#include "kernels/linear.cuh"
#include "kernels/rmsnorm.cuh"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

void gpu_batch_options_validate(const GpuBatchOptions& o) {
    const int max_bucket = k::GEMV_MAX_BATCH_ROWS / 2;  // the predictor's first pass has 2 rows a stream
    if (o.buckets.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batch buckets: at least one batch size is needed");
    for (size_t i = 0; i < o.buckets.size(); ++i) {
        if (o.buckets[i] < 1 || o.buckets[i] > max_bucket)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batch bucket {} is outside 1..{}", o.buckets[i], max_bucket);
        if (i > 0 && o.buckets[i] <= o.buckets[i - 1])
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batch buckets must be strictly ascending ({} after {})",
                 o.buckets[i], o.buckets[i - 1]);
    }
    for (const int f : o.chunk_frames)
        if (f < 1) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batch chunk frames {} must be >= 1", f);
    if (o.wide_rows < 1) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "wide_rows {} must be >= 1", o.wide_rows);
    if (o.skinny_max_rows < 0 || o.skinny_max_rows > k::SKINNY_MAX_ROWS)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "skinny_max_rows {} must be in 0..{}", o.skinny_max_rows,
             k::SKINNY_MAX_ROWS);
    if (o.skinny_tiles < 0 || o.skinny_tiles > 2)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "skinny_tiles {} must be 0 (the default), 1 or 2", o.skinny_tiles);
    if (o.slice_blocks_per_sm < 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "slice_blocks_per_sm {} must be >= 0", o.slice_blocks_per_sm);
    if (o.short_slices_blocks < 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "short_slices_blocks {} must be 0 (a block per slice) or more",
             o.short_slices_blocks);
    if (o.long_slices_rows < 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "long_slices_rows {} must be 0 (by SM count) or a row count",
             o.long_slices_rows);
}

GpuBatch::GpuBatch(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, int max_context,
                   GpuBatchOptions options)
    : weights_(std::move(weights)), context_(context), max_context_(max_context), options_(std::move(options)) {
    QTTS_ASSERT(weights_);
    context_.guard().check("GpuBatch::GpuBatch");
    gpu_batch_options_validate(options_);
    DeviceScope scope(context_.device());
    const GpuLmWeights& w = *weights_;
    const GpuStack& T = w.talker;
    const GpuStack& P = w.predictor;
    const int B = max_streams(), G = w.num_code_groups, H = T.hidden, Hc = P.hidden;
    rows_cap_ = 2 * B;
    talker_splits_ = k::attention_splits(max_context_);
    max_in_ = std::max({H, T.q_dim(), T.intermediate, Hc, P.q_dim(), P.intermediate});
    max_out_ = std::max({T.qkv_dim(), H, 2 * T.intermediate, w.codec_vocab, P.qkv_dim(), Hc, 2 * P.intermediate,
                         w.predictor_vocab});
    const size_t predictor_kv = P.layers.size() * size_t(P.n_kv) * size_t(G) * size_t(P.head_dim);

    size_t total = 0;
    auto carve = [&total](size_t bytes) {
        const size_t off = align_up(total);
        total = off + bytes;
        return off;
    };
    const size_t o_slots = carve(B * sizeof(k::StreamSlot)), o_tseqs = carve(B * sizeof(k::AttentionSeq)),
                 o_pseqs = carve(B * sizeof(k::AttentionSeq)), o_codes = carve(size_t(B) * k::SAMPLE_MAX_GROUPS * 4),
                 o_hidden = carve(size_t(B) * H * 4);
    const size_t o_tx = carve(size_t(B) * H * 4), o_tqkv = carve(size_t(B) * T.qkv_dim() * 4),
                 o_tattn = carve(size_t(B) * T.q_dim() * 4), o_tmlp = carve(size_t(B) * T.intermediate * 4);
    const size_t R = size_t(rows_cap_);
    const size_t o_px = carve(R * Hc * 4), o_pqkv = carve(R * P.qkv_dim() * 4), o_pattn = carve(R * P.q_dim() * 4),
                 o_pmlp = carve(R * P.intermediate * 4), o_pin = carve(R * H * 4),
                 o_pk = carve(size_t(B) * predictor_kv * 4), o_pv = carve(size_t(B) * predictor_kv * 4);
    const size_t o_tlog = carve(size_t(B) * w.codec_vocab * 4), o_plog = carve(size_t(B) * w.predictor_vocab * 4),
                 o_partial = carve(size_t(B) * k::attention_partial_floats(T.n_heads, 1, talker_splits_, T.head_dim) * 4),
                 o_counters = carve(size_t(B) * k::attention_counter_count(T.n_kv, 1) * 4),
                 o_xb = carve(2 * R * max_in_ * 2), o_y2 = carve(2 * R * max_out_ * 4);
    memory_.allocate(total);
    uint8_t* base = memory_.as<uint8_t>();
    auto f32 = [base](size_t off) { return reinterpret_cast<float*>(base + off); };
    slots_ = reinterpret_cast<k::StreamSlot*>(base + o_slots);
    talker_seqs_ = reinterpret_cast<k::AttentionSeq*>(base + o_tseqs);
    predictor_seqs_ = reinterpret_cast<k::AttentionSeq*>(base + o_pseqs);
    batch_codes_ = reinterpret_cast<int32_t*>(base + o_codes);
    hidden_ = f32(o_hidden);
    talker_ = Activations{f32(o_tx), f32(o_tqkv), f32(o_tattn), f32(o_tmlp)};
    predictor_ = Activations{f32(o_px), f32(o_pqkv), f32(o_pattn), f32(o_pmlp)};
    predictor_in_ = f32(o_pin);
    predictor_k_ = f32(o_pk);
    predictor_v_ = f32(o_pv);
    talker_logits_ = f32(o_tlog);
    predictor_logits_ = f32(o_plog);
    partial_ = f32(o_partial);
    counters_ = reinterpret_cast<uint32_t*>(base + o_counters);
    xb_ = reinterpret_cast<bf16_t*>(base + o_xb);
    y2_ = f32(o_y2);
    CUDA_CHECK(cudaMemsetAsync(memory_.get(), 0, total, context_.stream()));  // idle rows, counters at zero

    host_slots_ = PinnedArray<k::StreamSlot>(size_t(B));
    host_talker_seqs_ = PinnedArray<k::AttentionSeq>(size_t(B));
    host_predictor_seqs_ = PinnedArray<k::AttentionSeq>(size_t(B));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    QTTS_LOG_INFO("GPU batch on device {}: up to {} streams, {:.1f} MB of step buffers (tensor cores from {} rows, "
                  "one launch per product up to {} rows)",
                  context_.device(), B, total / 1e6, options_.wide_rows, options_.skinny_max_rows);
}

int GpuBatch::bucket_for(int n) const {
    if (n < 1 || n > max_streams())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "a batch of {} streams: this batch holds 1..{}", n, max_streams());
    return *std::lower_bound(options_.buckets.begin(), options_.buckets.end(), n);
}

void GpuBatch::bind(const std::vector<GpuLm*>& streams) {
    context_.guard().check("GpuBatch::bind");
    const int n = int(streams.size());
    if (n > max_streams())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{} streams do not fit a batch of at most {}", n, max_streams());
    std::set<const GpuLm*> seen;
    for (const GpuLm* s : streams) {
        if (!s || &s->weights() != weights_.get() || s->max_context() != max_context_)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "GpuBatch::bind: every stream must use this batch's weights and a context of {} positions",
                 max_context_);
        if (!seen.insert(s).second) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuBatch::bind: a stream is bound twice");
    }
    DeviceScope scope(context_.device());
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));  // the pinned tables may still be in flight
    const GpuStack& P = weights_->predictor;
    const size_t predictor_kv = P.layers.size() * size_t(P.n_kv) * size_t(weights_->num_code_groups) * P.head_dim;
    for (int r = 0; r < max_streams(); ++r) {
        k::StreamSlot slot;
        k::AttentionSeq talker, predictor;
        if (r < n) {
            slot = streams[size_t(r)]->batch_slot();
            talker = streams[size_t(r)]->batch_talker_seq();
            predictor.k_cache = predictor_k_ + size_t(r) * predictor_kv;
            predictor.v_cache = predictor_v_ + size_t(r) * predictor_kv;
            predictor.stopped = talker.stopped;
        }
        host_slots_[size_t(r)] = slot;
        host_talker_seqs_[size_t(r)] = talker;
        host_predictor_seqs_[size_t(r)] = predictor;
    }
    const size_t B = size_t(max_streams());
    CUDA_CHECK(cudaMemcpyAsync(slots_, host_slots_.get(), B * sizeof(k::StreamSlot), cudaMemcpyHostToDevice,
                               context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(talker_seqs_, host_talker_seqs_.get(), B * sizeof(k::AttentionSeq),
                               cudaMemcpyHostToDevice, context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(predictor_seqs_, host_predictor_seqs_.get(), B * sizeof(k::AttentionSeq),
                               cudaMemcpyHostToDevice, context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    bound_ = n;
}

// ---- the step -------------------------------------------------------------------------------

void GpuBatch::product(const k::GemvArgs& a) {
    const k::Launch l = context_.launch();
    if (a.rows < options_.wide_rows) {
        gemv_launch(a, l);
        return;
    }
    // Tensor cores, few rows: one launch (split, products and output rule inside).
    if (a.rows <= options_.skinny_max_rows && k::skinny_supported(a)) {
        CUDA_CHECK_KERNEL(k::skinny_product(a, l, 0, options_.skinny_tiles, options_.skinny_weights));
        return;
    }
    // Tensor cores, many rows: rows split into bf16 hi + lo halves ([2 rows, in]), one GEMM
    // against the stacked weights, then the halves summed with the product's output rule.
    const bool swiglu = a.output == k::GemvOutput::GEMV_OUTPUT_SWIGLU;
    QTTS_ASSERT(!swiglu || a.w2 == a.w + size_t(a.out) * a.in);  // gate rows, then up rows
    const int out = swiglu ? 2 * a.out : a.out;
    QTTS_ASSERT(a.rows <= rows_cap_ && a.in <= max_in_ && out <= max_out_);
    const bool norm = a.input == k::GemvInput::GEMV_INPUT_RMSNORM;
    using E = k::LinearEpilogue;
    const E epilogue = swiglu ? E::LINEAR_EPILOGUE_SWIGLU
                              : (a.output == k::GemvOutput::GEMV_OUTPUT_ADD ? E::LINEAR_EPILOGUE_ADD
                                                                             : E::LINEAR_EPILOGUE_STORE);
    linear_split(l, context_.cublas(), SplitScratch{xb_, y2_}, a.x, a.rows, a.in, a.ldx, norm ? a.norm_w : nullptr,
                 a.eps, a.w, out, a.out, a.bias, epilogue, a.y, a.ldy, 2 * a.rows);
}

template <typename Attend>
void GpuBatch::stack_pass(const GpuStack& s, const DecodeRows& b, Attend&& attend) {
    const k::Launch l = context_.launch();
    const bool split = b.rows >= options_.wide_rows && b.rows > options_.skinny_max_rows;
    if (split && options_.split_fusion) {
        QTTS_ASSERT(b.rows <= rows_cap_ && std::max({s.hidden, s.q_dim(), s.intermediate}) <= max_in_ &&
                    std::max(s.qkv_dim(), 2 * s.intermediate) <= max_out_);
        stack_split_pass(
            s, b, context_.cublas(), SplitScratch{xb_, y2_}, 2 * b.rows,
            [&](int layer, const SplitAttentionIo& io) {
                k::AttentionArgs a = attend(layer);
                a.qkv = io.qkv_hi;  // the qkv GEMM's halves, added as the combine would
                a.qkv_lo = io.qkv_lo;
                a.out_split = io.out_split;  // the o product's input
                CUDA_CHECK_KERNEL(k::attention(a, l));
            },
            l, true);
        return;
    }
    stack_decode_pass(s, b, [this](const k::GemvArgs& a) { product(a); }, attend, l);
}

k::AttentionArgs GpuBatch::talker_attention(int layer, int rows) const {
    const GpuStack& s = weights_->talker;
    k::AttentionArgs a = attention_args(s, layer, talker_.qkv, talker_.attn, nullptr, nullptr, max_context_,
                                        talker_splits_, partial_, counters_, 1, nullptr, 0);
    a.seqs = talker_seqs_;
    a.batch = rows;
    a.pos_settled = true;  // the positions were advanced by the previous step's last sampler
    const int sms = context_.sm_count(), row_blocks = rows * s.n_kv;  // blocks per slice
    // Blocks per (stream, KV head) for about slice_blocks_per_sm blocks per SM.
    const int per_sm_aim = (options_.slice_blocks_per_sm * sms + row_blocks - 1) / row_blocks;
    const int long_from = options_.long_slices_rows > 0 ? options_.long_slices_rows
                                                        : (sms + s.n_kv - 1) / s.n_kv;  // row_blocks >= SMs
    if (rows >= long_from) {
        // Slices of 128 keys, and about slice_blocks_per_sm blocks per SM whatever the context: at
        // 64 rows two blocks per (stream, KV head) instead of talker_splits_ (32 at 4096
        // positions), most of which would find no key at a short context.
        a.min_chunk = k::ATTN_KEYS_PER_SPLIT;
        a.grid_splits = std::min(talker_splits_, std::max(1, per_sm_aim));
    } else if (options_.short_slices_blocks > 0) {
        // Slices of 16 keys or more, and at least short_slices_blocks blocks per (stream, KV head):
        // a context of up to that many slices still gets a block per slice, and a short one does
        // not schedule thousands of blocks that find no key.
        a.grid_splits = std::min(talker_splits_, std::max(options_.short_slices_blocks, per_sm_aim));
    }
    return a;
}

k::AttentionArgs GpuBatch::predictor_attention(int layer, int rows, int group) const {
    const GpuStack& s = weights_->predictor;
    const int T = group == 1 ? 2 : 1, pos = group == 1 ? 0 : group;
    k::AttentionArgs a = attention_args(s, layer, predictor_.qkv, predictor_.attn, nullptr, nullptr,
                                        weights_->num_code_groups, 1, nullptr, nullptr, T, nullptr, pos);
    a.seqs = predictor_seqs_;
    a.batch = rows;
    return a;
}

void GpuBatch::predictor_pass(int rows, int group) {
    const GpuLmWeights& w = *weights_;
    const GpuStack& P = w.predictor;
    const int H = w.talker.hidden, Hc = P.hidden;
    const bool project = w.predictor_proj_w != nullptr;
    // Group 1 reads two rows a stream ([talker output, codebook-0 embedding], positions 0 and 1),
    // the others one (the previous codebook's embedding at position `group`).
    const int T = group == 1 ? 2 : 1;
    if (group == 1) {
        CUDA_CHECK_KERNEL(k::predictor_input_rows(hidden_, w.codec_embedding, batch_codes_, k::SAMPLE_MAX_GROUPS, rows,
                                                  H, project ? predictor_in_ : predictor_.x, context_.launch()));
        if (project) {
            k::GemvArgs proj = gemv_product(w.predictor_proj_w, Hc, H, 2 * rows, predictor_in_, predictor_.x);
            proj.bias = w.predictor_proj_b;
            product(proj);
        }
    }  // else: the previous draw wrote each row's input into predictor_.x (projected, if at all)
    stack_pass(P, DecodeRows{predictor_.x, predictor_.qkv, predictor_.attn, predictor_.mlp, T * rows},
               [this, rows, group](int layer) { return predictor_attention(layer, rows, group); });
    // The head reads each stream's last row.
    k::GemvArgs head = gemv_normed(gemv_product(w.predictor_head[size_t(group - 1)], w.predictor_vocab, Hc, rows,
                                                predictor_.x + size_t(T - 1) * Hc, predictor_logits_),
                                   P.norm, P.eps);
    head.ldx = T * Hc;
    product(head);
}

void GpuBatch::talker_step(int rows) {
    const k::Launch l = context_.launch();
    const GpuLmWeights& w = *weights_;
    const GpuStack& s = w.talker;
    const int H = s.hidden;
    k::FrameEmbedArgs f = frame_embed_tables(w);
    f.codes = batch_codes_;
    f.code_stride = k::SAMPLE_MAX_GROUPS;
    f.rows = rows;
    f.slots = slots_;
    f.out = talker_.x;
    f.ldo = H;
    CUDA_CHECK_KERNEL(k::frame_embed(f, l));
    stack_pass(s, DecodeRows{talker_.x, talker_.qkv, talker_.attn, talker_.mlp, rows},
               [this, rows](int layer) { return talker_attention(layer, rows); });
    CUDA_CHECK_KERNEL(k::rmsnorm(talker_.x, rows, H, H, s.norm, s.eps, hidden_, H, l));
    product(gemv_product(w.codec_head, w.codec_vocab, H, rows, hidden_, talker_logits_));
}

void GpuBatch::step_enqueue(int rows) {
    context_.guard().check("GpuBatch::step_enqueue");
    QTTS_ASSERT(rows >= 1 && rows <= max_streams());
    DeviceScope scope(context_.device());
    const k::Launch l = context_.launch();
    const GpuLmWeights& w = *weights_;
    CUDA_CHECK_KERNEL(k::slots_load(slots_, rows, w.talker.hidden, batch_codes_, hidden_, l));
    // Codebooks 1..15 of each stream's frame in progress. Each draw but the last also writes the
    // next pass's input rows (the projected row of the code drawn, or its embedding): no gather or
    // projection launch between.
    for (int g = 1; g < w.num_code_groups; ++g) {
        predictor_pass(rows, g);
        k::SampleArgs a = sample_args(w, g, predictor_logits_);
        a.slots = slots_;
        a.rows = rows;
        a.ld_logits = w.predictor_vocab;
        a.batch_codes = batch_codes_;
        if (g + 1 < w.num_code_groups) draw_next_predictor_input(a, w, g, predictor_.x, w.predictor.hidden);
        CUDA_CHECK_KERNEL(k::sample(a, l));
    }
    // The talker step of the finished frame and codebook 0 of the next one.
    talker_step(rows);
    k::SampleArgs a = sample_args(w, 0, talker_logits_);
    a.frame_offset = 1;
    a.advance = true;
    a.slots = slots_;
    a.rows = rows;
    a.ld_logits = w.codec_vocab;
    a.batch_codes = batch_codes_;
    CUDA_CHECK_KERNEL(k::sample(a, l));
    CUDA_CHECK_KERNEL(k::slots_store_hidden(slots_, rows, w.talker.hidden, hidden_, l));
}

// ---- graphs ---------------------------------------------------------------------------------

void GpuBatch::capture() {
    if (!options_.cuda_graphs) return;
    for (const int bucket : options_.buckets) {
        for (const int frames : options_.chunk_frames) {
            const auto key = std::make_pair(bucket, frames);
            if (graphs_.count(key)) continue;
            GraphStats s;
            GraphExec exec = graph_capture(
                context_, "batch " + std::to_string(bucket) + " x" + std::to_string(frames),
                [this, bucket, frames] {
                    for (int i = 0; i < frames; ++i) step_enqueue(bucket);
                },
                &s);
            s.frames = frames;
            stats_.push_back(s);
            graphs_.emplace(key, std::move(exec));
        }
    }
}

long long GpuBatch::graph_device_bytes() const {
    long long total = 0;
    for (const GraphStats& s : stats_) total += s.device_bytes;
    return total;
}

void GpuBatch::run(int frames) {
    if (frames <= 0 || bound_ == 0) return;
    const int bucket = bucket_for(bound_);
    auto it = graphs_.find(std::make_pair(bucket, frames));
    if (it != graphs_.end()) {
        graph_replay(context_, it->second);
        return;
    }
    // A size without its own graph (a capped last chunk's 2-3 frames): the one-frame graph once
    // per frame, the same steps.
    if (auto one = graphs_.find(std::make_pair(bucket, 1)); one != graphs_.end()) {
        for (int i = 0; i < frames; ++i) graph_replay(context_, one->second);
        return;
    }
    OwnerGuard::Scope owner(context_.guard(), "eager batch steps");
    for (int i = 0; i < frames; ++i) step_enqueue(bucket);
}

void GpuBatch::talker_logits_read(int row, float* out) {
    context_.guard().check("GpuBatch::talker_logits_read");
    QTTS_ASSERT(row >= 0 && row < max_streams());
    DeviceScope scope(context_.device());
    const size_t n = size_t(weights_->codec_vocab);
    PinnedArray<float> pinned(n);
    CUDA_CHECK(cudaMemcpyAsync(pinned.get(), talker_logits_ + size_t(row) * n, n * 4, cudaMemcpyDeviceToHost,
                               context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    std::memcpy(out, pinned.get(), n * 4);
}

}  // namespace qtts::cuda
