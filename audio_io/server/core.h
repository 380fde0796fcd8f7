// Internals of the network server (audio_io/http_server.h), shared by its source files:
// the state every connection sees (ServerCore), the audio formatters, and the pump threads that
// read engine streams and hand encoded audio to the connections.
//
// Threading model:
//  - Asio I/O threads run the sockets; every connection lives on its own strand, so a session's
//    members are touched by one handler at a time.
//  - One pump thread per active stream: it blocks in Stream::wait (never on an I/O thread, never
//    on the engine thread), reads PCM with Stream::read (the single consumer), encodes it and
//    posts the bytes to the connection's strand through PumpSink.
//  - Backpressure: the sink reports how many bytes are queued on its socket; past
//    ServerOptions::max_backlog_bytes the pump cancels the stream and the connection is dropped,
//    so a client that stops reading costs a bounded amount of memory.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json_fwd.hpp>

#include "audio_io/server/server.h"
#include "audio_io/opus_encoder.h"
#include "audio_io/pcm_format.h"
#include "audio_io/server/metrics.h"
#include "audio_io/server/request_params.h"
#include "audio_io/server/speech_service.h"

namespace qtts::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;
using Request = http::request<http::string_body>;

extern const char* const kServerName;  // "qtts/<version>" for Server headers

double seconds_since(Clock::time_point t);
const char* stop_reason_text(StopReason reason);  // "eos", "frame_budget", ...
std::string base64_encode(const std::string& bytes);

// Holds one unit of a ServerCore counter while it lives; moves, releases once.
class CounterHold {
public:
    CounterHold() = default;
    explicit CounterHold(std::atomic<int64_t>& counter) : counter_(&counter) { counter.fetch_add(1); }
    CounterHold(CounterHold&& other) noexcept : counter_(other.counter_) { other.counter_ = nullptr; }
    CounterHold& operator=(CounterHold&& other) noexcept {
        if (this != &other) {
            release();
            counter_ = other.counter_;
            other.counter_ = nullptr;
        }
        return *this;
    }
    CounterHold(const CounterHold&) = delete;
    CounterHold& operator=(const CounterHold&) = delete;
    ~CounterHold() { release(); }

    void release() {
        if (counter_) counter_->fetch_sub(1);
        counter_ = nullptr;
    }

private:
    std::atomic<int64_t>* counter_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Audio formatting: PCM in, the byte pieces a connection sends out. A piece is one WebSocket
// binary message; HTTP and TCP simply concatenate the pieces.
// ---------------------------------------------------------------------------------------------
struct AudioPiece {
    std::string bytes;
    // Utterance samples a client can decode from every piece up to and including this one (so a
    // connection that drops the pieces after it can report exactly what it sent).
    int64_t samples_end = 0;
};

class AudioFormatter {
public:
    virtual ~AudioFormatter() = default;
    virtual void start(std::vector<AudioPiece>& out) = 0;  // container headers, if any
    virtual void write(const float* pcm, size_t n, std::vector<AudioPiece>& out) = 0;
    virtual void finish(std::vector<AudioPiece>& out) = 0;
    virtual int pre_skip() const { return 0; }  // raw Opus packets: decoder delay at 24 kHz
};

// AUDIO_FORMAT_WAV streams a header with unknown sizes; whole-file responses patch it (see
// wav_header_patch).
std::unique_ptr<AudioFormatter> audio_formatter_create(AudioFormat format, const OpusEncoderOptions& opus);
// Rewrites the 44-byte header at the start of a complete WAV body with its real sizes.
void wav_header_patch(std::string& body);

// ---------------------------------------------------------------------------------------------
// Pumps
// ---------------------------------------------------------------------------------------------
struct StreamOutcome {
    StreamMetrics metrics;
    std::string error;         // the engine's error (empty when none)
    bool cancelled = false;    // by the client (cancel message or disconnect) or server stop
    bool slow_client = false;  // the connection's backlog passed the limit
    int64_t samples = 0;       // PCM samples read from the stream and encoded
    int64_t stalls = 0;        // times the audio read so far fell behind the wall clock since the
                               // first audio (a listener playing from the first chunk would
                               // have run dry) before generation ended
    bool server_stop = false;  // cut by the server stopping (stop(), or a drain past its deadline)
    // Counts this stream in ServerCore::terminals_pending until the connection has sent its
    // terminal message (or is gone): stop() waits for that before it stops the I/O threads.
    CounterHold terminal;
};

// The connection side of a stream. Called on the pump thread; implementations only post work
// to their strand and read atomics.
class PumpSink {
public:
    virtual ~PumpSink() = default;
    // pieces hold `bytes` bytes of encoded audio covering `samples` new PCM samples. The pump
    // has already added `bytes` to the backlog the sink reports.
    virtual void pump_audio(std::vector<AudioPiece> pieces, size_t bytes, int64_t samples) = 0;
    virtual void pump_end(StreamOutcome outcome) = 0;
    virtual bool pump_abandoned() const = 0;  // stop: the client went away or cancelled
    virtual std::atomic<size_t>& pump_backlog() = 0;  // bytes queued, not yet on the socket
};

// The PumpSink half every session shares: the pump thread's calls hop onto the session's strand,
// where Session::audio_on / Session::end_on run (sessions befriend this class for them). Also
// holds the strand and the backlog counter.
template <class Session>
class StrandPumpSink : public PumpSink {
public:
    explicit StrandPumpSink(boost::asio::any_io_executor strand) : executor_(std::move(strand)) {}

    void pump_audio(std::vector<AudioPiece> pieces, size_t bytes, int64_t samples) override {
        boost::asio::post(executor_, [self = session_shared(), pieces = std::move(pieces), bytes, samples]() mutable {
            self->audio_on(std::move(pieces), bytes, samples);
        });
    }
    void pump_end(StreamOutcome outcome) override {
        boost::asio::post(executor_, [self = session_shared(), outcome = std::move(outcome)]() mutable {
            self->end_on(std::move(outcome));
        });
    }
    std::atomic<size_t>& pump_backlog() override { return backlog_; }

protected:
    const boost::asio::any_io_executor executor_;  // the connection's strand (also used by the pump thread)
    std::atomic<size_t> backlog_{0};               // bytes queued for the socket, not yet written

private:
    std::shared_ptr<Session> session_shared() { return static_cast<Session*>(this)->shared_from_this(); }
};

struct PumpJob {
    std::shared_ptr<Stream> stream;
    std::unique_ptr<AudioFormatter> formatter;
    std::shared_ptr<PumpSink> sink;
};

struct ServerCore;

// A fixed set of threads, one per stream slot: an admitted stream always finds a free thread.
class PumpPool {
public:
    PumpPool(ServerCore& core, int threads);
    ~PumpPool();
    void job_add(PumpJob job);
    void stop();  // running jobs see core.stopping, cancel their streams and end; joins

private:
    void worker_run();
    void job_run(PumpJob& job);
    void job_abandon(PumpJob& job);  // cancel, release the slot, tell the sink

    ServerCore& core_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<PumpJob> jobs_;
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

// ---------------------------------------------------------------------------------------------
// Shared server state
// ---------------------------------------------------------------------------------------------
struct ServerCore {
    ServerCore(SpeechService& service, const ServerOptions& options);

    SpeechService& service;
    const ServerOptions options;
    SpeechLimits limits;
    OpusEncoderOptions opus;
    ServerMetrics metrics;
    std::atomic<int64_t> active_streams{0};
    std::atomic<int64_t> connections{0};
    std::atomic<int64_t> terminals_pending{0};  // see StreamOutcome::terminal
    std::atomic<bool> draining{false};  // no new streams; running ones finish (HttpServer::drain)
    std::atomic<bool> stopping{false};
    std::unique_ptr<PumpPool> pumps;
    // Declared last so it is destroyed first: destroying it destroys the handlers still queued,
    // which own sessions, whose destructors use the members above.
    net::io_context ioc;

    // Server-wide limits that travel in the engine request (the audio length cap).
    void request_limits_apply(SpeechRequest& request) const;
    bool stream_slot_acquire();  // false at max_streams
    void stream_slot_release();
    MetricGauges gauges() const;
    // The GET /healthz body: overall status (`unready`, or "ok"), model, backend, streams, and
    // one entry per engine of the service (its state, load and counters).
    std::string health_body(const std::string& unready) const;
    // Why the server takes no new streams now: "loading" (the service is not ready), "draining"
    // or "stopping"; empty when it does. The readiness endpoint reports the same.
    std::string unready_reason() const;
    // The 503 a new speech request gets while unready_reason() is not empty.
    RequestError unready_error(const std::string& reason) const;
};

// Counts an open connection for ServerOptions::max_connections; moves with the socket.
class ConnectionSlot : public CounterHold {
public:
    ConnectionSlot() = default;
    explicit ConnectionSlot(ServerCore& core) : CounterHold(core.connections) {}
};

// The `done` metrics shared by WebSocket events and SSE.
nlohmann::json outcome_json(const StreamOutcome& outcome, double ttfa_seconds);
// Maps a submit() (or Stream call) failure to a RequestError: its kind from request_error_kind,
// or from the service's busy/unavailable errors.
RequestError submit_error_map(const std::exception& e);
// The `code` of the error body for a submit refusal: "max_streams" or "capacity" for a busy
// service (ServiceBusyError), empty otherwise.
std::string submit_error_code(const std::exception& e);
// The qtts_errors_total type of a refused request: busy, unavailable, internal, too_large or bad_request.
const char* request_error_metric(const RequestError& e);

// Session entry points (each in its own source file).
void http_session_run(ServerCore& core, tcp::socket socket, ConnectionSlot slot);
// The HTTP session hands over an upgrade request it has read. (A client sends no WebSocket frame
// before the 101 response, so no bytes beyond the request need to move along.)
void ws_session_run(ServerCore& core, tcp::socket socket, ConnectionSlot slot, Request request);
void tcp_session_run(ServerCore& core, tcp::socket socket, ConnectionSlot slot);

}  // namespace qtts::server
