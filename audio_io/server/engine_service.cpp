#include "audio_io/server/speech_service.h"

#include <utility>

#include "engine/common/error.h"

namespace qtts {

EngineSpeechService::EngineSpeechService(Engine& engine, std::string model_name)
    : engine_(engine), model_name_(std::move(model_name)) {}

std::shared_ptr<Stream> EngineSpeechService::submit(const SpeechRequest& request) {
    try {
        return engine_.submit(request);
    } catch (const Error& e) {
        // At its stream limit: a capacity problem (retry later), not a bad request. The server
        // counts its own slots first; the engine can still be full for a moment after a cancel,
        // until its thread has retired the cancelled stream.
        if (e.code() == ErrorCode::ERROR_BUSY) throw ServiceBusyError(e.what());
        throw;
    }
}

std::vector<std::string> EngineSpeechService::voices() const { return engine_.speakers(); }

std::vector<std::string> EngineSpeechService::languages() const { return engine_.languages(); }

std::string EngineSpeechService::failure() const { return engine_.failure(); }

std::string EngineSpeechService::backend_name() const { return engine_.backend_name(); }

}  // namespace qtts
