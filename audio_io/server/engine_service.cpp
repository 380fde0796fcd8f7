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
        // Every engine refused: a capacity problem (retry later), not a bad request. The server
        // counts its own slots first, so an engine at its stream limit is rare (it can be full for
        // a moment after a cancel, until its thread has retired the cancelled stream); an engine
        // with free slots refused by admission control (its real-time capacity is used).
        if (e.code() == ErrorCode::ERROR_BUSY) {
            bool slots_free = false;
            for (const EngineStatus& s : engines_.status())
                if (s.state == EngineState::ENGINE_STATE_SERVING && s.load.active + s.load.queued < s.load.max_streams)
                    slots_free = true;
            throw ServiceBusyError(e.what(), slots_free ? "capacity" : "max_streams");
        }
        throw;
    }
}

std::vector<std::string> EngineSpeechService::voices() const { return engines_.speakers(); }

std::vector<std::string> EngineSpeechService::languages() const { return engines_.languages(); }

std::string EngineSpeechService::failure() const { return engines_.failure(); }

std::string EngineSpeechService::backend_name() const { return engines_.backend_name(); }

std::vector<EngineStatus> EngineSpeechService::engines() const { return engines_.status(); }

}  // namespace qtts
