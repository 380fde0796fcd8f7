// qtts bench-decoder: GPU time per frame of the speech-tokenizer decoder in steady streaming.
//
//   qtts bench-decoder [--model DIR] [--chunks 1,2,4,25] [--frames N] [--repeats R] [--device N]
//                      [--no-cuda-graphs] [--json FILE] [--cache DIR] [--streams 2,8,32,64]
//                      [--math fp32,bf16x3,tf32]
//
// Without --model a release-size random speech tokenizer (DecoderConfig defaults: decoder_dim
// 1536, latent 1024, 8 transformer layers) is generated with make_model (cached). For every
// chunk size the decoder streams `frames` frames per repeat; each chunk is timed on the GPU with
// CUDA events around the graph replay (or the eager launches), codes already uploaded, and the
// median chunk time / chunk size is the reported time per frame. decode() wall time per frame
// (codes upload + chunk + PCM copy + sync) is reported next to it. Graphs on and off.
// --streams: batched passes (cuda/gpu_batch_decoder.h) of S streams x each chunk size, wall time
// per pass (codes in, samples out, sync), per stream-frame, and audio-seconds per second.
// --math: each arithmetic of the convolution products in turn, with its SNR against fp32.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/qtts/bench_common.h"
#include "apps/qtts/cli.h"
#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/model/make_model.h"
#include "engine/model/weights.h"

#ifdef QTTS_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <cuda_profiler_api.h>

#include "engine/cuda/gpu_batch_decoder.h"
#include "engine/cuda/gpu_speech_decoder.h"
#endif

namespace {

void usage() {
    std::printf(
        "usage: qtts bench-decoder [options]\n"
        "  --model DIR        checkpoint whose speech tokenizer is benchmarked (default: a generated\n"
        "                     release-size random one)\n"
        "  --cache DIR        where the generated model is written (default /tmp/qtts-bench-decoder)\n"
        "  --chunks LIST      chunk sizes in frames (default 1,2,4,25)\n"
        "  --frames N         frames streamed per repeat and chunk size (default 100)\n"
        "  --repeats R        repeats per chunk size (default 3)\n"
        "  --device N         CUDA device (default 0)\n"
        "  --no-cuda-graphs   eager only\n"
        "  --math LIST        arithmetic of the convolution products, measured in turn (fp32, tf32,\n"
        "                     bf16x3; default: the engine's, bf16x3); each but fp32 also gets its SNR\n"
        "                     and largest difference against fp32 products\n"
        "  --stages           also print a per-stage GPU time breakdown (eager; of the batched passes too)\n"
        "  --variants         also measure small-row transformer kernels and PDL off (graphs on)\n"
        "  --streams LIST     also time batched passes of that many streams per chunk size\n"
        "  --profile          with --streams: one more eager batched pass per size inside\n"
        "                     cudaProfilerStart/Stop (for `ncu --profile-from-start off`; tools/ncu_kernels.py\n"
        "                     sums its kernels)\n"
        "  --json FILE        write the results as JSON\n");
}

#ifdef QTTS_HAVE_CUDA

namespace qc = qtts::cuda;

struct Row {
    int chunk = 0;
    bool graphs = false;
    qc::DecoderMath math = qc::DecoderMath::DECODER_MATH_FP32;
    bool small = false;
    bool pdl = true;
    bool padded = true;
    double gpu_ms_per_chunk = 0.0;
    double gpu_ms_per_frame = 0.0;
    double wall_ms_per_frame = 0.0;
};

// A stage breakdown: `profile_once` runs one profiled pass ((what ran, GPU ms) pairs in launch
// order); after one warm-up, five runs, each summed by kind, and the median per kind, printed
// after `label` in first-launch order and returned as a {kind: ms} object.
nlohmann::json stage_medians(const char* label,
                             const std::function<std::vector<std::pair<std::string, float>>(int run)>& profile_once) {
    std::vector<std::string> names;                  // kinds in first-launch order
    std::map<std::string, std::vector<double>> sums;  // kind -> per-run sum
    for (int r = 0; r < 6; ++r) {
        const auto pieces = profile_once(r);
        if (r == 0) continue;  // warm-up
        std::map<std::string, double> run;
        for (const auto& [name, ms] : pieces) {
            if (!run.count(name) && !sums.count(name)) names.push_back(name);
            run[name] += ms;
        }
        for (const auto& [name, ms] : run) sums[name].push_back(ms);
    }
    std::printf("%s", label);
    nlohmann::json stages = nlohmann::json::object();
    for (const std::string& name : names) {
        const double ms = qtts_cli::bench_median(sums[name]);
        std::printf("  %s %.3f;", name.c_str(), ms);
        stages[name] = ms;
    }
    std::printf("\n");
    return stages;
}

// Batched passes: S streams (each its own decoder state) x n frames in one pass, timed on the
// host around decode() (codes upload, the pass, samples back, sync); median of `repeats` x 8.
nlohmann::json bench_batched(qc::GpuContext& context, const std::shared_ptr<const qc::GpuSpeechDecoderWeights>& weights,
                             const std::vector<int>& streams, const std::vector<int>& chunks,
                             const std::vector<int32_t>& codes, int frames, int repeats, bool graphs, bool stages,
                             bool profile) {
    const int nq = weights->config().num_quantizers, spf = weights->samples_per_frame();
    const int max_streams = *std::max_element(streams.begin(), streams.end());
    const int max_chunk = *std::max_element(chunks.begin(), chunks.end());
    qc::GpuSpeechDecoderOptions one;
    one.max_chunk_frames = max_chunk;
    one.graph_chunk_sizes = {};
    std::vector<std::unique_ptr<qc::GpuSpeechDecoder>> decoders;
    for (int i = 0; i < max_streams; ++i) decoders.push_back(std::make_unique<qc::GpuSpeechDecoder>(weights, context, one));
    qc::GpuBatchDecoderOptions options;
    options.max_streams = max_streams;
    options.chunk_frames = chunks;
    options.buckets = streams;
    options.cuda_graphs = graphs;
    qc::GpuBatchDecoder batch(weights, context, decoders.front()->layout(), options);
    nlohmann::json out = nlohmann::json::array();
    const double frame_s = double(spf) / qtts::SAMPLE_RATE;
    const char* math = qc::decoder_math_name(weights->math());
    for (const int S : streams)
        for (const int n : chunks) {
            std::vector<qc::GpuSpeechDecoder*> members;
            for (int i = 0; i < S; ++i) members.push_back(decoders[size_t(i)].get());
            std::vector<int32_t> chunk_codes(size_t(S) * n * nq);
            std::vector<float> pcm(size_t(S) * n * spf);
            std::vector<double> ms;
            int at = 0;
            for (int r = 0; r < 2 + repeats * 8; ++r) {
                for (int i = 0; i < S; ++i)
                    for (int f = 0; f < n; ++f)
                        std::copy_n(codes.begin() + ptrdiff_t((at + i + f) % frames) * nq, nq,
                                    chunk_codes.begin() + (ptrdiff_t(i) * n + f) * nq);
                at = (at + n) % frames;
                const auto t0 = std::chrono::steady_clock::now();
                batch.decode(members, chunk_codes.data(), n, pcm.data());
                if (r >= 2) ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
            }
            std::sort(ms.begin(), ms.end());
            const double median = ms[ms.size() / 2];
            const double per_frame = median / (double(S) * n);
            const double audio_per_s = double(S) * n * frame_s / (median / 1e3);
            std::printf("  batched %-3d streams x %-2d frames (%s, %s): %8.3f ms per pass, %7.4f ms per stream-frame, "
                        "%7.1f audio-s/s\n",
                        S, n, graphs ? "graph" : "eager", math, median, per_frame, audio_per_s);
            nlohmann::json row = {{"streams", S}, {"chunk", n}, {"graphs", graphs}, {"math", math},
                                  {"graph", batch.has_graph(S, n)}, {"ms_per_pass", median},
                                  {"ms_per_stream_frame", per_frame}, {"audio_s_per_s", audio_per_s}};
            if (stages)  // one eager pass with events at its stage boundaries
                row["stages_ms"] = stage_medians("    stages (eager, GPU ms per pass):", [&](int) {
                    return batch.decode_profile(members, chunk_codes.data(), n);
                });
            if (profile) {  // the profiler's window: one eager pass
                CUDA_CHECK(cudaProfilerStart());
                batch.decode_profile(members, chunk_codes.data(), n);
                CUDA_CHECK(cudaProfilerStop());
            }
            out.push_back(row);
        }
    return out;
}

int bench_decoder_cuda(const qtts_cli::Args& args) {
    const int device = int(args.get_int("device", 0));
    const int frames = int(std::max(1LL, args.get_int("frames", 100)));
    const int repeats = int(std::max(1LL, args.get_int("repeats", 3)));
    const std::vector<int> chunks = qtts_cli::bench_sizes(args.get_or("chunks", "1,2,4,25"), "chunks");
    const bool graphs_allowed = !args.has("no-cuda-graphs");

    std::string model_dir;
    if (auto m = args.get("model")) {
        model_dir = *m;
    } else {
        model_dir = args.get_or("cache", "/tmp/qtts-bench-decoder") + "/release-decoder";
        if (!std::filesystem::exists(model_dir + "/speech_tokenizer/model.safetensors")) {
            const auto t0 = std::chrono::steady_clock::now();
            qtts::ModelPreset preset = qtts::model_preset("tiny-customvoice");
            preset.speech_config.decoder = qtts::DecoderConfig{};
            qtts::model_write_random(preset, model_dir, 21);
            std::printf("generated a release-size random speech tokenizer in %s (%.1f s)\n", model_dir.c_str(),
                        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
    }
    const auto ckpt = qtts::checkpoint_load(model_dir);
    const qtts::DecoderConfig& d = ckpt->speech_config.decoder;

    std::vector<qc::DecoderMath> maths;
    for (const std::string& name : qtts_cli::bench_names(args.get_or("math", "bf16x3"))) {
        qc::DecoderMath m{};
        if (!qc::decoder_math_parse(name, &m))
            qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--math: unknown arithmetic '{}' (fp32, tf32, bf16x3)", name);
        maths.push_back(m);
    }
    qc::GpuContext context(device);
    // One upload per arithmetic (the weights hold the products' operands); fp32 for the accuracy.
    std::map<qc::DecoderMath, std::shared_ptr<const qc::GpuSpeechDecoderWeights>> uploads;
    auto weights_for = [&](qc::DecoderMath m) {
        auto& w = uploads[m];
        if (!w) {
            qc::GpuSpeechDecoderWeightOptions wo;
            wo.math = m;
            w = qc::GpuSpeechDecoderWeights::upload(*ckpt, device, wo);
        }
        return w;
    };
    const auto weights = weights_for(maths.front());
    const int max_chunk = *std::max_element(chunks.begin(), chunks.end());
    const int nq = d.num_quantizers;

    // Deterministic codes spread over the codebooks.
    std::vector<int32_t> codes(size_t(frames) * nq);
    uint64_t state = 0x9e3779b97f4a7c15ULL;
    for (auto& c : codes) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        c = int32_t((state >> 33) % uint64_t(d.codebook_size));
    }

    std::vector<Row> rows;
    nlohmann::json graph_json = nlohmann::json::array();
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    struct Mode {
        bool graphs;
        qc::DecoderMath math;
        bool small, pdl, padded;
    };
    // The first arithmetic with graphs on and off, then variants with graphs on, then the others.
    const qc::DecoderMath first = maths.front();
    std::vector<Mode> modes{{true, first, false, true, true}, {false, first, false, true, true}};
    if (args.has("variants")) {
        modes.push_back({true, first, true, true, true});    // small-row transformer kernels
        modes.push_back({true, first, false, false, true});  // no programmatic dependent launch
        modes.push_back({true, first, true, false, true});
        modes.push_back({true, first, false, true, false});  // unpadded weight rows
    }
    for (size_t i = 1; i < maths.size(); ++i) modes.push_back({true, maths[i], false, true, true});
    std::shared_ptr<const qc::GpuSpeechDecoderWeights> unpadded;
    const bool pdl_default = context.pdl();
    for (const Mode& mode : modes) {
        const bool graphs = mode.graphs;
        if (graphs && !graphs_allowed) continue;
        qc::GpuSpeechDecoderOptions options;
        options.max_chunk_frames = max_chunk;
        options.graph_chunk_sizes = chunks;
        options.cuda_graphs = graphs;
        options.small_kernels = mode.small;
        context.pdl_set(mode.pdl && pdl_default);
        if (!mode.padded && !unpadded) {
            qc::GpuSpeechDecoderWeightOptions wo;
            wo.pad_rows = false;
            wo.math = mode.math;
            unpadded = qc::GpuSpeechDecoderWeights::upload(*ckpt, device, wo);
        }
        qc::GpuSpeechDecoder dec(mode.padded ? weights_for(mode.math) : unpadded, context, options);
        if (graphs && !dec.graphs_enabled()) {
            std::printf("graphs disabled by the environment: eager only\n");
            continue;
        }
        for (const auto& s : dec.graph_stats())
            graph_json.push_back({{"name", s.name},
                                  {"frames", s.frames},
                                  {"nodes", s.nodes},
                                  {"capture_ms", s.capture_ms},
                                  {"instantiate_ms", s.instantiate_ms},
                                  {"device_bytes", s.device_bytes}});
        for (const int chunk : chunks) {
            std::vector<double> chunk_ms, wall_ms;
            // Warm-up: one pass of a few chunks (also crosses the attention window start-up).
            dec.reset();
            std::vector<float> pcm;
            for (int s = 0; s + chunk <= std::min(frames, 8 * chunk); s += chunk) dec.decode(codes.data() + size_t(s) * nq, chunk, &pcm);
            for (int r = 0; r < repeats; ++r) {
                dec.reset();
                for (int s = 0; s + chunk <= frames; s += chunk) {
                    dec.codes_upload(codes.data() + size_t(s) * nq, chunk);
                    CUDA_CHECK(cudaEventRecord(e0, context.stream()));
                    dec.chunk_run(chunk);
                    CUDA_CHECK(cudaEventRecord(e1, context.stream()));
                    CUDA_CHECK(cudaEventSynchronize(e1));
                    float ms = 0.0f;
                    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                    chunk_ms.push_back(ms);
                }
                // decode() end to end (host codes in, host PCM out).
                dec.reset();
                pcm.clear();
                for (int s = 0; s + chunk <= frames; s += chunk) {
                    const auto t0 = std::chrono::steady_clock::now();
                    dec.decode(codes.data() + size_t(s) * nq, chunk, &pcm);
                    wall_ms.push_back(
                        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
                }
            }
            Row row;
            row.chunk = chunk;
            row.graphs = dec.has_graph(chunk);
            row.math = mode.math;
            row.small = mode.small;
            row.pdl = mode.pdl && pdl_default;
            row.padded = mode.padded;
            row.gpu_ms_per_chunk = qtts_cli::bench_median(chunk_ms);
            row.gpu_ms_per_frame = row.gpu_ms_per_chunk / chunk;
            row.wall_ms_per_frame = qtts_cli::bench_median(wall_ms) / chunk;
            rows.push_back(row);
        }
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    context.pdl_set(pdl_default);

    // Stage breakdown (eager, events between stages; includes launch gaps).
    nlohmann::json stage_json = nlohmann::json::array();
    if (args.has("stages")) {
        qc::GpuSpeechDecoderOptions options;
        options.max_chunk_frames = max_chunk;
        options.cuda_graphs = false;
        qc::GpuSpeechDecoder dec(weights, context, options);
        std::printf("\nstage breakdown (eager, median of 5 chunks, GPU ms per chunk, summed by kind):\n");
        for (const int chunk : chunks) {
            const std::string label = "  chunk " + std::to_string(chunk) + ":";
            const nlohmann::json stages = stage_medians(label.c_str(), [&](int r) {
                dec.codes_upload(codes.data() + size_t((r * chunk) % std::max(1, frames - chunk)) * nq, chunk);
                return dec.chunk_profile(chunk);
            });
            stage_json.push_back({{"chunk", chunk}, {"stages_ms", stages}});
        }
    }

    // Accuracy: the same frames through fp32 products and each other arithmetic (eager, chunks of 4).
    nlohmann::json accuracy_json = nlohmann::json::array();
    std::vector<std::string> accuracy_lines;
    auto decode_all = [&](qc::DecoderMath m) {
        qc::GpuSpeechDecoderOptions options;
        options.cuda_graphs = false;
        qc::GpuSpeechDecoder dec(weights_for(m), context, options);
        std::vector<float> pcm;
        for (int s = 0; s + 4 <= frames; s += 4) dec.decode(codes.data() + size_t(s) * nq, 4, &pcm);
        return pcm;
    };
    std::vector<float> ref;
    for (const qc::DecoderMath m : maths) {
        if (m == qc::DecoderMath::DECODER_MATH_FP32) continue;
        if (ref.empty()) ref = decode_all(qc::DecoderMath::DECODER_MATH_FP32);
        const std::vector<float> got = decode_all(m);
        double sig = 0.0, err = 0.0, worst = 0.0;
        for (size_t i = 0; i < ref.size(); ++i) {
            const double e = double(got[i]) - ref[i];
            sig += double(ref[i]) * ref[i];
            err += e * e;
            worst = std::max(worst, std::fabs(e));
        }
        const double snr = err > 0.0 ? 10.0 * std::log10(sig / err) : 300.0;
        accuracy_lines.push_back(fmt::format("  {} vs fp32 products: SNR {:.1f} dB, max abs difference {:.3g} over {} frames",
                                                     qc::decoder_math_name(m), snr, worst, frames));
        accuracy_json.push_back({{"math", qc::decoder_math_name(m)}, {"snr_db", snr}, {"max_abs", worst}, {"frames", frames}});
    }

    const double frame_ms = 1000.0 * weights->samples_per_frame() / double(qtts::SAMPLE_RATE);
    std::printf("\nspeech decoder on %s (device %d): decoder_dim %d, latent %d, %d layers, %d samples/frame (%.0f ms)\n",
                context.device_name().c_str(), device, d.decoder_dim, d.latent_dim, d.num_layers,
                weights->samples_per_frame(), frame_ms);
    std::printf("  %-6s %-7s %-5s %-12s %-4s %-6s %14s %14s %14s %10s\n", "chunk", "graphs", "math", "transformer",
                "pdl", "rows", "GPU ms/chunk", "GPU ms/frame", "decode ms/frm", "x realtime");
    for (const Row& r : rows)
        std::printf("  %-6d %-7s %-5s %-12s %-4s %-6s %14.3f %14.3f %14.3f %10.1f\n", r.chunk, r.graphs ? "on" : "off",
                    qc::decoder_math_name(r.math), r.small ? "small-row" : "cublas", r.pdl ? "on" : "off",
                    r.padded ? "pad4" : "odd", r.gpu_ms_per_chunk,
                    r.gpu_ms_per_frame, r.wall_ms_per_frame, frame_ms / r.gpu_ms_per_frame);
    for (const std::string& line : accuracy_lines) std::printf("%s\n", line.c_str());

    nlohmann::json batched_json = nlohmann::json::array();
    if (auto list = args.get("streams")) {
        const std::vector<int> streams = qtts_cli::bench_sizes(*list, "streams");
        for (const qc::DecoderMath m : maths)
            for (const auto& r : bench_batched(context, weights_for(m), streams, chunks, codes, frames, repeats,
                                               graphs_allowed, args.has("stages"), args.has("profile")))
                batched_json.push_back(r);
    }

    if (auto path = args.get("json")) {
        nlohmann::json out;
        out["device"] = context.device_name();
        out["model"] = model_dir;
        out["decoder"] = {{"decoder_dim", d.decoder_dim}, {"latent_dim", d.latent_dim}, {"hidden_size", d.hidden_size},
                          {"num_layers", d.num_layers}, {"samples_per_frame", weights->samples_per_frame()}};
        out["frames"] = frames;
        out["repeats"] = repeats;
        out["weights_bytes"] = weights->device_bytes();
        nlohmann::json results = nlohmann::json::array();
        for (const Row& r : rows)
            results.push_back({{"chunk", r.chunk},
                               {"graphs", r.graphs},
                               {"math", qc::decoder_math_name(r.math)},
                               {"small_row_transformer", r.small},
                               {"pdl", r.pdl},
                               {"padded_rows", r.padded},
                               {"gpu_ms_per_chunk", r.gpu_ms_per_chunk},
                               {"gpu_ms_per_frame", r.gpu_ms_per_frame},
                               {"decode_wall_ms_per_frame", r.wall_ms_per_frame}});
        out["results"] = results;
        out["graphs"] = graph_json;
        if (!accuracy_json.empty()) out["accuracy_vs_fp32"] = accuracy_json;
        if (!stage_json.empty()) out["stages"] = stage_json;
        if (!batched_json.empty()) out["batched"] = batched_json;
        qtts_cli::bench_json_write(*path, out);
    }
    return 0;
}

#endif

int cmd_bench_decoder(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "cache", "chunks", "frames", "repeats", "device", "json", "streams", "math"},
                        {"help", "no-cuda-graphs", "stages", "variants", "profile"});
    if (args.has("help")) {
        usage();
        return 0;
    }
    if (!qtts_cli::bench_gpu_present("bench-decoder", "the CUDA decoder", int(args.get_int("device", 0)))) return 1;
#ifdef QTTS_HAVE_CUDA
    return bench_decoder_cuda(args);
#else
    return 1;  // not reached: bench_gpu_present() is false without CUDA
#endif
}

}  // namespace

QTTS_COMMAND("bench-decoder", "benchmark the GPU speech decoder (GPU ms per frame at several chunk sizes)",
             cmd_bench_decoder);
