// Request validation for the network server, kept apart from the sockets so it can be tested on
// its own: the OpenAI-style JSON body of POST /v1/audio/speech, the WebSocket `start` message,
// the plain TCP line, and the JSON error body every endpoint returns.
//
// Thread safety: pure functions (the SpeechService is only asked for its voices/languages).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "audio_io/server/speech_service.h"

namespace qtts {

enum class AudioFormat {
    AUDIO_FORMAT_OGG_OPUS,      // Ogg Opus pages (HTTP "opus", WebSocket "ogg", TCP)
    AUDIO_FORMAT_OPUS_PACKETS,  // raw Opus packets with the 12-byte header (WebSocket "opus")
    AUDIO_FORMAT_WAV,           // 16-bit PCM WAV (HTTP "wav")
    AUDIO_FORMAT_PCM,           // headerless s16le, 24 kHz mono (HTTP and WebSocket "pcm")
};

const char* audio_format_name(AudioFormat format);
std::string audio_format_content_type(AudioFormat format);

// A request refused before it reached the engine: an HTTP status, an error type for the JSON
// body ("invalid_request_error", ...), the offending field (empty when none) and a message that
// says what was wrong and what is accepted.
class RequestError : public std::runtime_error {
public:
    RequestError(int status, std::string type, std::string param, const std::string& message)
        : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)) {}
    int status() const { return status_; }
    const std::string& type() const { return type_; }
    const std::string& param() const { return param_; }

private:
    int status_;
    std::string type_;
    std::string param_;
};

// {"error": {"message": ..., "type": ..., "param": ... or null, "code": ... or null}}
std::string error_body_json(const std::string& message, const std::string& type, const std::string& param = "",
                            const std::string& code = "");

struct SpeechLimits {
    size_t max_text_bytes = 8 * 1024;
};

struct SpeechParams {
    SpeechRequest request;
    AudioFormat format = AudioFormat::AUDIO_FORMAT_OGG_OPUS;
    bool stream = false;  // chunked transfer as audio is generated
    bool sse = false;     // stream_format "sse": server-sent events with base64 audio
    // WebSocket `start` only: the format as the protocol names it ("opus", "ogg", "pcm"), and
    // "end": true (the text is complete, a one-shot utterance).
    std::string format_name;
    bool text_complete = false;
};

// True when text is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool utf8_valid(const std::string& text);

// POST /v1/audio/speech. Fields: model (string, ignored), input (required), voice, instructions,
// response_format (opus | wav | pcm; default opus), speed (only 1.0), language, seed, stream,
// stream_format (audio | sse). Unknown fields are ignored, as OpenAI clients send extras.
// Throws RequestError (400) for anything malformed.
SpeechParams speech_params_parse_http(const std::string& body, const SpeechService& service, const SpeechLimits& limits);

// WebSocket `start`: voice, language, format (opus | ogg | pcm; default opus), instructions,
// seed, an optional first `text` and `end` (true: no more text follows). The request is
// incremental: more text comes with `append`.
SpeechParams speech_params_parse_ws_start(const nlohmann::json& message, const SpeechService& service,
                                          const SpeechLimits& limits);

// Plain TCP: one line. Plain text is spoken with the default voice; a line that starts with '{'
// is a JSON object with the HTTP fields (input, voice, language, instructions, seed). The output
// is always Ogg Opus.
SpeechParams speech_params_parse_tcp_line(const std::string& line, const SpeechService& service,
                                          const SpeechLimits& limits);

// The one seed range of every entry point (qtts say --seed and the server's `seed` field): an
// integer from 0 to 2^64-1, the engine's whole seed space. Reads decimal text (digits only, as the
// command line gives it); throws RequestError (400, param "seed") for anything else, negative
// numbers included, with a message that states the range.
uint64_t seed_parse(const std::string& text);

// Checks one piece of text (UTF-8, size) for the named field; throws RequestError (400).
void text_check(const std::string& text, const std::string& field, size_t max_bytes);

}  // namespace qtts
