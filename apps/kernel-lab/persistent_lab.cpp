// qtts-kernel-lab persist: the code predictor's passes as the product runs them (a graph of
// gemv and attention launches, PDL on) against one cooperative launch of the lab's persistent
// kernel (persistent_pass.h), on a checkpoint's predictor: logits and caches compared bitwise,
// then both timed.
#include "apps/kernel-lab/persistent_lab.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "apps/kernel-lab/persistent_pass.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/event_timer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "engine/model/weights.h"

namespace qtts::kernel_lab {

namespace {

namespace qc = ::qtts::cuda;
namespace k = ::qtts::kernels;

std::vector<float> random_vector(size_t n, std::mt19937& rng, float lo, float hi) {
    std::uniform_real_distribution<float> uni(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = uni(rng);
    return v;
}

template <typename T>
std::vector<T> download(const qc::DeviceArray<T>& d, size_t n) {
    std::vector<T> v(n);
    CUDA_CHECK(cudaMemcpy(v.data(), d.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
    return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0.0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, double(std::fabs(a[i] - b[i])));
    return m;
}

}  // namespace

int lab_persist(const std::string& model, int device, uint64_t seed) {
    qc::GpuContext ctx(device);
    const auto weights = qc::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const qc::GpuLmWeights& w = *weights;
    const qc::GpuStack& P = w.predictor;
    const int H = P.hidden, passes = w.num_code_groups - 1, max_ctx = w.num_code_groups, pos0 = 1;
    const size_t cache_floats = P.layers.size() * size_t(P.n_kv) * max_ctx * P.head_dim;

    std::mt19937 rng{uint32_t(seed)};
    const auto x_in = random_vector(size_t(passes) * H, rng, -2.0f, 2.0f);
    const auto caches0 = random_vector(2 * cache_floats, rng, -1.0f, 1.0f);  // k | v
    const size_t logit_floats = size_t(passes) * size_t(w.predictor_vocab);
    qc::DeviceArray<float> d_x_in{x_in.size()}, d_caches{caches0.size()}, x{size_t(H)}, qkv{size_t(P.qkv_dim())},
        attn{size_t(P.q_dim())}, mlp{size_t(P.intermediate)}, logits_chain{logit_floats}, logits_persist{logit_floats};
    qc::DeviceArray<unsigned> barrier(4096);
    CUDA_CHECK(cudaMemcpy(d_x_in.get(), x_in.data(), x_in.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(barrier.get(), 0, barrier.bytes()));
    float* k_cache = d_caches.get();
    float* v_cache = d_caches.get() + cache_floats;
    const auto caches_reset = [&] {
        CUDA_CHECK(cudaMemcpy(d_caches.get(), caches0.data(), caches0.size() * 4, cudaMemcpyHostToDevice));
    };

    // The product's launches: pass p from input row p at position pos0 + p, then the head.
    const k::Launch l = ctx.launch();
    const auto chain = [&] {
        for (int p = 0; p < passes; ++p) {
            CUDA_CHECK(cudaMemcpyAsync(x.get(), d_x_in.get() + size_t(p) * H, size_t(H) * 4, cudaMemcpyDeviceToDevice,
                                       ctx.stream()));
            qc::stack_decode_pass(
                P, qc::DecodeRows{x.get(), qkv.get(), attn.get(), mlp.get(), 1},
                [&l](const k::GemvArgs& a) { qc::gemv_launch(a, l); },
                [&](int layer) {
                    return qc::attention_args(P, layer, qkv.get(), attn.get(), k_cache, v_cache, max_ctx, 1, nullptr,
                                              nullptr, 1, nullptr, pos0 + p);
                },
                l);
            qc::gemv_launch(qc::gemv_normed(qc::gemv_product(w.predictor_head[0], w.predictor_vocab, H, 1, x.get(),
                                                             logits_chain.get() + size_t(p) * w.predictor_vocab),
                                            P.norm, P.eps),
                            l);
        }
    };

    PersistArgs a;
    a.n_layers = int(P.layers.size());
    for (int i = 0; i < a.n_layers; ++i) {
        const qc::GpuStack::Layer& L = P.layers[size_t(i)];
        a.layers[i] = PersistLayer{L.qkv, L.o, L.gate_up, L.down, L.input_norm, L.post_norm, L.q_norm, L.k_norm};
    }
    a.head = w.predictor_head[0];
    a.final_norm = P.norm;
    a.eps = P.eps;
    a.inv_freq = P.inv_freq;
    a.hidden = H;
    a.intermediate = P.intermediate;
    a.n_heads = P.n_heads;
    a.n_kv = P.n_kv;
    a.head_dim = P.head_dim;
    a.vocab = w.predictor_vocab;
    a.x_in = d_x_in.get();
    a.x = x.get();
    a.qkv = qkv.get();
    a.attn = attn.get();
    a.mlp = mlp.get();
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.max_ctx = max_ctx;
    a.pos0 = pos0;
    a.passes = passes;
    a.logits = logits_persist.get();
    a.barrier = barrier.get();
    if (!persist_supported(a)) {
        std::printf("qtts-kernel-lab persist: the checkpoint's predictor shapes are not supported\n");
        return 1;
    }
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    const int per_sm = persist_blocks_per_sm(device);
    const int blocks = sms * per_sm;

    // Same inputs, same caches: bitwise the same logits and appended cache rows?
    caches_reset();
    chain();
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    const auto ref_logits = download(logits_chain, logit_floats);
    const auto ref_caches = download(d_caches, caches0.size());
    caches_reset();
    persist_launch(a, blocks, ctx.stream());
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    const auto got_logits = download(logits_persist, logit_floats);
    const auto got_caches = download(d_caches, caches0.size());
    const bool same_logits = std::memcmp(got_logits.data(), ref_logits.data(), ref_logits.size() * 4) == 0;
    const bool same_caches = std::memcmp(got_caches.data(), ref_caches.data(), ref_caches.size() * 4) == 0;
    const bool finite = std::all_of(ref_logits.begin(), ref_logits.end(), [](float v) { return std::isfinite(v); });

    // Timed: the chain as one graph of `passes` passes, replayed; the persistent kernel as one
    // launch of `passes` passes (each run rewrites the same cache rows from the same inputs).
    qc::GraphStats stats;
    const qc::GraphExec graph = qc::graph_capture(ctx, "predictor passes (lab)", chain, &stats);
    for (int i = 0; i < 3; ++i) qc::graph_replay(ctx, graph);
    const double chain_ms = qtts::cuda::time_on_stream(ctx.stream(), 20, [&] { qc::graph_replay(ctx, graph); });
    const auto persist_time = [&](const PersistArgs& args, int grid) {
        // Every block starts a launch with the same arrival count: zero them for a new grid.
        CUDA_CHECK(cudaMemsetAsync(barrier.get(), 0, barrier.bytes(), ctx.stream()));
        for (int i = 0; i < 3; ++i) persist_launch(args, grid, ctx.stream());
        return qtts::cuda::time_on_stream(ctx.stream(), 20, [&] { persist_launch(args, grid, ctx.stream()); });
    };
    const double persist_ms = persist_time(a, blocks);
    // The same with one block per SM, and the barriers and prefetches alone (no stage work).
    const double one_per_sm_ms = per_sm > 1 ? persist_time(a, sms) : persist_ms;
    PersistArgs bare = a;
    bare.barriers_only = true;
    const double barriers_ms = persist_time(bare, blocks);
    bare.prefetch = false;
    const double barriers_alone_ms = persist_time(bare, blocks);
    bare.counter_barrier = true;
    const double counter_alone_ms = persist_time(bare, blocks);
    PersistArgs counter = a;
    counter.counter_barrier = true;
    const double counter_ms = persist_time(counter, blocks);
    PersistArgs no_prefetch = a;
    no_prefetch.prefetch = false;
    const double no_prefetch_ms = persist_time(no_prefetch, blocks);
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));

    const double bytes = double(P.layer_weight_bytes()) + double(w.predictor_vocab) * H * 2.0;  // per pass
    std::printf("qtts-kernel-lab persist: %s, device %d (%s), seed %llu\n", model.c_str(), device,
                ctx.device_name().c_str(), static_cast<unsigned long long>(seed));
    std::printf("  %d passes of %zu layers + head, positions %d..%d, %.1f MB of weights a pass\n", passes,
                P.layers.size(), pos0, pos0 + passes - 1, bytes / 1e6);
    std::printf("  chain (graph, %zu nodes, PDL %s): %8.2f us a pass\n", stats.nodes, ctx.pdl() ? "on" : "off",
                chain_ms * 1e3 / passes);
    std::printf("  persistent (%d blocks of 256, one launch): %8.2f us a pass (%.2fx)\n", blocks,
                persist_ms * 1e3 / passes, chain_ms / persist_ms);
    std::printf("  persistent, %d blocks (one per SM): %8.2f us a pass\n", sms, one_per_sm_ms * 1e3 / passes);
    std::printf("  persistent, barriers and prefetches only (%d blocks, 27 barriers a pass): %8.2f us a pass\n",
                blocks, barriers_ms * 1e3 / passes);
    std::printf("  persistent, barriers alone (no prefetch): %8.2f us a pass; with the one-counter barrier %8.2f us\n",
                barriers_alone_ms * 1e3 / passes, counter_alone_ms * 1e3 / passes);
    std::printf("  persistent with the one-counter barrier: %8.2f us a pass; without weight prefetches: %8.2f us a pass\n",
                counter_ms * 1e3 / passes, no_prefetch_ms * 1e3 / passes);
    std::printf("  bitwise: logits %s, caches %s (max |diff| logits %.3g, caches %.3g); chain logits finite: %s\n",
                same_logits ? "equal" : "DIFFER", same_caches ? "equal" : "DIFFER",
                max_abs_diff(got_logits, ref_logits), max_abs_diff(got_caches, ref_caches), finite ? "yes" : "NO");
    return same_logits && same_caches && finite ? 0 : 1;
}

}  // namespace qtts::kernel_lab
