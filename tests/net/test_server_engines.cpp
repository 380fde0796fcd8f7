// Several engines behind one server (an EnginePool of CPU engines with the embedded demo model):
// requests spread over them, /healthz and /metrics per engine, an engine left out at start-up,
// and an engine lost mid-run while the other keeps serving.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include <nlohmann/json.hpp>

#include "engine/runtime/engine_debug.h"
#include "engine_server.h"

using namespace net_test;
using json = nlohmann::json;

namespace {

// The value of the /metrics line that starts with `series` ("name{labels}"), or -1 when absent.
double metric_value(const std::string& text, const std::string& series) {
    const size_t at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1.0;
    return std::stod(text.substr(at + series.size() + 2));
}

std::string metrics_get(const EngineServer& s) {
    const HttpResult m = curl_get(s.port(), "/metrics");
    REQUIRE(m.status == 200);
    return m.body;
}

json healthz_get(const EngineServer& s, int expected_status) {
    const HttpResult h = curl_get(s.port(), "/healthz");
    REQUIRE(h.status == expected_status);
    return json::parse(h.body);
}

double engine_requests(const std::string& metrics, const std::string& label) {
    return metric_value(metrics, "qtts_engine_requests_total{engine=\"" + label + "\"}");
}

// A WebSocket utterance that speaks its first word and then waits for more text: it stays on
// its engine until `end`, however fast or slow the machine is. The word must be short: the demo
// model's tokenizer is byte-level (a token per byte, a frame per token), and the servers here
// cap a request at 0.5 s of audio (6 frames), which a longer committed text would reach before
// it waits, ending the stream on its own.
std::unique_ptr<WsClient> ws_waiting_start(const EngineServer& s, uint64_t seed) {
    auto ws = std::make_unique<WsClient>(s.port(), std::chrono::milliseconds(60000));
    REQUIRE(ws->connected());
    REQUIRE(ws->send_text(json{{"type", "start"}, {"format", "pcm"}, {"seed", seed}, {"text", "Hi, how"}}.dump()));
    const auto started = ws->read_until_event({"started"});
    REQUIRE(started);
    return ws;
}

}  // namespace

TEST_CASE("several engines: one left out at start-up, requests spread, health and metrics per engine", "[net]") {
    qtts::log();  // create the logger first, so it outlives the server at exit
    // cuda:63 exists on no machine this runs on (and a CPU-only build has no CUDA at all): it
    // fails to load, and the server starts with the two CPU engines.
    EngineServer s(EngineServer::server_options(0.5), {{"cpu", 0}, {"cpu", 0}, {"cuda", 63}});

    json h = healthz_get(s, 200);
    CHECK(h["status"] == "ok");
    CHECK(h["backend"] == "cpu,cpu");
    CHECK(h["engines_serving"] == 2);
    REQUIRE(h["engines"].size() == 3);
    CHECK(h["engines"][0]["engine"] == "cpu#0");
    CHECK(h["engines"][0]["state"] == "serving");
    CHECK(h["engines"][0]["error"].is_null());
    CHECK(h["engines"][1]["engine"] == "cpu#1");
    CHECK(h["engines"][2]["engine"] == "cuda:63");
    CHECK(h["engines"][2]["state"] == "not_loaded");
    CHECK_THAT(h["engines"][2]["error"].get<std::string>(), Catch::Contains("device 63"));
    std::string m = metrics_get(s);
    CHECK(metric_value(m, "qtts_engine_up{engine=\"cpu#0\",backend=\"cpu\",state=\"serving\"}") == 1);
    CHECK(metric_value(m, "qtts_engine_up{engine=\"cuda:63\",backend=\"cuda:63\",state=\"not_loaded\"}") == 0);
    CHECK(engine_requests(m, "cpu#0") == 0);

    // One after another, each on idle engines: they take turns.
    for (int i = 0; i < 4; ++i) {
        const HttpResult r = curl_post(s.port(), "/v1/audio/speech", speech_body("Hi there.", "wav", false, 100 + i, ""));
        REQUIRE(r.status == 200);
    }
    m = metrics_get(s);
    CHECK(engine_requests(m, "cpu#0") == 2);
    CHECK(engine_requests(m, "cpu#1") == 2);
    CHECK(engine_requests(m, "cuda:63") == 0);
    CHECK(metric_value(m, "qtts_engine_streams_total{engine=\"cpu#0\",outcome=\"completed\"}") == 2);
    CHECK(metric_value(m, "qtts_engine_streams_total{engine=\"cpu#1\",outcome=\"completed\"}") == 2);
    CHECK(metric_value(m, "qtts_engine_audio_seconds_total{engine=\"cpu#1\"}") > 0);
    CHECK(metric_value(m, "qtts_engine_batch_decoded_chunks_total{engine=\"cpu#1\"}") == 0);  // CPU: no batching
    CHECK(metric_value(m, "qtts_engine_batch_overlapped_chunks_total{engine=\"cpu#1\"}") == 0);
    CHECK(metric_value(m, "qtts_engine_batch_started_total{engine=\"cpu#1\"}") == 0);
    // The engine thread's time: its chunks were made in per-stream passes, none batched.
    CHECK(metric_value(m, "qtts_engine_thread_seconds_total{engine=\"cpu#1\",part=\"service\"}") > 0);
    CHECK(metric_value(m, "qtts_engine_thread_seconds_total{engine=\"cpu#1\",part=\"steps\"}") == 0);

    // At the same time: the second goes to the engine without a stream.
    auto a = ws_waiting_start(s, 1);
    auto b = ws_waiting_start(s, 2);
    // Both wait for text now, however long they are left to: give a fast machine the time a slow
    // one takes, so a stream that would end on its own fails here too.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    h = healthz_get(s, 200);
    CHECK(h["engines"][0]["active_streams"].get<int64_t>() + h["engines"][0]["queued_streams"].get<int64_t>() == 1);
    CHECK(h["engines"][1]["active_streams"].get<int64_t>() + h["engines"][1]["queued_streams"].get<int64_t>() == 1);
    CHECK(h["engines"][0]["requests"] == 3);
    CHECK(h["engines"][1]["requests"] == 3);
    for (auto* ws : {a.get(), b.get()}) {
        REQUIRE(ws->send_text(R"({"type":"end"})"));
        const WsUtterance u = ws_utterance_read(*ws);
        CHECK(u.errors.empty());
        CHECK(u.done.value("stop_reason", "") != "error");
    }
}

TEST_CASE("several engines: an engine lost mid-run ends its stream with an error; the other serves on", "[net]") {
    qtts::log();
    // 4 s of audio at most a request: the kept stream, spoken to its end on the fp32 CPU
    // reference, stays well inside the client's timeout on a loaded machine.
    EngineServer s(EngineServer::server_options(4.0), {{"cpu", 0}, {"cpu", 0}});
    auto first = ws_waiting_start(s, 1);
    auto second = ws_waiting_start(s, 2);
    REQUIRE(s.recorder.entries().size() == 2);
    // The first request went to cpu#0 (idle engines: its turn), the second to cpu#1 (fewer streams).
    const json h0 = healthz_get(s, 200);
    REQUIRE(h0["engines"][0]["requests"] == 1);
    REQUIRE(h0["engines"][1]["requests"] == 1);

    qtts::engine_fault_inject_fatal(*s.pool.engine(0));
    const WsUtterance lost = ws_utterance_read(*first);
    REQUIRE_FALSE(lost.done.is_null());
    CHECK(lost.done["stop_reason"] == "error");
    REQUIRE(lost.errors.size() == 1);
    CHECK_THAT(lost.errors[0].dump(), Catch::Contains("injected fault"));

    // The other stream was untouched: it finishes normally.
    CHECK_FALSE(s.recorder.entries()[1].stream->generation_done());
    REQUIRE(second->send_text(R"({"type":"end"})"));
    const WsUtterance kept = ws_utterance_read(*second);
    CHECK(kept.errors.empty());
    CHECK(kept.done.value("stop_reason", "") != "error");
    CHECK(kept.done.value("samples", 0) > 0);

    // Still healthy and ready while one engine serves; healthz says which one is out and why.
    json h = healthz_get(s, 200);
    CHECK(h["status"] == "ok");
    CHECK(h["engines_serving"] == 1);
    CHECK(h["engines"][0]["state"] == "failed");
    CHECK_THAT(h["engines"][0]["error"].get<std::string>(), Catch::Contains("serves no more streams"));
    CHECK(h["engines"][0]["failed"] == 1);
    CHECK(h["engines"][1]["state"] == "serving");
    CHECK(curl_get(s.port(), "/readyz").status == 200);

    // New requests go to the engine that serves.
    for (int i = 0; i < 2; ++i)
        CHECK(curl_post(s.port(), "/v1/audio/speech", speech_body("Hi there.", "wav", false, 7, "")).status == 200);
    std::string m = metrics_get(s);
    CHECK(engine_requests(m, "cpu#0") == 1);
    CHECK(engine_requests(m, "cpu#1") == 3);
    CHECK(metric_value(m, "qtts_engine_up{engine=\"cpu#0\",backend=\"cpu\",state=\"failed\"}") == 0);
    CHECK(metric_value(m, "qtts_engine_streams_total{engine=\"cpu#0\",outcome=\"failed\"}") == 1);
    CHECK(metric_value(m, "qtts_streams_failed_total") == 1);

    // The last engine goes too: the server is failed (not ready), and says so.
    qtts::engine_fault_inject_fatal(*s.pool.engine(1));
    REQUIRE(wait_until([&] { return !s.pool.healthy(); }));
    h = healthz_get(s, 503);
    CHECK(h["status"] == "failed");
    CHECK(h["engines_serving"] == 0);
    const HttpResult ready = curl_get(s.port(), "/readyz");
    CHECK(ready.status == 503);
    CHECK(json::parse(ready.body)["reason"] == "failed");
    const HttpResult refused = curl_post(s.port(), "/v1/audio/speech", speech_body("Hi there.", "wav", false, 7, ""));
    CHECK(refused.status == 503);
    CHECK_THAT(refused.body, Catch::Contains("no engine serves"));
    // Nothing is left running.
    CHECK(wait_until([&] { return s.server.active_streams() == 0; }));
}

TEST_CASE("admission control: 429 `capacity` while the engine's real-time capacity is used; /metrics says so", "[net]") {
    qtts::log();
    qtts::EnginePoolOptions engines = EngineServer::pool_options({{"cpu", 0}});
    engines.engine.admission = true;
    engines.engine.admission_headroom = 1.0;
    EngineServer s(EngineServer::server_options(2.0), engines);
    const std::string label = s.pool.status()[0].label;
    const auto series = [&](const std::string& name, const std::string& extra = "") {
        return name + "{engine=\"" + label + "\"" + extra + "}";
    };
    // A slow backend: 0.5 s per chunk of at most 0.32 s of audio carries less than one stream at
    // real time, and a listener of the one stream it has runs dry before every chunk but the first.
    qtts::engine_chunk_delay_set(s.engine, std::chrono::milliseconds(500));
    HttpResult first;
    std::thread client([&] { first = curl_post(s.port(), "/v1/audio/speech", speech_body("Hi there.", "pcm", true, 3, "")); });
    REQUIRE(wait_until([&] { return s.engine.stats().underruns >= 1; }, std::chrono::milliseconds(30000)));

    const HttpResult refused = curl_post(s.port(), "/v1/audio/speech", speech_body("Second.", "pcm", false, 4, ""));
    CHECK(refused.status == 429);
    CHECK(json::parse(refused.body)["error"]["code"] == "capacity");
    CHECK_THAT(refused.body, Catch::Contains("real-time capacity"));
    CHECK_THAT(refused.headers, Catch::Contains("Retry-After: 1"));
    std::string m = metrics_get(s);
    CHECK(metric_value(m, series("qtts_engine_refused_total", ",reason=\"capacity\"")) == 1);
    CHECK(metric_value(m, series("qtts_engine_refused_total", ",reason=\"max_streams\"")) == 0);
    CHECK(metric_value(m, "qtts_errors_total{type=\"busy\"}") == 1);
    const double capacity = metric_value(m, series("qtts_engine_capacity_streams"));
    CHECK(capacity > 0.0);
    CHECK(capacity < 1.1);
    CHECK(metric_value(m, series("qtts_engine_stream_lag_max_seconds")) >= 0.42);  // dry 0.42 s or more before chunk 2
    CHECK(metric_value(m, series("qtts_engine_stream_lag_mean_seconds")) >= 0.42);  // the one stream
    CHECK(metric_value(m, series("qtts_engine_batch_size")) == 0);                   // no batched step on the CPU
    CHECK(metric_value(m, series("qtts_engine_queue_depth")) == 0);

    client.join();
    CHECK(first.status == 200);
    m = metrics_get(s);
    // 2 s of audio in chunks of 1 + 4 x 6 frames: each of the 6 later chunks came late.
    CHECK(metric_value(m, series("qtts_engine_underruns_total")) == 6);
    CHECK(metric_value(m, series("qtts_engine_underrun_seconds_total")) >= 0.42 + 5 * 0.18);
    CHECK(metric_value(m, series("qtts_engine_lagged_streams_total")) == 1);

    // The load is gone (and the backend fast again): requests are admitted.
    qtts::engine_chunk_delay_set(s.engine, std::chrono::microseconds(0));
    CHECK(curl_post(s.port(), "/v1/audio/speech", speech_body("Third.", "wav", false, 5, "")).status == 200);
    CHECK(metric_value(metrics_get(s), series("qtts_engine_refused_total", ",reason=\"capacity\"")) == 1);
}
