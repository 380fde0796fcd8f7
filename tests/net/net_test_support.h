// Helpers for the network tests (header-only, tests/net/ only):
//  - FakeSpeechService: a deterministic SpeechService whose streams play a sine, paced like an
//    engine (first chunk after a delay, then one 80 ms chunk per interval), with incremental
//    text, cancellation and scripted failures. Lets the server be tested without a model.
//  - RecordingService: wraps any service and keeps every stream it handed out, with the time
//    of submission, so tests can look at the server's streams from the outside.
//  - Real clients: curl and nc through the shell, a Beast WebSocket client, raw POSIX sockets.
//  - Decoding: Ogg Opus through libopusfile, raw packets through libopus, s16le.
//  - Comparison: best normalised cross-correlation over a lag window.
//  - Protocol readers: SSE bodies, one WebSocket utterance, the samples a client received.
// Every wait is bounded; every external command runs under `timeout`.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/websocket.hpp>
#include <nlohmann/json.hpp>
#include <opus/opus.h>
#include <opus/opusfile.h>

#include "audio_io/server/speech_service.h"
#include "engine/common/error.h"
#include "test_support.h"

namespace net_test {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr int kRate = 24000;
constexpr int kChunk = 1920;  // one 80 ms codec frame

// ---------------------------------------------------------------------------------------------
// Fake engine
// ---------------------------------------------------------------------------------------------
struct FakeConfig {
    double seconds_per_byte = 0.01;           // audio produced per byte of text
    std::chrono::milliseconds first_delay{20};  // submit -> first chunk
    std::chrono::milliseconds chunk_interval{10};  // between chunks (80 ms of audio each)
    int max_streams = 1000;                   // the service's own limit (ServiceBusyError)
};

// The sine every fake stream plays: frequency from the seed (or 300 Hz), amplitude 0.4.
inline double fake_frequency(const std::optional<uint64_t>& seed, const std::string& speaker) {
    double f = seed ? 180.0 + double(*seed % 97) * 3.0 : 300.0;
    if (speaker == "Bass") f *= 0.5;
    return f;
}
inline float fake_sample(double freq, int64_t i) {
    return float(0.4 * std::sin(2.0 * M_PI * freq * double(i) / kRate));
}
inline int64_t fake_samples_for(size_t text_bytes, double seconds_per_byte) {
    return int64_t(std::llround(double(text_bytes) * seconds_per_byte * kRate));
}

class FakeStream : public qtts::Stream {
public:
    FakeStream(uint64_t id, const qtts::SpeechRequest& r, const FakeConfig& cfg, std::atomic<int>* live)
        : id_(id), cfg_(cfg), freq_(fake_frequency(r.seed, r.speaker)), live_(live) {
        submit_time_ = Clock::now();
        next_chunk_ = submit_time_ + cfg.first_delay;
        target_ = fake_samples_for(r.text.size(), cfg.seconds_per_byte);
        closed_ = !r.incremental;
        fail_ = r.text.find("FAIL") != std::string::npos;
        live_->fetch_add(1);
    }
    ~FakeStream() override { live_->fetch_sub(1); }

    uint64_t id() const override { return id_; }

    size_t read(float* out, size_t n) override {
        std::lock_guard<std::mutex> lock(m_);
        advance_locked(Clock::now());
        const int64_t avail = produced_ - read_pos_;
        const size_t k = size_t(std::min<int64_t>(avail, int64_t(n)));
        for (size_t i = 0; i < k; ++i) out[i] = fake_sample(freq_, read_pos_ + int64_t(i));
        read_pos_ += int64_t(k);
        return k;
    }

    bool wait(std::chrono::milliseconds timeout) override {
        const auto deadline = Clock::now() + timeout;
        std::unique_lock<std::mutex> lock(m_);
        for (;;) {
            const auto now = Clock::now();
            advance_locked(now);
            if (read_pos_ < produced_ || done_locked()) return true;
            if (now >= deadline) return false;
            auto until = deadline;
            if (produced_ < target_ && next_chunk_ < until) until = next_chunk_;
            cv_.wait_until(lock, until);
        }
    }

    bool finished() const override {
        std::lock_guard<std::mutex> lock(m_);
        const_cast<FakeStream*>(this)->advance_locked(Clock::now());
        return done_locked() && read_pos_ == produced_;
    }
    bool generation_done() const override {
        std::lock_guard<std::mutex> lock(m_);
        const_cast<FakeStream*>(this)->advance_locked(Clock::now());
        return done_locked();
    }

    void text_append(const std::string& text) override {
        std::lock_guard<std::mutex> lock(m_);
        if (closed_ || cancelled_) return;
        advance_locked(Clock::now());
        if (produced_ >= target_) next_chunk_ = std::max(next_chunk_, Clock::now());  // resume pacing now
        target_ += fake_samples_for(text.size(), cfg_.seconds_per_byte);
        appended_ += text;
        cv_.notify_all();
    }
    void text_close() override {
        std::lock_guard<std::mutex> lock(m_);
        closed_ = true;
        cv_.notify_all();
    }
    void cancel() override {
        std::lock_guard<std::mutex> lock(m_);
        cancel_called_ = true;
        if (!done_locked()) cancelled_ = true;
        cv_.notify_all();
    }

    // Barge-in: cancel, and what was produced is never read; later reads return 0.
    void discard() override {
        cancel();
        std::lock_guard<std::mutex> lock(m_);
        discarded_ = true;
        read_pos_ = produced_;
    }
    size_t available() const override {
        std::lock_guard<std::mutex> lock(m_);
        const_cast<FakeStream*>(this)->advance_locked(Clock::now());
        return discarded_ ? 0 : size_t(produced_ - read_pos_);
    }

    qtts::StreamMetrics metrics() const override {
        std::lock_guard<std::mutex> lock(m_);
        qtts::StreamMetrics m;
        m.samples = produced_;
        m.frames = (produced_ + kChunk - 1) / kChunk;
        m.ttfa_gen_ms = double(cfg_.first_delay.count());
        m.generation_ms = done_time_ ? std::chrono::duration<double, std::milli>(*done_time_ - submit_time_).count() : 0.0;
        m.rtf = produced_ > 0 ? m.generation_ms / 1000.0 / (double(produced_) / kRate) : 0.0;
        m.stop_reason = cancelled_ ? qtts::StopReason::STOP_CANCELLED
                        : failed_  ? qtts::StopReason::STOP_ERROR
                                   : qtts::StopReason::STOP_EOS;
        return m;
    }
    std::string error() const override {
        std::lock_guard<std::mutex> lock(m_);
        return failed_ ? "scripted failure (text contains FAIL)" : "";
    }
    std::vector<std::vector<int32_t>> codes() const override { return {}; }

    // Test inspection: cancel() was called (whether or not generation had already ended).
    bool cancelled() const {
        std::lock_guard<std::mutex> lock(m_);
        return cancel_called_;
    }
    std::optional<Clock::time_point> done_time() const {
        std::lock_guard<std::mutex> lock(m_);
        return done_time_;
    }
    int64_t target_samples() const {
        std::lock_guard<std::mutex> lock(m_);
        return target_;
    }
    std::string appended() const {
        std::lock_guard<std::mutex> lock(m_);
        return appended_;
    }
    double frequency() const { return freq_; }

private:
    bool done_locked() const { return cancelled_ || failed_ || (closed_ && produced_ >= target_); }

    void advance_locked(Clock::time_point now) {
        while (!cancelled_ && !failed_ && produced_ < target_ && next_chunk_ <= now) {
            produced_ += std::min<int64_t>(kChunk, target_ - produced_);
            next_chunk_ += cfg_.chunk_interval;
            if (fail_ && produced_ >= kChunk) failed_ = true;  // fail after the first chunk
        }
        if (!done_time_ && done_locked()) done_time_ = now;
    }

    uint64_t id_;
    FakeConfig cfg_;
    double freq_;
    std::atomic<int>* live_;
    mutable std::mutex m_;
    std::condition_variable cv_;
    Clock::time_point submit_time_;
    Clock::time_point next_chunk_;
    int64_t target_ = 0;
    int64_t produced_ = 0;
    int64_t read_pos_ = 0;
    bool closed_ = true;
    bool cancelled_ = false;
    bool discarded_ = false;
    bool cancel_called_ = false;
    bool fail_ = false;
    bool failed_ = false;
    std::string appended_;
    std::optional<Clock::time_point> done_time_;
};

class FakeSpeechService : public qtts::SpeechService {
public:
    explicit FakeSpeechService(FakeConfig cfg = {}) : cfg_(cfg) {}

    std::shared_ptr<qtts::Stream> submit(const qtts::SpeechRequest& r) override {
        if (!r.incremental && r.text.empty()) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "empty text");
        std::lock_guard<std::mutex> lock(m_);
        int running = 0;
        for (const auto& st : streams_) running += !st->generation_done();
        if (running >= cfg_.max_streams) throw qtts::ServiceBusyError("fake service is full");
        auto s = std::make_shared<FakeStream>(next_id_.fetch_add(1), r, cfg_, &live_);
        streams_.push_back(s);
        requests_.push_back(r);
        return s;
    }
    std::vector<std::string> voices() const override { return {"Alto", "Bass"}; }
    std::vector<std::string> languages() const override { return {"auto", "English", "Chinese"}; }
    std::string model_name() const override { return "fake-sine"; }
    std::string backend_name() const override { return "fake"; }
    std::string failure() const override {
        std::lock_guard<std::mutex> lock(m_);
        return failure_;
    }
    // As an engine whose backend failed for good (Engine::failure).
    void failure_set(const std::string& why) {
        std::lock_guard<std::mutex> lock(m_);
        failure_ = why;
    }

    std::vector<std::shared_ptr<FakeStream>> streams() const {
        std::lock_guard<std::mutex> lock(m_);
        return streams_;
    }
    std::vector<qtts::SpeechRequest> requests() const {
        std::lock_guard<std::mutex> lock(m_);
        return requests_;
    }
    int live() const { return live_.load(); }
    // True once nobody but this service (and the caller's copy) holds stream i: the server let go.
    bool released(size_t i) const {
        std::lock_guard<std::mutex> lock(m_);
        return i < streams_.size() && streams_[i].use_count() == 1;
    }
    const FakeConfig& config() const { return cfg_; }

private:
    FakeConfig cfg_;
    std::atomic<uint64_t> next_id_{1};
    std::atomic<int> live_{0};
    mutable std::mutex m_;
    std::vector<std::shared_ptr<FakeStream>> streams_;
    std::vector<qtts::SpeechRequest> requests_;
    std::string failure_;
};

// Wraps a service and records what it handed out.
class RecordingService : public qtts::SpeechService {
public:
    explicit RecordingService(qtts::SpeechService& inner) : inner_(inner) {}
    struct Entry {
        std::shared_ptr<qtts::Stream> stream;
        qtts::SpeechRequest request;
        Clock::time_point submitted;
    };
    std::shared_ptr<qtts::Stream> submit(const qtts::SpeechRequest& r) override {
        const auto t = Clock::now();
        auto s = inner_.submit(r);
        std::lock_guard<std::mutex> lock(m_);
        entries_.push_back({s, r, t});
        return s;
    }
    std::vector<std::string> voices() const override { return inner_.voices(); }
    std::vector<std::string> languages() const override { return inner_.languages(); }
    std::string model_name() const override { return inner_.model_name(); }
    std::string backend_name() const override { return inner_.backend_name(); }
    bool ready() const override { return inner_.ready(); }
    std::string failure() const override { return inner_.failure(); }
    std::vector<qtts::EngineStatus> engines() const override { return inner_.engines(); }
    std::vector<Entry> entries() const {
        std::lock_guard<std::mutex> lock(m_);
        return entries_;
    }

private:
    qtts::SpeechService& inner_;
    mutable std::mutex m_;
    std::vector<Entry> entries_;
};

// Waits (bounded) until pred() holds.
template <typename Pred>
bool wait_until(Pred pred, std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
        if (pred()) return true;
        std::this_thread::sleep_for(5ms);
    }
    return pred();
}

// ---------------------------------------------------------------------------------------------
// Files and commands
// ---------------------------------------------------------------------------------------------
inline std::string file_read(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
inline void file_write(const std::string& path, const std::string& data) {
    std::ofstream f(path, std::ios::binary);
    f << data;
}
inline std::string temp_path(const std::string& name) {
    static std::atomic<int> counter{0};
    return qtts_test::temp_dir() + "/" + std::to_string(counter.fetch_add(1)) + "-" + name;
}

struct CommandResult {
    int exit_code = -1;
    std::string out;
};

// Runs a shell command (give it its own `timeout`) and returns its stdout and exit code.
inline CommandResult command_run(const std::string& cmd) {
    CommandResult r;
    FILE* p = popen(cmd.c_str(), "r");
    if (!p) return r;
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
}

struct HttpResult {
    int status = 0;
    int curl_exit = -1;
    std::string body;
    std::string headers;
};

// curl with a JSON body from a file (so any bytes, even invalid UTF-8, go out unchanged).
inline HttpResult curl_request(int port, const std::string& method, const std::string& path, const std::string* body,
                               const std::string& extra = "", int max_time_s = 20) {
    const std::string out = temp_path("body.bin");
    const std::string hdr = temp_path("headers.txt");
    std::string cmd = "timeout " + std::to_string(max_time_s + 5) + " curl -s -S --max-time " + std::to_string(max_time_s) +
                      " -o " + out + " -D " + hdr + " -w '%{http_code}' -X " + method + " " + extra;
    if (body) {
        const std::string in = temp_path("request.json");
        file_write(in, *body);
        cmd += " -H 'Content-Type: application/json' --data-binary @" + in;
    }
    cmd += " 'http://127.0.0.1:" + std::to_string(port) + path + "' 2>/dev/null";
    const CommandResult c = command_run(cmd);
    HttpResult r;
    r.curl_exit = c.exit_code;
    r.status = std::atoi(c.out.c_str());
    r.body = file_read(out);
    r.headers = file_read(hdr);
    return r;
}
inline HttpResult curl_post(int port, const std::string& path, const std::string& body, const std::string& extra = "") {
    return curl_request(port, "POST", path, &body, extra);
}
inline HttpResult curl_get(int port, const std::string& path) { return curl_request(port, "GET", path, nullptr); }

// ---------------------------------------------------------------------------------------------
// Audio decoding and comparison
// ---------------------------------------------------------------------------------------------
inline std::vector<float> s16le_decode(const std::string& bytes, size_t offset = 0) {
    std::vector<float> out;
    for (size_t i = offset; i + 1 < bytes.size(); i += 2) {
        const int16_t v = int16_t(uint16_t(uint8_t(bytes[i])) | (uint16_t(uint8_t(bytes[i + 1])) << 8));
        out.push_back(float(v) / 32767.0f);
    }
    return out;
}

// Decodes a whole Ogg Opus stream (libopusfile: 48 kHz output, pre-skip and end trimming applied).
// ok = false when opusfile rejects it.
inline std::vector<float> ogg_opus_decode_48k(const std::string& bytes, bool* ok = nullptr) {
    std::vector<float> pcm;
    int err = 0;
    OggOpusFile* of = op_open_memory(reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), &err);
    if (!of) {
        if (ok) *ok = false;
        return pcm;
    }
    std::vector<float> buf(5760 * 2);
    bool good = true;
    for (int guard = 0; guard < 1000000; ++guard) {
        const int n = op_read_float(of, buf.data(), int(buf.size()), nullptr);
        if (n < 0) {
            good = false;
            break;
        }
        if (n == 0) break;
        const int channels = op_head(of, -1)->channel_count;
        for (int i = 0; i < n; ++i) pcm.push_back(buf[size_t(i * channels)]);
    }
    op_free(of);
    if (ok) *ok = good;
    return pcm;
}
// The 24 kHz signal is band-limited to 12 kHz, so every other 48 kHz sample is close enough.
inline std::vector<float> decimate2(const std::vector<float>& x) {
    std::vector<float> y;
    y.reserve(x.size() / 2);
    for (size_t i = 0; i < x.size(); i += 2) y.push_back(x[i]);
    return y;
}

// One-pole high-pass at ~20 Hz: removes the DC offset every Opus encoder rejects anyway.
inline std::vector<float> dc_block(const std::vector<float>& x, double cutoff_hz = 20.0) {
    std::vector<float> y(x.size());
    const double rc = 1.0 / (2.0 * M_PI * cutoff_hz), dt = 1.0 / kRate, alpha = rc / (rc + dt);
    double prev_y = 0.0, prev_x = x.empty() ? 0.0 : x[0];
    for (size_t i = 0; i < x.size(); ++i) {
        prev_y = alpha * (prev_y + double(x[i]) - prev_x);
        prev_x = x[i];
        y[i] = float(prev_y);
    }
    return y;
}

// Number of complete Ogg pages at the start of bytes (by the page header's segment table).
inline size_t ogg_pages_complete(const std::string& b) {
    size_t pos = 0, pages = 0;
    while (pos + 27 <= b.size() && b.compare(pos, 4, "OggS") == 0) {
        const size_t segments = uint8_t(b[pos + 26]);
        if (pos + 27 + segments > b.size()) break;
        size_t body = 0;
        for (size_t i = 0; i < segments; ++i) body += uint8_t(b[pos + 27 + i]);
        if (pos + 27 + segments + body > b.size()) break;
        pos += 27 + segments + body;
        ++pages;
    }
    return pages;
}

// True when the last complete Ogg page in b carries the end-of-stream flag (a finished stream).
inline bool ogg_ends_with_eos(const std::string& b) {
    size_t pos = 0, last = std::string::npos;
    for (size_t pages = ogg_pages_complete(b), i = 0; i < pages; ++i) {
        last = pos;
        const size_t segments = uint8_t(b[pos + 26]);
        size_t body = 0;
        for (size_t k = 0; k < segments; ++k) body += uint8_t(b[pos + 27 + k]);
        pos += 27 + segments + body;
    }
    return last != std::string::npos && (uint8_t(b[last + 5]) & 0x04) != 0;
}

// Best normalised cross-correlation of a and b over lags in [-max_lag, max_lag].
inline double correlation_best(const std::vector<float>& a, const std::vector<float>& b, int max_lag, int* best_lag = nullptr) {
    double best = -2.0;
    for (int lag = -max_lag; lag <= max_lag; ++lag) {
        double ab = 0, aa = 0, bb = 0;
        for (size_t i = 0; i < a.size(); ++i) {
            const long j = long(i) + lag;
            if (j < 0 || j >= long(b.size())) continue;
            ab += double(a[i]) * b[size_t(j)];
            aa += double(a[i]) * a[i];
            bb += double(b[size_t(j)]) * b[size_t(j)];
        }
        if (aa <= 0 || bb <= 0) continue;
        const double c = ab / std::sqrt(aa * bb);
        if (c > best) {
            best = c;
            if (best_lag) *best_lag = lag;
        }
    }
    return best;
}

// Raw packets from the WebSocket `opus` format, decoded with libopus at 24 kHz.
class PacketDecoder {
public:
    PacketDecoder() {
        int err = 0;
        dec_ = opus_decoder_create(kRate, 1, &err);
    }
    ~PacketDecoder() {
        if (dec_) opus_decoder_destroy(dec_);
    }
    // Returns the decoded samples, or -1 for a corrupt packet.
    int decode(const std::string& packet, std::vector<float>& out) {
        std::vector<float> buf(5760);
        const int n = opus_decode_float(dec_, reinterpret_cast<const unsigned char*>(packet.data()), opus_int32(packet.size()),
                                        buf.data(), int(buf.size()), 0);
        if (n > 0) out.insert(out.end(), buf.begin(), buf.begin() + n);
        return n;
    }

private:
    OpusDecoder* dec_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// WebSocket client (Beast); every operation is bounded by the timeout
// ---------------------------------------------------------------------------------------------
class WsClient {
public:
    struct Message {
        bool text = true;
        std::string data;
    };

    // rcvbuf > 0 sets SO_RCVBUF before connecting (a small window for slow-reader tests).
    explicit WsClient(int port, std::chrono::milliseconds timeout = 10000ms, int rcvbuf = 0)
        : ws_(ioc_), timeout_(timeout) {
        namespace net = boost::asio;
        const std::string path = "/v1/audio/stream";
        auto& tcp = boost::beast::get_lowest_layer(ws_);
        tcp.expires_after(timeout_);
        boost::system::error_code ec;
        tcp.socket().open(net::ip::tcp::v4(), ec);
        if (!ec && rcvbuf > 0) tcp.socket().set_option(net::socket_base::receive_buffer_size(rcvbuf), ec);
        if (!ec) tcp.socket().connect(net::ip::tcp::endpoint(net::ip::make_address("127.0.0.1"), uint16_t(port)), ec);
        if (ec) {
            error_ = "connect: " + ec.message();
            return;
        }
        ws_.async_handshake("127.0.0.1", path, [this](boost::system::error_code e) { ec_ = e; });
        run();
        if (ec_) {
            error_ = "handshake: " + ec_.message();
            return;
        }
        connected_ = true;
    }

    bool connected() const { return connected_; }
    const std::string& error() const { return error_; }

    bool send_text(const std::string& data) { return send(true, data); }
    bool send_binary(const std::string& data) { return send(false, data); }

    // nullopt on close, error or timeout.
    std::optional<Message> read() {
        if (!connected_) return std::nullopt;
        buffer_.consume(buffer_.size());
        ws_.async_read(buffer_, [this](boost::system::error_code e, size_t) { ec_ = e; });
        run();
        if (ec_) {
            error_ = "read: " + ec_.message();
            connected_ = false;
            return std::nullopt;
        }
        return Message{ws_.got_text(), boost::beast::buffers_to_string(buffer_.data())};
    }

    // Reads until a text message whose "type" is one of the given types (binary messages and
    // other events are collected). nullopt when the connection ends first.
    std::optional<std::string> read_until_event(const std::vector<std::string>& types, std::vector<Message>* seen = nullptr) {
        for (int guard = 0; guard < 100000; ++guard) {
            auto m = read();
            if (!m) return std::nullopt;
            if (seen) seen->push_back(*m);
            if (m->text) {
                for (const auto& t : types)
                    if (m->data.find("\"type\":\"" + t + "\"") != std::string::npos) return m->data;
            }
        }
        return std::nullopt;
    }

    // The close frame the server sent (code 0 when none arrived).
    boost::beast::websocket::close_reason close_reason() const { return ws_.reason(); }

    void close() {
        if (!connected_) return;
        ws_.async_close(boost::beast::websocket::close_code::normal, [this](boost::system::error_code e) { ec_ = e; });
        run();
        connected_ = false;
    }

    // Drops the TCP connection without a close handshake (a vanished client).
    void drop() {
        boost::system::error_code ec;
        boost::beast::get_lowest_layer(ws_).socket().close(ec);
        connected_ = false;
    }

private:
    bool send(bool text, const std::string& data) {
        if (!connected_) return false;
        ws_.text(text);
        ws_.async_write(boost::asio::buffer(data), [this](boost::system::error_code e, size_t) { ec_ = e; });
        run();
        if (ec_) {
            error_ = "write: " + ec_.message();
            connected_ = false;
            return false;
        }
        return true;
    }
    // Runs the pending operation for at most the timeout; past it the socket is cancelled, so
    // the operation ends with an error (the tcp_stream expiry alone does not bound WebSocket
    // reads once the handshake is done).
    void run() {
        boost::beast::get_lowest_layer(ws_).expires_after(timeout_);
        ioc_.restart();
        ioc_.run_for(timeout_);
        if (!ioc_.stopped()) {
            boost::system::error_code ignored;
            boost::beast::get_lowest_layer(ws_).socket().cancel(ignored);
            ioc_.run_for(timeout_);
            if (!ec_) ec_ = boost::asio::error::timed_out;
        }
    }

    boost::asio::io_context ioc_;
    boost::beast::websocket::stream<boost::beast::tcp_stream> ws_;
    boost::beast::flat_buffer buffer_;
    std::chrono::milliseconds timeout_;
    boost::system::error_code ec_;
    bool connected_ = false;
    std::string error_;
};

// ---------------------------------------------------------------------------------------------
// Raw POSIX client sockets, for misbehaving clients
// ---------------------------------------------------------------------------------------------
inline int raw_connect(int port, int rcvbuf = 0) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    if (rcvbuf > 0) setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
        ::close(fd);
        return -1;
    }
    return fd;
}
inline bool raw_send(int fd, const std::string& data) {
    size_t done = 0;
    while (done < data.size()) {
        const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
        if (n <= 0) return false;
        done += size_t(n);
    }
    return true;
}
// Reads what arrives within the timeout; stops early at EOF (sets *eof) or after max bytes.
inline std::string raw_recv(int fd, std::chrono::milliseconds timeout, size_t max = 1 << 20, bool* eof = nullptr) {
    std::string out;
    const auto deadline = Clock::now() + timeout;
    if (eof) *eof = false;
    while (out.size() < max) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) break;
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, int(left)) <= 0) break;
        char buf[16384];
        const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, max - out.size()), 0);
        if (n <= 0) {
            if (eof) *eof = true;
            break;
        }
        out.append(buf, size_t(n));
    }
    return out;
}
// True when the peer closes (EOF or reset) within the timeout; reads and drops data meanwhile.
inline bool raw_wait_closed(int fd, std::chrono::milliseconds timeout) {
    bool eof = false;
    const auto deadline = Clock::now() + timeout;
    while (!eof && Clock::now() < deadline) raw_recv(fd, 50ms, 1 << 20, &eof);
    return eof;
}

// `clients` curl processes POST the file `body_path` to /v1/audio/speech at once, each saving
// its response as <dir>/out<i>.ogg (i = 1..clients); returns how many got status 200.
inline int curl_clients_parallel(int port, const std::string& body_path, const std::string& dir, int clients,
                                 int max_seconds) {
    if (command_run("mkdir -p " + dir).exit_code != 0) return 0;
    const std::string cmd = "cd " + dir + " && for i in $(seq 1 " + std::to_string(clients) + "); do (timeout " +
                            std::to_string(max_seconds + 5) + " curl -s -N --max-time " + std::to_string(max_seconds) +
                            " -o out$i.ogg -w '%{http_code}\\n' --data-binary @" + body_path + " http://127.0.0.1:" +
                            std::to_string(port) + "/v1/audio/speech) & done; wait";
    const CommandResult r = command_run(cmd);
    int ok_count = 0;
    std::istringstream codes(r.out);
    std::string code;
    while (codes >> code) ok_count += code == "200";
    return ok_count;
}

inline std::string speech_json(const std::string& input, const std::string& format, bool stream,
                               const std::string& extra = "") {
    std::string j = "{\"model\":\"qtts\",\"input\":\"" + input + "\",\"response_format\":\"" + format + "\"";
    if (stream) j += ",\"stream\":true";
    if (!extra.empty()) j += "," + extra;
    return j + "}";
}

// ---------------------------------------------------------------------------------------------
// Protocol readers
// ---------------------------------------------------------------------------------------------
// Standard base64, decoded by hand: the tests must not share the server's encoder.
inline std::string base64_decode(const std::string& b64) {
    static const std::string abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    uint32_t acc = 0;
    int bits = 0;
    for (char c : b64) {
        if (c == '=') break;
        acc = (acc << 6) | uint32_t(abc.find(c));
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out.push_back(char((acc >> bits) & 0xff));
        }
    }
    return out;
}

// A server-sent-events body: the audio of every speech.audio.delta, and every event in order.
struct SseResult {
    std::string audio;
    std::vector<nlohmann::json> events;
};
inline SseResult sse_parse(const std::string& body) {
    SseResult r;
    std::istringstream lines(body);
    std::string line;
    while (std::getline(lines, line)) {
        if (line.rfind("data: ", 0) != 0) continue;
        nlohmann::json ev = nlohmann::json::parse(line.substr(6));
        if (ev.value("type", "") == "speech.audio.delta") r.audio += base64_decode(ev["audio"].get<std::string>());
        r.events.push_back(std::move(ev));
    }
    return r;
}

// Everything one WebSocket utterance brought, read up to its `done` (or the connection's end).
struct WsUtterance {
    nlohmann::json started;                 // null when none came
    nlohmann::json done;                    // null when none came
    std::vector<nlohmann::json> errors;     // `error` events before `done`
    std::vector<std::string> audio;         // binary messages, in order
    bool connection_ended = false;          // the connection closed before `done`
};
inline WsUtterance ws_utterance_read(WsClient& ws) {
    WsUtterance u;
    for (int guard = 0; guard < 100000; ++guard) {
        auto m = ws.read();
        if (!m) {
            u.connection_ended = true;
            return u;
        }
        if (!m->text) {
            u.audio.push_back(std::move(m->data));
            continue;
        }
        nlohmann::json ev = nlohmann::json::parse(m->data);
        const std::string type = ev.value("type", "");
        if (type == "started") u.started = ev;
        if (type == "error") u.errors.push_back(ev);
        if (type == "done") {
            u.done = ev;
            return u;
        }
    }
    return u;
}

// The utterance samples a client can decode from the audio messages of one WebSocket utterance
// in `format`: exact for pcm; from the last granule for ogg (decoded with libopusfile); for raw
// Opus packets the whole packets less pre_skip, where the last packet may be padding.
struct SampleRange {
    int64_t lo = 0, hi = 0;
    bool contains(int64_t n) const { return n >= lo && n <= hi; }
};
inline SampleRange ws_received_samples(const std::string& format, const std::vector<std::string>& audio, int pre_skip,
                                       bool* decodes = nullptr) {
    if (decodes) *decodes = true;
    if (format == "pcm") {
        int64_t bytes = 0;
        for (const auto& a : audio) bytes += int64_t(a.size());
        return {bytes / 2, bytes / 2};
    }
    if (format == "ogg") {
        std::string all;
        for (const auto& a : audio) all += a;
        bool ok = false;
        const int64_t n48 = int64_t(ogg_opus_decode_48k(all, &ok).size());
        if (decodes) *decodes = ok;
        return {std::max<int64_t>(0, n48 / 2 - 1), (n48 + 1) / 2};
    }
    PacketDecoder dec;
    std::vector<float> pcm;
    for (const auto& frame : audio) {
        if (frame.size() < 12) {
            if (decodes) *decodes = false;
            continue;
        }
        if (dec.decode(frame.substr(12), pcm) != 480 && decodes) *decodes = false;
    }
    const int64_t hi = std::max<int64_t>(0, int64_t(pcm.size()) - pre_skip);
    return {std::max<int64_t>(0, hi - 479), hi};
}

}  // namespace net_test
