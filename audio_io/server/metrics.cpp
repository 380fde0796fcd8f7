#include "audio_io/server/metrics.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include <fmt/format.h>

namespace qtts {

namespace {

// Prometheus floats: shortest round-trip text, "+Inf" for infinity.
std::string number_text(double v) {
    if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
    if (std::isnan(v)) return "NaN";
    return fmt::format("{}", v);
}

void header_append(std::string& out, const std::string& name, const char* type, const std::string& help) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

// One family per quantity, one line per engine (label `engine`: "cuda:0", "cpu#1"). The engines'
// own values: the server-wide families above do not depend on them.
void engines_render(const std::vector<EngineStatus>& engines, std::string& out) {
    const auto family = [&](const char* name, const char* type, const char* help, auto value) {
        header_append(out, name, type, help);
        for (const EngineStatus& e : engines) out += fmt::format("{}{{engine=\"{}\"}} {}\n", name, e.label, value(e));
    };
    header_append(out, "qtts_engine_up", "gauge", "Whether the engine takes new streams (0: failed, or left out at start-up).");
    for (const EngineStatus& e : engines)
        out += fmt::format("qtts_engine_up{{engine=\"{}\",backend=\"{}\",state=\"{}\"}} {}\n", e.label, e.backend,
                           engine_state_name(e.state), e.state == EngineState::ENGINE_STATE_SERVING ? 1 : 0);
    family("qtts_engine_active_streams", "gauge", "Streams the engine is generating.",
           [](const EngineStatus& e) { return e.load.active; });
    family("qtts_engine_queued_streams", "gauge", "Streams accepted by the engine, not yet started by its thread.",
           [](const EngineStatus& e) { return e.load.queued; });
    family("qtts_engine_real_time_factor", "gauge",
           "The engine's recent real-time factor (round time / audio per stream; above 1 its streams fall behind; 0 idle).",
           [](const EngineStatus& e) { return number_text(e.load.rtf); });
    family("qtts_engine_requests_total", "counter", "Requests routed to the engine and accepted by it.",
           [](const EngineStatus& e) { return e.routed; });
    header_append(out, "qtts_engine_streams_total", "counter", "Streams the engine ended, by outcome.");
    for (const EngineStatus& e : engines) {
        out += fmt::format("qtts_engine_streams_total{{engine=\"{}\",outcome=\"completed\"}} {}\n", e.label, e.stats.completed);
        out += fmt::format("qtts_engine_streams_total{{engine=\"{}\",outcome=\"cancelled\"}} {}\n", e.label, e.stats.cancelled);
        out += fmt::format("qtts_engine_streams_total{{engine=\"{}\",outcome=\"failed\"}} {}\n", e.label, e.stats.errors);
    }
    family("qtts_engine_audio_seconds_total", "counter", "Seconds of audio the engine generated.",
           [](const EngineStatus& e) { return number_text(e.stats.audio_seconds); });
    family("qtts_engine_batch_decoded_chunks_total", "counter",
           "Stream chunks whose audio came out of a batched speech-decoder pass (CUDA).",
           [](const EngineStatus& e) { return e.stats.batch_decoded_chunks; });
    family("qtts_engine_batch_overlapped_chunks_total", "counter",
           "Of those, chunks whose decoder pass ran beside the engine's next step (CUDA).",
           [](const EngineStatus& e) { return e.stats.batch_overlapped_chunks; });
    family("qtts_engine_batch_started_total", "counter",
           "Streams whose prompt prefill ran in a pass shared with other new streams (CUDA).",
           [](const EngineStatus& e) { return e.stats.batch_started; });
    family("qtts_engine_prefill_slices_total", "counter",
           "Slices of long prompt prefills run between other streams' steps (sliced starts, cpu-fast).",
           [](const EngineStatus& e) { return e.stats.prefill_slices; });
    family("qtts_engine_sliced_starts_total", "counter",
           "Segment starts whose prompt prefill ran in slices while other streams played (cpu-fast).",
           [](const EngineStatus& e) { return e.stats.sliced_starts; });
    header_append(out, "qtts_engine_refused_total", "counter",
                  "New streams the engine refused (429): at its stream limit, or by admission control (capacity).");
    for (const EngineStatus& e : engines) {
        out += fmt::format("qtts_engine_refused_total{{engine=\"{}\",reason=\"max_streams\"}} {}\n", e.label, e.stats.refused_limit);
        out += fmt::format("qtts_engine_refused_total{{engine=\"{}\",reason=\"capacity\"}} {}\n", e.label, e.stats.refused_capacity);
    }
    family("qtts_engine_capacity_streams", "gauge",
           "Streams the engine sustains at real time, measured from its recent rounds (0: not measured yet).",
           [](const EngineStatus& e) { return number_text(e.stats.capacity); });
    family("qtts_engine_batch_size", "gauge", "Streams in the batched LM step of the engine's last round (0: none).",
           [](const EngineStatus& e) { return e.stats.batch_size; });
    family("qtts_engine_queue_depth", "gauge",
           "Streams submitted whose first chunk is not made yet (queued, or taken in and not served; not those waiting for text).",
           [](const EngineStatus& e) { return e.stats.queue_depth; });
    family("qtts_engine_stream_lag_max_seconds", "gauge",
           "Largest lag behind real time over the engine's active streams: seconds a listener playing from the first audio "
           "spent dry, plus the current gap.",
           [](const EngineStatus& e) { return number_text(e.stats.lag_max_s); });
    family("qtts_engine_stream_lag_mean_seconds", "gauge", "Mean lag behind real time over the engine's active streams that have audio.",
           [](const EngineStatus& e) { return number_text(e.stats.lag_mean_s); });
    family("qtts_engine_underruns_total", "counter",
           "Chunks published after a real-time listener (no prebuffer) would have run dry, waits for text or reader excluded.",
           [](const EngineStatus& e) { return e.stats.underruns; });
    family("qtts_engine_underrun_seconds_total", "counter", "Seconds those listeners spent dry.",
           [](const EngineStatus& e) { return number_text(e.stats.underrun_seconds); });
    family("qtts_engine_lagged_streams_total", "counter", "Streams that ended having underrun at least once.",
           [](const EngineStatus& e) { return e.stats.streams_lagged; });
    header_append(out, "qtts_engine_thread_seconds_total", "counter",
                  "Wall time of the engine thread, by what it did: batched starts and first chunks of new streams, batched "
                  "steady steps, per-stream passes, waiting for work, and the rest (its rounds' bookkeeping).");
    for (const EngineStatus& e : engines) {
        const EngineStats::ThreadTime& t = e.stats.thread_time;
        const std::pair<const char*, double> parts[] = {{"starts", t.starts_s}, {"first_steps", t.first_steps_s},
                                                        {"steps", t.steps_s},   {"service", t.service_s},
                                                        {"idle", t.idle_s},     {"other", t.other_s()}};
        for (const auto& [part, seconds] : parts)
            out += fmt::format("qtts_engine_thread_seconds_total{{engine=\"{}\",part=\"{}\"}} {}\n", e.label, part,
                               number_text(seconds));
    }
    header_append(out, "qtts_engine_batched_steps_total", "counter",
                  "Batched LM steps (CUDA), by the number of streams they advanced together.");
    for (const EngineStatus& e : engines)
        for (size_t n = 2; n < e.stats.batch_histogram.size(); ++n)
            if (e.stats.batch_histogram[n] > 0)
                out += fmt::format("qtts_engine_batched_steps_total{{engine=\"{}\",streams=\"{}\"}} {}\n", e.label, n,
                                   e.stats.batch_histogram[n]);
}

}  // namespace

MetricHistogram::MetricHistogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void MetricHistogram::observe(double value) {
    size_t i = 0;
    while (i < bounds_.size() && value > bounds_[i]) ++i;
    ++counts_[i];
    sum_ += value;
    ++count_;
}

void MetricHistogram::render(const std::string& name, const std::string& help, std::string& out) const {
    header_append(out, name, "histogram", help);
    uint64_t cumulative = 0;
    for (size_t i = 0; i < bounds_.size(); ++i) {
        cumulative += counts_[i];
        out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, number_text(bounds_[i]), cumulative);
    }
    cumulative += counts_.back();
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, cumulative);
    out += fmt::format("{}_sum {}\n{}_count {}\n", name, number_text(sum_), name, count_);
}

ServerMetrics::ServerMetrics()
    : ttfa_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0}),
      rtf_({0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0}) {}

void ServerMetrics::request_count(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++requests_[{endpoint, status}];
}

void ServerMetrics::error_count(const std::string& type) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++errors_[type];
}

void ServerMetrics::ttfa_observe(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    ttfa_.observe(seconds);
}

void ServerMetrics::stream_started() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++streams_started_;
}

void ServerMetrics::stream_finished(const StreamReport& r) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (r.completed) ++streams_completed_;
    if (r.cancelled) ++streams_cancelled_;
    if (r.failed) ++streams_failed_;
    stalls_ += uint64_t(std::max<int64_t>(0, r.stalls));
    audio_seconds_ += r.audio_seconds;
    if (r.completed && r.rtf > 0.0) rtf_.observe(r.rtf);
}

uint64_t ServerMetrics::errors(const std::string& type) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = errors_.find(type);
    return it == errors_.end() ? 0 : it->second;
}

uint64_t ServerMetrics::requests(const std::string& endpoint, int status) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = requests_.find({endpoint, status});
    return it == requests_.end() ? 0 : it->second;
}

std::string ServerMetrics::prometheus_text(const MetricGauges& g) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string out;
    out.reserve(4096);
    header_append(out, "qtts_requests_total", "counter", "Requests handled, by endpoint and status code.");
    for (const auto& [key, n] : requests_)
        out += fmt::format("qtts_requests_total{{endpoint=\"{}\",code=\"{}\"}} {}\n", key.first, key.second, n);
    header_append(out, "qtts_errors_total", "counter", "Errors, by type.");
    for (const auto& [type, n] : errors_) out += fmt::format("qtts_errors_total{{type=\"{}\"}} {}\n", type, n);

    header_append(out, "qtts_active_streams", "gauge", "Speech streams being generated or sent now.");
    out += fmt::format("qtts_active_streams {}\n", g.active_streams);
    header_append(out, "qtts_max_streams", "gauge", "Concurrent stream limit (more are refused with 429).");
    out += fmt::format("qtts_max_streams {}\n", g.max_streams);
    header_append(out, "qtts_connections", "gauge", "Open client connections (HTTP, WebSocket and TCP).");
    out += fmt::format("qtts_connections {}\n", g.connections);

    header_append(out, "qtts_streams_started_total", "counter", "Speech streams started.");
    out += fmt::format("qtts_streams_started_total {}\n", streams_started_);
    header_append(out, "qtts_streams_completed_total", "counter", "Speech streams that ran to their end.");
    out += fmt::format("qtts_streams_completed_total {}\n", streams_completed_);
    header_append(out, "qtts_streams_cancelled_total", "counter", "Speech streams cancelled by the client or a disconnect.");
    out += fmt::format("qtts_streams_cancelled_total {}\n", streams_cancelled_);
    header_append(out, "qtts_streams_failed_total", "counter", "Speech streams that failed inside the engine.");
    out += fmt::format("qtts_streams_failed_total {}\n", streams_failed_);
    header_append(out, "qtts_stream_stalls_total", "counter",
                  "Times a stream fell behind real time: a listener playing from the first audio would have run dry.");
    out += fmt::format("qtts_stream_stalls_total {}\n", stalls_);
    header_append(out, "qtts_audio_seconds_total", "counter", "Seconds of audio generated.");
    out += fmt::format("qtts_audio_seconds_total {}\n", number_text(audio_seconds_));

    ttfa_.render("qtts_ttfa_seconds",
                 "Time to first audio: request received to the first audio bytes queued on the socket.", out);
    rtf_.render("qtts_real_time_factor", "Generation time divided by audio duration, per completed stream.", out);
    if (!g.engines.empty()) engines_render(g.engines, out);
    return out;
}

}  // namespace qtts
