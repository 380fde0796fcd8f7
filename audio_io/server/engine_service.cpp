#include "audio_io/server/speech_service.h"

#include <utility>

#include "engine/common/error.h"

namespace qtts {

EngineSpeechService::EngineSpeechService(EnginePool& engines, std::string model_name)
    : engines_(engines), model_name_(std::move(model_name)) {}

std::shared_ptr<Stream> EngineSpeechService::submit(const SpeechRequest& request) {
    try {
        return engines_.submit(request);
    } catch (const Error& e) {
        // Every engine at its stream limit: a capacity problem (retry later), not a bad request.
        // The server counts its own slots first; an engine can still be full for a moment after
        // a cancel, until its thread has retired the cancelled stream.
        if (e.code() == ErrorCode::ERROR_BUSY) throw ServiceBusyError(e.what());
        throw;
    }
}

std::vector<std::string> EngineSpeechService::voices() const { return engines_.speakers(); }

std::vector<std::string> EngineSpeechService::languages() const { return engines_.languages(); }

std::string EngineSpeechService::failure() const { return engines_.failure(); }

std::string EngineSpeechService::backend_name() const { return engines_.backend_name(); }

std::vector<EngineStatus> EngineSpeechService::engines() const { return engines_.status(); }

}  // namespace qtts
