// qtts serve: the HTTP / WebSocket / plain TCP speech server (API: docs/server.md).
#include <signal.h>

#include <csignal>
#include <cstdio>
#include <memory>
#include <string>

#include "audio_io/server/server.h"
#include "audio_io/server/speech_service.h"
#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/api/qtts.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;

void print_usage() {
    std::printf(
        "usage: qtts serve [--model DIR] [options]\n"
        "  --model DIR            checkpoint directory (default: the embedded demo model)\n"
        "  --host ADDR            listen address (default 127.0.0.1; 0.0.0.0 serves the network)\n"
        "  --port N               HTTP + WebSocket port (default 8080; 0 = any free port)\n"
        "  --tcp-port N           also serve plain TCP: one line in, Ogg Opus out (default off)\n"
        "  --max-streams N        concurrent streams, more get 429 (default 16; CUDA: at most as many as\n"
        "                         the device memory, or --gpu-memory-limit, holds)\n"
        "  --max-connections N    open connections, more get 503 (default 256)\n"
        "  --bitrate N            Opus bits per second (default 32000)\n"
        "  --max-text-bytes N     text per request or utterance (default 8192)\n"
        "  --max-audio-seconds S  cap on one request's audio (default: the engine's frame budget)\n"
        "  --idle-timeout S       seconds without a request or message before closing (default 30)\n"
        "  --drain-seconds S      on SIGTERM/SIGINT: refuse new streams, let running ones finish for up to\n"
        "                         S seconds, then cut the rest (default 30; 0 = cut at once)\n"
        "  --io-threads N         network threads (default 2)\n"
        "  --backend auto|cpu|cpu-fast|cuda  talker + code predictor backend (default auto: CUDA when\n"
        "                         usable, else cpu-fast; cpu is the fp32 reference)\n"
        "  --cpu-format bf16|int8 cpu-fast weight format (default bf16, exact; int8 ~2x faster)\n"
        "  --threads N            cpu-fast threads per engine (default 0: every core)\n"
        "  --device N             CUDA device index (default 0)\n"
        "  --devices LIST         one engine per GPU, e.g. 0,1 (same as --engines cuda:0,cuda:1)\n"
        "  --engines LIST         one engine per entry: cpu, cuda:N or N, e.g. cuda:0,cpu or cpu,cpu; each\n"
        "                         request goes to the least-loaded engine (instead of --backend/--device)\n"
        "  --no-cuda-graphs       run the GPU frame steps eagerly (same audio)\n"
        "  --cpu-decoder          CUDA backend: decode speech on the CPU instead of the GPU (same audio to ~1e-6)\n"
        "  --no-fused-chunks      CUDA backend: replay the LM and the decoder separately (same audio)\n"
        "  --no-batching          CUDA and cpu-fast: every stream takes its own LM steps (no shared batched step)\n"
        "  --batch-exact          CUDA backend: batched streams keep their own arithmetic (codes bitwise as alone,\n"
        "                         sampled ones too; slower batched steps)\n"
        "  --admission on|off     refuse new streams (429, code capacity) when the engine's measured real-time\n"
        "                         capacity is used (default on)\n"
        "  --admission-headroom F fraction of the measured capacity admitted streams may use (default 0.9;\n"
        "                         0.05..4)\n"
        "  --prefill-slice N      cpu-fast: while other streams play, a prompt prefill longer than N rows runs N\n"
        "                         rows per engine round instead of stalling them (default %d; 0 = whole)\n"
        "%s%s"
        "Endpoints: POST /v1/audio/speech, GET /v1/audio/voices, GET /livez, GET /readyz, GET /healthz,\n"
        "GET /metrics, WebSocket /v1/audio/stream. The server listens while the model loads (/livez 200,\n"
        "/readyz 503 until it is ready). Stop with Ctrl-C (SIGINT) or SIGTERM (graceful drain, above).\n",
        qtts::PREFILL_SLICE_DEFAULT, qtts_cli::GPU_MEMORY_LIMIT_HELP, qtts_cli::MAX_CONTEXT_HELP);
}

int int_option(const qtts_cli::Args& args, const char* name, long long fallback, long long lo, long long hi) {
    const long long v = args.get_int(name, fallback);
    if (v < lo || v > hi) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--{} must be in {}..{}, got {}", name, lo, hi, v);
    return int(v);
}

std::string model_name_of(const std::string& dir) {
    if (dir.empty()) return "qtts-default";
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    const auto slash = d.find_last_of('/');
    return slash == std::string::npos ? d : d.substr(slash + 1);
}

int cmd_serve(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv,
                        {"model", "host", "port", "tcp-port", "max-streams", "max-connections", "bitrate", "max-text-bytes",
                         "max-audio-seconds", "idle-timeout", "drain-seconds", "io-threads", "backend", "cpu-format", "threads", "device", "devices",
                         "engines", "gpu-memory-limit", "max-context", "admission", "admission-headroom", "prefill-slice"},
                        {"help", "no-cuda-graphs", "cpu-decoder", "no-fused-chunks", "no-batching", "batch-exact"});
    if (args.has("help")) {
        print_usage();
        return 0;
    }
    if (!args.positional().empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unexpected argument '{}' (run qtts serve --help)", args.positional()[0]);

    qtts::ServerOptions options;
    options.host = args.get_or("host", "127.0.0.1");
    options.port = int_option(args, "port", 8080, 0, 65535);
    options.tcp_port = int_option(args, "tcp-port", -1, -1, 65535);
    options.max_streams = int_option(args, "max-streams", 16, 1, 1024);
    options.max_connections = int_option(args, "max-connections", 256, 1, 100000);
    options.bitrate = int_option(args, "bitrate", 32000, 6000, 510000);
    options.max_text_bytes = size_t(int_option(args, "max-text-bytes", 8192, 16, 1 << 20));
    options.max_audio_seconds = args.get_double("max-audio-seconds", 0.0);
    options.idle_timeout = std::chrono::milliseconds(1000LL * int_option(args, "idle-timeout", 30, 1, 86400));
    options.io_threads = int_option(args, "io-threads", 2, 1, 64);
    qtts::server_options_validate(options);
    const int drain_seconds = int_option(args, "drain-seconds", 30, 0, 86400);

    qtts::EnginePoolOptions pool_options;
    qtts::EngineOptions& engine_options = pool_options.engine;
    engine_options.model_dir = args.get_or("model", "");
    engine_options.backend.name = args.get_or("backend", "auto");
    engine_options.backend.cpu_format = args.get_or("cpu-format", "bf16");
    engine_options.backend.threads = int_option(args, "threads", 0, 0, 256);
    engine_options.backend.device = int_option(args, "device", 0, 0, 63);
    engine_options.backend.cuda_graphs = !args.has("no-cuda-graphs");
    engine_options.backend.gpu_decoder = !args.has("cpu-decoder");
    engine_options.backend.fused_chunks = !args.has("no-fused-chunks");
    engine_options.backend.batching = !args.has("no-batching");
    engine_options.backend.batch_exact = args.has("batch-exact");
    // A server's listeners play in real time: refusing one more (429) beats letting every admitted
    // stream fall behind, so admission control is on here (the library's default is off).
    const std::string admission = args.get_or("admission", "on");
    if (admission != "on" && admission != "off")
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--admission expects on or off, got '{}'", admission);
    engine_options.admission = admission == "on";
    // Its range is checked once, by the engine (Engine's constructor), like every EngineOptions field.
    engine_options.admission_headroom = args.get_double("admission-headroom", engine_options.admission_headroom);
    engine_options.prefill_slice = int(args.get_int("prefill-slice", engine_options.prefill_slice));
    // Every engine may hold the server's whole stream limit, so one engine can carry the load
    // when the others are out (docs/server.md, "Several engines").
    // Without --max-streams a CUDA engine makes as many stream slots as its device's memory holds
    // (at most 16); the server's own limit stays 16 and the engine refuses the rest (429).
    engine_options.max_streams = args.has("max-streams") ? options.max_streams : qtts::MAX_STREAMS_AUTO;
    engine_options.backend.gpu_memory_limit = qtts_cli::gpu_memory_limit_option(args);
    engine_options.backend.max_context = qtts_cli::max_context_option(args);
    // Several engines: checked here, before the server listens (the pool checks the same rule).
    if (args.has("engines") && args.has("devices"))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--engines and --devices both name the engines; give one of them");
    if ((args.has("engines") || args.has("devices")) && (args.has("backend") || args.has("device")))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "--{} names each engine's backend and device; leave out --backend and --device",
             args.has("engines") ? "engines" : "devices");
    if (args.has("engines")) pool_options.targets = qtts::engine_targets_parse(*args.get("engines"));
    if (args.has("devices")) {
        pool_options.targets = qtts::engine_targets_parse(*args.get("devices"));
        for (const qtts::EngineTarget& t : pool_options.targets)
            if (t.backend != "cuda")
                fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                     "--devices takes CUDA device indices (e.g. 0,1); for CPU engines use --engines (e.g. cuda:0,cpu)");
    }

    // Block the stop signals before any thread starts (threads inherit the mask), then wait for
    // them here with sigwait: no work in a signal handler.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    // A client that vanishes must not kill the server with SIGPIPE (Asio also guards its sends).
    std::signal(SIGPIPE, SIG_IGN);

    // Listen first, so /livez answers while the model loads and /readyz says "loading"; the
    // engine is attached once it is built (and warm: warm-up is part of the engine's start-up).
    // Declared in this order so the server stops before the engines go away.
    std::unique_ptr<qtts::EnginePool> engines;
    std::unique_ptr<qtts::EngineSpeechService> service;
    qtts::DeferredSpeechService deferred(model_name_of(engine_options.model_dir));
    qtts::HttpServer server(deferred, options);
    server.start();
    std::printf("qtts serve: http://%s:%d  (model %s, loading)\n", options.host.c_str(), server.port(),
                deferred.model_name().c_str());
    if (server.tcp_port() >= 0) std::printf("qtts serve: plain TCP on %s:%d\n", options.host.c_str(), server.tcp_port());
    std::fflush(stdout);

    // The engines load side by side; one that fails is left out (logged) while another loads,
    // and when none does the error stops the server on the way out.
    engines = std::make_unique<qtts::EnginePool>(pool_options);
    service = std::make_unique<qtts::EngineSpeechService>(*engines, deferred.model_name());
    deferred.attach(*service);
    std::printf("qtts serve: ready (backend %s)\n", service->backend_name().c_str());
    if (engines->size() > 1) {
        for (const qtts::EngineStatus& e : engines->status())
            std::printf("qtts serve: engine %s (%s): %s%s%s\n", e.label.c_str(), e.backend.c_str(), qtts::engine_state_name(e.state),
                        e.error.empty() ? "" : ": ", e.error.c_str());
    }
    std::fflush(stdout);

    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    QTTS_LOG_INFO("serve: received signal {}: draining (up to {} s)", signal_number, drain_seconds);
    const qtts::DrainReport report = server.drain(std::chrono::seconds(drain_seconds));
    std::printf("qtts serve: stopped: %lld of %lld running streams finished, %lld cut\n", (long long)report.finished,
                (long long)report.running, (long long)report.cut);
    return 0;
}

}  // namespace

QTTS_COMMAND("serve", "serve speech over HTTP (OpenAI-compatible), WebSocket and plain TCP", cmd_serve);
