// The network server in front of the real qtts::Engine (the embedded default model, on the CPU
// unless a GPU is present), shared by the tests/net files that run against the real engine.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "audio_io/server/server.h"
#include "engine/common/log.h"
#include "net_test_support.h"
#include "engine/api/qtts.h"

namespace net_test {

struct EngineServer {
    qtts::EnginePool pool;
    qtts::Engine& engine;  // the pool's first engine (the only one unless targets are given)
    qtts::EngineSpeechService service;
    RecordingService recorder;
    qtts::HttpServer server;

    // targets empty: one engine, on the GPU when there is one, else the CPU.
    static qtts::EnginePoolOptions pool_options(const std::vector<qtts::EngineTarget>& targets = {}) {
        qtts::EnginePoolOptions o;  // empty model_dir: the embedded default model
        o.engine.max_streams = 16;
        o.targets = targets;
        return o;
    }
    // Random weights rarely say end-of-speech: every request is capped (max_audio_seconds) so
    // the frame budget (tens of seconds for a sentence) does not set the tests' run time.
    static qtts::ServerOptions server_options(double max_audio_seconds) {
        qtts::ServerOptions o;
        o.port = 0;
        o.tcp_port = 0;
        o.max_streams = 16;
        o.max_audio_seconds = max_audio_seconds;
        return o;
    }

    explicit EngineServer(const qtts::ServerOptions& options, const std::vector<qtts::EngineTarget>& targets = {})
        : EngineServer(options, pool_options(targets)) {}
    EngineServer(const qtts::ServerOptions& options, const qtts::EnginePoolOptions& engines)
        : pool(engines), engine(first_loaded(pool)), service(pool, "default"), recorder(service), server(recorder, options) {
        server.start();
    }
    static qtts::Engine& first_loaded(const qtts::EnginePool& pool) {
        for (size_t i = 0; i < pool.size(); ++i)
            if (pool.engine(i)) return *pool.engine(i);
        throw std::runtime_error("no engine loaded");
    }
    int port() const { return server.port(); }
    int tcp_port() const { return server.tcp_port(); }

    // A speaker the model has (empty for models without preset voices).
    std::string first_voice() const {
        const auto v = service.voices();
        return v.empty() ? "" : v.front();
    }
    // The recorder entry of the most recent request (nullopt when there is none).
    std::optional<RecordingService::Entry> last_entry() const {
        const auto entries = recorder.entries();
        if (entries.empty()) return std::nullopt;
        return entries.back();
    }
};

// A POST /v1/audio/speech body.
inline std::string speech_body(const std::string& text, const std::string& format, bool stream, uint64_t seed,
                               const std::string& voice, const std::string& stream_format = "") {
    nlohmann::json j = {{"model", "qtts"}, {"input", text}, {"response_format", format}, {"seed", seed}};
    if (stream) j["stream"] = true;
    if (!stream_format.empty()) j["stream_format"] = stream_format;
    if (!voice.empty()) j["voice"] = voice;
    return j.dump();
}

}  // namespace net_test
