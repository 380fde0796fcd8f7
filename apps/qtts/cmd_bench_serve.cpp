// qtts bench-serve: the serving benchmark (issue 18). One in-process qtts::Engine, many clients.
//
//   qtts bench-serve [--model DIR | --preset P] [--concurrency 1,4,10,16,32,64] [--requests N]
//                    [--frames F] [--backend auto|cpu|cuda] [--device N] [--max-streams N] [--json FILE]
//   qtts bench-serve --paced --rate R --duration S [--arrivals poisson|fixed] [--prebuffer-ms M] ...
//
// Closed loop: for each concurrency level c, c client threads (all made first, then started
// together) each submit a request, drain its stream as fast as it comes, then submit the next,
// until the level's N requests are done.
// Paced: requests arrive at R per second for S seconds; each admitted stream is played by a
// simulated player (prebuffer, then one period of audio per period of wall time) that counts
// underruns. Both report time to first audio, latency, real-time factor, throughput, refusals,
// the engine's batch-size histogram and (CUDA) device memory; a table, and JSON with --json.
//
// Every request has the same length: max_frames = --frames (default 75 = 6 s), fixed English
// sentences and fixed seeds, so a run is repeatable and levels compare. A random-weight model
// runs to the cap; a real one may end a sentence sooner at EOS (the audio seconds say so).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "apps/qtts/bench_common.h"
#include "apps/qtts/bench_player.h"
#include "apps/qtts/cli.h"
#include "engine/api/qtts.h"
#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/strings.h"
#include "engine/runtime/engine_debug.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;
using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

// Four English sentences of about twenty words (~6-7 s of speech each for a real model).
const std::vector<std::string>& serve_sentences() {
    static const std::vector<std::string> sentences = {
        "The morning train to the coast was running late, so we waited on the platform with coffee and a newspaper.",
        "Please remember to water the plants on the balcony and close every window before you leave the house tonight.",
        "Our new library opens next Monday, with a reading room for children and a quiet space for study upstairs.",
        "After the storm had passed, the fishermen mended their nets and counted the boats that drifted along the shore.",
    };
    return sentences;
}

void usage() {
    std::printf(
        "usage: qtts bench-serve [options]          closed loop at each concurrency level\n"
        "       qtts bench-serve --paced --rate R --duration S [options]   real-time paced players\n"
        "  --model DIR            checkpoint (default: the embedded demo model)\n"
        "  --preset P             a random-weight checkpoint of this preset instead (written once to --cache)\n"
        "  --cache DIR            where --preset models go (default $QTTS_CACHE_DIR or /tmp/qtts-bench)\n"
        "  --backend B            auto|cpu|cpu-fast|cuda (default auto)\n"
        "  --cpu-format F         cpu-fast weight format: bf16 (default, exact) or int8\n"
        "  --threads N            cpu-fast: threads of the matrix products (default 0 = every core)\n"
        "  --device N             CUDA device (default 0)\n"
        "  --max-streams N        engine stream limit (default: the largest concurrency; paced: 64)\n"
        "  --first-chunk-frames K, --chunk-frames K   chunk sizes (default: the engine's, %d then %d)\n"
        "  --frames F[,G...]      frames per request, 80 ms each (default 75 = 6 s; 0 = until EOS or the budget);\n"
        "                         a list: request i gets the (i mod n)-th (mixed lengths, so that streams start\n"
        "                         while others play instead of in waves)\n"
        "  --sentences K          each request's text is K of the fixed sentences in a row (default 1; 4 make\n"
        "                         one segment of ~100 text tokens: a long prompt prefill)\n"
        "  --prefill-slice N      sliced starts (EngineOptions::prefill_slice): prompt rows per round of a long\n"
        "                         start while other streams play (default %d; 0 = every start whole)\n"
        "  --no-batching          CUDA and cpu-fast: every stream takes its own LM steps (compare with the batched step)\n"
        "  --batch-exact          CUDA backend: batched streams keep their one-row arithmetic (bitwise codes as alone;\n"
        "                         BackendOptions::batch_exact)\n"
        "  --admission on|off     the engine's admission control (default off: every request up to --max-streams)\n"
        "  --timeout-s T          a stream that makes no progress for T s is cancelled and counted (default 60)\n"
        "  --json FILE            write the results as JSON\n"
        "%s%s"
        " closed loop:\n"
        "  --concurrency LIST     client threads per level (default 1,4,10,16,32,64)\n"
        "  --requests N           requests per level (default max(2 x concurrency, 8))\n"
        "  --trace                the JSON gets each level's chunks in the order the engine made them\n"
        "                         ([round, stream, frames, batched, ended, step frames] each: which streams\n"
        "                         shared its rounds, and how many frames the batched step that made it made)\n"
        " paced (--paced):\n"
        "  --rate R               new requests per second (> 0)\n"
        "  --duration S           seconds of arrivals (> 0)\n"
        "  --arrivals A           poisson (default) or fixed intervals\n"
        "  --prebuffer-ms M       audio a player buffers before it starts (default 100)\n"
        "  --period-ms P          a player takes P ms of audio every P ms (default 20)\n",
        qtts::FIRST_CHUNK_FRAMES_DEFAULT, qtts::CHUNK_FRAMES_DEFAULT, qtts::PREFILL_SLICE_DEFAULT, qtts_cli::GPU_MEMORY_LIMIT_HELP,
        qtts_cli::MAX_CONTEXT_HELP);
}

// ---------------------------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------------------------

struct ServeOptions {
    std::string model_dir;
    std::string backend = "auto";
    int device = 0;
    int max_streams = 0;
    int first_chunk_frames = qtts::FIRST_CHUNK_FRAMES_DEFAULT;
    int chunk_frames = qtts::CHUNK_FRAMES_DEFAULT;
    int frames = 75;           // the first of frames_cycle
    std::vector<int> frames_cycle = {75};  // request i: frames_cycle[i mod size]
    int sentences = 1;  // fixed sentences per request's text
    double timeout_s = 60.0;
    // closed loop
    std::vector<int> concurrency;
    long long requests = 0;  // 0: max(2c, 8)
    bool trace = false;      // each level's chunks (engine_trace) in the JSON
    // paced
    bool paced = false;
    double rate = 0.0;
    double duration_s = 0.0;
    bool poisson = true;
    double prebuffer_ms = 100.0;
    double period_ms = 20.0;
};

// A number option inside [lo, hi]; the message names the option and the range.
double option_number(const qtts_cli::Args& args, const char* name, double fallback, double lo, double hi) {
    const double v = args.get_double(name, fallback);
    if (!std::isfinite(v) || v < lo || v > hi)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--{} must be a number from {} to {}, got {}", name, lo, hi,
             args.get_or(name, ""));
    return v;
}
long long option_int(const qtts_cli::Args& args, const char* name, long long fallback, long long lo, long long hi) {
    const long long v = args.get_int(name, fallback);
    if (v < lo || v > hi) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--{} must be {}..{}, got {}", name, lo, hi, v);
    return v;
}

ServeOptions options_parse(const qtts_cli::Args& args) {
    ServeOptions o;
    o.backend = args.get_or("backend", "auto");
    if (o.backend != "auto" && o.backend != "cpu" && o.backend != "cpu-fast" && o.backend != "cuda")
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--backend expects auto, cpu, cpu-fast or cuda, got '{}'", o.backend);
    o.device = int(option_int(args, "device", 0, 0, 63));
    o.first_chunk_frames = int(option_int(args, "first-chunk-frames", o.first_chunk_frames, 1, 1000));
    o.chunk_frames = int(option_int(args, "chunk-frames", o.chunk_frames, 1, 1000));
    if (args.has("frames")) {
        std::string bad;
        o.frames_cycle.clear();
        if (!qtts::int_list_parse(args.get_or("frames", ""), 0, 100000, &o.frames_cycle, &bad) || o.frames_cycle.empty())
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--frames must be 0..100000 (or a list of such), got '{}'",
                 bad.empty() ? args.get_or("frames", "") : bad);
        o.frames = o.frames_cycle.front();
    }
    o.sentences = int(option_int(args, "sentences", o.sentences, 1, 16));
    o.timeout_s = option_number(args, "timeout-s", o.timeout_s, 0.1, 86400.0);
    o.paced = args.has("paced");
    o.trace = args.has("trace");
    if (o.paced) {
        for (const char* closed_only : {"concurrency", "requests", "trace"})
            if (args.has(closed_only))
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--{} is for closed-loop runs; --paced takes --rate and --duration",
                     closed_only);
        if (!args.has("rate") || !args.has("duration"))
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--paced needs --rate R (requests per second) and --duration S (seconds)");
        // Rates and durations must be positive: a zero rate never ends, a zero duration measures nothing.
        o.rate = args.get_double("rate", 0.0);
        if (!std::isfinite(o.rate) || o.rate <= 0.0 || o.rate > 10000.0)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--rate must be above 0 and at most 10000 requests per second, got {}",
                 args.get_or("rate", ""));
        o.duration_s = args.get_double("duration", 0.0);
        if (!std::isfinite(o.duration_s) || o.duration_s <= 0.0 || o.duration_s > 86400.0)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--duration must be above 0 and at most 86400 seconds, got {}",
                 args.get_or("duration", ""));
        const std::string arrivals = args.get_or("arrivals", "poisson");
        if (arrivals != "poisson" && arrivals != "fixed")
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--arrivals expects poisson or fixed, got '{}'", arrivals);
        o.poisson = arrivals == "poisson";
        if (o.rate * o.duration_s > 1e6)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--rate x --duration asks for {:.0f} requests; at most 1000000 per run",
                 o.rate * o.duration_s);
        o.prebuffer_ms = option_number(args, "prebuffer-ms", o.prebuffer_ms, 0.0, 60000.0);
        o.period_ms = option_number(args, "period-ms", o.period_ms, 1.0, 1000.0);
        o.max_streams = int(option_int(args, "max-streams", 64, 1, 4096));
    } else {
        for (const char* paced_only : {"rate", "duration", "arrivals", "prebuffer-ms", "period-ms"})
            if (args.has(paced_only))
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--{} is for paced runs (add --paced)", paced_only);
        o.concurrency = qtts_cli::bench_sizes(args.get_or("concurrency", "1,4,10,16,32,64"), "concurrency");
        if (args.has("requests")) o.requests = option_int(args, "requests", 0, 1, 1000000);
        const int largest = *std::max_element(o.concurrency.begin(), o.concurrency.end());
        o.max_streams = int(option_int(args, "max-streams", largest, 1, 4096));
    }
    return o;
}

qtts::SpeechRequest request_make(const ServeOptions& o, uint64_t index) {
    qtts::SpeechRequest r;
    const std::vector<std::string>& all = serve_sentences();
    for (int k = 0; k < o.sentences; ++k)
        r.text += (k > 0 ? " " : "") + all[(index + uint64_t(k)) % all.size()];
    r.language = "english";
    r.max_frames = o.frames_cycle[index % o.frames_cycle.size()];
    r.seed = 1000 + index;  // fixed per request: the same run makes the same audio
    return r;
}

// ---------------------------------------------------------------------------------------------
// Results of one request, and what a level reports from them
// ---------------------------------------------------------------------------------------------

struct RequestResult {
    bool done = false;         // it ran (admitted); false: refused or never tried
    bool busy = false;         // refused with ERROR_BUSY
    bool timed_out = false;    // no progress for --timeout-s: cancelled
    std::string error;         // refused for another reason, or failed after admission
    double ttfa_ms = -1.0;     // submit() called -> first PCM available
    double ttfa_gen_ms = -1.0;  // the engine's side: the stream made -> first PCM published (StreamMetrics)
    double e2e_ms = 0.0;       // submit() called -> last sample taken by the client
    double gap_ms = 0.0;       // the longest wait for audio after the first (a stall of this stream)
    double audio_s = 0.0;      // audio the client read
    double rtf = 0.0;          // engine: generation time / audio duration
    qtts::StopReason stop = qtts::StopReason::STOP_NONE;
    // paced players
    double play_start_ms = -1.0;  // submit() called -> the player's first period
    int64_t underruns = 0;        // periods that found less audio than they needed
    int64_t underrun_events = 0;  // runs of such periods in a row
    double underrun_ms = 0.0;     // silence the player had to make up
};

bool result_ok(const RequestResult& r) { return r.done && !r.timed_out && r.error.empty(); }

// Steps that advanced n streams together, n >= 2, between two snapshots (keys: n as text).
nlohmann::json histogram_delta(const qtts::EngineStats& before, const qtts::EngineStats& after) {
    nlohmann::json out = nlohmann::json::object();
    for (size_t n = 0; n < after.batch_histogram.size(); ++n) {
        const int64_t was = n < before.batch_histogram.size() ? before.batch_histogram[n] : 0;
        if (after.batch_histogram[n] - was > 0) out[std::to_string(n)] = after.batch_histogram[n] - was;
    }
    return out;
}

std::string histogram_text(const nlohmann::json& h) {
    if (h.empty()) return "none";
    std::string s;
    for (const auto& [n, steps] : h.items()) s += (s.empty() ? "" : " ") + n + ":" + std::to_string(steps.get<int64_t>());
    return s;
}

// The engine's own counts over a level or run: refusals by reason (refused_busy above counts
// both, as the clients saw them) and the underruns of its real-time listener model.
void engine_delta(const qtts::EngineStats& before, const qtts::EngineStats& after, nlohmann::json& out) {
    out["refused_capacity"] = after.refused_capacity - before.refused_capacity;
    out["refused_limit"] = after.refused_limit - before.refused_limit;
    out["engine_underruns"] = after.underruns - before.underruns;
    out["engine_underrun_s"] = after.underrun_seconds - before.underrun_seconds;
    out["prefill_slices"] = after.prefill_slices - before.prefill_slices;
    out["sliced_starts"] = after.sliced_starts - before.sliced_starts;
    const qtts::EngineStats::ThreadTime &a = after.thread_time, &b = before.thread_time;
    qtts::EngineStats::ThreadTime d;
    d.starts_s = a.starts_s - b.starts_s;
    d.first_steps_s = a.first_steps_s - b.first_steps_s;
    d.steps_s = a.steps_s - b.steps_s;
    d.service_s = a.service_s - b.service_s;
    d.idle_s = a.idle_s - b.idle_s;
    d.total_s = a.total_s - b.total_s;
    out["engine_thread_s"] = {{"starts", d.starts_s}, {"first_steps", d.first_steps_s}, {"steps", d.steps_s},
                              {"service", d.service_s}, {"idle", d.idle_s}, {"other", d.other_s()},
                              {"total", d.total_s}};
}

// The engine thread's time over a level or run, as shares of its wall time (engine_delta).
std::string thread_time_text(const nlohmann::json& t) {
    const double total = t["total"].get<double>();
    if (total <= 0.0) return "none";
    std::string s;
    for (const char* part : {"starts", "first_steps", "steps", "service", "idle", "other"})
        s += fmt::format("{}{} {:.1f}%", s.empty() ? "" : ", ", part, 100.0 * t[part].get<double>() / total);
    return s + fmt::format(" of {:.2f} s", total);
}

// What every mode reports about a set of requests.
nlohmann::json results_summary(const std::vector<RequestResult>& results) {
    std::vector<double> ttfa, ttfa_gen, e2e, rtf;
    double audio_s = 0.0;
    int64_t ok = 0, busy = 0, errors = 0, timeouts = 0, faster = 0;
    std::map<std::string, int64_t> stops;
    for (const RequestResult& r : results) {
        if (r.busy) ++busy;
        if (r.timed_out) ++timeouts;
        else if (!r.error.empty() && !r.busy) ++errors;
        if (!result_ok(r)) continue;
        ++ok;
        ttfa.push_back(r.ttfa_ms);
        if (r.ttfa_gen_ms >= 0) ttfa_gen.push_back(r.ttfa_gen_ms);
        e2e.push_back(r.e2e_ms);
        rtf.push_back(r.rtf);
        if (r.rtf < 1.0) ++faster;
        audio_s += r.audio_s;
        ++stops[qtts::stop_reason_name(r.stop)];
    }
    double rtf_mean = 0.0;
    for (const double x : rtf) rtf_mean += x / double(rtf.size());
    return {{"completed", ok},
            {"refused_busy", busy},
            {"errors", errors},
            {"timeouts", timeouts},
            {"ttfa_ms_p50", qtts_cli::bench_median(ttfa)},
            {"ttfa_ms_p95", qtts_cli::bench_percentile(ttfa, 95)},
            {"ttfa_ms_p99", qtts_cli::bench_percentile(ttfa, 99)},
            {"ttfa_ms_max", qtts_cli::bench_percentile(ttfa, 100)},
            // Engine side (the stream made in submit() -> first PCM published): the client's
            // TTFA less submit()'s own work before that and the client's wake-up after it.
            {"ttfa_gen_ms_p50", qtts_cli::bench_median(ttfa_gen)},
            {"ttfa_gen_ms_p95", qtts_cli::bench_percentile(ttfa_gen, 95)},
            {"e2e_ms_p50", qtts_cli::bench_median(e2e)},
            {"e2e_ms_p95", qtts_cli::bench_percentile(e2e, 95)},
            {"rtf_mean", rtf_mean},
            {"rtf_max", qtts_cli::bench_percentile(rtf, 100)},
            {"faster_than_realtime", ok > 0 ? double(faster) / double(ok) : 0.0},
            {"audio_s", audio_s},
            {"stop_reasons", stops}};
}

// The first error message among the results (for the closing line of a failed run).
std::string first_error(const std::vector<RequestResult>& results) {
    for (const RequestResult& r : results)
        if (!r.busy && !r.error.empty()) return r.error;
    return "";
}

// submit(), telling a refusal for being full (counted, part of the measurement) from other errors.
std::shared_ptr<qtts::Stream> submit_counted(qtts::Engine& engine, const qtts::SpeechRequest& request, RequestResult* r) {
    try {
        return engine.submit(request);
    } catch (const qtts::Error& e) {
        r->busy = e.code() == ErrorCode::ERROR_BUSY;
        r->error = e.what();
        return nullptr;
    }
}

// After the stream ended (or was cancelled): its engine-side numbers and how it ended.
void stream_close(const qtts::Stream& stream, RequestResult* r) {
    const qtts::StreamMetrics m = stream.metrics();
    r->rtf = m.rtf;
    r->ttfa_gen_ms = m.ttfa_gen_ms;
    r->stop = m.stop_reason;
    if (r->error.empty() && !stream.error().empty()) r->error = stream.error();
    if (r->error.empty() && !r->timed_out && m.stop_reason == qtts::StopReason::STOP_ERROR)
        r->error = "the stream ended with an error";
    r->done = true;
}

// ---------------------------------------------------------------------------------------------
// Closed loop
// ---------------------------------------------------------------------------------------------

// One request, read as fast as it comes on the calling thread.
RequestResult request_drain(qtts::Engine& engine, const qtts::SpeechRequest& request, double timeout_s) {
    RequestResult r;
    std::vector<float> buf(8192);
    const auto t0 = Clock::now();
    const auto stream = submit_counted(engine, request, &r);
    if (!stream) return r;
    int64_t samples = 0;
    auto last_progress = Clock::now();
    auto last_sample = last_progress;
    for (;;) {
        const size_t n = stream->read(buf.data(), buf.size());
        if (n > 0) {
            const auto now = Clock::now();
            if (r.ttfa_ms >= 0) r.gap_ms = std::max(r.gap_ms, ms_between(last_sample, now));
            last_sample = last_progress = now;
            if (r.ttfa_ms < 0) r.ttfa_ms = ms_between(t0, last_sample);
            samples += int64_t(n);
            continue;
        }
        if (stream->finished()) break;
        if (!stream->wait(std::chrono::milliseconds(50)) &&
            ms_between(last_progress, Clock::now()) > timeout_s * 1e3) {
            stream->cancel();
            r.timed_out = true;
            r.error = "no audio for " + std::to_string(timeout_s) + " s: cancelled";
            break;
        }
    }
    r.e2e_ms = ms_between(t0, last_sample);
    r.audio_s = double(samples) / qtts::SAMPLE_RATE;
    stream_close(*stream, &r);
    if (samples == 0 && r.error.empty()) r.error = "the stream ended without audio";
    return r;
}

nlohmann::json closed_level(qtts::Engine& engine, const ServeOptions& o, int concurrency, uint64_t* next_index) {
    const long long n = o.requests > 0 ? o.requests : std::max<long long>(2LL * concurrency, 8);
    if (n < concurrency)
        QTTS_LOG_WARN("bench-serve: {} requests at concurrency {}: only {} clients are ever busy", n, concurrency, n);
    std::vector<RequestResult> results(static_cast<size_t>(n));
    std::atomic<long long> taken{0};
    const uint64_t base = *next_index;
    *next_index += uint64_t(n);
    const qtts::EngineStats before = engine.stats();
    if (o.trace) engine_trace_start(engine, size_t(1) << 18);
    // Every client thread is made first and they start together at t0: c clients means c
    // requests at once, not a first wave spread over the time it takes to create the threads (on
    // the GPU machine 16 of 64 came after the engine had started the other 48's first chunks, and
    // that group stayed a round behind the rest for the whole level: bench-serve --trace).
    std::mutex gate_mutex;
    std::condition_variable gate;
    int ready = 0;
    bool open = false;
    std::vector<std::thread> clients;
    for (int c = 0; c < concurrency; ++c) {
        clients.emplace_back([&] {
            {
                std::unique_lock<std::mutex> lock(gate_mutex);
                ++ready;
                gate.notify_all();
                gate.wait(lock, [&] { return open; });
            }
            for (long long i = taken.fetch_add(1); i < n; i = taken.fetch_add(1)) {
                try {
                    results[size_t(i)] = request_drain(engine, request_make(o, base + uint64_t(i)), o.timeout_s);
                } catch (const std::exception& e) {  // not one the engine reports: counted, the level goes on
                    results[size_t(i)].error = e.what();
                }
                // A refused client waits a moment before its next request instead of spinning.
                if (results[size_t(i)].busy) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
        });
    }
    {
        std::unique_lock<std::mutex> lock(gate_mutex);
        gate.wait(lock, [&] { return ready == concurrency; });
        open = true;
    }
    const auto t0 = Clock::now();
    gate.notify_all();
    for (auto& t : clients) t.join();
    const double wall_s = ms_between(t0, Clock::now()) / 1e3;
    nlohmann::json level = results_summary(results);
    level["concurrency"] = concurrency;
    level["requests"] = n;
    level["wall_s"] = wall_s;
    level["requests_per_s"] = wall_s > 0 ? level["completed"].get<double>() / wall_s : 0.0;
    level["audio_s_per_wall_s"] = wall_s > 0 ? level["audio_s"].get<double>() / wall_s : 0.0;
    level["batch_histogram"] = histogram_delta(before, engine.stats());
    // Each request's longest wait for audio after its first: the reader takes audio as it comes,
    // so this is the engine's longest pause for that stream (another stream's whole prompt
    // prefill shows here; sliced starts bound it). Median over requests, and the longest of all.
    std::vector<double> gaps;
    for (const RequestResult& r : results)
        if (result_ok(r)) gaps.push_back(r.gap_ms);
    level["gap_ms_p50"] = qtts_cli::bench_median(gaps);
    level["gap_ms_max"] = qtts_cli::bench_percentile(gaps, 100);
    engine_delta(before, engine.stats(), level);
    if (const std::string e = first_error(results); !e.empty()) level["first_error"] = e;
    if (o.trace) {
        nlohmann::json chunks = nlohmann::json::array();
        for (const qtts::EngineTraceEntry& t : engine_trace_take(engine))
            chunks.push_back({t.round, t.stream_id, t.frames, t.batched, t.ended, t.step_frames});
        level["trace"] = std::move(chunks);
    }
    return level;
}

// ---------------------------------------------------------------------------------------------
// Paced players
// ---------------------------------------------------------------------------------------------

// A stream and its simulated player (apps/qtts/bench_player.h), advanced by the pacing thread.
struct Player {
    std::shared_ptr<qtts::Stream> stream;
    size_t index = 0;               // into the results
    Clock::time_point submitted;    // submit() called
    double submit_ms = 0.0;         // how long submit() took (validation on the caller's thread)
    qtts_cli::BenchPlayer sim;
    Clock::time_point last_progress;
    Clock::time_point last_sample;
};

struct PacedShared {
    std::mutex mutex;
    std::vector<Player> inbox;  // admitted streams the pacing thread has not taken yet
    bool arrivals_done = false;
};

// Reads what the stream has and plays up to `now`; true once the player is finished (played
// out, failed or timed out), with its result filled in.
bool player_tick(Player& p, const ServeOptions& o, Clock::time_point now, std::vector<float>& scratch,
                 RequestResult& r) {
    for (;;) {
        const size_t n = p.stream->read(scratch.data(), scratch.size());
        if (n == 0) break;
        p.sim.push(int64_t(n));
        p.last_progress = p.last_sample = now;
    }
    // Generation over and every sample read: what the player lacks from now on is the end of the
    // stream, not lateness.
    const bool ended = p.stream->finished();
    if (p.sim.advance(ms_between(p.submitted, now), ended)) {
        const qtts::StreamMetrics m = p.stream->metrics();
        if (m.ttfa_gen_ms >= 0) r.ttfa_ms = p.submit_ms + m.ttfa_gen_ms;
        r.e2e_ms = ms_between(p.submitted, p.last_sample);
        r.audio_s = double(p.sim.received) / qtts::SAMPLE_RATE;
        r.play_start_ms = p.sim.play_start_ms;
        r.underruns = p.sim.underruns;
        r.underrun_events = p.sim.underrun_events;
        r.underrun_ms = double(p.sim.underrun_samples) * 1e3 / qtts::SAMPLE_RATE;
        stream_close(*p.stream, &r);
        if (p.sim.received == 0 && r.error.empty()) r.error = "the stream ended without audio";
        return true;
    }
    if (!ended && ms_between(p.last_progress, now) > o.timeout_s * 1e3) {
        p.stream->cancel();
        r.timed_out = true;
        r.error = "no audio for " + std::to_string(o.timeout_s) + " s: cancelled";
        r.audio_s = double(p.sim.received) / qtts::SAMPLE_RATE;
        stream_close(*p.stream, &r);
        return true;
    }
    return false;
}

nlohmann::json paced_run(qtts::Engine& engine, const ServeOptions& o, uint64_t first_index) {
    // Arrival times, fixed before the run (a seeded Poisson process, or evenly spaced).
    std::vector<double> arrivals_s;
    std::mt19937_64 rng(42);
    std::exponential_distribution<double> gap(o.rate);
    for (double t = o.poisson ? gap(rng) : 0.0; t < o.duration_s; t += o.poisson ? gap(rng) : 1.0 / o.rate)
        arrivals_s.push_back(t);
    std::vector<RequestResult> results(arrivals_s.size());
    const int64_t per_period = std::max<int64_t>(1, std::llround(o.period_ms * qtts::SAMPLE_RATE / 1e3));
    const int64_t prebuffer = std::llround(o.prebuffer_ms * qtts::SAMPLE_RATE / 1e3);
    PacedShared shared;
    // Listeners playing at once (a stream's listener plays its audio for its whole duration, long
    // after the engine made it) and the engine's streams at once (generating or queued), each
    // sampled every period by the pacing thread.
    int64_t peak_players = 0;
    int64_t peak_engine_streams = 0;

    const qtts::EngineStats before = engine.stats();
    const auto t0 = Clock::now();
    // The pacing thread: every player, once per period, on absolute deadlines (no drift).
    std::exception_ptr pacer_error;  // set when the pacing thread fails; rethrown after the join
    std::thread pacer([&] {
        try {
            std::vector<Player> players;
            std::vector<float> scratch(16384);
            const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(o.period_ms));
            auto next = Clock::now();
            for (;;) {
                bool arrivals_done = false;
                {
                    std::lock_guard<std::mutex> lock(shared.mutex);
                    for (Player& p : shared.inbox) players.push_back(std::move(p));
                    shared.inbox.clear();
                    arrivals_done = shared.arrivals_done;
                }
                peak_players = std::max<int64_t>(peak_players, int64_t(players.size()));
                const qtts::EngineLoad load = engine.load();
                peak_engine_streams = std::max<int64_t>(peak_engine_streams, load.active + load.queued);
                const auto now = Clock::now();
                for (size_t i = 0; i < players.size();) {
                    if (player_tick(players[i], o, now, scratch, results[players[i].index])) {
                        if (i + 1 < players.size()) players[i] = std::move(players.back());
                        players.pop_back();
                    } else {
                        ++i;
                    }
                }
                if (arrivals_done && players.empty()) break;
                next += period;
                if (next < Clock::now()) next = Clock::now();  // fell behind: catch up, do not burst
                std::this_thread::sleep_until(next);
            }
        } catch (...) {
            pacer_error = std::current_exception();
        }
    });
    // Arrivals on this thread; whatever happens here, the pacing thread is told to finish and joined.
    const auto arrivals_finish = [&] {
        {
            std::lock_guard<std::mutex> lock(shared.mutex);
            shared.arrivals_done = true;
        }
        pacer.join();
    };
    try {
        for (size_t i = 0; i < arrivals_s.size(); ++i) {
            std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(arrivals_s[i])));
            Player p{nullptr, i, {}, 0.0, qtts_cli::BenchPlayer(prebuffer, per_period, o.period_ms), {}, {}};
            p.submitted = Clock::now();
            p.stream = submit_counted(engine, request_make(o, first_index + i), &results[i]);
            if (!p.stream) continue;
            const auto now = Clock::now();
            p.submit_ms = ms_between(p.submitted, now);
            p.last_progress = p.last_sample = now;
            std::lock_guard<std::mutex> lock(shared.mutex);
            shared.inbox.push_back(std::move(p));
        }
    } catch (...) {
        arrivals_finish();
        throw;
    }
    arrivals_finish();
    if (pacer_error) std::rethrow_exception(pacer_error);
    const double wall_s = ms_between(t0, Clock::now()) / 1e3;

    nlohmann::json run = results_summary(results);
    std::vector<double> play_start, underruns;
    int64_t with_underrun = 0, events = 0;
    double underrun_ms = 0.0, underrun_ms_max = 0.0;
    for (const RequestResult& r : results) {
        if (!result_ok(r)) continue;
        play_start.push_back(r.play_start_ms);
        underruns.push_back(double(r.underruns));
        if (r.underruns > 0) ++with_underrun;
        events += r.underrun_events;
        underrun_ms += r.underrun_ms;
        underrun_ms_max = std::max(underrun_ms_max, r.underrun_ms);
    }
    double underruns_total = 0.0;
    for (const double u : underruns) underruns_total += u;
    const int64_t ok = run["completed"].get<int64_t>();
    run["rate"] = o.rate;
    run["duration_s"] = o.duration_s;
    run["arrivals"] = o.poisson ? "poisson" : "fixed";
    run["requests"] = int64_t(arrivals_s.size());
    run["admitted"] = int64_t(arrivals_s.size()) - run["refused_busy"].get<int64_t>();
    run["prebuffer_ms"] = o.prebuffer_ms;
    run["period_ms"] = o.period_ms;
    run["play_start_ms_p50"] = qtts_cli::bench_median(play_start);
    run["play_start_ms_p95"] = qtts_cli::bench_percentile(play_start, 95);
    run["underruns"] = int64_t(underruns_total);
    run["underruns_per_stream"] = ok > 0 ? underruns_total / double(ok) : 0.0;
    run["underrun_events"] = events;
    run["streams_with_underrun"] = with_underrun;
    run["underrun_ms_total"] = underrun_ms;
    run["underrun_ms_max"] = underrun_ms_max;
    run["peak_listeners"] = peak_players;
    run["peak_engine_streams"] = peak_engine_streams;
    run["wall_s"] = wall_s;
    run["requests_per_s"] = wall_s > 0 ? double(ok) / wall_s : 0.0;
    run["audio_s_per_wall_s"] = wall_s > 0 ? run["audio_s"].get<double>() / wall_s : 0.0;
    run["batch_histogram"] = histogram_delta(before, engine.stats());
    engine_delta(before, engine.stats(), run);
    if (const std::string e = first_error(results); !e.empty()) run["first_error"] = e;
    nlohmann::json streams = nlohmann::json::array();
    for (const RequestResult& r : results) {
        if (!r.done) continue;
        streams.push_back({{"ttfa_ms", r.ttfa_ms}, {"play_start_ms", r.play_start_ms}, {"e2e_ms", r.e2e_ms},
                           {"audio_s", r.audio_s}, {"underruns", r.underruns},
                           {"underrun_events", r.underrun_events}, {"underrun_ms", r.underrun_ms},
                           {"rtf", r.rtf}, {"stop_reason", qtts::stop_reason_name(r.stop)}, {"error", r.error}});
    }
    run["streams"] = streams;
    return run;
}

// ---------------------------------------------------------------------------------------------
// The command
// ---------------------------------------------------------------------------------------------

int cmd_bench_serve(const std::vector<std::string>& argv) {
    const qtts_cli::Args args(argv,
                              {"model", "preset", "cache", "backend", "device", "max-streams", "first-chunk-frames",
                               "chunk-frames", "frames", "timeout-s", "json", "concurrency", "requests", "rate",
                               "duration", "arrivals", "prebuffer-ms", "period-ms", "admission", "gpu-memory-limit",
                               "max-context", "cpu-format", "threads", "sentences", "prefill-slice"},
                              {"help", "paced", "no-batching", "batch-exact", "trace"});
    if (args.has("help")) {
        usage();
        return 0;
    }
    if (!args.positional().empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unexpected argument '{}' (qtts bench-serve --help)", args.positional()[0]);
    ServeOptions o = options_parse(args);
    o.model_dir = qtts_cli::bench_model_dir(args);

    qtts::EngineOptions eo;
    eo.model_dir = o.model_dir;
    eo.backend.name = o.backend;
    eo.backend.device = o.device;
    eo.backend.cpu_format = args.get_or("cpu-format", eo.backend.cpu_format);  // checked by the engine's load
    eo.backend.threads = int(option_int(args, "threads", 0, 0, 1024));
    eo.max_streams = o.max_streams;
    eo.first_chunk_frames = o.first_chunk_frames;
    eo.chunk_frames = o.chunk_frames;
    eo.prefill_slice = int(args.get_int("prefill-slice", eo.prefill_slice));  // checked by the engine
    eo.backend.batching = !args.has("no-batching");
    eo.backend.batch_exact = args.has("batch-exact");
    eo.backend.gpu_memory_limit = qtts_cli::gpu_memory_limit_option(args);
    eo.backend.max_context = qtts_cli::max_context_option(args);
    const std::string admission = args.get_or("admission", "off");
    if (admission != "on" && admission != "off")
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--admission expects on or off, got '{}'", admission);
    eo.admission = admission == "on";
    const auto load0 = Clock::now();
    qtts::Engine engine(eo);
    const double load_s = ms_between(load0, Clock::now()) / 1e3;
    const std::string backend = engine.backend_name();
    const qtts::ModelInfo info = engine.model_info();

    nlohmann::json out;
    out["command"] = "bench-serve";
    out["mode"] = o.paced ? "paced" : "closed";
    out["model"] = o.model_dir;
    out["model_type"] = info.type;
    out["model_size"] = info.size;
    if (auto preset = args.get("preset")) out["preset"] = *preset;
    out["backend"] = backend;
    // The machine, so that a result file says where it was measured (device calls come on H100 or
    // H200 machines; ratios hold only within one).
    const bool on_gpu = backend.rfind("cuda", 0) == 0;
    const std::string machine = on_gpu ? qtts::cuda_describe(o.device)
                                       : fmt::format("cpu, {} hardware threads", std::thread::hardware_concurrency());
    out["device"] = machine;
    out["max_streams"] = o.max_streams;
    out["first_chunk_frames"] = o.first_chunk_frames;
    out["chunk_frames"] = o.chunk_frames;
    out["frames"] = o.frames;
    if (o.frames_cycle.size() > 1) out["frames_cycle"] = o.frames_cycle;
    out["sentences"] = o.sentences;
    out["prefill_slice"] = eo.prefill_slice;
    out["cpu_format"] = eo.backend.cpu_format;
    out["threads"] = eo.backend.threads;
    out["batching"] = eo.backend.batching;
    out["batch_exact"] = eo.backend.batch_exact;
    out["admission"] = eo.admission;
    out["load_s"] = load_s;

    std::printf("\nqtts bench-serve  %s (%s %s)  backend %s (%s)  max streams %d  chunks %d then %d  ",
                o.model_dir.c_str(), info.type.c_str(), info.size.c_str(), backend.c_str(), machine.c_str(),
                o.max_streams, o.first_chunk_frames, o.chunk_frames);
    if (o.frames_cycle.size() > 1) std::printf("frames per request by turn: %s\n", args.get_or("frames", "").c_str());
    else if (o.frames > 0) std::printf("%d frames (%.2f s) per request\n", o.frames, o.frames * 0.08);
    else std::printf("requests end at EOS or the frame budget\n");

    // Warm-up: one request, not counted (first-touch costs, lazy allocations).
    uint64_t next_index = 0;
    const RequestResult warm = request_drain(engine, request_make(o, next_index++), o.timeout_s);
    if (!result_ok(warm)) fail(ErrorCode::ERROR_INTERNAL, "the warm-up request failed: {}", warm.error);
    out["warm_up_ttfa_ms"] = warm.ttfa_ms;
    std::printf("  warm-up: time to first audio %.1f ms, %.2f s of audio in %.1f ms\n", warm.ttfa_ms, warm.audio_s,
                warm.e2e_ms);

    bool failed = false;
    std::string failure;
    if (!o.paced) {
        std::printf("  %5s %5s %5s %4s %4s  %-23s %-17s %-13s %5s %7s %9s  %s\n", "conc", "reqs", "ok", "busy", "err",
                    "TTFA p50/p95/p99 (ms)", "e2e p50/p95 (ms)", "RTF mean/max", "<RT", "req/s", "audio-s/s",
                    "batch steps (n:count)");
        nlohmann::json levels = nlohmann::json::array();
        for (const int c : o.concurrency) {
            nlohmann::json l = closed_level(engine, o, c, &next_index);
            const int64_t bad = l["errors"].get<int64_t>() + l["timeouts"].get<int64_t>();
            std::printf("  %5d %5lld %5lld %4lld %4lld  %6.1f/%6.1f/%7.1f   %7.0f/%7.0f   %5.3f/%5.3f %4.0f%% %7.2f %9.2f  %s\n", c,
                        l["requests"].get<long long>(), l["completed"].get<long long>(),
                        l["refused_busy"].get<long long>(), (long long)bad, l["ttfa_ms_p50"].get<double>(),
                        l["ttfa_ms_p95"].get<double>(), l["ttfa_ms_p99"].get<double>(), l["e2e_ms_p50"].get<double>(),
                        l["e2e_ms_p95"].get<double>(), l["rtf_mean"].get<double>(), l["rtf_max"].get<double>(),
                        100.0 * l["faster_than_realtime"].get<double>(), l["requests_per_s"].get<double>(),
                        l["audio_s_per_wall_s"].get<double>(), histogram_text(l["batch_histogram"]).c_str());
            std::printf("         engine thread: %s; engine-side TTFA p50/p95 %.1f / %.1f ms; longest wait for audio "
                        "p50/max %.0f / %.0f ms\n",
                        thread_time_text(l["engine_thread_s"]).c_str(), l["ttfa_gen_ms_p50"].get<double>(),
                        l["ttfa_gen_ms_p95"].get<double>(), l["gap_ms_p50"].get<double>(),
                        l["gap_ms_max"].get<double>());
            std::fflush(stdout);
            if (bad > 0 && !failed) {
                failed = true;
                failure = l.value("first_error", std::string());
            }
            levels.push_back(std::move(l));
        }
        out["levels"] = levels;
    } else {
        nlohmann::json run = paced_run(engine, o, next_index);
        const int64_t bad = run["errors"].get<int64_t>() + run["timeouts"].get<int64_t>();
        std::printf("  paced: %g requests/s (%s arrivals) for %g s; players prebuffer %.0f ms, take %.0f ms every %.0f ms\n",
                    o.rate, o.poisson ? "poisson" : "fixed", o.duration_s, o.prebuffer_ms, o.period_ms, o.period_ms);
        std::printf("  requests %lld: admitted %lld, refused (busy) %lld, errors %lld; at most %lld streams in the engine "
                    "and %lld listeners playing at once\n",
                    run["requests"].get<long long>(), run["admitted"].get<long long>(),
                    run["refused_busy"].get<long long>(), (long long)bad, run["peak_engine_streams"].get<long long>(),
                    run["peak_listeners"].get<long long>());
        std::printf("  time to first audio p50/p95/p99 %.1f / %.1f / %.1f ms; playback starts p50/p95 %.1f / %.1f ms\n",
                    run["ttfa_ms_p50"].get<double>(), run["ttfa_ms_p95"].get<double>(), run["ttfa_ms_p99"].get<double>(),
                    run["play_start_ms_p50"].get<double>(), run["play_start_ms_p95"].get<double>());
        std::printf("  underruns: %lld short periods (%.2f per stream) in %lld gaps; streams with any %lld of %lld; "
                    "silence %.0f ms (max %.0f in one stream)\n",
                    run["underruns"].get<long long>(), run["underruns_per_stream"].get<double>(),
                    run["underrun_events"].get<long long>(),
                    run["streams_with_underrun"].get<long long>(), run["completed"].get<long long>(),
                    run["underrun_ms_total"].get<double>(), run["underrun_ms_max"].get<double>());
        std::printf("  RTF mean/max %.3f / %.3f; %.2f requests/s, %.2f audio-s per wall-s; batch steps %s\n",
                    run["rtf_mean"].get<double>(), run["rtf_max"].get<double>(), run["requests_per_s"].get<double>(),
                    run["audio_s_per_wall_s"].get<double>(), histogram_text(run["batch_histogram"]).c_str());
        std::printf("  engine thread: %s\n", thread_time_text(run["engine_thread_s"]).c_str());
        if (bad > 0) {
            failed = true;
            failure = run.value("first_error", std::string());
        }
        out["paced"] = run;
    }

    // Device memory while the engine still holds its states (whole device: other processes count).
    if (on_gpu && qtts::cuda_device_count() > 0) {
        const qtts::DeviceMemory mem = qtts::cuda_memory(o.device);
        out["gpu_memory"] = {{"device", o.device}, {"used_bytes", mem.used_bytes}, {"total_bytes", mem.total_bytes}};
        std::printf("  GPU %d memory: %.2f of %.2f GiB in use\n", o.device, mem.used_bytes / 1073741824.0,
                    mem.total_bytes / 1073741824.0);
    } else {
        out["gpu_memory"] = nullptr;
    }
    if (auto path = args.get("json")) qtts_cli::bench_json_write(*path, out);
    if (failed) {
        std::fprintf(stderr, "qtts bench-serve: some requests failed or timed out (first: %s)\n", failure.c_str());
        return 1;
    }
    return 0;
}

}  // namespace

QTTS_COMMAND("bench-serve", "serving benchmark: closed-loop concurrency levels or real-time paced players", cmd_bench_serve);
