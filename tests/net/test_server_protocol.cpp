// Every protocol path against the real engine (issue 15): each HTTP format whole and streamed,
// SSE, each WebSocket format with `start.text`, empty utterances, cancel at every phase, idle
// timeouts, reconnects, plain TCP; and the invariant that every accepted stream ends with
// exactly one terminal message whose sample count is what the client received, over a seeded
// random mix of client behaviours. One engine (the embedded default model) serves them all;
// each request is capped at 1 s of audio to keep the run short on two CPU cores.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "engine_server.h"

using namespace net_test;
using json = nlohmann::json;

namespace {

EngineServer& protocol_server() {
    qtts::log();  // create the logger first, so it outlives the server at exit
    static EngineServer s(EngineServer::server_options(1.0));
    return s;
}

// The engine stream the recorder saw for a request with this seed (each request here has its own).
std::optional<RecordingService::Entry> entry_by_seed(const EngineServer& s, uint64_t seed) {
    for (const auto& e : s.recorder.entries())
        if (e.request.seed && *e.request.seed == seed) return e;
    return std::nullopt;
}

json ws_start(const EngineServer& s, const std::string& format, uint64_t seed, const std::string& text, bool end) {
    json j = {{"type", "start"}, {"format", format}, {"seed", seed}};
    if (!text.empty()) j["text"] = text;
    if (end) j["end"] = true;
    if (!s.first_voice().empty()) j["voice"] = s.first_voice();
    return j;
}

// Samples an Ogg Opus body decodes to, at 24 kHz (libopusfile decodes at 48 kHz).
int64_t ogg_samples_24k(const std::string& body, bool* ok) { return int64_t(ogg_opus_decode_48k(body, ok).size() / 2); }

bool stop_reason_natural(const json& done) {
    const std::string r = done.value("stop_reason", "");
    return r == "eos" || r == "max_frames" || r == "frame_budget";
}

std::atomic<uint64_t> g_seed{1000};  // a fresh seed per request: the recorder finds streams by it

}  // namespace

TEST_CASE("protocol: every HTTP format, whole and streamed, carries exactly the engine's samples", "[net]") {
    EngineServer& s = protocol_server();
    for (const std::string format : {"pcm", "wav", "opus"}) {
        for (const bool stream : {false, true}) {
            const uint64_t seed = g_seed++;
            INFO("format " << format << (stream ? ", streamed" : ", whole file"));
            const HttpResult r = curl_post(s.port(), "/v1/audio/speech", speech_body("Hi there.", format, stream, seed, s.first_voice()));
            REQUIRE(r.status == 200);
            CHECK(r.curl_exit == 0);
            const auto entry = entry_by_seed(s, seed);
            REQUIRE(entry);
            const int64_t engine_samples = entry->stream->metrics().samples;
            CHECK(engine_samples > 0);
            if (format == "pcm") {
                CHECK(int64_t(r.body.size()) == 2 * engine_samples);
            } else if (format == "wav") {
                REQUIRE(r.body.size() >= 44);
                CHECK(r.body.compare(0, 4, "RIFF") == 0);
                CHECK(int64_t(r.body.size() - 44) == 2 * engine_samples);
            } else {
                bool ok = false;
                CHECK(std::llabs((long long)(ogg_samples_24k(r.body, &ok) - engine_samples)) <= 1);
                CHECK(ok);
            }
        }
    }
    const uint64_t seed = g_seed++;
    const HttpResult sse = curl_post(s.port(), "/v1/audio/speech", speech_body("Hi there.", "pcm", true, seed, s.first_voice(), "sse"));
    REQUIRE(sse.status == 200);
    const SseResult parsed = sse_parse(sse.body);
    REQUIRE(!parsed.events.empty());
    CHECK(parsed.events.back()["type"] == "speech.audio.done");
    const auto entry = entry_by_seed(s, seed);
    REQUIRE(entry);
    CHECK(int64_t(parsed.audio.size()) == 2 * entry->stream->metrics().samples);
    CHECK(parsed.events.back()["metrics"]["samples"] == entry->stream->metrics().samples);
}

TEST_CASE("protocol: WebSocket start.text is spoken by the engine, in every format", "[net]") {
    // Issue 15, item 2: the engine used to drop start.text (started, then done with 0 samples).
    EngineServer& s = protocol_server();
    WsClient ws(s.port(), 60000ms);
    REQUIRE(ws.connected());
    for (const std::string format : {"opus", "ogg", "pcm"}) {
        INFO("format " << format);
        const uint64_t seed = g_seed++;
        REQUIRE(ws.send_text(ws_start(s, format, seed, "Good morning.", true).dump()));
        const WsUtterance u = ws_utterance_read(ws);
        REQUIRE(!u.done.is_null());
        INFO(u.done.dump());
        CHECK(u.errors.empty());
        CHECK(stop_reason_natural(u.done));
        const int64_t samples = u.done["samples"].get<int64_t>();
        CHECK(samples > 0);
        const auto entry = entry_by_seed(s, seed);
        REQUIRE(entry);
        CHECK(samples == entry->stream->metrics().samples);
        bool decodes = false;
        const SampleRange got = ws_received_samples(format, u.audio, u.started.value("pre_skip", 0), &decodes);
        CHECK(decodes);
        INFO("received " << got.lo << ".." << got.hi);
        CHECK(got.contains(samples));
    }
}

TEST_CASE("protocol: empty utterances end cleanly on every transport", "[net]") {
    // Issue 15, item 1: an `ogg` utterance with no samples aborted the whole process.
    EngineServer& s = protocol_server();
    WsClient ws(s.port(), 30000ms);
    REQUIRE(ws.connected());
    for (const std::string format : {"ogg", "opus", "pcm"}) {
        // Closed with no text to speak: blank text in `start` itself, or an `end` with empty text.
        for (const bool end_in_start : {true, false}) {
            INFO("format " << format << (end_in_start ? ", start with blank text and end" : ", start then end with empty text"));
            REQUIRE(ws.send_text(ws_start(s, format, g_seed++, end_in_start ? " \n  " : "", end_in_start).dump()));
            if (!end_in_start) REQUIRE(ws.send_text(R"({"type":"end","text":""})"));
            const WsUtterance u = ws_utterance_read(ws);
            REQUIRE(!u.done.is_null());
            INFO(u.done.dump());
            CHECK(u.errors.empty());
            CHECK(u.done["samples"] == 0);
            bool decodes = false;
            const SampleRange got = ws_received_samples(format, u.audio, u.started.value("pre_skip", 0), &decodes);
            CHECK(got.contains(0));
            if (format == "ogg") {
                // A complete, valid Ogg Opus stream of no audio (headers and an end-of-stream page).
                CHECK(decodes);
                std::string all;
                for (const auto& a : u.audio) all += a;
                CHECK(ogg_ends_with_eos(all));
            }
        }
    }
    // The same connection still speaks, and the process is alive for everyone.
    REQUIRE(ws.send_text(ws_start(s, "ogg", g_seed++, "Still here.", true).dump()));
    const WsUtterance after = ws_utterance_read(ws);
    REQUIRE(!after.done.is_null());
    CHECK(after.done["samples"].get<int64_t>() > 0);
    ws.close();

    const HttpResult empty = curl_post(s.port(), "/v1/audio/speech", speech_body("", "opus", true, 1, ""));
    CHECK(empty.status == 400);
    const HttpResult blank = curl_post(s.port(), "/v1/audio/speech", speech_body("   ", "opus", false, 1, ""));
    CHECK(blank.status == 400);
    const std::string line = temp_path("empty-line.txt");
    file_write(line, "\n");
    const CommandResult tcp = command_run("timeout 20 nc 127.0.0.1 " + std::to_string(s.tcp_port()) + " < " + line);
    CHECK(tcp.out.rfind("ERROR: ", 0) == 0);
    CHECK(curl_get(s.port(), "/healthz").status == 200);
}

TEST_CASE("protocol: cancel at every phase; done.samples is what the client received", "[net]") {
    // Issue 15, item 7: after a cancel, done.samples counted audio that was dropped, never sent.
    EngineServer& s = protocol_server();
    WsClient ws(s.port(), 30000ms);
    REQUIRE(ws.connected());

    SECTION("before any text") {
        REQUIRE(ws.send_text(ws_start(s, "pcm", g_seed++, "", false).dump()));
        REQUIRE(ws.send_text(R"({"type":"cancel"})"));
        const WsUtterance u = ws_utterance_read(ws);
        REQUIRE(!u.done.is_null());
        CHECK(u.done["stop_reason"] == "cancelled");
        CHECK(u.done["samples"] == 0);
        CHECK(u.audio.empty());
    }
    SECTION("right after start, before the first audio") {
        for (const std::string format : {"pcm", "opus", "ogg"}) {
            INFO("format " << format);
            REQUIRE(ws.send_text(ws_start(s, format, g_seed++, "A sentence the client cancels at once.", false).dump()));
            REQUIRE(ws.send_text(R"({"type":"cancel"})"));
            const WsUtterance u = ws_utterance_read(ws);
            REQUIRE(!u.done.is_null());
            INFO(u.done.dump());
            const SampleRange got = ws_received_samples(format, u.audio, u.started.value("pre_skip", 0));
            CHECK(got.contains(u.done["samples"].get<int64_t>()));
        }
    }
    SECTION("after the first audio") {
        for (const std::string format : {"pcm", "opus", "ogg"}) {
            INFO("format " << format);
            const uint64_t seed = g_seed++;
            REQUIRE(ws.send_text(ws_start(s, format, seed, "A longer sentence that keeps the engine busy for a while.", true).dump()));
            std::vector<WsClient::Message> before;
            // ogg: the first binary message holds the headers only; wait for one with audio.
            const size_t audio_messages = format == "ogg" ? 2 : 1;
            size_t binary = 0;
            json started;
            while (binary < audio_messages) {
                auto m = ws.read();
                REQUIRE(m);
                if (m->text) {
                    const json ev = json::parse(m->data);
                    if (ev["type"] == "started") started = ev;
                    REQUIRE(ev["type"] != "done");
                    continue;
                }
                ++binary;
                before.push_back(*m);
            }
            REQUIRE(ws.send_text(R"({"type":"cancel"})"));
            WsUtterance u = ws_utterance_read(ws);
            REQUIRE(!u.done.is_null());
            INFO(u.done.dump());
            std::vector<std::string> audio;
            for (const auto& m : before) audio.push_back(m.data);
            audio.insert(audio.end(), u.audio.begin(), u.audio.end());
            bool decodes = false;
            const SampleRange got = ws_received_samples(format, audio, started.value("pre_skip", 0), &decodes);
            CHECK(decodes);
            INFO("received " << got.lo << ".." << got.hi);
            const int64_t samples = u.done["samples"].get<int64_t>();
            CHECK(samples > 0);
            CHECK(got.contains(samples));
            // Never more than the engine made (the audio dropped at the cancel is not counted).
            const auto entry = entry_by_seed(s, seed);
            REQUIRE(entry);
            CHECK(samples <= entry->stream->metrics().samples);
        }
    }
    SECTION("after done: harmless, no second done") {
        REQUIRE(ws.send_text(ws_start(s, "pcm", g_seed++, "Short.", true).dump()));
        const WsUtterance u = ws_utterance_read(ws);
        REQUIRE(!u.done.is_null());
        REQUIRE(ws.send_text(R"({"type":"cancel"})"));
        // The next message the server sends belongs to the next utterance.
        REQUIRE(ws.send_text(ws_start(s, "pcm", g_seed++, "", true).dump()));
        auto next = ws.read();
        REQUIRE(next);
        REQUIRE(next->text);
        CHECK(json::parse(next->data)["type"] == "started");
        const WsUtterance rest = ws_utterance_read(ws);
        CHECK(!rest.done.is_null());
    }
    ws.close();
    CHECK(wait_until([&] { return s.server.active_streams() == 0; }, 10000ms));
}

TEST_CASE("protocol: idle timeouts end with a terminal event and a close frame", "[net]") {
    // Issue 15, item 4: the WebSocket idle timeout used to drop the socket (1006), no event.
    EngineServer& s = protocol_server();
    qtts::ServerOptions o = EngineServer::server_options(1.0);
    o.tcp_port = 0;
    o.idle_timeout = 400ms;
    qtts::HttpServer idle_server(s.recorder, o);  // the same engine behind a short idle timeout
    idle_server.start();

    SECTION("WebSocket with nothing running: error idle_timeout, then close 1000") {
        WsClient ws(idle_server.port(), 10000ms);
        REQUIRE(ws.connected());
        auto m = ws.read();
        REQUIRE(m);
        const json ev = json::parse(m->data);
        CHECK(ev["type"] == "error");
        CHECK(ev["error"]["code"] == "idle_timeout");
        CHECK(!ws.read());  // then the close handshake
        CHECK(ws.close_reason().code == boost::beast::websocket::close_code::normal);
        CHECK(std::string(ws.close_reason().reason.c_str()) == "idle timeout");
    }
    SECTION("WebSocket utterance waiting for text: done with stop_reason timeout, then close 1000") {
        WsClient ws(idle_server.port(), 10000ms);
        REQUIRE(ws.connected());
        REQUIRE(ws.send_text(ws_start(s, "pcm", g_seed++, "", false).dump()));
        const WsUtterance u = ws_utterance_read(ws);
        REQUIRE(!u.done.is_null());
        CHECK(u.done["stop_reason"] == "timeout");
        CHECK(u.done["samples"] == 0);
        CHECK(!ws.read());
        CHECK(ws.close_reason().code == boost::beast::websocket::close_code::normal);
    }
    SECTION("HTTP keep-alive and TCP: an idle connection is closed") {
        const int http_fd = raw_connect(idle_server.port());
        const int tcp_fd = raw_connect(idle_server.tcp_port());
        REQUIRE(http_fd >= 0);
        REQUIRE(tcp_fd >= 0);
        CHECK(raw_wait_closed(http_fd, 3000ms));
        CHECK(raw_wait_closed(tcp_fd, 3000ms));
        ::close(http_fd);
        ::close(tcp_fd);
    }
    CHECK(wait_until([&] { return idle_server.active_streams() == 0; }, 5000ms));
    idle_server.stop();
}

TEST_CASE("protocol: reconnects after closing and after vanishing mid-stream", "[net]") {
    EngineServer& s = protocol_server();
    for (int round = 0; round < 3; ++round) {
        INFO("round " << round);
        WsClient ws(s.port(), 30000ms);
        REQUIRE(ws.connected());
        REQUIRE(ws.send_text(ws_start(s, "pcm", g_seed++, "Round trip.", true).dump()));
        if (round == 1) {
            // Vanish after the first audio: the server cancels the stream and frees its slot.
            for (int guard = 0; guard < 1000; ++guard) {
                auto m = ws.read();
                REQUIRE(m);
                if (!m->text) break;
            }
            ws.drop();
            CHECK(wait_until([&] { return s.server.active_streams() == 0; }, 10000ms));
            continue;
        }
        const WsUtterance u = ws_utterance_read(ws);
        REQUIRE(!u.done.is_null());
        CHECK(ws_received_samples("pcm", u.audio, 0).contains(u.done["samples"].get<int64_t>()));
        ws.close();
    }
    // HTTP after a client vanished mid-stream on the same server.
    const int fd = raw_connect(s.port());
    REQUIRE(fd >= 0);
    const std::string body = speech_body("Gone before the end.", "pcm", true, g_seed++, s.first_voice());
    REQUIRE(raw_send(fd, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) +
                             "\r\n\r\n" + body));
    CHECK(!raw_recv(fd, 30000ms, 300).empty());
    ::close(fd);
    const uint64_t seed = g_seed++;
    const HttpResult again = curl_post(s.port(), "/v1/audio/speech", speech_body("Back again.", "pcm", false, seed, s.first_voice()));
    CHECK(again.status == 200);
    CHECK(wait_until([&] { return s.server.active_streams() == 0; }, 10000ms));
}

// ---------------------------------------------------------------------------------------------
// The invariant, over a random mix of clients
// ---------------------------------------------------------------------------------------------
namespace {

enum class Transport { WS, HTTP, SSE, TCP };
enum class Behaviour { NORMAL, CANCEL_EARLY, CANCEL_LATE, VANISH, SLOW_READER, EMPTY_TEXT, BAD_JSON };
const char* const kTransportNames[] = {"websocket", "http", "sse", "tcp"};
const char* const kBehaviourNames[] = {"normal", "cancel-early", "cancel-late", "vanish", "slow-reader", "empty-text", "bad-json"};

// What one client saw; checked on the main thread (Catch2 assertions are not thread-safe).
struct Verdict {
    std::string label;
    uint64_t seed = 0;
    bool accepted = false;         // the server took a stream for it
    bool client_sees_end = true;   // false for a client that vanished on purpose
    int terminals = 0;             // done / speech.audio.done / error events, complete transfers
    bool terminal_last = true;     // nothing of this stream came after its terminal message
    bool samples_checked = false;  // reported and received are comparable
    int64_t reported = -1;         // the sample count the server reported (or the engine made)
    SampleRange received;
    bool refused_as_expected = true;  // bad input got its documented error
    std::string note;
};

Verdict ws_client_run(EngineServer& s, Behaviour b, const std::string& format, uint64_t seed) {
    Verdict v;
    WsClient ws(s.port(), 30000ms, b == Behaviour::SLOW_READER ? 4096 : 0);
    if (!ws.connected()) {
        v.note = "connect failed: " + ws.error();
        return v;
    }
    const std::string text = "Testing one two three.";
    if (b == Behaviour::BAD_JSON) {
        ws.send_text("{\"type\": start");
        auto m = ws.read();
        v.refused_as_expected = m && m->text && json::parse(m->data)["type"] == "error";
    }
    const bool end = b != Behaviour::CANCEL_EARLY;
    ws.send_text(ws_start(s, format, seed, b == Behaviour::EMPTY_TEXT ? "" : text, end).dump());
    if (b == Behaviour::CANCEL_EARLY) ws.send_text(R"({"type":"cancel"})");
    std::vector<std::string> audio;
    json started;
    if (b == Behaviour::CANCEL_LATE || b == Behaviour::VANISH) {
        const size_t wanted = format == "ogg" ? 2 : 1;  // ogg: past the header message
        for (int guard = 0; guard < 100000 && audio.size() < wanted; ++guard) {
            auto m = ws.read();
            if (!m) break;
            if (m->text) {
                const json ev = json::parse(m->data);
                if (ev["type"] == "started") started = ev;
                if (ev["type"] == "done") {  // ended before the wanted audio: count it normally
                    v.accepted = true;
                    v.terminals = 1;
                    v.reported = ev["samples"].get<int64_t>();
                    v.received = ws_received_samples(format, audio, started.value("pre_skip", 0));
                    v.samples_checked = true;
                    return v;
                }
            } else {
                audio.push_back(m->data);
            }
        }
        if (b == Behaviour::VANISH) {
            v.accepted = !started.is_null();
            v.client_sees_end = false;
            ws.drop();
            return v;
        }
        ws.send_text(R"({"type":"cancel"})");
    }
    if (b == Behaviour::SLOW_READER) std::this_thread::sleep_for(300ms);  // let the socket fill up
    WsUtterance u = ws_utterance_read(ws);
    if (!u.started.is_null()) started = u.started;
    v.accepted = !started.is_null();
    audio.insert(audio.end(), u.audio.begin(), u.audio.end());
    if (u.done.is_null()) {
        v.note = "no done";
        return v;
    }
    v.terminals = 1;
    v.reported = u.done["samples"].get<int64_t>();
    v.received = ws_received_samples(format, audio, started.value("pre_skip", 0));
    v.samples_checked = true;
    // Exactly one: the next thing on the connection belongs to the next utterance.
    ws.send_text(ws_start(s, "pcm", seed + 1000000, "", true).dump());
    auto next = ws.read();
    v.terminal_last = next && next->text && json::parse(next->data)["type"] == "started";
    ws_utterance_read(ws);
    ws.close();
    return v;
}

Verdict http_client_run(EngineServer& s, Transport t, Behaviour b, uint64_t seed) {
    Verdict v;
    const std::string voice = s.first_voice();
    if (b == Behaviour::EMPTY_TEXT || b == Behaviour::BAD_JSON) {
        const std::string body = b == Behaviour::EMPTY_TEXT ? speech_body("", "pcm", true, seed, voice) : "{\"input\": ";
        v.refused_as_expected = curl_post(s.port(), "/v1/audio/speech", body).status == 400;
        return v;
    }
    const std::string body = speech_body("Testing one two three.", "pcm", true, seed, voice, t == Transport::SSE ? "sse" : "");
    if (b == Behaviour::CANCEL_EARLY || b == Behaviour::CANCEL_LATE || b == Behaviour::VANISH) {
        // HTTP has no cancel message: leaving is how a client cancels.
        const int fd = raw_connect(s.port());
        if (fd < 0) return v;
        raw_send(fd, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
                         body);
        v.accepted = raw_recv(fd, 20000ms, b == Behaviour::CANCEL_EARLY ? 100 : 2000).find("200 OK") != std::string::npos;
        ::close(fd);
        v.client_sees_end = false;
        return v;
    }
    const HttpResult r = curl_post(s.port(), "/v1/audio/speech", body, b == Behaviour::SLOW_READER ? "--limit-rate 40k" : "");
    v.accepted = r.status == 200;
    if (t == Transport::SSE) {
        const SseResult parsed = sse_parse(r.body);
        for (size_t i = 0; i < parsed.events.size(); ++i) {
            const std::string type = parsed.events[i].value("type", "");
            if (type == "speech.audio.done" || type == "error") {
                ++v.terminals;
                v.terminal_last = i + 1 == parsed.events.size();
                if (type == "speech.audio.done") v.reported = parsed.events[i]["metrics"]["samples"].get<int64_t>();
            }
        }
        v.received = {int64_t(parsed.audio.size() / 2), int64_t(parsed.audio.size() / 2)};
        v.samples_checked = v.reported >= 0;
    } else {
        v.terminals = r.curl_exit == 0 ? 1 : 0;  // a complete chunked transfer (its last chunk)
        const auto entry = entry_by_seed(s, seed);
        v.reported = entry ? entry->stream->metrics().samples : -1;
        v.received = {int64_t(r.body.size() / 2), int64_t(r.body.size() / 2)};
        v.samples_checked = true;
    }
    return v;
}

Verdict tcp_client_run(EngineServer& s, Behaviour b, uint64_t seed) {
    Verdict v;
    const json line_json = {{"input", "Testing one two three."}, {"seed", seed}};
    std::string line = line_json.dump() + "\n";
    if (b == Behaviour::EMPTY_TEXT) line = "\n";
    if (b == Behaviour::BAD_JSON) line = "{\"input\": \n";
    const int fd = raw_connect(s.tcp_port());
    if (fd < 0) return v;
    raw_send(fd, line);
    if (b == Behaviour::EMPTY_TEXT || b == Behaviour::BAD_JSON) {
        v.refused_as_expected = raw_recv(fd, 10000ms, 4096).rfind("ERROR: ", 0) == 0;
        ::close(fd);
        return v;
    }
    if (b == Behaviour::CANCEL_EARLY || b == Behaviour::CANCEL_LATE || b == Behaviour::VANISH) {
        v.accepted = !raw_recv(fd, 20000ms, b == Behaviour::CANCEL_EARLY ? 10 : 1000).empty();
        ::close(fd);
        v.client_sees_end = false;
        return v;
    }
    bool eof = false;
    std::string bytes;
    for (int guard = 0; guard < 10000 && !eof; ++guard) {
        bytes += raw_recv(fd, 200ms, 1 << 20, &eof);
        if (b == Behaviour::SLOW_READER) std::this_thread::sleep_for(20ms);
    }
    ::close(fd);
    v.accepted = bytes.compare(0, 4, "OggS") == 0;
    // The terminal message of a TCP stream is its end-of-stream page.
    v.terminals = ogg_ends_with_eos(bytes) ? 1 : 0;
    bool ok = false;
    const int64_t got = ogg_samples_24k(bytes, &ok);
    v.received = {std::max<int64_t>(0, got - 1), got + 1};
    const auto entry = entry_by_seed(s, seed);
    v.reported = entry ? entry->stream->metrics().samples : -1;
    v.samples_checked = ok;
    return v;
}

// Reads one counter or gauge from the /metrics text (-1 when absent).
double metric_value(const std::string& text, const std::string& name) {
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line))
        if (line.rfind(name + " ", 0) == 0) return std::atof(line.c_str() + name.size() + 1);
    return -1;
}

}  // namespace

TEST_CASE("protocol: every accepted stream ends with one terminal message, frees its slot, reports what was sent", "[net]") {
    EngineServer& s = protocol_server();
    const char* env_seed = std::getenv("QTTS_NET_SEED");
    const uint64_t seed = env_seed ? std::strtoull(env_seed, nullptr, 10) : std::random_device{}();
    std::printf("protocol invariant: seed %llu (rerun with QTTS_NET_SEED=%llu)\n", (unsigned long long)seed,
                (unsigned long long)seed);
    std::fflush(stdout);
    INFO("seed " << seed << " (QTTS_NET_SEED reruns it)");
    const std::string metrics_before = curl_get(s.port(), "/metrics").body;

    constexpr int kClients = 28, kWorkers = 3;
    struct Plan {
        Transport transport;
        Behaviour behaviour;
        std::string format;
        uint64_t seed;
    };
    std::mt19937_64 rng(seed);
    std::vector<Plan> plans;
    const char* const formats[] = {"opus", "ogg", "pcm"};
    for (int i = 0; i < kClients; ++i)
        plans.push_back(Plan{Transport(rng() % 4), Behaviour(rng() % 7), formats[rng() % 3], g_seed.fetch_add(1) + 500000});

    std::vector<Verdict> verdicts(plans.size());
    std::atomic<size_t> next{0};
    std::vector<std::thread> workers;
    for (int w = 0; w < kWorkers; ++w)
        workers.emplace_back([&] {
            for (size_t i = next++; i < plans.size(); i = next++) {
                const Plan& p = plans[i];
                Verdict v = p.transport == Transport::WS    ? ws_client_run(s, p.behaviour, p.format, p.seed)
                            : p.transport == Transport::TCP ? tcp_client_run(s, p.behaviour, p.seed)
                                                            : http_client_run(s, p.transport, p.behaviour, p.seed);
                v.label = std::string(kTransportNames[int(p.transport)]) + " " + kBehaviourNames[int(p.behaviour)] +
                          (p.transport == Transport::WS ? " " + p.format : "");
                v.seed = p.seed;
                verdicts[i] = std::move(v);
            }
        });
    for (auto& t : workers) t.join();

    int accepted = 0;
    for (const Verdict& v : verdicts) {
        INFO("client " << v.label << " (request seed " << v.seed << ") " << v.note);
        CHECK(v.refused_as_expected);
        if (!v.accepted) continue;
        ++accepted;
        if (v.client_sees_end) {
            CHECK(v.terminals == 1);
            CHECK(v.terminal_last);
            if (v.samples_checked) {
                INFO("reported " << v.reported << ", received " << v.received.lo << ".." << v.received.hi);
                CHECK(v.received.contains(v.reported));
            }
        }
        // Whatever the client did, the engine's stream has ended (no stream left running).
        const auto entry = entry_by_seed(s, v.seed);
        REQUIRE(entry);
        CHECK(wait_until([&] { return entry->stream->generation_done(); }, 10000ms));
    }
    std::printf("protocol invariant: %d of %d clients had a stream accepted\n", accepted, kClients);

    // Every slot is free again, and the outcome counters add up (checked through /metrics).
    CHECK(wait_until([&] { return s.server.active_streams() == 0; }, 10000ms));
    const std::string metrics_after = curl_get(s.port(), "/metrics").body;
    CHECK(metric_value(metrics_after, "qtts_active_streams") == 0);
    const auto delta = [&](const std::string& name) { return metric_value(metrics_after, name) - metric_value(metrics_before, name); };
    const double started = delta("qtts_streams_started_total");
    CHECK(started >= accepted);
    CHECK(started == delta("qtts_streams_completed_total") + delta("qtts_streams_cancelled_total") +
                         delta("qtts_streams_failed_total"));
    CHECK(delta("qtts_streams_failed_total") == 0);
}
