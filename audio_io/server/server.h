// The qtts network server: an OpenAI-compatible HTTP API, a WebSocket streaming API and an
// optional plain TCP mode, all on Boost.Beast/Asio, serving any SpeechService (a qtts::Engine in
// `qtts serve`, a scripted source in tests). API reference: docs/server.md.
//
// Threads: `io_threads` Asio threads run every socket (each connection on its own strand); each
// active stream is read by one pump thread (Stream::wait/read) that encodes the audio and hands
// it to the connection's strand. Nothing here ever runs on, or blocks, the engine thread.
//
// Thread safety: start/stop from one controlling thread; the accessors from any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "audio_io/server/metrics.h"
#include "audio_io/server/speech_service.h"

namespace qtts {

struct ServerOptions {
    std::string host = "127.0.0.1";  // listen address (HTTP and TCP); 0.0.0.0 to serve the network
    int port = 8080;                 // HTTP + WebSocket port; 0 = pick a free port (see port())
    int tcp_port = -1;               // plain TCP mode: -1 = off, 0 = pick a free port
    int io_threads = 2;              // Asio threads
    int max_streams = 16;            // concurrent speech streams; more get 429
    int max_connections = 256;       // open sockets; more get 503 and are closed
    int bitrate = 32000;             // Opus bits per second
    int opus_complexity = 6;         // Opus encoder complexity 0..10

    size_t max_body_bytes = 64 * 1024;       // HTTP request body (413 beyond)
    size_t max_header_bytes = 16 * 1024;     // HTTP request header block (431 beyond)
    size_t max_text_bytes = 8 * 1024;        // `input` / appended text per utterance (UTF-8 bytes)
    size_t max_ws_message_bytes = 64 * 1024; // one WebSocket message from the client
    size_t max_backlog_bytes = 4 * 1024 * 1024;  // encoded audio queued for one connection; a
                                                 // client that reads slower is disconnected
    double max_audio_seconds = 0.0;  // cap on one request's audio (rounded up to 80 ms frames);
                                     // 0 = the engine's own frame budget (scales with the text)

    std::chrono::milliseconds idle_timeout{30000};   // no request / message / line for this long
    std::chrono::milliseconds send_timeout{15000};   // one socket write pending this long
    std::chrono::milliseconds cancel_grace{2000};    // after cancel, wait this long for the engine to end it

    int socket_send_buffer_bytes = 0;  // SO_SNDBUF for accepted sockets; 0 = the OS default
};

// Throws qtts::Error (ERROR_INVALID_ARGUMENT) naming the bad field and the accepted range.
void server_options_validate(const ServerOptions& options);

// What a drain did (HttpServer::drain).
struct DrainReport {
    int64_t running = 0;   // streams running when the drain began
    int64_t finished = 0;  // of those, streams that ended before the deadline (any reason)
    int64_t cut = 0;       // streams still running at the deadline, ended by the server
    double seconds = 0.0;  // how long the drain took, stop included
};

class HttpServer {
public:
    HttpServer(SpeechService& service, const ServerOptions& options);
    ~HttpServer();  // stops
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds the ports and starts the threads; throws qtts::Error (ERROR_IO) when a port cannot be
    // bound. Returns once the server accepts connections.
    void start();
    // Cancels every stream, closes every connection and joins the threads. Each cut stream gets
    // its terminal message first (WebSocket `error` + `done` + close frame 1001, SSE `error`, a
    // truncated HTTP or TCP transfer, a 503 for a whole file); stop waits up to 2 s for those to
    // be written. Idempotent.
    void stop();
    // Graceful shutdown (SIGTERM in `qtts serve`): from now on new streams are refused with 503
    // (/readyz turns 503 "draining", HTTP responses close their connection); running streams
    // may finish until `deadline`, then stop() cuts the rest. Returns what happened; logs it.
    DrainReport drain(std::chrono::milliseconds deadline);
    // Only the first half of drain(): refuse new streams, leave running ones alone.
    void drain_begin();

    int port() const;      // the bound HTTP port (after start)
    int tcp_port() const;  // the bound TCP port, or -1 when the TCP mode is off
    int64_t active_streams() const;
    int64_t connections() const;
    const ServerMetrics& metrics() const;

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace qtts
