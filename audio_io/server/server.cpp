// The server object: listeners for the HTTP and TCP ports, the I/O threads and the pumps.
#include "audio_io/server/server.h"

#include <array>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "audio_io/server/core.h"
#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts {

using namespace qtts::server;

void server_options_validate(const ServerOptions& o) {
    const auto check = [](bool ok, const std::string& message) {
        if (!ok) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}", message);
    };
    check(o.port >= 0 && o.port <= 65535, fmt::format("port must be in 0..65535 (0 = any free port), got {}", o.port));
    check(o.tcp_port >= -1 && o.tcp_port <= 65535,
          fmt::format("tcp port must be in 0..65535, or -1 for no TCP mode, got {}", o.tcp_port));
    check(o.io_threads >= 1 && o.io_threads <= 64, fmt::format("io threads must be in 1..64, got {}", o.io_threads));
    check(o.max_streams >= 1 && o.max_streams <= 1024, fmt::format("max streams must be in 1..1024, got {}", o.max_streams));
    check(o.max_connections >= 1, fmt::format("max connections must be at least 1, got {}", o.max_connections));
    OpusEncoderOptions opus;
    opus.bitrate = o.bitrate;
    opus.complexity = o.opus_complexity;
    opus_encoder_options_validate(opus);
    check(o.max_body_bytes >= 256, "max body bytes must be at least 256");
    check(o.max_header_bytes >= 1024, "max header bytes must be at least 1024");
    // The server's text limit is its own per-request rule within the library's (text_check is
    // called with it); a larger one would only move the refusal from the server to the engine.
    check(o.max_text_bytes >= 16 && o.max_text_bytes <= REQUEST_MAX_TEXT_BYTES,
          fmt::format("max text bytes must be in 16..{}, got {}", REQUEST_MAX_TEXT_BYTES, o.max_text_bytes));
    check(o.max_ws_message_bytes >= 256, "max WebSocket message bytes must be at least 256");
    check(o.max_backlog_bytes >= 4096, "max backlog bytes must be at least 4096");
    check(o.idle_timeout.count() > 0 && o.send_timeout.count() > 0, "timeouts must be positive");
    check(o.cancel_grace.count() >= 0, "cancel grace must not be negative");
    check(o.max_audio_seconds >= 0.0 && o.max_audio_seconds <= 3600.0,
          fmt::format("max audio seconds must be in 0..3600 (0 = no cap beyond the engine's), got {}", o.max_audio_seconds));
    check(!o.host.empty(), "host must not be empty (127.0.0.1 serves this machine only, 0.0.0.0 every interface)");
    boost::system::error_code ec;
    boost::asio::ip::make_address(o.host == "localhost" ? "127.0.0.1" : o.host, ec);
    check(!ec, fmt::format("host '{}' is not an IP address (examples: 127.0.0.1, 0.0.0.0, ::1, localhost)", o.host));
}

namespace {

// stop(): how long the connections get to write the terminal messages of the streams it cut.
constexpr std::chrono::milliseconds kTerminalFlushWait{2000};

enum class ListenerKind { LISTENER_HTTP, LISTENER_TCP };

class Listener : public std::enable_shared_from_this<Listener> {
public:
    Listener(ServerCore& core, ListenerKind kind, const tcp::endpoint& endpoint)
        : core_(core), kind_(kind), acceptor_(net::make_strand(core.ioc)), retry_timer_(acceptor_.get_executor()) {
        beast::error_code ec;
        const auto bind_fail = [&](const char* what) {
            fail(ErrorCode::ERROR_IO, "cannot listen on {}:{} ({}): {}", endpoint.address().to_string(), endpoint.port(), what,
                 ec.message());
        };
        acceptor_.open(endpoint.protocol(), ec);
        if (ec) bind_fail("open");
        acceptor_.set_option(net::socket_base::reuse_address(true), ec);
        if (ec) bind_fail("SO_REUSEADDR");
        acceptor_.bind(endpoint, ec);
        if (ec) bind_fail("bind");
        acceptor_.listen(net::socket_base::max_listen_connections, ec);
        if (ec) bind_fail("listen");
        port_ = acceptor_.local_endpoint().port();
    }

    int port() const { return port_; }

    void run() {
        net::dispatch(acceptor_.get_executor(), [self = shared_from_this()] { self->accept_next(); });
    }

    void stop() {
        net::dispatch(acceptor_.get_executor(), [self = shared_from_this()] {
            beast::error_code ec;
            self->acceptor_.close(ec);
            self->retry_timer_.cancel();
        });
    }

private:
    void accept_next() {
        if (core_.stopping.load() || !acceptor_.is_open()) return;
        // Each connection gets its own strand: its handlers never run concurrently.
        acceptor_.async_accept(net::make_strand(core_.ioc), [self = shared_from_this()](beast::error_code ec, tcp::socket s) {
            self->accept_on(ec, std::move(s));
        });
    }

    void accept_on(beast::error_code ec, tcp::socket socket) {
        if (ec == net::error::operation_aborted || core_.stopping.load()) return;
        if (ec) {
            // Usually out of file descriptors: wait a little instead of spinning.
            QTTS_LOG_WARN("server: accept failed: {}", ec.message());
            retry_timer_.expires_after(std::chrono::milliseconds(100));
            retry_timer_.async_wait([self = shared_from_this()](beast::error_code wec) {
                if (!wec) self->accept_next();
            });
            return;
        }
        socket.set_option(tcp::no_delay(true), ec);  // audio chunks are small and latency-bound
        if (core_.options.socket_send_buffer_bytes > 0)
            socket.set_option(net::socket_base::send_buffer_size(core_.options.socket_send_buffer_bytes), ec);
        if (core_.connections.load() >= core_.options.max_connections) {
            reject(std::move(socket));
        } else if (kind_ == ListenerKind::LISTENER_HTTP) {
            http_session_run(core_, std::move(socket), ConnectionSlot(core_));
        } else {
            tcp_session_run(core_, std::move(socket), ConnectionSlot(core_));
        }
        accept_next();
    }

    // Over the connection limit: a short answer and close, without reading the request.
    void reject(tcp::socket socket) {
        core_.metrics.error_count("connection_limit");
        std::string text;
        if (kind_ == ListenerKind::LISTENER_HTTP) {
            // Written by hand (the socket gets no session): the status and type still come from
            // the one mapping.
            const HttpError http = request_error_http(RequestErrorKind::REQUEST_ERROR_UNAVAILABLE);
            const std::string body = error_body_json(
                fmt::format("too many open connections (limit {}); retry later", core_.options.max_connections),
                http.type, "", "max_connections");
            text = fmt::format("HTTP/1.1 {} Service Unavailable\r\nServer: {}\r\nContent-Type: application/json\r\n"
                               "Retry-After: 1\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{}",
                               http.status, kServerName, body.size(), body);
        } else {
            text = "ERROR: too many open connections; retry later\n";
        }
        // Write the answer, half-close, then give the client a moment to read it and close: closing
        // at once with its request unread would reset the connection and lose the answer.
        struct Rejected {
            tcp::socket socket;
            net::steady_timer timer;
            std::string text;
            std::array<char, 1024> sink{};
        };
        const auto executor = socket.get_executor();  // the connection's strand: timer and socket share it
        auto r = std::make_shared<Rejected>(Rejected{std::move(socket), net::steady_timer(executor), std::move(text)});
        net::async_write(r->socket, net::buffer(r->text), [r](beast::error_code ec, size_t) {
            beast::error_code ignored;
            if (ec) {
                r->socket.close(ignored);
                return;
            }
            r->socket.shutdown(tcp::socket::shutdown_send, ignored);
            r->timer.expires_after(std::chrono::milliseconds(500));
            r->timer.async_wait([r](beast::error_code) {
                beast::error_code e;
                r->socket.close(e);
            });
            r->socket.async_read_some(net::buffer(r->sink), [r](beast::error_code, size_t) {
                // Any answer (data, EOF, error) ends it; the timer bounds a silent client.
                beast::error_code e;
                r->timer.cancel();
                r->socket.close(e);
            });
        });
    }

    ServerCore& core_;
    ListenerKind kind_;
    tcp::acceptor acceptor_;
    net::steady_timer retry_timer_;
    int port_ = 0;
};

}  // namespace

struct HttpServer::Impl {
    Impl(SpeechService& service, const ServerOptions& options) : core(service, options) {}

    ServerCore core;
    std::shared_ptr<Listener> http_listener;
    std::shared_ptr<Listener> tcp_listener;
    std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
    std::vector<std::thread> threads;
    bool started = false;
    bool stopped = false;
};

HttpServer::HttpServer(SpeechService& service, const ServerOptions& options) {
    server_options_validate(options);
    impl_ = std::make_unique<Impl>(service, options);
}

HttpServer::~HttpServer() {
    try {
        stop();
    } catch (const std::exception& e) {
        QTTS_LOG_ERROR("server: stopping failed: {}", e.what());
    }
}

void HttpServer::start() {
    Impl& s = *impl_;
    if (s.started) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the server is already started");
    const ServerOptions& o = s.core.options;
    beast::error_code ec;
    const auto address = net::ip::make_address(o.host == "localhost" ? "127.0.0.1" : o.host, ec);  // validated above
    s.http_listener = std::make_shared<Listener>(s.core, ListenerKind::LISTENER_HTTP, tcp::endpoint(address, uint16_t(o.port)));
    if (o.tcp_port >= 0)
        s.tcp_listener = std::make_shared<Listener>(s.core, ListenerKind::LISTENER_TCP, tcp::endpoint(address, uint16_t(o.tcp_port)));
    s.started = true;
    s.core.pumps = std::make_unique<PumpPool>(s.core, o.max_streams);
    s.work.emplace(net::make_work_guard(s.core.ioc));
    s.http_listener->run();
    if (s.tcp_listener) s.tcp_listener->run();
    for (int i = 0; i < o.io_threads; ++i) {
        s.threads.emplace_back([&core = s.core] {
            // A handler that throws is a bug; log it and keep serving the other connections.
            for (;;) {
                try {
                    core.ioc.run();
                    return;
                } catch (const std::exception& e) {
                    QTTS_LOG_ERROR("server: unexpected exception in an I/O handler: {}", e.what());
                }
            }
        });
    }
    QTTS_LOG_INFO("server: HTTP on {}:{}{}, {} stream slots, {} I/O threads", o.host, port(),
                  tcp_port() >= 0 ? fmt::format(", plain TCP on {}:{}", o.host, tcp_port()) : std::string(), o.max_streams,
                  o.io_threads);
}

void HttpServer::stop() {
    Impl& s = *impl_;
    if (!s.started || s.stopped) return;
    s.stopped = true;
    s.core.stopping = true;
    if (s.http_listener) s.http_listener->stop();
    if (s.tcp_listener) s.tcp_listener->stop();
    s.core.pumps->stop();  // every running stream is cancelled; joins
    // The I/O threads still run: let the connections write the cut streams' terminal messages.
    const auto flush_deadline = Clock::now() + kTerminalFlushWait;
    while (s.core.terminals_pending.load() > 0 && Clock::now() < flush_deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (s.core.terminals_pending.load() > 0)
        QTTS_LOG_WARN("server: {} connection(s) did not take their stream's last message in time",
                      s.core.terminals_pending.load());
    s.work.reset();
    s.core.ioc.stop();
    for (auto& t : s.threads) t.join();
    s.threads.clear();
    QTTS_LOG_INFO("server: stopped");
}

void HttpServer::drain_begin() {
    if (!impl_->started || impl_->stopped) return;
    impl_->core.draining = true;
}

DrainReport HttpServer::drain(std::chrono::milliseconds deadline) {
    Impl& s = *impl_;
    DrainReport report;
    if (!s.started || s.stopped) return report;
    const auto start = Clock::now();
    drain_begin();
    report.running = s.core.active_streams.load();
    QTTS_LOG_INFO("server: draining: new streams are refused; {} running, up to {:g} s to finish", report.running,
                  double(deadline.count()) / 1000.0);
    while (s.core.active_streams.load() > 0 && Clock::now() - start < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    report.cut = s.core.active_streams.load();
    report.finished = std::max<int64_t>(0, report.running - report.cut);
    stop();
    report.seconds = seconds_since(start);
    QTTS_LOG_INFO("server: drained in {:.1f} s: {} of {} running streams finished, {} cut at the deadline", report.seconds,
                  report.finished, report.running, report.cut);
    return report;
}

int HttpServer::port() const { return impl_->http_listener ? impl_->http_listener->port() : -1; }
int HttpServer::tcp_port() const { return impl_->tcp_listener ? impl_->tcp_listener->port() : -1; }
int64_t HttpServer::active_streams() const { return impl_->core.active_streams.load(); }
int64_t HttpServer::connections() const { return impl_->core.connections.load(); }
const ServerMetrics& HttpServer::metrics() const { return impl_->core.metrics; }

}  // namespace qtts
