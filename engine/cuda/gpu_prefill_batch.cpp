#include "engine/cuda/gpu_prefill_batch.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cuda/gpu_lm_launch.h"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

namespace {
constexpr int GEMM_ROW_STEP = 64;  // GEMM row counts are rounded to this: few shapes to warm up
// From this many GEMM rows (256 prompt rows) the STORE and ADD products run as two GEMMs straight
// into their outputs (linear_split_direct) instead of GEMM + combine: measured on the H200 (1.7B,
// qtts bench --batch) 2-5% faster passes for 10-32 prompts, where the combine's fp32 traffic
// counts, but 7-15% slower for passes under ~256 rows, where each cuBLAS call's fixed cost does.
constexpr int DIRECT_MIN_GEMM_ROWS = 512;
constexpr int TABLE_PASSES = 4;    // attention tables of this many full passes before a sync
}  // namespace

GpuPrefillBatch::GpuPrefillBatch(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, int chunk_rows,
                                 int max_rows)
    : weights_(std::move(weights)), context_(context), chunk_rows_(chunk_rows), max_rows_(max_rows) {
    QTTS_ASSERT(weights_);
    context_.guard().check("GpuPrefillBatch::GpuPrefillBatch");
    if (chunk_rows_ < 1 || max_rows_ < chunk_rows_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batched prefill: {} rows per pass cannot hold a {}-row prompt chunk",
             max_rows_, chunk_rows_);
    DeviceScope scope(context_.device());
    const GpuStack& T = weights_->talker;
    const size_t R = size_t(max_rows_);
    const size_t max_in = size_t(std::max({T.hidden, T.q_dim(), T.intermediate}));
    const size_t max_out = size_t(std::max({T.qkv_dim(), T.hidden, 2 * T.intermediate}));
    size_t total = 0;
    auto carve = [&total](size_t bytes) {
        const size_t off = align_up(total);
        total = off + bytes;
        return off;
    };
    const size_t o_x = carve(R * T.hidden * 4), o_qkv = carve(R * T.qkv_dim() * 4), o_attn = carve(R * T.q_dim() * 4),
                 o_mlp = carve(R * T.intermediate * 4), o_xb = carve(2 * R * max_in * 2),
                 o_y2 = carve(2 * R * max_out * 4);
    table_capacity_ = size_t(TABLE_PASSES) * R;  // a pass has at most one member per row
    const size_t o_table = carve(table_capacity_ * sizeof(k::AttentionPrefillSeq));
    memory_.allocate(total);
    uint8_t* base = memory_.as<uint8_t>();
    auto f32 = [base](size_t off) { return reinterpret_cast<float*>(base + off); };
    x_ = f32(o_x);
    qkv_ = f32(o_qkv);
    attn_ = f32(o_attn);
    mlp_ = f32(o_mlp);
    xb_ = reinterpret_cast<bf16_t*>(base + o_xb);
    y2_ = f32(o_y2);
    table_ = reinterpret_cast<k::AttentionPrefillSeq*>(base + o_table);
    host_table_ = PinnedArray<k::AttentionPrefillSeq>(table_capacity_);
    // Zeros: the GEMM rows past a pass's split rows read this scratch (results never read).
    CUDA_CHECK(cudaMemsetAsync(memory_.get(), 0, total, context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    QTTS_LOG_INFO("GPU batched prefill on device {}: up to {} prompt rows per pass, {:.1f} MB", context_.device(),
                  max_rows_, total / 1e6);
}

void GpuPrefillBatch::product(const float* x, int rows, int in, const float* norm_w, const bf16_t* w, int out, int n,
                              k::LinearEpilogue epilogue, float* y, int ldy, int g) {
    const k::Launch l = context_.launch();
    const float eps = weights_->talker.eps;
    if (g >= DIRECT_MIN_GEMM_ROWS && epilogue != k::LinearEpilogue::LINEAR_EPILOGUE_SWIGLU)
        linear_split_direct(l, context_.cublas(), xb_, x, rows, in, in, norm_w, eps, w, out, epilogue, y, ldy, g);
    else
        linear_split(l, context_.cublas(), SplitScratch{xb_, y2_}, x, rows, in, in, norm_w, eps, w, out, n, nullptr,
                     epilogue, y, ldy, g);
}

int GpuPrefillBatch::gemm_rows(int rows) const {
    return std::min((2 * rows + GEMM_ROW_STEP - 1) / GEMM_ROW_STEP * GEMM_ROW_STEP, 2 * max_rows_);
}

void GpuPrefillBatch::run(const std::vector<GpuLm*>& streams, const std::vector<int>& positions) {
    context_.guard().check("GpuPrefillBatch::run");
    QTTS_ASSERT(streams.size() == positions.size());
    DeviceScope scope(context_.device());
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));  // no earlier table upload is in flight
    table_used_ = 0;
    // Groups in the given order (the most urgent first), each within max_rows in its first pass.
    std::vector<Member> group;
    int group_rows = 0;
    for (size_t i = 0; i < streams.size(); ++i) {
        GpuLm* lm = streams[i];
        QTTS_ASSERT(lm && &lm->weights() == weights_.get() && &lm->context() == &context_ &&
                    lm->options().prefill_chunk == chunk_rows_);
        QTTS_ASSERT(positions[i] >= 1 && positions[i] < lm->max_context());
        QTTS_ASSERT(std::count(streams.begin(), streams.end(), lm) == 1);  // one table row per cache
        const int first_rows = std::min(positions[i], chunk_rows_);
        if (group_rows + first_rows > max_rows_) {
            group_run(group);
            group.clear();
            group_rows = 0;
        }
        group.push_back(Member{lm, positions[i], 0, 0});
        group_rows += first_rows;
    }
    if (!group.empty()) group_run(group);
}

void GpuPrefillBatch::group_run(std::vector<Member>& group) {
    const int H = weights_->talker.hidden;
    for (int pos0 = 0;; pos0 += chunk_rows_) {
        // This pass: every member with prompt rows left, chunk_rows_ of them at most.
        std::vector<Member> members;
        int rows = 0;
        for (const Member& m : group) {
            if (m.positions <= pos0) continue;
            Member p = m;
            p.row = rows;
            p.rows = std::min(chunk_rows_, m.positions - pos0);
            rows += p.rows;
            members.push_back(p);
        }
        if (members.empty()) return;
        for (const Member& m : members)
            CUDA_CHECK(cudaMemcpyAsync(x_ + size_t(m.row) * H, m.lm->embeds_ + size_t(pos0) * H,
                                       size_t(m.rows) * H * 4, cudaMemcpyDeviceToDevice, context_.stream()));
        pass(members, rows, pos0);
        // A member whose prompt ends in this pass: its last row gives its hidden state and logits.
        for (const Member& m : members)
            if (pos0 + m.rows == m.positions) {
                m.lm->talker_head(x_ + size_t(m.row + m.rows - 1) * H);
                m.lm->talker_length_ = m.positions;
            }
    }
}

void GpuPrefillBatch::pass(const std::vector<Member>& members, int rows, int pos0) {
    const GpuStack& s = weights_->talker;
    const int H = s.hidden, I = s.intermediate, QD = s.q_dim(), QKV = s.qkv_dim();
    const k::Launch l = context_.launch();
    const int g = gemm_rows(rows);
    // One attention launch (and one key/value append) per layer for every member, from a table
    // of their caches, rows and positions; T and splits size the launch (the largest member's).
    const k::AttentionPrefillSeq* table = table_upload(members, pos0);
    int tiles = 0, longest = 0, splits = 1;
    for (const Member& m : members) {
        tiles += (m.rows + k::ATTN_TILE - 1) / k::ATTN_TILE;
        longest = std::max(longest, m.rows);
        splits = std::max(splits, k::attention_splits(pos0 + m.rows));
    }
    const int max_ctx = members.front().lm->talker_buf_.max_ctx;
    const auto attention = [&](int layer) {
        k::AttentionArgs a = attention_args(s, layer, qkv_, attn_, nullptr, nullptr, max_ctx, splits, nullptr, nullptr,
                                            longest, nullptr, 0);
        a.append = false;
        a.prefill_seqs = table;
        a.batch = int(members.size());
        a.prefill_rows = rows;
        a.prefill_tiles = tiles;
        CUDA_CHECK_KERNEL(k::kv_append(a, l));
        CUDA_CHECK_KERNEL(k::attention(a, l));
    };
    if (g < DIRECT_MIN_GEMM_ROWS) {  // every product split + GEMM + combine: the combines fused into the next splits
        stack_split_pass(s, DecodeRows{x_, qkv_, attn_, mlp_, rows}, context_.cublas(), SplitScratch{xb_, y2_}, g,
                         [&](int layer, const SplitAttentionIo&) { attention(layer); }, l);
        return;
    }
    using E = k::LinearEpilogue;
    for (size_t i = 0; i < s.layers.size(); ++i) {
        const GpuStack::Layer& L = s.layers[i];
        product(x_, rows, H, L.input_norm, L.qkv, QKV, QKV, E::LINEAR_EPILOGUE_STORE, qkv_, QKV, g);
        attention(int(i));
        product(attn_, rows, QD, nullptr, L.o, H, H, E::LINEAR_EPILOGUE_ADD, x_, H, g);
        product(x_, rows, H, L.post_norm, L.gate_up, 2 * I, I, E::LINEAR_EPILOGUE_SWIGLU, mlp_, I, g);
        product(mlp_, rows, I, nullptr, L.down, H, H, E::LINEAR_EPILOGUE_ADD, x_, H, g);
    }
}

const k::AttentionPrefillSeq* GpuPrefillBatch::table_upload(const std::vector<Member>& members, int pos0) {
    const size_t n = members.size();
    QTTS_ASSERT(n <= size_t(max_rows_));
    if (table_used_ + n > table_capacity_) {  // every region taken: the earlier passes' uploads must land first
        CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
        table_used_ = 0;
    }
    const size_t at = table_used_;
    table_used_ += n;
    const int max_ctx = members.front().lm->talker_buf_.max_ctx;
    for (size_t i = 0; i < n; ++i) {
        GpuLm& lm = *members[i].lm;
        k::AttentionPrefillSeq& q = host_table_[at + i];
        q.k_cache = lm.talker_buf_.k_cache;
        q.v_cache = lm.talker_buf_.v_cache;
        q.row0 = members[i].row;
        q.T = members[i].rows;
        q.pos0 = pos0;
        q.splits = k::attention_splits(pos0 + q.T);  // as the stream's own prefill launch
        q.partial = lm.partial_;
        q.counters = lm.counters_;
        // What attention() checks for a launch of one stream, checked here for each entry.
        QTTS_ASSERT(lm.talker_buf_.max_ctx == max_ctx && pos0 + q.T <= max_ctx && q.T <= chunk_rows_);
        QTTS_ASSERT(((reinterpret_cast<uintptr_t>(q.k_cache) | reinterpret_cast<uintptr_t>(q.v_cache)) & 15) == 0);
    }
    CUDA_CHECK(cudaMemcpyAsync(table_ + at, host_table_.get() + at, n * sizeof(k::AttentionPrefillSeq),
                               cudaMemcpyHostToDevice, context_.stream()));
    return table_ + at;
}

void GpuPrefillBatch::warm_up() {
    context_.guard().check("GpuPrefillBatch::warm_up");
    DeviceScope scope(context_.device());
    const GpuStack& s = weights_->talker;
    const GpuStack::Layer& L = s.layers.front();
    const int H = s.hidden, I = s.intermediate, QD = s.q_dim(), QKV = s.qkv_dim();
    const k::Launch l = context_.launch();
    using E = k::LinearEpilogue;
    // Every GEMM row count run() can use, with every product shape of a layer; outputs go to this
    // object's scratch only (no stream is touched).
    std::set<int> shapes;
    for (int rows = 1; rows <= max_rows_; ++rows) shapes.insert(gemm_rows(rows));
    for (const int g : shapes) {
        const int rows = std::min(g / 2, max_rows_);
        product(x_, rows, H, L.input_norm, L.qkv, QKV, QKV, E::LINEAR_EPILOGUE_STORE, qkv_, QKV, g);
        product(attn_, rows, QD, nullptr, L.o, H, H, E::LINEAR_EPILOGUE_STORE, x_, H, g);
        product(x_, rows, H, L.post_norm, L.gate_up, 2 * I, I, E::LINEAR_EPILOGUE_SWIGLU, mlp_, I, g);
        product(mlp_, rows, I, nullptr, L.down, H, H, E::LINEAR_EPILOGUE_STORE, x_, H, g);
    }
    // The fused combine + split of the smaller passes (stack_split_pass), loaded here too (one row).
    CUDA_CHECK_KERNEL(k::combine_add_rmsnorm_split_bf16(y2_, H, 1, H, x_, H, L.post_norm, s.eps, xb_, l));
    // The batched attention kernels too (one row against one key, on this object's scratch):
    // a kernel's first launch loads its code, which takes device memory; that happens here, at
    // start-up, inside what the memory plan measured, not at the first request.
    k::AttentionPrefillSeq& q = host_table_[0];
    q = k::AttentionPrefillSeq{};
    q.k_cache = y2_;  // [n_kv, 1, head_dim] each, in the GEMM scratch
    q.v_cache = y2_ + size_t(s.n_kv) * s.head_dim;
    q.T = 1;
    CUDA_CHECK(cudaMemcpyAsync(table_, host_table_.get(), sizeof(q), cudaMemcpyHostToDevice, context_.stream()));
    k::AttentionArgs a = attention_args(s, 0, qkv_, attn_, nullptr, nullptr, 1, 1, nullptr, nullptr, 1, nullptr, 0);
    a.append = false;
    a.prefill_seqs = table_;
    a.batch = 1;
    a.prefill_rows = 1;
    a.prefill_tiles = 1;
    CUDA_CHECK_KERNEL(k::kv_append(a, l));
    CUDA_CHECK_KERNEL(k::attention(a, l));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
}

}  // namespace qtts::cuda
