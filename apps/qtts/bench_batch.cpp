// qtts bench --batch LIST: the batched frame step (engine/cuda/gpu_batch.h) per bucket.
//
// For each bucket b of LIST, b streams (the bench prompt, seeded sampling with a different seed
// each, EOS masked) are prefilled and bound to one GpuBatch, then `frames` frames are replayed in
// graphs of `chunk` frames and timed with GPU events. Product paths measured side by side: gemv
// for every product ("gemv"); split cuBLAS GEMMs (split, GEMM, combine: three launches) for every
// product over at least 4 rows ("split", the default before the one-launch kernel); "auto" is the
// batch's default choice (tensor cores from GpuBatchOptions::wide_rows rows, one launch each up to
// skinny_max_rows rows: kernels/skinny.cuh, split cuBLAS past that); "sk16" / "sk32" as auto with
// one launch up to 16 / 32 rows; "t1" as auto with one tile per block in every one-launch product
// (the kernel before two-tile blocks); "wr" as auto with every one-launch product keeping its
// weight steps in registers (GpuBatchOptions::skinny_weights; the kernel before the shared-memory
// ring); "unfused" as auto with three launches per split product (GpuBatchOptions::split_fusion
// off); "short0" as auto with a block per short key slice in the talker attention
// (GpuBatchOptions::short_slices_blocks 0; auto: the slices taken in turn by at least 8 blocks
// per stream and KV head). `--batch-paths` picks some of them. Reported per bucket and path:
// step time per frame, audio seconds per wall second of LM work (b x 80 ms / step), the bytes a
// step must read (weights once + every stream's talker KV cache) and the bandwidth that achieves,
// and the graph's nodes and device memory.
// Then the batched prefill (engine/cuda/gpu_prefill_batch.h): for each bucket b, b prompts started
// one after another (GpuLm::generation_start each) against started together (prompt_load each, one
// GpuPrefillBatch::run with the engine's row cap, generation_begin each), wall time with the
// synchronisation, median of 5, at the bench prompt's length and with its sentence 5 times (the
// serving benchmark's sentences with the byte-level tokenizer of a random model are ~125); then
// the passes alone: the host's time to enqueue them, their GPU time, and their GPU time with
// twice the rows per pass.
// Last, whether the batched speech decoder's pass can hide behind the LM step (overlap_rows).
#include "apps/qtts/bench_batch.h"

#ifdef QTTS_HAVE_CUDA

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_profiler_api.h>
#include <nlohmann/json.hpp>

#include "apps/qtts/bench_common.h"
#include "engine/common/error.h"
#include "engine/cuda/event_timer.h"
#include "engine/cuda/gpu_batch.h"
#include "engine/cuda/gpu_batch_decoder.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "engine/cuda/gpu_prefill_batch.h"
#include "engine/cuda/gpu_speech_decoder.h"
#include "engine/generation/sampling.h"
#include "engine/model/weights.h"
#include "engine/text/prompt.h"

namespace qtts_cli {

namespace {

namespace qc = qtts::cuda;
using Clock = std::chrono::steady_clock;

struct PathSpec {
    const char* name;
    int wide_rows;        // 0: the default
    int skinny_max_rows;  // -1: the default
    int skinny_tiles;     // 0: the default
    bool split_fusion = true;
    qtts::kernels::SkinnyWeights skinny_weights = qtts::kernels::SkinnyWeights::SKINNY_WEIGHTS_SHARED;
    int short_slices_blocks = -1;  // -1: the default
};

// Starts streams first .. first + b - 1 on the bench prompt (stream i seeded seed_base + i;
// generation_start synchronises) and binds them to `batch`.
void streams_start_bound(qc::GpuBatch& batch, const std::vector<std::unique_ptr<qc::GpuLm>>& streams, int first, int b,
                         const qtts::Prompt& prompt, qc::GpuGenerationSetup setup, uint64_t seed_base) {
    std::vector<qc::GpuLm*> bound;
    for (int i = first; i < first + b; ++i) {
        setup.seed = seed_base + uint64_t(i);
        streams[size_t(i)]->generation_start(prompt, setup);
        bound.push_back(streams[size_t(i)].get());
    }
    batch.bind(bound);
}

// Wall time of one(), median of 9 calls after one warm-up call (one() synchronises itself).
double wall_median_ms(const std::function<void()>& one) {
    one();
    std::vector<double> ms;
    for (int rep = 0; rep < 9; ++rep) {
        const auto t0 = Clock::now();
        one();
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
    return qtts_cli::bench_median(ms);
}

nlohmann::json prefill_rows(qc::GpuContext& context, const std::shared_ptr<const qc::GpuLmWeights>& weights,
                            const std::vector<std::unique_ptr<qc::GpuLm>>& streams, const std::vector<int>& sizes,
                            qc::GpuGenerationSetup setup) {
    const int chunk = streams.front()->options().prefill_chunk;
    qc::GpuPrefillBatch prefill(weights, context, chunk, std::max(qc::PREFILL_BATCH_ROWS, chunk));
    prefill.warm_up();
    qc::GpuPrefillBatch prefill_wide(weights, context, chunk, 2 * prefill.max_rows());
    prefill_wide.warm_up();
    nlohmann::json rows = nlohmann::json::array();
    std::printf("\n  prompt prefills + first draws, one after another vs together (%d rows per pass), median of 5:\n",
                prefill.max_rows());
    std::printf("  %-7s %-10s %12s %12s %8s %12s %10s %10s\n", "streams", "positions", "alone ms", "together ms", "ratio",
                "enqueue ms", "GPU ms", "GPU x2 ms");
    for (const int repeat : {1, 5}) {
        const qtts::Prompt prompt = bench_prompt(weights->config(), repeat);
        const int L = int(prompt.positions.size());
        for (const int b : sizes) {
            std::vector<qc::GpuLm*> lms;  // the first b streams, each with the whole prompt
            for (int i = 0; i < b; ++i) lms.push_back(streams[size_t(i)].get());
            const std::vector<int> positions(size_t(b), L);
            std::vector<double> alone, together;
            for (int rep = 0; rep < 6; ++rep) {  // the first round warms up, not counted
                auto t0 = Clock::now();
                for (qc::GpuLm* lm : lms) lm->generation_start(prompt, setup);
                const double a = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
                t0 = Clock::now();
                std::vector<qc::GpuLm::PromptRows> loaded;
                for (qc::GpuLm* lm : lms) loaded.push_back(lm->prompt_load(prompt));
                prefill.run(lms, positions);
                for (int i = 0; i < b; ++i) lms[size_t(i)]->generation_begin(loaded[size_t(i)], setup);
                context.synchronize();
                const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
                if (rep > 0) {
                    alone.push_back(a);
                    together.push_back(t);
                }
            }
            // The prefill passes alone (no loads, no first draws): the host's time to enqueue them
            // (run() returns before the GPU is done) and the GPU's time from first to last.
            double enqueue_ms = 0.0;
            const double gpu_ms = qc::time_on_stream(context.stream(), 1, [&] {
                const auto t0 = Clock::now();
                prefill.run(lms, positions);
                enqueue_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
            });
            // The same passes with twice the rows per pass (fewer, wider passes).
            std::vector<double> wide;
            for (int rep = 0; rep < 3; ++rep)
                wide.push_back(qc::time_on_stream(context.stream(), 1, [&] { prefill_wide.run(lms, positions); }));
            const double a = qtts_cli::bench_median(alone), t = qtts_cli::bench_median(together),
                         w = qtts_cli::bench_median(wide);
            std::printf("  %-7d %-10d %12.2f %12.2f %8.2f %12.2f %10.2f %10.2f\n", b, L, a, t, a / t, enqueue_ms,
                        gpu_ms, w);
            rows.push_back({{"streams", b},
                            {"positions", L},
                            {"alone_ms", a},
                            {"together_ms", t},
                            {"passes_enqueue_ms", enqueue_ms},
                            {"passes_gpu_ms", gpu_ms},
                            {"passes_gpu_ms_wide", w}});
        }
    }
    return rows;
}

// Where a prefill pass's time goes: each product of a talker layer (its real weights, zero
// inputs) at the GEMM row counts of one ~121-position prompt (256) and of a full 512-row pass
// (1024): the cuBLAS GEMM alone, and with its split and combine kernels (linear_split, what the
// passes run below 512 GEMM rows, and for gate/up always); GPU time per call, mean of 20 calls in
// a row.
nlohmann::json prefill_products(qc::GpuContext& context, const std::shared_ptr<const qc::GpuLmWeights>& weights) {
    const qc::GpuStack& T = weights->talker;
    const qc::GpuStack::Layer& L = T.layers.front();
    const int H = T.hidden, I = T.intermediate, QD = T.q_dim(), QKV = T.qkv_dim();
    const int max_rows2 = 2 * qc::PREFILL_BATCH_ROWS, max_in = std::max({H, QD, I}), max_out = std::max({QKV, H, 2 * I});
    qc::DeviceArray<qc::bf16_t> xb(size_t(max_rows2) * max_in);
    qc::DeviceArray<float> y2(size_t(max_rows2) * max_out), x(size_t(max_rows2 / 2) * max_in),
        y(size_t(max_rows2 / 2) * max_out);
    CUDA_CHECK(cudaMemsetAsync(xb.get(), 0, xb.bytes(), context.stream()));
    CUDA_CHECK(cudaMemsetAsync(x.get(), 0, x.bytes(), context.stream()));
    CUDA_CHECK(cudaMemsetAsync(y.get(), 0, y.bytes(), context.stream()));
    using E = qtts::kernels::LinearEpilogue;
    struct Product {
        const char* name;
        const qc::bf16_t* w;
        int out, in, n;
        const float* norm;
        E epilogue;
    };
    const Product products[] = {{"qkv", L.qkv, QKV, H, QKV, L.input_norm, E::LINEAR_EPILOGUE_STORE},
                                {"o", L.o, H, QD, H, nullptr, E::LINEAR_EPILOGUE_ADD},
                                {"gate_up", L.gate_up, 2 * I, H, I, L.post_norm, E::LINEAR_EPILOGUE_SWIGLU},
                                {"down", L.down, H, I, H, nullptr, E::LINEAR_EPILOGUE_ADD}};
    nlohmann::json rows = nlohmann::json::array();
    std::printf("\n  prefill products of one talker layer (GPU us per call; TFLOP/s of the GEMM's rows):\n");
    std::printf("  %-8s %9s %10s %9s %12s\n", "product", "GEMM rows", "GEMM us", "TFLOP/s", "+split/comb");
    const qtts::kernels::Launch l = context.launch();
    for (const int rows2 : {256, 1024}) {
        for (const Product& p : products) {
            const float alpha = 1.0f, beta = 0.0f;
            const auto gemm = [&] {
                CUBLAS_CHECK(cublasGemmEx(context.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, p.out, rows2, p.in, &alpha, p.w,
                                          CUDA_R_16BF, p.in, xb.get(), CUDA_R_16BF, p.in, &beta, y2.get(), CUDA_R_32F,
                                          p.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            const auto full = [&] {
                qc::linear_split(l, context.cublas(), qc::SplitScratch{xb.get(), y2.get()}, x.get(), rows2 / 2, p.in,
                                 p.in, p.norm, T.eps, p.w, p.out, p.n, nullptr, p.epilogue, y.get(), p.n, rows2);
            };
            gemm();
            full();
            const double gemm_ms = qc::time_on_stream(context.stream(), 20, gemm);
            const double full_ms = qc::time_on_stream(context.stream(), 20, full);
            const double tflops = 2.0 * p.out * double(rows2) * p.in / (gemm_ms * 1e-3) / 1e12;
            std::printf("  %-8s %9d %10.1f %9.0f %12.1f\n", p.name, rows2, gemm_ms * 1e3, tflops, full_ms * 1e3);
            rows.push_back({{"product", p.name}, {"gemm_rows", rows2}, {"gemm_us", gemm_ms * 1e3}, {"tflops", tflops},
                            {"linear_split_us", full_ms * 1e3}});
        }
    }
    return rows;
}

}  // namespace

// Can a round's batched decoder pass hide behind the batched LM step? The engine runs them one
// after the other on one stream. For each bucket b: one LM step of `chunk` frames for b streams
// (the engine's batch graph, `context`) and one batched decoder pass of b streams x `chunk` frames
// (random valid codes; a second context: its own stream, cuBLAS handle and workspace), wall time
// with the synchronisations, median of 9: each alone, one after the other, and launched together
// (the LM graph first, then the decoder pass, which returns when its samples are on the host;
// then the LM stream is waited for). hidden = (serial - together) / decoder alone.
nlohmann::json overlap_rows(qc::GpuContext& context, const qtts::Checkpoint& checkpoint,
                            const std::shared_ptr<const qc::GpuLmWeights>& weights,
                            const std::vector<std::unique_ptr<qc::GpuLm>>& streams, const std::vector<int>& sizes,
                            const qtts::Prompt& prompt, qc::GpuGenerationSetup setup, int max_context, int chunk) {
    const int max_streams = sizes.back();
    qc::GpuBatchOptions lm_options;
    lm_options.buckets = sizes;
    lm_options.chunk_frames = {chunk};
    qc::GpuBatch batch(weights, context, max_context, lm_options);
    batch.capture();

    qc::GpuContext side(context.device());
    const auto decoder_weights = qc::GpuSpeechDecoderWeights::upload(checkpoint, context.device());
    qc::GpuSpeechDecoderOptions stream_options;  // the streams' state blocks only: no graphs of their own
    stream_options.max_chunk_frames = std::max(8, chunk);
    stream_options.cuda_graphs = false;
    auto shared_pass = std::make_shared<qc::DecoderPass>(
        decoder_weights, side, qc::DecoderStateLayout::make(*decoder_weights, stream_options.max_chunk_frames),
        stream_options.max_chunk_frames, stream_options);
    std::vector<std::unique_ptr<qc::GpuSpeechDecoder>> decoders;
    std::vector<qc::GpuSpeechDecoder*> decoder_ptrs;
    for (int i = 0; i < max_streams; ++i) {
        decoders.push_back(std::make_unique<qc::GpuSpeechDecoder>(decoder_weights, side, stream_options, shared_pass));
        decoder_ptrs.push_back(decoders.back().get());
    }
    qc::GpuBatchDecoderOptions batch_decoder_options;
    batch_decoder_options.max_streams = max_streams;
    batch_decoder_options.chunk_frames = {chunk};
    batch_decoder_options.buckets = sizes;
    qc::GpuBatchDecoder batch_decoder(decoder_weights, side, decoders.front()->layout(), batch_decoder_options);
    const qtts::DecoderConfig& dc = decoder_weights->config();
    std::vector<int32_t> codes(size_t(max_streams) * chunk * dc.num_quantizers);
    uint64_t state = 0x2545f4914f6cdd1dULL;
    for (auto& c : codes) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        c = int32_t((state >> 33) % uint64_t(dc.codebook_size));
    }
    std::vector<float> pcm(size_t(max_streams) * chunk * decoder_weights->samples_per_frame());

    nlohmann::json rows = nlohmann::json::array();
    std::printf("\n  batched LM step + batched decoder pass of %d frames, alone / one after the other / together "
                "(second stream), wall ms, median of 9:\n", chunk);
    std::printf("  %-7s %10s %12s %10s %12s %8s %12s %8s\n", "streams", "LM ms", "decoder ms", "serial ms",
                "together ms", "hidden", "LM first ms", "hidden");
    for (const int b : sizes) {
        const std::vector<qc::GpuSpeechDecoder*> decs(decoder_ptrs.begin(), decoder_ptrs.begin() + b);
        const auto restart = [&] { streams_start_bound(batch, streams, 0, b, prompt, setup, 2000); };
        const auto lm = [&] { batch.run(chunk); };
        const auto decode = [&] { batch_decoder.decode(decs, codes.data(), chunk, pcm.data()); };
        const auto median_of = [&](const std::function<void()>& one) {
            restart();
            return wall_median_ms(one);
        };
        const double lm_ms = median_of([&] { lm(); context.synchronize(); });
        const double decoder_ms = median_of(decode);
        const double serial_ms = median_of([&] { lm(); context.synchronize(); decode(); });
        const double together_ms = median_of([&] { lm(); decode(); context.synchronize(); });
        const double hidden = decoder_ms > 0 ? (serial_ms - together_ms) / decoder_ms : 0.0;
        context.stream_priority_set(true);  // the LM step's blocks first, the decoder's in what is left
        const double priority_ms = median_of([&] { lm(); decode(); context.synchronize(); });
        context.stream_priority_set(false);
        const double hidden_priority = decoder_ms > 0 ? (serial_ms - priority_ms) / decoder_ms : 0.0;
        std::printf("  %-7d %10.2f %12.2f %10.2f %12.2f %7.0f%% %12.2f %7.0f%%\n", b, lm_ms, decoder_ms, serial_ms,
                    together_ms, 100.0 * hidden, priority_ms, 100.0 * hidden_priority);
        rows.push_back({{"streams", b},
                        {"frames", chunk},
                        {"lm_ms", lm_ms},
                        {"decoder_ms", decoder_ms},
                        {"serial_ms", serial_ms},
                        {"together_ms", together_ms},
                        {"hidden", hidden},
                        {"together_lm_priority_ms", priority_ms},
                        {"hidden_lm_priority", hidden_priority}});
    }
    batch.bind({});
    return rows;
}

// Would two half batches side by side beat one batch? The batched step is latency-bound (its
// launches wait for each other, and many are too small to fill the GPU), so two independent
// chains of launches on two CUDA streams may overlap where one chain cannot. For each h: 2h
// streams as one batch of 2h rows (`context`), against the same streams as two batches of h
// rows, the second on a second context (its own stream and cuBLAS handle), both replays enqueued
// before either is waited for. Wall time of `chunk` frames with the synchronisations, median of
// 9; the rows of both are the engine's default product paths.
nlohmann::json pair_rows(qc::GpuContext& context, const std::shared_ptr<const qc::GpuLmWeights>& weights,
                         const std::vector<std::unique_ptr<qc::GpuLm>>& streams, const std::vector<int>& halves,
                         const qtts::Prompt& prompt, qc::GpuGenerationSetup setup, int max_context, int chunk) {
    std::vector<int> sizes;
    for (const int h : halves) {
        if (2 * h > int(streams.size()))
            qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--batch-pairs {}: needs {} streams; the largest "
                       "--batch size is {}", h, 2 * h, streams.size());
        sizes.push_back(h);
        sizes.push_back(2 * h);
    }
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    qc::GpuBatchOptions options;
    options.buckets = sizes;
    options.chunk_frames = {chunk};
    qc::GpuContext side(context.device());
    qc::GpuBatch whole(weights, context, max_context, options), first(weights, context, max_context, options),
        second(weights, side, max_context, options);
    whole.capture();
    first.capture();
    second.capture();
    nlohmann::json rows = nlohmann::json::array();
    std::printf("\n  2h streams: one batch of 2h rows against two batches of h rows at once (two CUDA streams),\n"
                "  %d frames, wall ms per frame, median of 9:\n", chunk);
    std::printf("  %-5s %-7s %12s %12s %12s %8s\n", "h", "streams", "one batch", "half alone", "two halves", "ratio");
    for (const int h : halves) {
        streams_start_bound(whole, streams, 0, 2 * h, prompt, setup, 3000);
        const double whole_ms = wall_median_ms([&] { whole.run(chunk); context.synchronize(); }) / chunk;
        whole.bind({});
        streams_start_bound(first, streams, 0, h, prompt, setup, 3000);
        streams_start_bound(second, streams, h, h, prompt, setup, 3000);
        const double half_ms = wall_median_ms([&] { first.run(chunk); context.synchronize(); }) / chunk;
        const double pair_ms = wall_median_ms([&] {
            first.run(chunk);
            second.run(chunk);
            context.synchronize();
            side.synchronize();
        }) / chunk;
        first.bind({});
        second.bind({});
        std::printf("  %-5d %-7d %12.3f %12.3f %12.3f %8.3f\n", h, 2 * h, whole_ms, half_ms, pair_ms,
                    pair_ms / whole_ms);
        rows.push_back({{"half", h}, {"streams", 2 * h}, {"frames", chunk}, {"one_batch_ms", whole_ms},
                        {"half_alone_ms", half_ms}, {"two_halves_ms", pair_ms}});
    }
    return rows;
}

nlohmann::json bench_batch(const std::string& model_dir, int device, const std::vector<int>& buckets, int frames,
                           int chunk, const BatchBenchOptions& bench) {
    const PathSpec all_paths[] = {{"gemv", 1 << 20, 0, 0}, {"split", 4, 0, 0}, {"auto", 0, -1, 0},
                                  {"sk16", 0, 16, 0},    {"sk32", 0, 32, 0}, {"t1", 0, -1, 1},
                                  {"unfused", 0, -1, 0, false},
                                  {"wr", 0, -1, 0, true, qtts::kernels::SkinnyWeights::SKINNY_WEIGHTS_REGISTERS},
                                  {"short0", 0, -1, 0, true, qtts::kernels::SkinnyWeights::SKINNY_WEIGHTS_SHARED, 0}};
    for (const std::string& name : bench.paths)
        if (std::none_of(std::begin(all_paths), std::end(all_paths), [&](const PathSpec& p) { return name == p.name; }))
            qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--batch-paths: unknown path '{}' (gemv, split, auto, "
                       "sk16, sk32, t1, unfused, wr, short0)", name);
    std::vector<int> sizes = buckets;
    std::sort(sizes.begin(), sizes.end());
    sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
    const int max_streams = sizes.back();

    const auto checkpoint = qtts::checkpoint_load(model_dir);
    qc::GpuContext context(device);
    const auto weights = qc::GpuLmWeights::upload(checkpoint, device);
    const qtts::Prompt prompt = bench_prompt(checkpoint->config);
    const int L = int(prompt.positions.size());
    const int warm_up = 2 * chunk;
    // Each bucket restarts its streams, so a context covers the prompt and one measurement.
    const int needed = (L + warm_up + frames + 64 + 63) / 64 * 64;
    if (bench.max_context > 0 && bench.max_context < needed)
        qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--batch-context {}: the run needs at least {} positions",
                   bench.max_context, needed);
    const int max_context = bench.max_context > 0 ? bench.max_context : std::max(256, needed);

    const qtts::GenerationParams params = qtts::generation_params_from_config(checkpoint->generation);
    qc::GpuGenerationSetup setup;
    setup.talker = params.talker;
    setup.predictor = params.predictor;
    setup.min_new_tokens = 1 << 30;  // EOS never allowed: every stream runs every frame

    qc::GpuLmOptions lm_options;
    lm_options.max_context = max_context;
    std::vector<std::unique_ptr<qc::GpuLm>> streams;
    for (int i = 0; i < max_streams; ++i)
        streams.push_back(std::make_unique<qc::GpuLm>(weights, context, lm_options));

    // Bytes one step reads: the weights once (talker step + 15 predictor passes with heads) and
    // each stream's talker KV cache (fp32) at the mean context of the run.
    const qc::GpuStack& T = weights->talker;
    const double weight_bytes = double(weights->talker_step_bytes()) + double(weights->predictor_frame_bytes());
    const double kv_bytes_per_stream = double(T.layers.size()) * (L + warm_up + frames / 2.0) * 2.0 * T.kv_dim() * 4.0;

    nlohmann::json out;
    out["device"] = context.device_name();
    out["prompt_positions"] = L;
    out["frames"] = frames;
    out["chunk"] = chunk;
    out["max_context"] = max_context;
    out["stream_state_bytes"] = streams.front()->state_bytes();
    out["weight_bytes_per_step"] = weight_bytes;
    nlohmann::json rows = nlohmann::json::array();

    std::printf("  batched frame step: %d frames per bucket in graphs of %d frames, prompt %d positions\n", frames,
                chunk, L);
    std::printf("  %-7s %-7s %10s %12s %10s %10s %8s %10s\n", "bucket", "path", "step ms", "audio-s/s", "GB/step",
                "TB/s", "nodes", "graph MB");
    for (const PathSpec path : all_paths) {
        if (!bench.paths.empty() && std::find(bench.paths.begin(), bench.paths.end(), path.name) == bench.paths.end())
            continue;
        qc::GpuBatchOptions options;
        options.buckets = sizes;
        options.chunk_frames = {chunk};
        if (path.wide_rows > 0) options.wide_rows = path.wide_rows;
        if (path.skinny_max_rows >= 0) options.skinny_max_rows = path.skinny_max_rows;
        options.skinny_tiles = path.skinny_tiles;
        options.split_fusion = path.split_fusion;
        options.skinny_weights = path.skinny_weights;
        if (path.short_slices_blocks >= 0) options.short_slices_blocks = path.short_slices_blocks;
        const auto t0 = Clock::now();
        qc::GpuBatch batch(weights, context, max_context, options);
        batch.capture();
        const double capture_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        out["paths"][path.name] = {{"wide_rows", options.wide_rows},
                                   {"skinny_max_rows", options.skinny_max_rows},
                                   {"skinny_tiles", options.skinny_tiles},
                                   {"split_fusion", options.split_fusion},
                                   {"short_slices_blocks", options.short_slices_blocks},
                                   {"skinny_weights_in_registers",
                                    options.skinny_weights == qtts::kernels::SkinnyWeights::SKINNY_WEIGHTS_REGISTERS},
                                   {"capture_ms", capture_ms},
                                   {"graph_device_bytes", batch.graph_device_bytes()},
                                   {"workspace_bytes", batch.workspace_bytes()}};
        for (const int b : sizes) {
            streams_start_bound(batch, streams, 0, b, prompt, setup, 1000);
            for (int i = 0; i < warm_up; i += chunk) batch.run(chunk);
            const int calls = std::max(1, frames / chunk);
            const double step_ms = qc::time_on_stream(context.stream(), calls, [&] { batch.run(chunk); }) / chunk;
            const double bytes = weight_bytes + b * kv_bytes_per_stream;
            size_t nodes = 0;
            long long graph_bytes = 0;
            for (const auto& s : batch.graph_stats())
                if (s.name == "batch " + std::to_string(b) + " x" + std::to_string(chunk)) {
                    nodes = s.nodes;
                    graph_bytes = s.device_bytes;
                }
            const double audio_per_s = b * 80.0 / step_ms;
            const double tb_s = bytes / (step_ms * 1e-3) / 1e12;
            std::printf("  %-7d %-7s %10.3f %12.1f %10.3f %10.2f %8zu %10.1f\n", b, path.name, step_ms, audio_per_s,
                        bytes / 1e9, tb_s, nodes / size_t(chunk), graph_bytes / 1e6);
            rows.push_back({{"bucket", b},
                            {"path", path.name},
                            {"step_ms", step_ms},
                            {"audio_s_per_s", audio_per_s},
                            {"bytes_per_step", bytes},
                            {"achieved_tb_s", tb_s},
                            {"nodes_per_frame", nodes / size_t(chunk)},
                            {"graph_device_bytes", graph_bytes}});
            if (bench.profile) {
                CUDA_CHECK(cudaProfilerStart());
                batch.run(chunk);
                context.synchronize();
                CUDA_CHECK(cudaProfilerStop());
            }
        }
        batch.bind({});
    }
    out["batch"] = rows;
    if (!bench.pairs.empty())
        out["pairs"] = pair_rows(context, weights, streams, bench.pairs, prompt, setup, max_context, chunk);
    if (bench.step_only) return out;
    out["prefill"] = prefill_rows(context, weights, streams, sizes, setup);
    out["prefill_products"] = prefill_products(context, weights);
    out["overlap"] = overlap_rows(context, *checkpoint, weights, streams, sizes, prompt, setup, max_context, chunk);
    return out;
}

}  // namespace qtts_cli

#endif  // QTTS_HAVE_CUDA
