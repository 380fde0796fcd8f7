#include "audio_io/speech_service.h"

#include <utility>

#include "common/error.h"

namespace qtts {

EngineSpeechService::EngineSpeechService(Engine& engine, std::string model_name, int max_streams)
    : engine_(engine), model_name_(std::move(model_name)), max_streams_(max_streams) {}

std::shared_ptr<Stream> EngineSpeechService::submit(const SpeechRequest& request) {
    try {
        return engine_.submit(request);
    } catch (const Error& e) {
        // The engine refuses streams past its own limit with ERROR_UNSUPPORTED; that is a
        // capacity problem (retry later), not a bad request. A slot freed by a cancelled stream
        // is returned by the engine thread a moment later, so the server's own count can be
        // under the limit while the engine's is not yet.
        if (e.code() == ErrorCode::ERROR_UNSUPPORTED && engine_.stats().active_streams >= max_streams_)
            throw ServiceBusyError(e.what());
        throw;
    }
}

std::vector<std::string> EngineSpeechService::voices() const { return engine_.speakers(); }

std::vector<std::string> EngineSpeechService::languages() const { return engine_.languages(); }

std::string EngineSpeechService::backend_name() const { return engine_.backend_name(); }

}  // namespace qtts
