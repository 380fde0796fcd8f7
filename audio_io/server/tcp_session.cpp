// Plain TCP mode (--tcp-port): one line of text in, an Ogg Opus stream out, then the server
// closes the connection. Made for `nc` and `ffplay`:
//     echo "Hello there." | nc 127.0.0.1 8081 | ffplay -nodisp -autoexit -
// A line starting with '{' is a JSON object with the HTTP API's fields (input, voice, ...).
// Errors are one line "ERROR: <message>" instead of audio.
#include <array>

#include <fmt/format.h>

#include "audio_io/server/core.h"
#include "engine/common/log.h"

namespace qtts::server {

namespace {

class TcpSession : public std::enable_shared_from_this<TcpSession>, public StrandPumpSink<TcpSession> {
    friend class StrandPumpSink<TcpSession>;  // calls audio_on / end_on on the strand

public:
    TcpSession(ServerCore& core, tcp::socket socket, ConnectionSlot slot)
        : StrandPumpSink<TcpSession>(socket.get_executor()),
          core_(core),
          socket_(std::move(socket)),
          slot_(std::move(slot)),
          timer_(executor_),
          // A JSON line carries escapes and other fields besides the text; the text itself is
          // checked against max_text_bytes once parsed.
          line_buf_(line_limit(core.options)) {}

    void run() {
        net::dispatch(executor_, [self = shared_from_this()] { self->line_read(); });
    }

    // ---- PumpSink (pump thread); pump_audio / pump_end come from StrandPumpSink ----
    bool pump_abandoned() const override { return abandoned_.load(); }

private:
    static size_t line_limit(const ServerOptions& o) { return 2 * o.max_text_bytes + 4096; }

    void deadline_set(std::chrono::milliseconds d) {
        timer_.expires_after(d);
        timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
            if (ec || self->closed_ || self->timer_.expiry() > Clock::now()) return;
            self->core_.metrics.error_count("timeout");
            self->close_now();
        });
    }

    void line_read() {
        deadline_set(core_.options.idle_timeout);
        net::async_read_until(socket_, line_buf_, '\n',
                              [self = shared_from_this()](beast::error_code ec, size_t n) { self->line_on(ec, n); });
    }

    void line_on(beast::error_code ec, size_t n) {
        if (closed_) return;
        timer_.cancel();
        std::string line;
        if (!ec) {
            line.assign(net::buffers_begin(line_buf_.data()), net::buffers_begin(line_buf_.data()) + std::ptrdiff_t(n));
            line_buf_.consume(n);
        } else if (ec == net::error::eof && line_buf_.size() > 0) {
            // `printf 'text' | nc -N` sends no newline: the end of input ends the line.
            line.assign(net::buffers_begin(line_buf_.data()), net::buffers_end(line_buf_.data()));
            line_buf_.consume(line_buf_.size());
            client_eof_ = true;
        } else if (ec == net::error::not_found) {
            error_finish(RequestError(RequestErrorKind::REQUEST_ERROR_TOO_LARGE, "",
                                      fmt::format("the line is longer than the limit of {} bytes", line_limit(core_.options))));
            return;
        } else {
            close_now();
            return;
        }
        while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
        request_time_ = Clock::now();
        speech_start(line);
    }

    void speech_start(const std::string& line) {
        if (const std::string unready = core_.unready_reason(); !unready.empty()) {
            error_finish(core_.unready_error(unready));
            return;
        }
        SpeechParams params;
        try {
            params = speech_params_parse_tcp_line(line, core_.service, core_.limits);
        } catch (const RequestError& e) {
            error_finish(e);
            return;
        }
        if (!core_.stream_slot_acquire()) {
            error_finish(RequestError(RequestErrorKind::REQUEST_ERROR_BUSY, "",
                                      fmt::format("too many concurrent streams (limit {}); retry later", core_.options.max_streams)));
            return;
        }
        std::shared_ptr<Stream> stream;
        std::unique_ptr<AudioFormatter> formatter;
        try {
            formatter = audio_formatter_create(AudioFormat::AUDIO_FORMAT_OGG_OPUS, core_.opus);
            core_.request_limits_apply(params.request);
            stream = core_.service.submit(params.request);
        } catch (const std::exception& e) {
            core_.stream_slot_release();
            error_finish(submit_error_map(e));
            return;
        }
        core_.metrics.stream_started();
        core_.metrics.request_count("tcp", 200);
        speaking_ = true;
        stream_id_ = stream->id();
        watch_read();
        core_.pumps->job_add(PumpJob{std::move(stream), std::move(formatter), shared_from_this()});
    }

    // A reset while speaking means the client left. EOF alone does not: `nc -N` half-closes
    // after sending its line and still reads the audio.
    void watch_read() {
        if (client_eof_ || closed_ || reading_) return;
        reading_ = true;
        socket_.async_read_some(net::buffer(discard_), [self = shared_from_this()](beast::error_code ec, size_t) {
            self->reading_ = false;
            if (self->closed_) return;
            if (ec == net::error::eof) {
                self->client_eof_ = true;
                if (self->closing_) self->close_now();  // both sides done
                return;
            }
            if (ec) {
                if (self->speaking_) self->core_.metrics.error_count("disconnect");
                self->close_now();
                return;
            }
            self->watch_read();  // anything after the line is ignored
        });
    }

    void audio_on(std::vector<AudioPiece> pieces, size_t bytes, int64_t samples) {
        if (closed_) {
            backlog_.fetch_sub(bytes);
            return;
        }
        if (!first_audio_ && samples > 0) {
            first_audio_ = true;
            core_.metrics.ttfa_observe(seconds_since(request_time_));
        }
        for (auto& p : pieces) out_ += p.bytes;
        write_next();
    }

    void end_on(StreamOutcome outcome) {
        speaking_ = false;
        if (closed_) return;
        terminal_ = std::move(outcome.terminal);  // released when the connection closes
        // Cut by a server stop, too: no end-of-stream page, so a player reports a truncated stream.
        if (outcome.slow_client || outcome.cancelled) {
            close_now();
            return;
        }
        if (!outcome.error.empty()) {
            // Ogg data was probably sent already: stop without the end-of-stream page, so a player
            // reports a truncated stream rather than a complete one.
            QTTS_LOG_WARN("tcp: stream {} failed: {}", stream_id_, outcome.error);
            close_now();
            return;
        }
        finish_after_flush_ = true;
        write_next();
    }

    // The refusal as one "ERROR: <message>" line, then the connection ends. The metrics count it
    // with the status and type its kind has over HTTP (request_error_http).
    void error_finish(const RequestError& e) {
        core_.metrics.error_count(request_error_metric(e));
        core_.metrics.request_count("tcp", e.status());
        std::string line = "ERROR: " + std::string(e.what()) + "\n";
        backlog_.fetch_add(line.size());
        out_ += line;
        finish_after_flush_ = true;
        write_next();
    }

    void write_next() {
        if (writing_ || closed_) return;
        if (out_.empty()) {
            if (finish_after_flush_) close_graceful();
            return;
        }
        inflight_.swap(out_);
        out_.clear();
        writing_ = true;
        deadline_set(core_.options.send_timeout);
        net::async_write(socket_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t n) {
            self->writing_ = false;
            self->backlog_.fetch_sub(n);
            if (self->closed_) return;
            if (ec) {
                if (self->speaking_) self->core_.metrics.error_count("disconnect");
                self->close_now();
                return;
            }
            self->timer_.cancel();
            self->write_next();
        });
    }

    // Shut down our side so the client sees a clean end of stream, then wait (bounded) for the
    // client to close too; closing at once with unread input could reset the connection and
    // destroy audio the client has not read yet.
    void close_graceful() {
        if (closing_) return;
        closing_ = true;
        beast::error_code ec;
        socket_.shutdown(tcp::socket::shutdown_send, ec);
        if (client_eof_) {
            close_now();
            return;
        }
        timer_.expires_after(std::chrono::milliseconds(1000));
        timer_.async_wait([self = shared_from_this()](beast::error_code wec) {
            if (!wec) self->close_now();
        });
        watch_read();
    }

    void close_now() {
        if (closed_) return;
        closed_ = true;
        abandoned_ = true;
        beast::error_code ec;
        socket_.shutdown(tcp::socket::shutdown_both, ec);
        socket_.close(ec);
        timer_.cancel();
        backlog_.fetch_sub(out_.size());
        out_.clear();
        terminal_.release();
    }

    ServerCore& core_;
    tcp::socket socket_;
    ConnectionSlot slot_;
    net::steady_timer timer_;
    net::streambuf line_buf_;
    std::array<char, 1024> discard_{};
    Clock::time_point request_time_;
    uint64_t stream_id_ = 0;
    bool speaking_ = false;
    bool first_audio_ = false;
    bool client_eof_ = false;
    bool reading_ = false;
    bool closing_ = false;
    bool closed_ = false;
    bool writing_ = false;
    bool finish_after_flush_ = false;
    std::string out_;
    std::string inflight_;
    std::atomic<bool> abandoned_{false};
    CounterHold terminal_;  // the ended stream's ServerCore::terminals_pending, until the close
};

}  // namespace

void tcp_session_run(ServerCore& core, tcp::socket socket, ConnectionSlot slot) {
    std::make_shared<TcpSession>(core, std::move(socket), std::move(slot))->run();
}

}  // namespace qtts::server
