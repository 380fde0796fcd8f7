// What the network server needs from a speech engine, as an interface: the server core is
// written against SpeechService and qtts::Stream, so it can be tested with a scripted source
// (a deterministic sine in tests/net) as well as with the real qtts::Engine.
//
// Thread safety: every method may be called from any thread (the server calls submit from its
// I/O threads and reads each stream from one pump thread).
#pragma once

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts {

// Thrown by SpeechService::submit when the request is fine but the service cannot take it now:
// no free stream slot (code "max_streams") or, with admission control, no real-time capacity left
// (code "capacity"). The server answers 429 with the code and the client should retry later.
class ServiceBusyError : public std::runtime_error {
public:
    explicit ServiceBusyError(const std::string& message, std::string code = "max_streams")
        : std::runtime_error(message), code_(std::move(code)) {}
    const std::string& code() const { return code_; }

private:
    std::string code_;
};

// Thrown by SpeechService::submit while the service is not ready (the model is still loading);
// the server answers 503.
class ServiceUnavailableError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class SpeechService {
public:
    virtual ~SpeechService() = default;

    // Starts a request and returns its stream at once. Throws qtts::Error for a bad request
    // (unknown voice or language, bad text) and ServiceBusyError when at capacity.
    virtual std::shared_ptr<Stream> submit(const SpeechRequest& request) = 0;

    virtual std::vector<std::string> voices() const = 0;     // accepted `voice` names
    virtual std::vector<std::string> languages() const = 0;  // accepted `language` names
    virtual std::string model_name() const = 0;
    virtual std::string backend_name() const = 0;
    // False while the service cannot take requests yet (a model still loading). A ready engine is
    // warm: the engine warms up inside its start-up, before it is handed to the server.
    virtual bool ready() const { return true; }
    // Why the service can no longer serve (its backend failed for good: a lost GPU); empty while
    // it can. A failed service is not ready, for good.
    virtual std::string failure() const { return ""; }
    // The engines behind the service, each with its state, load and counters (/healthz and
    // /metrics report them per engine); empty for a service without engines (scripted ones).
    virtual std::vector<EngineStatus> engines() const { return {}; }
};

// Stands in for a service that is still being built, so the server can listen (and answer
// /livez and /readyz) while the model loads: until attach(), ready() is false, submit throws
// ServiceUnavailableError and the lists are empty; afterwards every call goes to the attached
// service. attach() once; the attached service must outlive this object's use.
class DeferredSpeechService : public SpeechService {
public:
    explicit DeferredSpeechService(std::string model_name) : model_name_(std::move(model_name)) {}

    void attach(SpeechService& service) { service_.store(&service); }

    std::shared_ptr<Stream> submit(const SpeechRequest& request) override {
        SpeechService* s = service_.load();
        if (!s) throw ServiceUnavailableError("the model is still loading");
        return s->submit(request);
    }
    std::vector<std::string> voices() const override {
        SpeechService* s = service_.load();
        return s ? s->voices() : std::vector<std::string>{};
    }
    std::vector<std::string> languages() const override {
        SpeechService* s = service_.load();
        return s ? s->languages() : std::vector<std::string>{};
    }
    std::string model_name() const override { return model_name_; }
    std::string backend_name() const override {
        SpeechService* s = service_.load();
        return s ? s->backend_name() : "loading";
    }
    bool ready() const override {
        SpeechService* s = service_.load();
        return s && s->ready();
    }
    std::string failure() const override {
        SpeechService* s = service_.load();
        return s ? s->failure() : "";
    }
    std::vector<EngineStatus> engines() const override {
        SpeechService* s = service_.load();
        return s ? s->engines() : std::vector<EngineStatus>{};
    }

private:
    std::string model_name_;
    std::atomic<SpeechService*> service_{nullptr};
};

// Serves the engines of a qtts::EnginePool (one engine or several; the pool routes each request
// to the least-loaded one). Kept in its own source file (engine_service.cpp) so programs that do
// not use it do not link the engine.
class EngineSpeechService : public SpeechService {
public:
    // model_name is what /healthz and /v1/audio/voices report (e.g. the model folder's name).
    EngineSpeechService(EnginePool& engines, std::string model_name);

    std::shared_ptr<Stream> submit(const SpeechRequest& request) override;
    std::vector<std::string> voices() const override;
    std::vector<std::string> languages() const override;
    std::string model_name() const override { return model_name_; }
    std::string backend_name() const override;
    // Ready while any engine serves; failed once none does.
    bool ready() const override { return failure().empty(); }
    std::string failure() const override;
    std::vector<EngineStatus> engines() const override;

private:
    EnginePool& engines_;
    std::string model_name_;
};

}  // namespace qtts
