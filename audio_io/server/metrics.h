// Counters, gauges and histograms of the network server, rendered in the Prometheus text
// exposition format (version 0.0.4) for GET /metrics.
//
// Thread safety: every method may be called from any thread (one mutex; the server updates a
// handful of values per request, far from contention).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts {

// A cumulative histogram with fixed upper bounds (the +Inf bucket is implicit).
class MetricHistogram {
public:
    explicit MetricHistogram(std::vector<double> upper_bounds);
    void observe(double value);
    // Appends "# TYPE", the _bucket lines (cumulative, le="..."), _sum and _count.
    void render(const std::string& name, const std::string& help, std::string& out) const;
    uint64_t count() const { return count_; }

private:
    std::vector<double> bounds_;
    std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
    double sum_ = 0.0;
    uint64_t count_ = 0;
};

// What one finished stream contributes to the metrics.
struct StreamReport {
    double audio_seconds = 0.0;
    double rtf = 0.0;        // generation time / audio duration (<= 0: unknown)
    int64_t stalls = 0;      // the stream fell behind real time (see StreamOutcome::stalls)
    bool completed = false;  // ended by the engine (EOS / budget), not by a cancel or an error
    bool cancelled = false;  // the client cancelled or went away
    bool failed = false;     // the engine reported an error
};

// Values owned elsewhere, sampled when /metrics is rendered.
struct MetricGauges {
    int64_t active_streams = 0;
    int64_t max_streams = 0;
    int64_t connections = 0;
    std::vector<EngineStatus> engines;  // rendered with an engine="<label>" label each
};

class ServerMetrics {
public:
    ServerMetrics();

    // endpoint: speech, voices, livez, readyz, healthz, metrics, page, websocket, tcp, other. status: the HTTP status
    // (101 for an accepted WebSocket, 200/4xx for TCP's outcome).
    void request_count(const std::string& endpoint, int status);
    // type: bad_request, busy, too_large, timeout, disconnect, slow_client, stream_error,
    // internal, connection_limit, unavailable (loading, draining or stopping).
    void error_count(const std::string& type);
    void ttfa_observe(double seconds);
    void stream_started();
    void stream_finished(const StreamReport& report);

    std::string prometheus_text(const MetricGauges& gauges) const;

    // For tests and /healthz.
    uint64_t errors(const std::string& type) const;
    uint64_t requests(const std::string& endpoint, int status) const;

private:
    mutable std::mutex mutex_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;
    std::map<std::string, uint64_t> errors_;
    uint64_t streams_started_ = 0;
    uint64_t streams_completed_ = 0;
    uint64_t streams_cancelled_ = 0;
    uint64_t streams_failed_ = 0;
    uint64_t stalls_ = 0;
    double audio_seconds_ = 0.0;
    MetricHistogram ttfa_;
    MetricHistogram rtf_;
};

}  // namespace qtts
