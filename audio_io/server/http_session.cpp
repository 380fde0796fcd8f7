// HTTP/1.1 connections: GET / (the browser page), /healthz, /metrics, /v1/audio/voices; POST
// /v1/audio/speech (whole file or chunked streaming, optionally as server-sent events); hands
// WebSocket upgrades on /v1/audio/stream to the WebSocket session.
//
// One session per connection, all its handlers on one strand. While a speech response is being
// produced the session keeps one read pending on the socket ("watch read"): EOF or an error
// there means the client left, and the stream is cancelled at once instead of being generated
// for nobody. Bytes that arrive instead (a pipelined next request) are kept for the next parse.
#include <array>
#include <map>
#include <optional>

#include <boost/beast/websocket/rfc6455.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "audio_io/server/core.h"
#include "audio_io/server/web_page.h"
#include "engine/common/log.h"

namespace qtts::server {

namespace {

using json = nlohmann::json;

constexpr const char* kSpeechPath = "/v1/audio/speech";
constexpr const char* kStreamPath = "/v1/audio/stream";
// GET endpoints by path, with their label in qtts_requests_total.
const std::map<std::string, std::string> kGetEndpoints = {
    {"/livez", "livez"},     {"/readyz", "readyz"},   {"/healthz", "healthz"},
    {"/metrics", "metrics"}, {"/v1/audio/voices", "voices"},
};
// A pipelined request waiting behind a speech response may be at most this big before the
// session stops reading it (it is parsed, with the usual limits, when the response is done).
constexpr size_t kPipelineBytes = 64 * 1024;

class HttpSession : public std::enable_shared_from_this<HttpSession>, public StrandPumpSink<HttpSession> {
    friend class StrandPumpSink<HttpSession>;  // calls audio_on / end_on on the strand

public:
    HttpSession(ServerCore& core, tcp::socket socket, ConnectionSlot slot)
        : StrandPumpSink<HttpSession>(socket.get_executor()),
          core_(core),
          socket_(std::move(socket)),
          slot_(std::move(slot)),
          timer_(executor_) {}

    ~HttpSession() override {
        // The pump holds a reference while it runs, so no stream can be left behind here; the
        // slot of a stream that never reached a pump is released where it was acquired.
    }

    void run() {
        net::dispatch(executor_, [self = shared_from_this()] { self->request_read(); });
    }

    // ---- PumpSink (pump thread); pump_audio / pump_end come from StrandPumpSink ----
    bool pump_abandoned() const override { return abandoned_.load(); }

private:
    enum class Phase {
        READ_REQUEST,  // parsing a request (or idle between keep-alive requests)
        RESPONDING,    // writing a plain response
        SPEECH,        // a speech stream is running (streamed or collected)
        AWAIT_NEXT,    // response done, the watch read will start the next request
        CLOSING,       // send side shut down, draining until EOF
        CLOSED,
    };

    // ---------------------------------------------------------------------------------------
    // Deadlines: one timer; the handler re-checks the expiry so a stale completion is harmless.
    // ---------------------------------------------------------------------------------------
    void deadline_set(std::chrono::milliseconds d) {
        timer_.expires_after(d);
        timer_.async_wait([self = shared_from_this()](beast::error_code ec) { self->deadline_on(ec); });
    }
    void deadline_clear() { timer_.cancel(); }

    void deadline_on(beast::error_code ec) {
        if (ec || phase_ == Phase::CLOSED || timer_.expiry() > Clock::now()) return;
        if (phase_ == Phase::CLOSING) {
            close_now();
            return;
        }
        // Quietly closing an idle keep-alive connection is normal; anything else is a timeout.
        const bool idle = (phase_ == Phase::READ_REQUEST || phase_ == Phase::AWAIT_NEXT) && buffer_.size() == 0 &&
                          !(parser_ && parser_->got_some());
        if (!idle) {
            core_.metrics.error_count("timeout");
            QTTS_LOG_DEBUG("http: closing a connection after a timeout");
        }
        client_gone();
    }

    // ---------------------------------------------------------------------------------------
    // Reading requests
    // ---------------------------------------------------------------------------------------
    void request_read() {
        if (phase_ == Phase::CLOSED) return;
        phase_ = Phase::READ_REQUEST;
        parser_.emplace();
        parser_->header_limit(std::uint32_t(core_.options.max_header_bytes));
        parser_->body_limit(core_.options.max_body_bytes);
        deadline_set(core_.options.idle_timeout);
        reading_ = true;
        http::async_read_header(socket_, buffer_, *parser_,
                                [self = shared_from_this()](beast::error_code ec, size_t) { self->header_on(ec); });
    }

    void header_on(beast::error_code ec) {
        reading_ = false;
        if (phase_ == Phase::CLOSED) return;
        if (ec) {
            read_error(ec);
            return;
        }
        auto& req = parser_->get();
        keep_alive_ = req.keep_alive();
        const auto length = parser_->content_length();
        if (length && *length > core_.options.max_body_bytes) {
            core_.metrics.error_count("too_large");
            error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_TOO_LARGE, "",
                                       fmt::format("the request body is {} bytes; the limit is {} bytes", *length,
                                                   core_.options.max_body_bytes)),
                          "other", true);
            return;
        }
        // curl and others wait (up to a second) for this before sending a larger body.
        if (beast::iequals(req[http::field::expect], "100-continue")) {
            auto cont = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
            net::async_write(socket_, net::buffer(*cont), [self = shared_from_this(), cont](beast::error_code wec, size_t) {
                if (wec) {
                    self->client_gone();
                    return;
                }
                self->body_read();
            });
            return;
        }
        body_read();
    }

    void body_read() {
        if (phase_ == Phase::CLOSED) return;
        reading_ = true;
        http::async_read(socket_, buffer_, *parser_,
                         [self = shared_from_this()](beast::error_code ec, size_t) { self->request_on(ec); });
    }

    void read_error(beast::error_code ec) {
        if (ec == http::error::end_of_stream || ec == net::error::eof || ec == net::error::connection_reset ||
            ec == net::error::operation_aborted || ec == net::error::bad_descriptor) {
            close_now();
            return;
        }
        if (ec == http::error::body_limit) {
            core_.metrics.error_count("too_large");
            error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_TOO_LARGE, "",
                                       fmt::format("the request body is larger than the limit of {} bytes",
                                                   core_.options.max_body_bytes)),
                          "other", true);
            return;
        }
        if (ec == http::error::header_limit) {
            core_.metrics.error_count("too_large");
            error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_HEADER_TOO_LARGE, "",
                                       fmt::format("the request header is larger than the limit of {} bytes",
                                                   core_.options.max_header_bytes)),
                          "other", true);
            return;
        }
        core_.metrics.error_count("bad_request");
        error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "", fmt::format("malformed HTTP request: {}", ec.message())), "other", true);
    }

    void request_on(beast::error_code ec) {
        reading_ = false;
        if (phase_ == Phase::CLOSED) return;
        if (ec) {
            read_error(ec);
            return;
        }
        deadline_clear();
        request_time_ = Clock::now();
        route(parser_->get());
    }

    // ---------------------------------------------------------------------------------------
    // Routing
    // ---------------------------------------------------------------------------------------
    void route(Request& req) {
        std::string path(req.target());
        if (auto q = path.find('?'); q != std::string::npos) path.resize(q);
        const auto method = req.method();

        if (path == kStreamPath) {
            if (boost::beast::websocket::is_upgrade(req)) {
                upgrade(req);
                return;
            }
            error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "",
                                       "this path is a WebSocket endpoint: connect with a WebSocket client (Upgrade: websocket)"),
                          "websocket", false);
            return;
        }
        if (path == "/" || path == "/index.html") {
            if (method != http::verb::get) {
                method_not_allowed("GET", "page");
                return;
            }
            page_respond(req);
            return;
        }
        if (path == kSpeechPath) {
            if (method != http::verb::post) {
                method_not_allowed("POST", "speech");
                return;
            }
            speech_start(req);
            return;
        }
        const bool get = method == http::verb::get;
        const auto endpoint_it = kGetEndpoints.find(path);
        if (endpoint_it != kGetEndpoints.end()) {
            const std::string endpoint = endpoint_it->second;
            if (!get) {
                method_not_allowed("GET", endpoint);
                return;
            }
            const std::string unready = core_.unready_reason();
            if (path == "/livez") {
                // The process is up and its I/O threads answer: nothing else is checked.
                json_respond(200, json{{"status", "alive"}}.dump(), endpoint);
            } else if (path == "/readyz") {
                json body = unready.empty() ? json{{"status", "ready"}} : json{{"status", "not_ready"}, {"reason", unready}};
                json_respond(unready.empty() ? 200 : request_error_http(RequestErrorKind::REQUEST_ERROR_UNAVAILABLE).status, body.dump(), endpoint);
            } else if (path == "/healthz") {
                json_respond(unready.empty() ? 200 : request_error_http(RequestErrorKind::REQUEST_ERROR_UNAVAILABLE).status,
                             core_.health_body(unready), endpoint);
            } else if (path == "/metrics") {
                http::response<http::string_body> res{http::status::ok, req.version()};
                res.set(http::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
                res.body() = core_.metrics.prometheus_text(core_.gauges());
                respond(std::move(res), endpoint, false);
            } else if (unready == "loading") {
                error_respond(core_.unready_error(unready), endpoint, false, unready);
            } else {
                json body = {{"model", core_.service.model_name()},
                             {"voices", core_.service.voices()},
                             {"languages", core_.service.languages()}};
                json_respond(200, body.dump(), endpoint);
            }
            return;
        }
        error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_NOT_FOUND, "",
                                   fmt::format("no endpoint at {}; available: GET / (the browser page), POST {}, GET /v1/audio/voices, GET /livez, "
                                               "GET /readyz, GET /healthz, GET /metrics, WebSocket {}",
                                               path, kSpeechPath, kStreamPath)),
                      "other", false);
    }

    void method_not_allowed(const char* allow, const std::string& endpoint) {
        const RequestError e(RequestErrorKind::REQUEST_ERROR_METHOD, "", fmt::format("this endpoint accepts {} only", allow));
        http::response<http::string_body> res{http::status(e.status()), 11};
        res.set(http::field::allow, allow);
        res.set(http::field::content_type, "application/json");
        res.body() = error_body_json(e.what(), e.type());
        respond(std::move(res), endpoint, false);
    }

    // The browser page, compiled in (web_page.h). It may run only its own inline script and style
    // and connect only back here (its Content-Security-Policy); browsers revalidate it on every
    // load (no-cache) and get 304 while the binary, and so the page, is the same.
    void page_respond(const Request& req) {
        const WebPage& page = web_page();
        const std::string etag(page.etag);
        const std::string if_none_match(req[http::field::if_none_match]);
        const bool unchanged = if_none_match == "*" || if_none_match.find(etag) != std::string::npos;
        http::response<http::string_body> res{unchanged ? http::status::not_modified : http::status::ok, 11};
        res.set(http::field::etag, etag);
        res.set(http::field::cache_control, "no-cache");
        if (!unchanged) {
            res.set(http::field::content_type, "text/html; charset=utf-8");
            res.set("Content-Security-Policy", std::string(page.content_security_policy));
            res.set("X-Content-Type-Options", "nosniff");
            res.set("Referrer-Policy", "no-referrer");
            res.body() = std::string(page.html);
        }
        respond(std::move(res), "page", false);
    }

    void upgrade(Request& req) {
        // The WebSocket session takes over the socket; this session ends here.
        phase_ = Phase::CLOSED;
        deadline_clear();
        ws_session_run(core_, std::move(socket_), std::move(slot_), parser_->release());
    }

    // ---------------------------------------------------------------------------------------
    // Plain responses
    // ---------------------------------------------------------------------------------------
    void json_respond(int status, std::string body, const std::string& endpoint) {
        http::response<http::string_body> res{http::status(status), 11};
        res.set(http::field::content_type, "application/json");
        res.body() = std::move(body);
        respond(std::move(res), endpoint, false);
    }

    // The JSON error body of a refusal, with the status and type of its kind (request_error_http);
    // busy and unavailable answers tell the client when to retry.
    void error_respond(const RequestError& e, const std::string& endpoint, bool close_after, const std::string& code = "") {
        http::response<http::string_body> res{http::status(e.status()), 11};
        res.set(http::field::content_type, "application/json");
        if (e.kind() == RequestErrorKind::REQUEST_ERROR_BUSY || e.kind() == RequestErrorKind::REQUEST_ERROR_UNAVAILABLE) res.set(http::field::retry_after, "1");
        res.body() = error_body_json(e.what(), e.type(), e.param(), code);
        respond(std::move(res), endpoint, close_after);
    }

    void respond(http::response<http::string_body> res, const std::string& endpoint, bool close_after) {
        if (phase_ == Phase::CLOSED) return;
        core_.metrics.request_count(endpoint, res.result_int());
        res.set(http::field::server, kServerName);
        // API answers are never cached; a response that chose its own caching (the page) keeps it.
        if (res.find(http::field::cache_control) == res.end()) res.set(http::field::cache_control, "no-store");
        // While draining, connections are not kept: the client's next request goes elsewhere.
        res.keep_alive(keep_alive_ && !close_after && !core_.draining.load());
        res.prepare_payload();
        if (phase_ != Phase::SPEECH) phase_ = Phase::RESPONDING;
        auto msg = std::make_shared<http::response<http::string_body>>(std::move(res));
        deadline_set(core_.options.send_timeout);
        http::async_write(socket_, *msg, [self = shared_from_this(), msg](beast::error_code ec, size_t) {
            if (ec) {
                self->client_gone();
                return;
            }
            self->response_done(!msg->keep_alive());
        });
    }

    // After the last byte of a response: next request, or close.
    void response_done(bool close_after) {
        if (phase_ == Phase::CLOSED) return;
        terminal_.release();
        deadline_clear();
        if (close_after) {
            close_graceful();
        } else if (reading_) {
            phase_ = Phase::AWAIT_NEXT;  // the pending watch read continues into the next request
            deadline_set(core_.options.idle_timeout);
        } else {
            request_read();
        }
    }

    // ---------------------------------------------------------------------------------------
    // Speech
    // ---------------------------------------------------------------------------------------
    void speech_start(Request& req) {
        if (const std::string unready = core_.unready_reason(); !unready.empty()) {
            core_.metrics.error_count("unavailable");
            error_respond(core_.unready_error(unready), "speech", false, unready);
            return;
        }
        SpeechParams params;
        try {
            params = speech_params_parse_http(req.body(), core_.service, core_.limits);
        } catch (const RequestError& e) {
            core_.metrics.error_count("bad_request");
            error_respond(e, "speech", false);
            return;
        }
        if (!core_.stream_slot_acquire()) {
            core_.metrics.error_count("busy");
            error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_BUSY, "",
                                       fmt::format("too many concurrent streams ({} active, limit {}); retry later",
                                                   core_.active_streams.load(), core_.options.max_streams)),
                          "speech", false, "max_streams");
            return;
        }
        std::shared_ptr<Stream> stream;
        std::unique_ptr<AudioFormatter> formatter;
        try {
            formatter = audio_formatter_create(params.format, core_.opus);
            core_.request_limits_apply(params.request);
            stream = core_.service.submit(params.request);
        } catch (const std::exception& e) {
            core_.stream_slot_release();
            const RequestError mapped = submit_error_map(e);
            core_.metrics.error_count(request_error_metric(mapped));
            error_respond(mapped, "speech", false, submit_error_code(e));
            return;
        }
        core_.metrics.stream_started();
        phase_ = Phase::SPEECH;
        params_ = params;
        stream_id_ = stream->id();
        first_audio_ = false;
        body_.clear();
        chunked_ = req.version() >= 11;
        if (!chunked_) keep_alive_ = false;  // HTTP/1.0: the end of the body is the end of the connection
        if (params_.stream) {
            core_.metrics.request_count("speech", 200);
            std::string head = fmt::format("HTTP/1.1 200 OK\r\nServer: {}\r\nContent-Type: {}\r\nCache-Control: no-store\r\n"
                                           "X-Qtts-Stream-Id: {}\r\n{}{}\r\n",
                                           kServerName,
                                           params_.sse ? "text/event-stream" : audio_format_content_type(params_.format),
                                           stream_id_, chunked_ ? "Transfer-Encoding: chunked\r\n" : "",
                                           keep_alive_ ? "" : "Connection: close\r\n");
            backlog_.fetch_add(head.size());
            out_.push_back(std::move(head));
            write_next();
        }
        watch_read();
        core_.pumps->job_add(PumpJob{std::move(stream), std::move(formatter), shared_from_this()});
    }

    // Keeps one read pending while the response is produced: EOF/error = the client left.
    void watch_read() {
        if (reading_ || phase_ == Phase::CLOSED || buffer_.size() >= kPipelineBytes) return;
        reading_ = true;
        socket_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
            self->watch_on(ec, n);
        });
    }

    void watch_on(beast::error_code ec, size_t n) {
        reading_ = false;
        if (phase_ == Phase::CLOSED) return;
        if (ec) {
            if (phase_ == Phase::SPEECH) {
                core_.metrics.error_count("disconnect");
                QTTS_LOG_INFO("http: client left during stream {}; cancelling it", stream_id_);
            }
            client_gone();
            return;
        }
        if (phase_ == Phase::CLOSING) {
            buffer_.consume(buffer_.size());
            drain_read();
            return;
        }
        buffer_.commit(n);
        if (phase_ == Phase::AWAIT_NEXT) {
            request_read();
            return;
        }
        // Bytes while the response is still going out: the client's next request (pipelined, or
        // sent the moment it read this response's last byte, before write_on ran here). No
        // further read is armed: response_done() parses what is buffered; a read armed now would
        // wait for bytes the client will only send after its answer (a keep-alive hang).
    }

    void audio_on(std::vector<AudioPiece> pieces, size_t bytes, int64_t samples) {
        if (phase_ != Phase::SPEECH) {
            backlog_.fetch_sub(bytes);
            return;
        }
        if (!first_audio_ && samples > 0) {
            first_audio_ = true;
            ttfa_seconds_ = seconds_since(request_time_);
            core_.metrics.ttfa_observe(ttfa_seconds_);
        }
        if (!params_.stream) {
            for (auto& p : pieces) body_ += p.bytes;
            backlog_.fetch_sub(bytes);  // collected, not queued: bounded by the engine's frame budget
            return;
        }
        size_t framed = 0;
        for (auto& p : pieces) {
            std::string payload = params_.sse
                                      ? sse_event(json{{"type", "speech.audio.delta"}, {"audio", base64_encode(p.bytes)}})
                                      : std::move(p.bytes);
            std::string out = chunk_frame(payload);
            framed += out.size();
            out_.push_back(std::move(out));
        }
        // The backlog counts what is actually queued (framing and base64 included).
        backlog_.fetch_add(framed);
        backlog_.fetch_sub(bytes);
        write_next();
    }

    void end_on(StreamOutcome outcome) {
        if (phase_ != Phase::SPEECH) return;
        terminal_ = std::move(outcome.terminal);  // released once the ending is written (or the socket is gone)
        if (outcome.slow_client) {
            QTTS_LOG_WARN("http: stream {}: the client reads too slowly (over {} bytes queued); disconnecting", stream_id_,
                          core_.options.max_backlog_bytes);
            close_now();
            return;
        }
        if (outcome.server_stop) {
            // Cut by the server stopping: the same ending as an engine failure.
            outcome.error = "the server shut down before the audio was complete";
        } else if (outcome.cancelled) {
            close_now();
            return;
        }
        const bool failed = !outcome.error.empty();
        if (failed) QTTS_LOG_WARN("http: stream {} failed: {}", stream_id_, outcome.error);
        if (!params_.stream) {
            phase_ = Phase::RESPONDING;
            if (outcome.server_stop) {
                error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_UNAVAILABLE, "", outcome.error), "speech", true, "stopping");
                return;
            }
            if (failed) {
                error_respond(RequestError(RequestErrorKind::REQUEST_ERROR_INTERNAL, "", "speech generation failed: " + outcome.error), "speech", false);
                return;
            }
            if (params_.format == AudioFormat::AUDIO_FORMAT_WAV) wav_header_patch(body_);
            http::response<http::string_body> res{http::status::ok, 11};
            res.set(http::field::content_type, audio_format_content_type(params_.format));
            res.set("X-Qtts-Stream-Id", std::to_string(stream_id_));
            res.body() = std::move(body_);
            body_.clear();
            respond(std::move(res), "speech", false);
            return;
        }
        if (params_.sse) {
            const char* error_type = request_error_http(outcome.server_stop ? RequestErrorKind::REQUEST_ERROR_UNAVAILABLE
                                                                            : RequestErrorKind::REQUEST_ERROR_INTERNAL)
                                         .type;
            json event = failed ? json{{"type", "error"}, {"error", {{"message", outcome.error}, {"type", error_type}}}}
                                : json{{"type", "speech.audio.done"}, {"metrics", outcome_json(outcome, ttfa_seconds_)}};
            std::string out = chunk_frame(sse_event(event));
            backlog_.fetch_add(out.size());
            out_.push_back(std::move(out));
        } else if (failed) {
            // Status 200 is already sent: end without the last chunk so the client sees an
            // incomplete transfer (curl: exit 18) rather than a short file that looks whole.
            abort_after_flush_ = true;
            write_next();
            return;
        }
        if (chunked_) {
            std::string last = "0\r\n\r\n";
            backlog_.fetch_add(last.size());
            out_.push_back(std::move(last));
        }
        finish_after_flush_ = true;
        write_next();
    }

    static std::string sse_event(const json& event) { return "data: " + event.dump() + "\n\n"; }

    std::string chunk_frame(const std::string& payload) const {
        if (!chunked_) return payload;
        std::string out = fmt::format("{:x}\r\n", payload.size());
        out += payload;
        out += "\r\n";
        return out;
    }

    // One write at a time; everything queued meanwhile goes out in the next one.
    void write_next() {
        if (writing_ || phase_ == Phase::CLOSED) return;
        if (out_.empty()) {
            if (abort_after_flush_) {
                close_now();
            } else if (finish_after_flush_) {
                finish_after_flush_ = false;
                response_done(!keep_alive_ || core_.draining.load());
            }
            return;
        }
        inflight_.clear();
        for (auto& piece : out_) inflight_ += piece;
        out_.clear();
        writing_ = true;
        deadline_set(core_.options.send_timeout);
        net::async_write(socket_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t n) {
            self->write_on(ec, n);
        });
    }

    void write_on(beast::error_code ec, size_t n) {
        writing_ = false;
        backlog_.fetch_sub(n);
        if (phase_ == Phase::CLOSED) return;
        if (ec) {
            if (phase_ == Phase::SPEECH) core_.metrics.error_count("disconnect");
            client_gone();
            return;
        }
        deadline_clear();
        write_next();
    }

    // ---------------------------------------------------------------------------------------
    // Closing
    // ---------------------------------------------------------------------------------------
    void client_gone() {
        abandoned_ = true;  // the pump cancels the stream on its next check
        close_now();
    }

    void close_now() {
        if (phase_ == Phase::CLOSED) return;
        phase_ = Phase::CLOSED;
        abandoned_ = true;
        beast::error_code ec;
        socket_.shutdown(tcp::socket::shutdown_both, ec);
        socket_.close(ec);
        timer_.cancel();
        out_.clear();
        terminal_.release();
    }

    // Half-close and read until the client closes too, so an error response sent before the
    // request body was read is not destroyed by a TCP reset.
    void close_graceful() {
        if (phase_ == Phase::CLOSED) return;
        phase_ = Phase::CLOSING;
        beast::error_code ec;
        socket_.shutdown(tcp::socket::shutdown_send, ec);
        deadline_set(std::chrono::milliseconds(1000));
        if (!reading_) drain_read();
    }

    void drain_read() {
        reading_ = true;
        socket_.async_read_some(net::buffer(drain_), [self = shared_from_this()](beast::error_code ec, size_t) {
            self->reading_ = false;
            if (self->phase_ == Phase::CLOSED) return;
            if (ec) {
                self->close_now();
                return;
            }
            self->drain_read();
        });
    }

    ServerCore& core_;
    tcp::socket socket_;
    ConnectionSlot slot_;
    net::steady_timer timer_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    Phase phase_ = Phase::READ_REQUEST;
    bool keep_alive_ = true;
    bool reading_ = false;
    std::array<char, 4096> drain_{};
    Clock::time_point request_time_;

    // The speech response in progress.
    SpeechParams params_;
    uint64_t stream_id_ = 0;
    bool chunked_ = true;
    bool first_audio_ = false;
    double ttfa_seconds_ = -1.0;
    std::string body_;             // whole-file responses: the encoded audio so far
    std::deque<std::string> out_;  // streamed responses: bytes waiting for the socket
    std::string inflight_;         // the bytes of the write in progress
    bool writing_ = false;
    bool finish_after_flush_ = false;
    bool abort_after_flush_ = false;
    std::atomic<bool> abandoned_{false};
    CounterHold terminal_;  // the ended stream's ServerCore::terminals_pending, until its ending is out
};

}  // namespace

void http_session_run(ServerCore& core, tcp::socket socket, ConnectionSlot slot) {
    std::make_shared<HttpSession>(core, std::move(socket), std::move(slot))->run();
}

}  // namespace qtts::server
