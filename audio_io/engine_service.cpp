#include "audio_io/speech_service.h"

#include <utility>

#include "common/error.h"

namespace qtts {

EngineSpeechService::EngineSpeechService(Engine& engine, std::string model_name)
    : engine_(engine), model_name_(std::move(model_name)) {}

std::shared_ptr<Stream> EngineSpeechService::submit(const SpeechRequest& request) {
    try {
        if (!request.incremental || request.text.empty()) return engine_.submit(request);
        // The engine takes an incremental request's text only through text_append (it ignores
        // SpeechRequest::text there), so the first text (a WebSocket `start.text`) goes that way.
        SpeechRequest opening = request;
        opening.text.clear();
        std::shared_ptr<Stream> stream = engine_.submit(opening);
        try {
            stream->text_append(request.text);
        } catch (...) {
            stream->cancel();  // refused text: give the engine's slot back at once
            throw;
        }
        return stream;
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

std::string EngineSpeechService::backend_name() const { return engine_.backend_name(); }

}  // namespace qtts
