// qtts bench: steady-state GPU frame time of the talker + code predictor.
//
//   qtts bench --model DIR | --preset P [--frames N] [--chunk K] [--no-cuda-graphs] [--json FILE]
//              [--device N] [--repeats R] [--cache DIR]
//
// Fixed prompt (a 22-token English sentence), fixed frame count, EOS ignored (it is masked), the
// reference sampling settings (temperature 0.9, top-k 50, repetition penalty 1.05). Reports
// prefill time, time to first frame, the frame time with graphs on and off (and with
// programmatic dependent launch off), the talker / predictor split, launches per frame and the
// bytes each frame reads against the bandwidth floor. Prints a table and optionally writes JSON.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli.h"
#include "common/device.h"
#include "common/error.h"
#include "common/log.h"
#include "model/make_model.h"
#include "model/weights.h"
#include "runtime/sampling.h"
#include "text/prompt.h"

#ifdef QTTS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "cuda/frame_graphs.h"
#include "cuda/gpu_generator.h"
#endif

namespace {

constexpr double FLOOR_BANDWIDTH = 4.3e12;  // measured device-to-device copy rate on the H200 (bytes/s)

void usage() {
    std::printf(
        "usage: qtts bench --model DIR | --preset P [options]\n"
        "  --model DIR        checkpoint to benchmark\n"
        "  --preset P         generate a random-weight checkpoint of this preset first (cached)\n"
        "  --cache DIR        where --preset models are written (default $QTTS_CACHE_DIR or /tmp/qtts-bench)\n"
        "  --frames N         frames per timed run (default 256)\n"
        "  --chunk K          frames per graph replay (default 4)\n"
        "  --repeats R        repetitions of the prefill / first-frame measurement (default 5)\n"
        "  --device N         CUDA device (default 0)\n"
        "  --no-cuda-graphs   skip the graph measurements (eager only)\n"
        "  --json FILE        write the results as JSON\n");
}

double median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

#ifdef QTTS_HAVE_CUDA

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

qtts::Prompt bench_prompt(const qtts::ModelConfig& config) {
    qtts::PromptRequest request;
    // "<|im_start|>assistant\n" + a fixed 22-token English text + "<|im_end|>\n<|im_start|>assistant\n"
    request.input_ids = {151644, 77091, 198,  785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 2585,
                         525,    498,   30,   9707, 1879, 11,   419,   374,   264, 1273, 13,    151645, 198,
                         151644, 77091, 198};
    request.language = "english";
    request.layout = qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING;
    if (config.type == qtts::ModelType::MODEL_TYPE_CUSTOM_VOICE && !config.talker.speaker_ids.empty())
        request.speaker = config.talker.speaker_ids.begin()->first;
    if (config.type == qtts::ModelType::MODEL_TYPE_BASE) {
        request.x_vector.assign(size_t(config.talker.hidden_size), 0.0f);
        for (size_t i = 0; i < request.x_vector.size(); ++i) request.x_vector[i] = 0.01f * float(int(i % 17) - 8);
    }
    return qtts::prompt_build(config, request);
}

// Times `count` launches of `body` with CUDA events on the stream; returns ms per launch.
template <typename F>
double time_on_stream(cudaStream_t stream, int count, F body) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < count; ++i) body();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    return double(ms) / count;
}

int bench_cuda(const qtts_cli::Args& args) {
    namespace qc = qtts::cuda;
    const int device = int(args.get_int("device", 0));
    const int frames = int(args.get_int("frames", 256));
    const int chunk = int(args.get_int("chunk", 4));
    const int repeats = int(args.get_int("repeats", 5));
    const bool graphs = !args.has("no-cuda-graphs");
    if (frames < 8 || chunk < 1 || repeats < 1) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--frames >= 8, --chunk >= 1, --repeats >= 1");

    nlohmann::json out;
    std::string model_dir;
    if (auto preset = args.get("preset")) {
        std::string cache = args.get_or("cache", "");
        if (cache.empty()) {
            const char* env = std::getenv("QTTS_CACHE_DIR");
            cache = env ? env : "/tmp/qtts-bench";
        }
        model_dir = cache + "/" + *preset;
        if (!std::filesystem::exists(model_dir + "/model.safetensors")) {
            std::printf("writing random-weight checkpoint %s to %s ...\n", preset->c_str(), model_dir.c_str());
            const auto stats = qtts::model_write_random(qtts::model_preset(*preset), model_dir, 1234);
            out["make_model_seconds"] = stats.seconds;
        }
        out["preset"] = *preset;
    } else if (auto model = args.get("model")) {
        model_dir = *model;
    } else {
        usage();
        return 2;
    }
    out["model"] = model_dir;

    const auto checkpoint = qtts::checkpoint_load(model_dir);
    qc::GpuContext context(device);
    const auto weights = qc::GpuLmWeights::upload(checkpoint, device);
    const qtts::Prompt prompt = bench_prompt(checkpoint->config);
    const int L = int(prompt.positions.size());

    qc::GpuGeneratorOptions options;
    options.graphs = graphs;
    options.first_chunk_frames = 1;
    options.chunk_frames = chunk;
    options.graph_frames = {1, chunk};
    options.lm.max_context = std::max(4096, L + frames * 4 + 64);
    const auto t_setup = Clock::now();
    qc::GpuGenerator gen(weights, context, options);
    const double setup_ms = ms_between(t_setup, Clock::now());
    qc::GpuLm& lm = gen.lm();
    cudaStream_t stream = context.stream();

    qtts::GenerationParams params = qtts::generation_params_from_config(checkpoint->generation);
    params.min_new_tokens = 1 << 30;  // EOS never allowed: a fixed number of frames
    params.max_frames = frames * 4 + 8;

    // Prefill and time to first frame (request -> first frame's codes on the host).
    std::vector<double> prefill_ms, first_frame_ms;
    for (int r = 0; r < repeats + 1; ++r) {
        const auto t0 = Clock::now();
        gen.start(prompt, params, 42 + uint64_t(r));
        const auto t1 = Clock::now();
        qtts::cpu::FrameCodes codes{};
        if (gen.next_frame(codes) != qtts::cpu::FrameStatus::FRAME_STATUS_FRAME)
            qtts::fail(qtts::ErrorCode::ERROR_INTERNAL, "bench: the first frame was not produced");
        const auto t2 = Clock::now();
        if (r == 0) continue;  // warm-up
        prefill_ms.push_back(ms_between(t0, t1));
        first_frame_ms.push_back(ms_between(t0, t2));
    }

    // Steady state: a fresh utterance, then `frames` frames per measurement.
    const auto steady = [&](const char* label, const std::function<void()>& one_chunk, int frames_per_call) {
        gen.start(prompt, params, 7);
        for (int i = 0; i < 2; ++i) one_chunk();  // warm-up
        const int calls = std::max(1, frames / frames_per_call);
        const auto w0 = Clock::now();
        const double ms = time_on_stream(stream, calls, one_chunk) / frames_per_call;
        const double wall = ms_between(w0, Clock::now()) / (calls * frames_per_call);
        QTTS_LOG_INFO("bench {}: {:.3f} ms/frame (GPU events), {:.3f} ms/frame wall", label, ms, wall);
        return std::pair<double, double>(ms, wall);
    };
    nlohmann::json results;
    std::pair<double, double> graph_time{0, 0}, eager_time{0, 0}, nopdl_time{0, 0};
    double talker_ms = 0, predictor_ms = 0;
    size_t nodes_per_frame = 0;
    eager_time = steady("eager", [&] { lm.frame_step_enqueue(); }, 1);
    if (gen.graphs_enabled()) {
        graph_time = steady("graphs", [&] { gen.graphs().run(chunk); }, chunk);
        for (const auto& s : gen.graphs().stats())
            if (s.frames == 1) nodes_per_frame = s.nodes;
        // Talker and predictor halves, each in its own graph.
        qc::GraphStats sp, st;
        const qc::GraphExec pred = qc::graph_capture(context, "predictor frame", [&] { lm.predictor_frame_enqueue(); }, &sp);
        const qc::GraphExec talk = qc::graph_capture(context, "talker frame", [&] { lm.talker_frame_enqueue(); }, &st);
        gen.start(prompt, params, 9);
        predictor_ms = time_on_stream(stream, frames, [&] { qc::graph_replay(context, pred); });
        talker_ms = time_on_stream(stream, frames, [&] { qc::graph_replay(context, talk); });
        // Programmatic dependent launch off.
        if (context.pdl()) {
            context.pdl_set(false);
            qc::GraphStats sn;
            const qc::GraphExec plain = qc::graph_capture(
                context, "frame (no PDL)", [&] { for (int i = 0; i < chunk; ++i) lm.frame_step_enqueue(); }, &sn);
            context.pdl_set(true);
            nopdl_time = steady("graphs, PDL off", [&] { qc::graph_replay(context, plain); }, chunk);
        }
    }
    context.synchronize();

    // Bytes a frame must read: every talker weight once, every predictor weight 15 times, and the
    // talker KV cache (fp32) at the mean context of the steady-state run.
    const qc::GpuStack& T = weights->talker;
    const int groups = weights->num_code_groups;
    const double mean_ctx = L + frames / 2.0;
    const double kv_bytes = double(T.layers.size()) * mean_ctx * 2.0 * T.kv_dim() * 4.0;
    const double weight_bytes =
        double(weights->talker_step_bytes()) + double(groups - 1) * double(weights->predictor_pass_bytes());
    const double frame_bytes = weight_bytes + kv_bytes;
    const double floor_ms = frame_bytes / FLOOR_BANDWIDTH * 1e3;
    const double best_ms = graph_time.first > 0 ? graph_time.first : eager_time.first;

    out["device"] = context.device_name();
    out["device_index"] = device;
    out["prompt_positions"] = L;
    out["frames"] = frames;
    out["chunk"] = chunk;
    out["setup_ms"] = setup_ms;
    out["weights_upload_s"] = weights->upload_seconds();
    out["weights_mb"] = weights->device_bytes() / 1e6;
    out["state_mb"] = lm.state_bytes() / 1e6;
    out["prefill_ms_p50"] = median(prefill_ms);
    out["first_frame_ms_p50"] = median(first_frame_ms);
    out["frame_ms_graphs"] = graph_time.first;
    out["frame_ms_graphs_wall"] = graph_time.second;
    out["frame_ms_graphs_no_pdl"] = nopdl_time.first;
    out["frame_ms_eager"] = eager_time.first;
    out["frame_ms_eager_wall"] = eager_time.second;
    out["talker_ms"] = talker_ms;
    out["predictor_ms"] = predictor_ms;
    out["launches_per_frame"] = nodes_per_frame;
    out["bytes_per_frame"] = frame_bytes;
    out["floor_ms"] = floor_ms;
    out["achieved_tb_s"] = best_ms > 0 ? frame_bytes / (best_ms * 1e-3) / 1e12 : 0.0;
    out["x_realtime"] = best_ms > 0 ? 80.0 / best_ms : 0.0;
    out["pdl"] = context.pdl();
    nlohmann::json graph_stats = nlohmann::json::array();
    for (const auto& s : gen.graphs().stats())
        graph_stats.push_back({{"name", s.name}, {"frames", s.frames}, {"nodes", s.nodes}, {"capture_ms", s.capture_ms},
                               {"instantiate_ms", s.instantiate_ms}, {"device_bytes", s.device_bytes}});
    out["graphs"] = graph_stats;

    std::printf("\nqtts bench  %s  on %s (device %d)\n", model_dir.c_str(), context.device_name().c_str(), device);
    std::printf("  prompt %d positions, %d frames per run, chunk %d, PDL %s\n", L, frames, chunk, context.pdl() ? "on" : "off");
    std::printf("  %-34s %10s\n", "metric", "value");
    auto row = [](const char* name, double v, const char* unit) { std::printf("  %-34s %10.3f %s\n", name, v, unit); };
    row("prefill (p50)", median(prefill_ms), "ms");
    row("time to first frame (p50)", median(first_frame_ms), "ms");
    row("frame, graphs", graph_time.first, "ms");
    row("frame, graphs, PDL off", nopdl_time.first, "ms");
    row("frame, eager (GPU)", eager_time.first, "ms");
    row("frame, eager (wall)", eager_time.second, "ms");
    row("  talker step (graph)", talker_ms, "ms");
    row("  predictor 15 passes (graph)", predictor_ms, "ms");
    row("launches per frame", double(nodes_per_frame), "");
    row("bytes per frame", frame_bytes / 1e9, "GB");
    row("bandwidth floor (4.3 TB/s)", floor_ms, "ms");
    row("achieved", best_ms > 0 ? frame_bytes / (best_ms * 1e-3) / 1e12 : 0.0, "TB/s");
    row("real-time factor", best_ms > 0 ? 80.0 / best_ms : 0.0, "x");
    if (auto path = args.get("json")) {
        std::ofstream f(*path);
        if (!f) qtts::fail(qtts::ErrorCode::ERROR_IO, "cannot write {}", *path);
        f << out.dump(2) << "\n";
        std::printf("  wrote %s\n", path->c_str());
    }
    return 0;
}

#endif

int cmd_bench(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "preset", "cache", "frames", "chunk", "repeats", "device", "json"},
                        {"help", "no-cuda-graphs"});
    if (args.has("help")) {
        usage();
        return 0;
    }
#ifdef QTTS_HAVE_CUDA
    const int device = int(args.get_int("device", 0));
    if (qtts::cuda_device_count() == 0) {
        std::fprintf(stderr, "qtts bench: %s; the benchmark measures the CUDA backend and needs a GPU\n",
                     qtts::cuda_describe(device).c_str());
        return 1;
    }
    return bench_cuda(args);
#else
    std::fprintf(stderr, "qtts bench: %s; the benchmark measures the CUDA backend\n", qtts::cuda_describe(0).c_str());
    return 1;
#endif
}

}  // namespace

QTTS_COMMAND("bench", "benchmark the GPU talker + code predictor (frame time, prefill, first frame)", cmd_bench);
