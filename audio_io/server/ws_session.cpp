// WebSocket /v1/audio/stream: JSON text messages for control and events, binary messages for
// audio. One utterance at a time per connection; text appended while it speaks continues the
// same utterance (an incremental engine request fed with Stream::text_append / text_close).
// Protocol reference: docs/server.md.
#include <boost/beast/websocket.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "audio_io/server/core.h"
#include "engine/common/log.h"

namespace qtts::server {

namespace {

using json = nlohmann::json;
namespace websocket = beast::websocket;

// After our close frame: how long the client has to answer with its own before the socket closes.
constexpr std::chrono::milliseconds kCloseAnswerWait{2000};

class WsSession : public std::enable_shared_from_this<WsSession>, public StrandPumpSink<WsSession> {
    friend class StrandPumpSink<WsSession>;  // calls audio_on / end_on on the strand

public:
    WsSession(ServerCore& core, tcp::socket socket, ConnectionSlot slot)
        : StrandPumpSink<WsSession>(socket.get_executor()),
          core_(core),
          ws_(std::move(socket)),
          slot_(std::move(slot)),
          timer_(executor_) {}

    void run(Request request) {
        request_ = std::move(request);
        net::dispatch(executor_, [self = shared_from_this()] { self->accept(); });
    }

    // ---- PumpSink (pump thread); pump_audio / pump_end come from StrandPumpSink ----
    bool pump_abandoned() const override { return closed_flag_.load() || cancel_requested_.load(); }

private:
    enum class State { IDLE, SPEAKING, CANCELLING };

    enum class OutKind { TEXT, BINARY, CLOSE };
    struct OutMessage {
        OutKind kind = OutKind::TEXT;
        std::string data;          // CLOSE: the close reason
        int64_t samples_end = 0;   // BINARY: AudioPiece::samples_end
        websocket::close_code close_code = websocket::close_code::normal;
    };

    // ---------------------------------------------------------------------------------------
    void accept() {
        ws_.read_message_max(core_.options.max_ws_message_bytes);
        ws_.auto_fragment(false);
        ws_.set_option(websocket::stream_base::decorator(
            [](websocket::response_type& res) { res.set(http::field::server, kServerName); }));
        deadline_set(core_.options.send_timeout);
        ws_.async_accept(request_, [self = shared_from_this()](beast::error_code ec) { self->accept_on(ec); });
    }

    void accept_on(beast::error_code ec) {
        if (closed_) return;
        if (ec) {
            core_.metrics.request_count("websocket", request_error_http(RequestErrorKind::REQUEST_ERROR_INVALID).status);
            core_.metrics.error_count("bad_request");
            close_now();
            return;
        }
        core_.metrics.request_count("websocket", 101);
        deadline_set(core_.options.idle_timeout);
        read_next();
    }

    void deadline_set(std::chrono::milliseconds d) {
        timer_.expires_after(d);
        timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
            if (ec || self->closed_ || self->timer_.expiry() > Clock::now()) return;
            core_timeout(*self);
        });
    }

    static void core_timeout(WsSession& s) {
        if (s.writing_ || s.close_queued_) {
            // A write (or the close handshake) did not finish in time: the client is gone or
            // does not read. Nothing more can be said to it.
            if (s.writing_) s.core_.metrics.error_count("timeout");
            s.close_now();
            return;
        }
        s.core_.metrics.error_count("timeout");
        QTTS_LOG_DEBUG("websocket: ending a connection after {} ms without activity",
                       (long long)s.core_.options.idle_timeout.count());
        s.idle_timeout_handle();
    }

    // No message and no audio for idle_timeout: end what is running with its terminal event,
    // then close with a close frame (never just drop the socket).
    void idle_timeout_handle() {
        const std::string message = fmt::format("no message for {:g} s; closing the connection",
                                                double(core_.options.idle_timeout.count()) / 1000.0);
        if (timed_out_) {
            close_now();  // the utterance did not end in time after its cancel
            return;
        }
        if (state_ == State::IDLE) {
            error_send(RequestError(RequestErrorKind::REQUEST_ERROR_TIMEOUT, "", message), "idle_timeout");
            close_send(websocket::close_code::normal, "idle timeout");
            return;
        }
        // An utterance waits for text that does not come: stop it; end_on sends `done` with
        // stop_reason "timeout", then the close frame.
        timed_out_ = true;
        if (state_ == State::SPEAKING) cancel_handle();
        deadline_set(core_.options.cancel_grace + core_.options.send_timeout);  // bounds the wait for the pump
    }

    // ---------------------------------------------------------------------------------------
    // Client messages
    // ---------------------------------------------------------------------------------------
    void read_next() {
        if (closed_) return;
        ws_.async_read(rbuf_, [self = shared_from_this()](beast::error_code ec, size_t) { self->read_on(ec); });
    }

    void read_on(beast::error_code ec) {
        if (closed_) return;
        if (ec) {
            if (ec != websocket::error::closed && ec != net::error::eof && ec != net::error::operation_aborted) {
                QTTS_LOG_DEBUG("websocket: read failed: {}", ec.message());
                core_.metrics.error_count(ec == websocket::error::message_too_big ? "too_large" : "disconnect");
            } else if (state_ != State::IDLE) {
                core_.metrics.error_count("disconnect");
            }
            close_now();  // cancels a running utterance through pump_abandoned()
            return;
        }
        const bool text = ws_.got_text();
        std::string data = beast::buffers_to_string(rbuf_.data());
        rbuf_.consume(rbuf_.size());
        if (close_queued_ || timed_out_) {
            // The connection is ending: messages that cross our close frame are not acted on.
        } else {
            if (!writing_) deadline_set(core_.options.idle_timeout);
            if (text)
                message_handle(data);
            else
                error_send(RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "",
                                        "binary messages are not accepted; send JSON text messages: start, append, end, cancel"));
        }
        read_next();
    }

    void message_handle(const std::string& data) {
        json msg;
        try {
            msg = json::parse(data);
        } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
            core_.metrics.error_count("bad_request");
            error_send(RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "", fmt::format("the message is not valid JSON: {}", e.what())));
            return;
        }
        if (!msg.is_object() || !msg.contains("type") || !msg["type"].is_string()) {
            core_.metrics.error_count("bad_request");
            error_send(RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "type",
                                    "a message must be a JSON object with a string `type`: start, append, end or cancel"));
            return;
        }
        const std::string type = msg["type"].get<std::string>();
        try {
            if (type == "start") {
                start_handle(msg);
            } else if (type == "append") {
                append_handle(msg, false);
            } else if (type == "end") {
                append_handle(msg, true);
            } else if (type == "cancel") {
                cancel_handle();
            } else {
                throw RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "type",
                                   fmt::format("unknown message type '{}'; accepted: start, append, end, cancel", type));
            }
        } catch (const RequestError& e) {
            core_.metrics.error_count(request_error_metric(e));
            error_send(e);
        } catch (const std::exception& e) {
            // The stream refused the call (e.g. text_append after the engine ended the utterance).
            const RequestError mapped = submit_error_map(e);
            core_.metrics.error_count(request_error_metric(mapped));
            error_send(mapped);
        }
    }

    void start_handle(const json& msg) {
        if (state_ != State::IDLE)
            throw RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "",
                               "an utterance is already in progress; send `end` and wait for `done`, or send `cancel`");
        if (const std::string unready = core_.unready_reason(); !unready.empty()) {
            core_.metrics.error_count("unavailable");
            const RequestError e = core_.unready_error(unready);
            error_send(e, unready);
            // Shutting down: tell the client to go elsewhere. Loading: it may retry here.
            if (unready != "loading") close_send(websocket::close_code::going_away, "server shutting down");
            return;
        }
        SpeechParams params = speech_params_parse_ws_start(msg, core_.service, core_.limits);
        if (!core_.stream_slot_acquire()) {
            core_.metrics.error_count("busy");
            const RequestError busy(RequestErrorKind::REQUEST_ERROR_BUSY, "",
                                    fmt::format("too many concurrent streams ({} active, limit {}); retry later",
                                                core_.active_streams.load(), core_.options.max_streams));
            error_send(busy, "max_streams");
            return;
        }
        std::unique_ptr<AudioFormatter> formatter;
        try {
            formatter = audio_formatter_create(params.format, core_.opus);
            core_.request_limits_apply(params.request);
            stream_ = core_.service.submit(params.request);
        } catch (const std::exception& e) {
            core_.stream_slot_release();
            const RequestError mapped = submit_error_map(e);
            core_.metrics.error_count(request_error_metric(mapped));
            error_send(mapped, submit_error_code(e));
            return;
        }
        core_.metrics.stream_started();
        state_ = State::SPEAKING;
        format_ = params.format;
        text_bytes_ = params.request.text.size();
        text_closed_ = false;
        first_audio_ = false;
        ttfa_seconds_ = -1.0;
        cancel_requested_ = false;
        samples_sent_ = 0;
        samples_kept_ = 0;
        // Time to first audio counts from the moment there is text to speak.
        text_time_set_ = !params.request.text.empty();
        if (text_time_set_) text_time_ = Clock::now();

        json started = {{"type", "started"},
                        {"stream_id", stream_->id()},
                        {"format", params.format_name},
                        {"sample_rate", SAMPLE_RATE},
                        {"channels", 1}};
        if (format_ == AudioFormat::AUDIO_FORMAT_OPUS_PACKETS) {
            started["frame_samples"] = SAMPLE_RATE / 50;
            started["pre_skip"] = formatter->pre_skip();
        }
        event_send(started);
        core_.pumps->job_add(PumpJob{stream_, std::move(formatter), shared_from_this()});
        // `start` may carry "end": true for a one-shot utterance.
        if (params.text_complete) append_handle(json{{"type", "end"}}, true);
    }

    void append_handle(const json& msg, bool close_text) {
        if (state_ != State::SPEAKING || !stream_)
            throw RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "",
                               fmt::format("`{}` needs an utterance in progress; send `start` first", close_text ? "end" : "append"));
        if (text_closed_)
            throw RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "",
                               "the utterance's text is already closed by `end`; wait for `done`, then `start` again");
        std::string text;
        auto it = msg.find("text");
        if (it != msg.end() && !it->is_null()) {
            if (!it->is_string()) throw RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "text", "`text` must be a string");
            text = it->get<std::string>();
        } else if (!close_text) {
            throw RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, "text", "`append` needs `text`: the text to add");
        }
        // The server's limit counts the whole utterance, as the engine's does (Stream::text_append).
        field_text_check(text, "text", core_.limits.max_text_bytes, text_bytes_);
        if (!text.empty()) {
            text_bytes_ += text.size();
            if (!text_time_set_) {
                text_time_set_ = true;
                text_time_ = Clock::now();
            }
            stream_->text_append(text);
        }
        if (close_text) {
            text_closed_ = true;
            stream_->text_close();
        }
    }

    void cancel_handle() {
        if (state_ != State::SPEAKING) return;  // nothing to cancel: harmless
        state_ = State::CANCELLING;
        cancel_requested_ = true;
        // Audio not yet on the socket is dropped; the pump cancels the stream and reports `done`,
        // whose sample count is then what the client did get.
        std::deque<OutMessage> kept;
        for (auto& m : out_) {
            if (m.kind != OutKind::BINARY) {
                kept.push_back(std::move(m));
            } else {
                backlog_.fetch_sub(m.data.size());
            }
        }
        out_ = std::move(kept);
        samples_kept_ = samples_sent_;
    }

    // ---------------------------------------------------------------------------------------
    // Audio and events
    // ---------------------------------------------------------------------------------------
    void audio_on(std::vector<AudioPiece> pieces, size_t bytes, int64_t samples) {
        if (closed_ || state_ != State::SPEAKING) {
            backlog_.fetch_sub(bytes);
            return;
        }
        if (!first_audio_ && samples > 0) {
            first_audio_ = true;
            ttfa_seconds_ = seconds_since(text_time_set_ ? text_time_ : Clock::now());
            core_.metrics.ttfa_observe(ttfa_seconds_);
            event_send(json{{"type", "first_audio"}, {"stream_id", stream_ ? stream_->id() : 0}, {"ttfa_ms", ttfa_seconds_ * 1000.0}});
        }
        for (auto& p : pieces) {
            samples_kept_ = p.samples_end;
            out_.push_back(OutMessage{OutKind::BINARY, std::move(p.bytes), p.samples_end});  // already counted by the pump
        }
        write_next();
    }

    void end_on(StreamOutcome outcome) {
        if (closed_) return;
        terminal_ = std::move(outcome.terminal);  // released once `done` (and a close) is written
        if (outcome.slow_client) {
            QTTS_LOG_WARN("websocket: the client reads too slowly (over {} bytes queued); disconnecting",
                          core_.options.max_backlog_bytes);
            close_now();
            return;
        }
        const uint64_t id = stream_ ? stream_->id() : 0;
        if (outcome.server_stop) {
            error_send(RequestError(RequestErrorKind::REQUEST_ERROR_UNAVAILABLE, "",
                                    "the server shut down before the utterance was complete"),
                       "stopping");
        } else if (!outcome.error.empty()) {
            error_send(RequestError(RequestErrorKind::REQUEST_ERROR_INTERNAL, "", "speech generation failed: " + outcome.error));
        }
        // Report what the client got: after a cancel the audio still queued was dropped.
        outcome.samples = samples_kept_;
        json done = outcome_json(outcome, ttfa_seconds_);
        done["type"] = "done";
        done["stream_id"] = id;
        if (outcome.server_stop) done["stop_reason"] = "shutdown";
        if (timed_out_) done["stop_reason"] = "timeout";
        event_send(done);
        stream_.reset();
        state_ = State::IDLE;
        cancel_requested_ = false;
        if (outcome.server_stop || core_.draining.load()) {
            close_send(websocket::close_code::going_away, "server shutting down");
        } else if (timed_out_) {
            close_send(websocket::close_code::normal, "idle timeout");
        }
    }

    // An `error` event: the HTTP error body of the same refusal (its type from request_error_http).
    void error_send(const RequestError& e, const std::string& code = "") {
        json body = json::parse(error_body_json(e.what(), e.type(), e.param(), code));
        body["type"] = "error";
        event_send(body);
    }

    void event_send(const json& event) {
        if (close_queued_) return;
        std::string data = event.dump(-1, ' ', false, json::error_handler_t::replace);
        backlog_.fetch_add(data.size());
        out_.push_back(OutMessage{OutKind::TEXT, std::move(data)});
        write_next();
    }

    // Queues the close frame after everything already queued; nothing is sent after it. The
    // client's answering close frame (or the deadline) ends the connection.
    void close_send(websocket::close_code code, const std::string& reason) {
        if (close_queued_ || closed_) return;
        close_queued_ = true;
        OutMessage m;
        m.kind = OutKind::CLOSE;
        m.data = reason;
        m.close_code = code;
        out_.push_back(std::move(m));
        write_next();
    }

    void write_next() {
        if (writing_ || closed_) return;
        if (out_.empty()) {
            terminal_.release();  // an ended stream's `done` is out
            return;
        }
        inflight_ = std::move(out_.front());
        out_.pop_front();
        writing_ = true;
        deadline_set(core_.options.send_timeout);
        if (inflight_.kind == OutKind::CLOSE) {
            ws_.async_close(websocket::close_reason(inflight_.close_code, inflight_.data),
                            [self = shared_from_this()](beast::error_code ec) { self->close_on(ec); });
            return;
        }
        if (inflight_.kind == OutKind::BINARY) samples_sent_ = inflight_.samples_end;
        ws_.text(inflight_.kind == OutKind::TEXT);
        ws_.async_write(net::buffer(inflight_.data), [self = shared_from_this()](beast::error_code ec, size_t) {
            self->write_on(ec);
        });
    }

    void write_on(beast::error_code ec) {
        writing_ = false;
        backlog_.fetch_sub(inflight_.data.size());
        inflight_.data.clear();
        if (closed_) return;
        if (ec) {
            if (state_ != State::IDLE) core_.metrics.error_count("disconnect");
            close_now();
            return;
        }
        if (!timed_out_) deadline_set(core_.options.idle_timeout);
        write_next();
    }

    // Our close frame is out; the pending read ends when the client answers with its own.
    void close_on(beast::error_code ec) {
        writing_ = false;
        if (closed_) return;
        if (ec || core_.stopping.load()) {
            // Stopping: the I/O threads are about to end, so nobody would wait for the answer.
            close_now();
            return;
        }
        deadline_set(kCloseAnswerWait);
        write_next();  // the queue is empty now: releases a terminal hold
    }

    void close_now() {
        if (closed_) return;
        closed_ = true;
        closed_flag_ = true;
        beast::error_code ec;
        auto& socket = beast::get_lowest_layer(ws_);
        socket.shutdown(tcp::socket::shutdown_both, ec);
        socket.close(ec);
        timer_.cancel();
        for (auto& m : out_)
            if (m.kind != OutKind::CLOSE) backlog_.fetch_sub(m.data.size());
        out_.clear();
        terminal_.release();
    }

    ServerCore& core_;
    websocket::stream<tcp::socket> ws_;
    ConnectionSlot slot_;
    net::steady_timer timer_;
    Request request_;
    beast::flat_buffer rbuf_;
    std::deque<OutMessage> out_;
    OutMessage inflight_;
    bool writing_ = false;
    bool close_queued_ = false;  // a close frame is queued or sent: nothing more goes out
    bool closed_ = false;
    std::atomic<bool> closed_flag_{false};  // closed_, readable from the pump thread
    CounterHold terminal_;  // the ended stream's ServerCore::terminals_pending, until `done` is out

    State state_ = State::IDLE;
    std::shared_ptr<Stream> stream_;
    AudioFormat format_ = AudioFormat::AUDIO_FORMAT_OPUS_PACKETS;
    size_t text_bytes_ = 0;
    bool text_closed_ = false;
    bool first_audio_ = false;
    bool text_time_set_ = false;
    Clock::time_point text_time_;
    double ttfa_seconds_ = -1.0;
    std::atomic<bool> cancel_requested_{false};
    bool timed_out_ = false;    // the idle timeout ended the utterance; the connection closes after `done`
    int64_t samples_sent_ = 0;  // samples_end of the last audio message handed to the socket
    int64_t samples_kept_ = 0;  // samples_end of the last audio message sent or still queued
};

}  // namespace

void ws_session_run(ServerCore& core, tcp::socket socket, ConnectionSlot slot, Request request) {
    std::make_shared<WsSession>(core, std::move(socket), std::move(slot))->run(std::move(request));
}

}  // namespace qtts::server
