// qtts bench: steady-state GPU frame time of the talker + code predictor.
//
//   qtts bench --model DIR | --preset P [--frames N] [--chunk K] [--no-cuda-graphs] [--json FILE]
//              [--device N] [--repeats R] [--cache DIR]
//   qtts bench --batch 1,2,4,8,16,32,64 ...   the batched frame step instead (apps/qtts/bench_batch.cpp)
//
// Fixed prompt (a 22-token English sentence), fixed frame count, EOS ignored (it is masked), the
// reference sampling settings (temperature 0.9, top-k 50, repetition penalty 1.05). Reports
// prefill time, time to first frame, the frame time with graphs on and off (and with
// programmatic dependent launch off), the talker / predictor split, launches per frame and the
// bytes each frame reads against the bandwidth floor. Prints a table and optionally writes JSON.
//
// End to end on the runtime path (SpeechModel + Utterance on the CUDA backend, GPU speech decoder,
// chunks of 1 then 4 frames like the engine): time to first audio = request submitted (text) ->
// first PCM chunk on the host (tokenization, prompt, prefill, first frame and its decode), p50 /
// p95 over --e2e-requests requests (default 20) of a ~20-word sentence after one warm-up; and the
// steady end-to-end frame time (LM + decoder + host copies per 80 ms frame) after the second chunk.
// A chunk is one fused graph replay (LM frames + their audio, cuda/fused_chunks.h);
// --e2e-compare measures the separate LM and decoder replays as well. --no-e2e skips it.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/qtts/bench_batch.h"
#include "apps/qtts/bench_common.h"
#include "apps/qtts/cli.h"
#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/model/make_model.h"
#include "engine/model/weights.h"
#include "engine/generation/sampling.h"
#include "engine/runtime/speech_model.h"
#include "engine/runtime/utterance.h"
#include "engine/text/prompt.h"

#ifdef QTTS_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "engine/cuda/event_timer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_generator.h"
#include "engine/cuda/gpu_speech_decoder.h"
#include "kernels/gemv.cuh"
#endif

namespace {

constexpr double FLOOR_BANDWIDTH = 4.3e12;  // measured device-to-device copy rate on the H200 (bytes/s)
// The end-to-end and cold-start requests' sentence (21 words).
constexpr const char* kBenchSentence =
    "The quick brown fox jumps over the lazy dog while the evening sun slowly sets behind the quiet distant hills.";

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
        "  --e2e-requests N   end-to-end requests (time to first audio, frame time with decode; default 20)\n"
        "  --no-e2e           skip the end-to-end runtime measurement\n"
        "  --e2e-chunks LIST  steady chunk sizes of the end-to-end runs (default 4; the first chunk is 1 frame)\n"
        "  --prefill-chunk N  prompt rows per prefill pass of the LM part (default: the engine's)\n"
        "  --prefill-sweep    also time the talker prefill at several prompt lengths, eager and as a graph\n"
        "  --overlap          also time an LM chunk and a decoder chunk launched together on two streams\n"
        "  --e2e-compare      also measure end to end with separate LM and decoder replays (no fused chunks)\n"
        "  --cold N           time to first audio of the first request of N fresh processes each, with and\n"
        "                     without the load-time warm-up (default 0: skipped)\n"
        "  --cold-gap-ms G    also with G ms of idle time before each of those requests\n"
        "  --batch LIST       instead: the batched frame step at these batch sizes (e.g. 1,2,4,8,16,32,64):\n"
        "                     step time, audio-s/s, bytes and bandwidth per bucket, gemv vs tensor cores\n"
        "  --batch-paths LIST with --batch: only these product paths (gemv,split,auto,sk16,sk32,t1,unfused,wr,short0)\n"
        "  --batch-step-only  with --batch: only the step table (no prefill, product or overlap tables)\n"
        "  --batch-pairs LIST with --batch: 2h streams as one batch against two batches of h on two CUDA\n"
        "                     streams replayed at once, for each h of LIST (2h must be a --batch size)\n"
        "  --batch-context N  with --batch: every stream's KV cache positions (default: what the run needs;\n"
        "                     the engine's streams have 4096, which sizes the talker attention's grid)\n"
        "  --batch-profile    with --batch: one more replay per bucket inside cudaProfilerStart/Stop (for\n"
        "                     `ncu --profile-from-start off`; tools/ncu_step.py sums its kernels)\n"
        "  --gpu-memory-limit S  the end-to-end runs' --gpu-memory-limit (e.g. 6G)\n"
        "  --json FILE        write the results as JSON\n");
}

#ifdef QTTS_HAVE_CUDA

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

using qtts::cuda::time_on_stream;

// Can the decoder hide behind the LM? One LM chunk graph (the generator's context) and one
// decoder chunk graph (a second context: its own stream and cuBLAS handle) timed alone, one
// after the other, and launched together on the two streams (wall time per chunk, synced).
struct Overlap {
    int chunk = 0;
    double lm_ms = 0, decoder_ms = 0, serial_ms = 0, concurrent_ms = 0;
};

Overlap overlap_probe(const qtts::Checkpoint& checkpoint, int device, qtts::cuda::GpuContext& context,
                      qtts::cuda::GpuGenerator& gen, const std::function<void()>& restart, int chunk) {
    namespace qc = qtts::cuda;
    Overlap o;
    o.chunk = chunk;
    qc::GpuContext decoder_context(device);
    const auto decoder_weights = qc::GpuSpeechDecoderWeights::upload(checkpoint, device);
    qc::GpuSpeechDecoderOptions options;
    options.max_chunk_frames = std::max(8, chunk);
    options.graph_chunk_sizes = {chunk};
    qc::GpuSpeechDecoder decoder(decoder_weights, decoder_context, options);
    std::vector<int32_t> codes(size_t(chunk) * 16);
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = int32_t((i * 7919) % 2048);
    decoder.codes_upload(codes.data(), chunk);
    const int iters = 40;
    const auto wall = [&](const std::function<void()>& one) {
        restart();
        for (int i = 0; i < 3; ++i) one();
        const auto t0 = Clock::now();
        for (int i = 0; i < iters; ++i) one();
        return ms_between(t0, Clock::now()) / iters;
    };
    o.lm_ms = wall([&] {
        gen.graphs().run(chunk);
        context.synchronize();
    });
    o.decoder_ms = wall([&] {
        decoder.chunk_run(chunk);
        decoder_context.synchronize();
    });
    o.serial_ms = wall([&] {
        gen.graphs().run(chunk);
        context.synchronize();
        decoder.chunk_run(chunk);
        decoder_context.synchronize();
    });
    o.concurrent_ms = wall([&] {
        gen.graphs().run(chunk);
        decoder.chunk_run(chunk);
        context.synchronize();
        decoder_context.synchronize();
    });
    return o;
}

struct EndToEnd {
    int requests = 0;
    int prompt_tokens = 0;        // text ids of the sentence (the tokenizer of the checkpoint)
    int prompt_positions = 0;     // talker prompt length of that sentence
    std::vector<double> ttfa_ms;  // per request: submit -> first PCM chunk on the host
    // Its parts: prepare() (text -> ids), the Utterance (state leases, ICL warm-up), the first
    // chunk (prompt, prefill, first frame, its audio); and, measured apart on the same prompt, the
    // generator's start (prompt embedding + prefill + codebook 0, synced) and its first frame.
    std::vector<double> prepare_ms, utterance_ms, first_chunk_ms, start_ms, first_frame_ms;
    // Time to first audio with the streaming text layout (the text enters during generation, so
    // the prefill holds only its first tokens), same sentence.
    std::vector<double> ttfa_streaming_ms;
    std::vector<double> frame_ms;  // per request: mean wall time per frame after the second chunk
    int64_t frames = 0;           // frames after the second chunk, all requests
    bool gpu_decoder = false;
    std::vector<int> fused_sizes;  // chunk sizes replayed as one graph (LM + decoder)
    int chunk = 4;                 // steady chunk (the first one is 1 frame)
    double load_s = 0.0;
};

// Time to first audio of the first requests in this process, on a model just loaded with or
// without the load-time warm-up, `gap_ms` of idle time before each request (a server between
// users). Run by `--cold` in fresh processes (`bench --cold-probe`), one line of JSON on stdout.
nlohmann::json cold_probe(const std::string& model_dir, int device, bool warm_up, int gap_ms) {
    qtts::BackendOptions options;
    options.name = "cuda";
    options.device = device;
    options.warm_up = warm_up;
    const auto t0 = Clock::now();
    const auto model = qtts::SpeechModel::load(model_dir, options);
    const double load_s = ms_between(t0, Clock::now()) / 1e3;
    qtts::SpeechRequest request;
    request.text = kBenchSentence;
    request.max_frames = 8;
    std::vector<double> ttfa, prepare_ms, first_chunk_ms;
    // The benchmark sentence twice, then a shorter one twice (a prompt length not seen before).
    for (int r = 0; r < 4; ++r) {
        if (gap_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(gap_ms));
        request.seed = 700 + uint64_t(r);
        if (r == 2) request.text = "Good morning, and welcome to the evening news.";
        std::vector<float> pcm;
        std::vector<qtts::FrameCodes> codes;
        const auto s0 = Clock::now();
        qtts::PreparedSpeech prepared = model->prepare(request);
        const auto s1 = Clock::now();
        qtts::Utterance utt(model, std::move(prepared));
        const auto s2 = Clock::now();
        if (utt.chunk(1, &pcm, &codes) != qtts::UtteranceStatus::UTTERANCE_CHUNK || pcm.empty())
            qtts::fail(qtts::ErrorCode::ERROR_INTERNAL, "bench: the first chunk produced no audio");
        const auto s3 = Clock::now();
        ttfa.push_back(ms_between(s0, s3));
        prepare_ms.push_back(ms_between(s0, s1));
        first_chunk_ms.push_back(ms_between(s2, s3));
    }
    return {{"warm_up", warm_up}, {"load_s", load_s},         {"gap_ms", gap_ms},
            {"ttfa_ms", ttfa},    {"prepare_ms", prepare_ms}, {"first_chunk_ms", first_chunk_ms}};
}

struct ColdRuns {
    bool warm_up = true;
    int gap_ms = 0;
    std::vector<double> first_ms, second_ms, load_s;
    std::vector<nlohmann::json> probes;  // each process's line
};

// `processes` fresh processes of this executable, each running cold_probe().
ColdRuns cold_runs(const std::string& model_dir, int device, bool warm_up, int processes, int gap_ms) {
    ColdRuns runs;
    runs.warm_up = warm_up;
    runs.gap_ms = gap_ms;
    const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
    const std::string command = "'" + self + "' bench -q --cold-probe --model '" + model_dir + "' --device " +
                                std::to_string(device) + " --cold-gap-ms " + std::to_string(gap_ms) +
                                (warm_up ? "" : " --no-warm-up");
    for (int p = 0; p < processes; ++p) {
        FILE* pipe = popen(command.c_str(), "r");
        if (!pipe) qtts::fail(qtts::ErrorCode::ERROR_IO, "bench: cannot start {}", command);
        std::string output;
        char buf[512];
        while (std::fgets(buf, sizeof buf, pipe)) output += buf;
        const int status = pclose(pipe);
        const size_t at = output.rfind("COLD-PROBE ");
        if (status != 0 || at == std::string::npos)
            qtts::fail(qtts::ErrorCode::ERROR_INTERNAL, "bench: cold probe failed (status {}): {}", status, output);
        const auto line = nlohmann::json::parse(output.substr(at + 11));
        runs.first_ms.push_back(line.at("ttfa_ms").at(0).get<double>());
        runs.second_ms.push_back(line.at("ttfa_ms").at(1).get<double>());
        runs.load_s.push_back(line.at("load_s").get<double>());
        runs.probes.push_back(line);
    }
    return runs;
}

// The runtime path end to end: what a server request costs on one stream, on the calling thread.
EndToEnd end_to_end(const std::string& model_dir, int device, bool graphs, int requests, bool fused, int chunk,
                    size_t memory_limit) {
    EndToEnd e;
    e.chunk = chunk;
    qtts::BackendOptions options;
    options.name = "cuda";
    options.device = device;
    options.gpu_memory_limit = memory_limit;
    options.cuda_graphs = graphs;
    options.fused_chunks = fused;
    options.chunk_sizes = {1, chunk};
    const auto t0 = Clock::now();
    const auto model = qtts::SpeechModel::load(model_dir, options);
    e.load_s = ms_between(t0, Clock::now()) / 1e3;
    e.gpu_decoder = model->gpu_decoder();
    e.fused_sizes = model->gpu_fused_chunk_sizes();
    qtts::SpeechRequest request;
    request.text = kBenchSentence;
    request.max_frames = 96;  // 7.7 s of audio per request; EOS may end it earlier (random weights)
    e.prompt_tokens = int(model->text_ids(request.text).size());
    std::vector<float> pcm;
    std::vector<qtts::FrameCodes> codes;
    pcm.reserve(size_t(request.max_frames) * qtts::SAMPLES_PER_FRAME);
    for (int r = 0; r < requests + 1; ++r) {
        request.seed = 100 + uint64_t(r);
        pcm.clear();
        codes.clear();
        const auto s0 = Clock::now();
        qtts::PreparedSpeech prepared = model->prepare(request);
        const auto s0a = Clock::now();
        qtts::Utterance utt(model, std::move(prepared));
        const auto s0b = Clock::now();
        qtts::UtteranceStatus status = utt.chunk(1, &pcm, &codes);
        const auto s1 = Clock::now();
        if (status != qtts::UtteranceStatus::UTTERANCE_CHUNK || pcm.empty())
            qtts::fail(qtts::ErrorCode::ERROR_INTERNAL, "bench: the first chunk produced no audio");
        // Steady frames are timed from the end of the second chunk: the first chunk's tail (the
        // talker step after its audio, cuda/fused_chunks.h) runs on into the second.
        bool done = utt.chunk(chunk, &pcm, &codes) == qtts::UtteranceStatus::UTTERANCE_DONE;
        const auto s1b = Clock::now();
        const int64_t first = utt.frames();
        while (!done) done = utt.chunk(chunk, &pcm, &codes) == qtts::UtteranceStatus::UTTERANCE_DONE;
        const auto s2 = Clock::now();
        if (r == 0) continue;  // warm-up
        e.ttfa_ms.push_back(ms_between(s0, s1));
        e.prepare_ms.push_back(ms_between(s0, s0a));
        e.utterance_ms.push_back(ms_between(s0a, s0b));
        e.first_chunk_ms.push_back(ms_between(s0b, s1));
        const int64_t rest = utt.frames() - first;
        if (rest > 0) {
            e.frame_ms.push_back(ms_between(s1b, s2) / double(rest));
            e.frames += rest;
        }
    }
    {
        qtts::SpeechRequest streaming = request;
        streaming.text_layout = qtts::TextLayout::TEXT_LAYOUT_STREAMING;
        for (int r = 0; r < requests + 1; ++r) {
            streaming.seed = 300 + uint64_t(r);
            pcm.clear();
            codes.clear();
            const auto s0 = Clock::now();
            qtts::Utterance utt(model, model->prepare(streaming));
            if (utt.chunk(1, &pcm, &codes) != qtts::UtteranceStatus::UTTERANCE_CHUNK || pcm.empty())
                qtts::fail(qtts::ErrorCode::ERROR_INTERNAL, "bench: the first chunk produced no audio");
            if (r > 0) e.ttfa_streaming_ms.push_back(ms_between(s0, Clock::now()));
        }
    }
    // The generator alone on the same prompt: start (prefill) and the first frame.
    {
        const qtts::PreparedSpeech prepared = model->prepare(request);
        qtts::PromptRequest prompt_request = prepared.base;
        prompt_request.input_ids = prepared.segments.front();
        const qtts::Prompt prompt = qtts::prompt_build(model->checkpoint().config, prompt_request);
        const auto gen = model->generator_new();
        for (int r = 0; r < requests + 1; ++r) {
            const auto g0 = Clock::now();
            gen->start(prompt, prepared.params, 500 + uint64_t(r));
            const auto g1 = Clock::now();
            std::vector<qtts::FrameCodes> frame;
            std::vector<float> audio;
            gen->chunk(1, &frame, &audio);
            const auto g2 = Clock::now();
            // A steady chunk after it, as a stream has: the first chunk's tail (the talker step
            // after its audio, cuda/fused_chunks.h) lands there, so the next start() is timed alone.
            gen->chunk(4, &frame, &audio);
            if (r == 0) continue;
            e.start_ms.push_back(ms_between(g0, g1));
            e.first_frame_ms.push_back(ms_between(g1, g2));
        }
        e.prompt_positions = int(prompt.positions.size());
    }
    e.requests = requests;
    return e;
}

int bench_cuda(const qtts_cli::Args& args) {
    namespace qc = qtts::cuda;
    const int device = int(args.get_int("device", 0));
    const int frames = int(args.get_int("frames", 256));
    const int chunk = int(args.get_int("chunk", 4));
    const int repeats = int(args.get_int("repeats", 5));
    const bool graphs = !args.has("no-cuda-graphs");
    const size_t memory_limit = qtts_cli::gpu_memory_limit_option(args);
    const int e2e_requests = args.has("no-e2e") ? 0 : int(args.get_int("e2e-requests", 20));
    const std::vector<int> e2e_chunks = qtts_cli::bench_sizes(args.get_or("e2e-chunks", "4"), "e2e-chunks");
    if (frames < 8 || chunk < 1 || repeats < 1) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--frames >= 8, --chunk >= 1, --repeats >= 1");

    nlohmann::json out;
    if (!args.get("preset") && !args.get("model")) {
        usage();
        return 2;
    }
    double make_model_seconds = -1.0;
    const std::string model_dir = qtts_cli::bench_model_dir(args, &make_model_seconds);
    if (make_model_seconds >= 0.0) out["make_model_seconds"] = make_model_seconds;
    if (auto preset = args.get("preset")) out["preset"] = *preset;
    out["model"] = model_dir;
    if (auto list = args.get("batch")) {  // the batched frame step per bucket, and nothing else
        const std::vector<int> buckets = qtts_cli::bench_sizes(*list, "batch");
        if (*std::max_element(buckets.begin(), buckets.end()) > qtts::kernels::GEMV_MAX_BATCH_ROWS / 2)
            qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--batch sizes go up to {}",
                       qtts::kernels::GEMV_MAX_BATCH_ROWS / 2);
        qtts_cli::BatchBenchOptions batch_options;
        if (auto paths = args.get("batch-paths")) batch_options.paths = qtts_cli::bench_names(*paths);
        batch_options.step_only = args.has("batch-step-only");
        batch_options.profile = args.has("batch-profile");
        batch_options.max_context = int(args.get_int("batch-context", 0));
        if (auto pairs = args.get("batch-pairs")) batch_options.pairs = qtts_cli::bench_sizes(*pairs, "batch-pairs");
        out.update(qtts_cli::bench_batch(model_dir, device, buckets, frames, chunk, batch_options));
        if (auto path = args.get("json")) qtts_cli::bench_json_write(*path, out);
        return 0;
    }
    if (args.has("cold-probe")) {  // a child of --cold: one fresh process's first requests
        const int gap_ms = int(args.get_int("cold-gap-ms", 0));
        std::printf("COLD-PROBE %s\n", cold_probe(model_dir, device, !args.has("no-warm-up"), gap_ms).dump().c_str());
        return 0;
    }
    const int cold_processes = int(args.get_int("cold", 0));
    if (cold_processes < 0) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--cold takes a count >= 0");
    std::vector<ColdRuns> cold;
    if (cold_processes > 0) {  // first, before this process holds GPU memory
        std::vector<int> gaps = {0};
        if (args.get_int("cold-gap-ms", 0) > 0) gaps.push_back(int(args.get_int("cold-gap-ms", 0)));
        for (const int gap_ms : gaps)
            for (const bool warm_up : {true, false})
                cold.push_back(cold_runs(model_dir, device, warm_up, cold_processes, gap_ms));
    }

    const auto checkpoint = qtts::checkpoint_load(model_dir);
    qc::GpuContext context(device);
    const auto weights = qc::GpuLmWeights::upload(checkpoint, device);
    const qtts::Prompt prompt = qtts_cli::bench_prompt(checkpoint->config);
    const int L = int(prompt.positions.size());

    qtts::BackendOptions options;
    options.cuda_graphs = graphs;
    options.chunk_sizes = {1, chunk};
    options.max_context = std::max(4096, L + frames * 4 + 64);
    options.prefill_chunk = int(args.get_int("prefill-chunk", 0));
    qtts::backend_options_validate(options);
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
        std::vector<qtts::FrameCodes> codes;
        if (gen.chunk(1, &codes, nullptr) != qtts::ChunkStatus::CHUNK_STATUS_FULL)
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

    // Prefill length sweep (--prefill-sweep): eager (host enqueue + GPU, synced wall time) vs the
    // same launches replayed from a graph (GPU time), per prompt length.
    nlohmann::json prefill_sweep = nlohmann::json::array();
    if (args.has("prefill-sweep")) {
        gen.start(prompt, params, 5);
        for (const int n : {16, 33, 64, 125, 250, 500}) {
            if (n >= lm.max_context()) break;
            std::vector<double> eager;
            for (int r = 0; r < 6; ++r) {
                const auto w0 = Clock::now();
                lm.prefill_enqueue(n);
                context.synchronize();
                if (r > 0) eager.push_back(ms_between(w0, Clock::now()));
            }
            qc::GraphStats ps;
            const qc::GraphExec pg = qc::graph_capture(context, "prefill", [&] { lm.prefill_enqueue(n); }, &ps);
            const double graph_ms = time_on_stream(stream, 5, [&] { qc::graph_replay(context, pg); });
            QTTS_LOG_INFO("bench prefill {} positions: eager {:.3f} ms (wall), graph {:.3f} ms (GPU), {} nodes", n,
                          qtts_cli::bench_median(eager), graph_ms, ps.nodes);
            prefill_sweep.push_back({{"positions", n}, {"eager_ms", qtts_cli::bench_median(eager)}, {"graph_ms", graph_ms}});
        }
    }

    Overlap overlap;
    if (gen.graphs_enabled() && args.has("overlap"))
        overlap = overlap_probe(*checkpoint, device, context, gen, [&] { gen.start(prompt, params, 11); }, chunk);

    // End to end: fused chunks at each steady chunk size, and (--e2e-compare) separate replays.
    std::vector<EndToEnd> e2e_runs;
    for (const int k : e2e_chunks) {
        if (e2e_requests == 0) break;
        e2e_runs.push_back(end_to_end(model_dir, device, graphs, e2e_requests, true, k, memory_limit));
        if (args.has("e2e-compare"))
            e2e_runs.push_back(end_to_end(model_dir, device, graphs, e2e_requests, false, k, memory_limit));
    }

    // Bytes a frame must read: every talker weight once, every predictor weight 15 times (its input
    // projection once), and the talker KV cache (fp32) at the mean context of the steady-state run.
    const qc::GpuStack& T = weights->talker;
    const double mean_ctx = L + frames / 2.0;
    const double kv_bytes = double(T.layers.size()) * mean_ctx * 2.0 * T.kv_dim() * 4.0;
    const double weight_bytes = double(weights->talker_step_bytes()) + double(weights->predictor_frame_bytes());
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
    out["prefill_ms_p50"] = qtts_cli::bench_median(prefill_ms);
    out["first_frame_ms_p50"] = qtts_cli::bench_median(first_frame_ms);
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
    if (!prefill_sweep.empty()) out["prefill_sweep"] = prefill_sweep;
    if (overlap.chunk > 0)
        out["overlap"] = {{"chunk", overlap.chunk},
                          {"lm_ms", overlap.lm_ms},
                          {"decoder_ms", overlap.decoder_ms},
                          {"serial_ms", overlap.serial_ms},
                          {"concurrent_ms", overlap.concurrent_ms}};
    auto e2e_json = [](const EndToEnd& e) {
        const double frame = qtts_cli::bench_median(e.frame_ms);
        return nlohmann::json{{"requests", e.requests},
                              {"prompt_text_tokens", e.prompt_tokens},
                              {"gpu_decoder", e.gpu_decoder},
                              {"fused_chunk_sizes", e.fused_sizes},
                              {"chunks", "1 then " + std::to_string(e.chunk)},
                              {"chunk", e.chunk},
                              {"load_s", e.load_s},
                              {"ttfa_ms_p50", qtts_cli::bench_median(e.ttfa_ms)},
                              {"ttfa_ms_p95", qtts_cli::bench_percentile(e.ttfa_ms, 95)},
                              {"ttfa_ms_min", qtts_cli::bench_percentile(e.ttfa_ms, 0)},
                              {"ttfa_prepare_ms_p50", qtts_cli::bench_median(e.prepare_ms)},
                              {"ttfa_utterance_ms_p50", qtts_cli::bench_median(e.utterance_ms)},
                              {"ttfa_first_chunk_ms_p50", qtts_cli::bench_median(e.first_chunk_ms)},
                              {"prompt_positions", e.prompt_positions},
                              {"ttfa_streaming_layout_ms_p50", qtts_cli::bench_median(e.ttfa_streaming_ms)},
                              {"ttfa_streaming_layout_ms_p95", qtts_cli::bench_percentile(e.ttfa_streaming_ms, 95)},
                              {"generator_start_ms_p50", qtts_cli::bench_median(e.start_ms)},
                              {"generator_first_frame_ms_p50", qtts_cli::bench_median(e.first_frame_ms)},
                              {"frame_ms_p50", frame},
                              {"frame_ms_p95", qtts_cli::bench_percentile(e.frame_ms, 95)},
                              {"frames", e.frames},
                              {"x_realtime", frame > 0 ? 80.0 / frame : 0.0}};
    };
    const double warm_ttfa = e2e_runs.empty() ? 0.0 : qtts_cli::bench_median(e2e_runs.front().ttfa_ms);
    for (const ColdRuns& c : cold) {
        const double first = qtts_cli::bench_median(c.first_ms);
        out[std::string(c.warm_up ? "cold_start" : "cold_start_no_warm_up") +
            (c.gap_ms > 0 ? "_gap" + std::to_string(c.gap_ms) + "ms" : "")] = {
            {"processes", c.first_ms.size()},
            {"gap_ms", c.gap_ms},
            {"probes", c.probes},
            {"first_ttfa_ms", c.first_ms},
            {"first_ttfa_ms_p50", first},
            {"second_ttfa_ms_p50", qtts_cli::bench_median(c.second_ms)},
            {"load_s_p50", qtts_cli::bench_median(c.load_s)},
            {"first_over_warm", warm_ttfa > 0 ? first / warm_ttfa : 0.0}};
    }
    if (!e2e_runs.empty()) {
        out["e2e"] = e2e_json(e2e_runs.front());
        nlohmann::json runs = nlohmann::json::array();
        for (const EndToEnd& e : e2e_runs) runs.push_back(e2e_json(e));
        out["e2e_runs"] = runs;
    }

    std::printf("\nqtts bench  %s  on %s (device %d)\n", model_dir.c_str(), context.device_name().c_str(), device);
    std::printf("  prompt %d positions, %d frames per run, chunk %d, PDL %s\n", L, frames, chunk, context.pdl() ? "on" : "off");
    std::printf("  %-34s %10s\n", "metric", "value");
    auto row = [](const char* name, double v, const char* unit) { std::printf("  %-48s %10.3f %s\n", name, v, unit); };
    row("prefill (p50)", qtts_cli::bench_median(prefill_ms), "ms");
    row("time to first frame (p50)", qtts_cli::bench_median(first_frame_ms), "ms");
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
    for (const auto& p : prefill_sweep)
        std::printf("  prefill %4d positions: eager %.3f ms, graph %.3f ms\n", p["positions"].get<int>(),
                    p["eager_ms"].get<double>(), p["graph_ms"].get<double>());
    if (overlap.chunk > 0) {
        std::printf("  overlap probe (one chunk of %d frames, wall time, synced)\n", overlap.chunk);
        row("  overlap: LM chunk alone", overlap.lm_ms, "ms");
        row("  overlap: decoder chunk alone", overlap.decoder_ms, "ms");
        row("  overlap: LM then decoder", overlap.serial_ms, "ms");
        row("  overlap: LM and decoder at once", overlap.concurrent_ms, "ms");
    }
    for (const EndToEnd& run : e2e_runs) {
        const EndToEnd* e = &run;
        const double frame = qtts_cli::bench_median(e->frame_ms);
        std::printf("  end to end (runtime: Utterance, %s decoder, chunks 1 then %d, %s; %d requests, %d text tokens)\n",
                    e->gpu_decoder ? "GPU" : "CPU", e->chunk,
                    e->fused_sizes.empty() ? "separate LM and decoder replays" : "fused chunk graphs", e->requests,
                    e->prompt_tokens);
        row("  time to first audio (p50)", qtts_cli::bench_median(e->ttfa_ms), "ms");
        row("  time to first audio (p95)", qtts_cli::bench_percentile(e->ttfa_ms, 95), "ms");
        row("    prepare (text -> ids)", qtts_cli::bench_median(e->prepare_ms), "ms");
        row("    utterance set-up", qtts_cli::bench_median(e->utterance_ms), "ms");
        row("    first chunk (prefill, frame, audio)", qtts_cli::bench_median(e->first_chunk_ms), "ms");
        row("    generator start (prefill)", qtts_cli::bench_median(e->start_ms), "ms");
        row("    generator first frame", qtts_cli::bench_median(e->first_frame_ms), "ms");
        row("  time to first audio, streaming text layout (p50)", qtts_cli::bench_median(e->ttfa_streaming_ms), "ms");
        row("  e2e frame, LM + decoder (p50)", frame, "ms");
        row("  e2e frame, LM + decoder (p95)", qtts_cli::bench_percentile(e->frame_ms, 95), "ms");
        row("  e2e real-time factor", frame > 0 ? 80.0 / frame : 0.0, "x");
    }
    for (const ColdRuns& c : cold) {
        std::printf("  fresh processes, %s load-time warm-up (%zu processes, %d ms idle before each request)\n",
                    c.warm_up ? "with" : "without", c.first_ms.size(), c.gap_ms);
        for (const auto& p : c.probes) std::printf("    probe %s\n", p.dump().c_str());
        row("  time to first audio, first request (p50)", qtts_cli::bench_median(c.first_ms), "ms");
        row("  time to first audio, second request (p50)", qtts_cli::bench_median(c.second_ms), "ms");
        row("  model load incl. warm-up (p50)", qtts_cli::bench_median(c.load_s), "s");
    }
    if (auto path = args.get("json")) qtts_cli::bench_json_write(*path, out);
    return 0;
}

#endif

int cmd_bench(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "preset", "cache", "frames", "chunk", "repeats", "device", "json", "e2e-requests", "e2e-chunks",
                         "prefill-chunk", "cold", "cold-gap-ms", "batch", "batch-paths", "batch-context", "batch-pairs", "gpu-memory-limit"},
                        {"help", "no-cuda-graphs", "no-e2e", "e2e-compare", "overlap", "prefill-sweep",
                         "cold-probe", "no-warm-up", "batch-step-only", "batch-profile"});
    if (args.has("help")) {
        usage();
        return 0;
    }
    if (!qtts_cli::bench_gpu_present("bench", "the CUDA backend", int(args.get_int("device", 0)))) return 1;
#ifdef QTTS_HAVE_CUDA
    return bench_cuda(args);
#else
    return 1;  // not reached: bench_gpu_present() is false without CUDA
#endif
}

}  // namespace

QTTS_COMMAND("bench", "benchmark the GPU talker + code predictor (frame time, prefill, first frame)", cmd_bench);
