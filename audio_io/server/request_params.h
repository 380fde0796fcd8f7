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

// Every way the server refuses a request or fails one. request_error_http is the one place that
// maps a kind to its HTTP status and the error type of the JSON body; WebSocket `error` events and
// the TCP `ERROR:` line use the same kinds (and the statuses in the request metrics).
enum class RequestErrorKind {
    REQUEST_ERROR_INVALID,           // 400 invalid_request_error: malformed or refused input
    REQUEST_ERROR_NOT_FOUND,         // 404 not_found_error: no endpoint at that path
    REQUEST_ERROR_METHOD,            // 405 invalid_request_error: the endpoint takes another method
    REQUEST_ERROR_TIMEOUT,           // 408 timeout_error: an idle WebSocket connection is closed
    REQUEST_ERROR_TOO_LARGE,         // 413 request_too_large: the body is over max_body_bytes
    REQUEST_ERROR_HEADER_TOO_LARGE,  // 431 request_too_large: the header is over max_header_bytes
    REQUEST_ERROR_BUSY,              // 429 rate_limit_error: every stream slot is taken (Retry-After)
    REQUEST_ERROR_INTERNAL,          // 500 server_error: generation or the server failed
    REQUEST_ERROR_UNAVAILABLE,       // 503 unavailable_error: loading, failed, draining, stopping (Retry-After)
};

struct HttpError {
    int status;        // HTTP status
    const char* type;  // the JSON body's error.type
};
HttpError request_error_http(RequestErrorKind kind);

// The kind of a library error (qtts::ErrorCode): bad input (invalid, not found, format,
// unsupported) is 400, ERROR_BUSY 429, ERROR_CANCELLED 503, the rest (I/O, shape, CUDA,
// internal: the server's side) 500.
RequestErrorKind request_error_kind(ErrorCode code);

// A request refused (or failed) by the server: its kind (hence status and type), the offending
// field (empty when none) and a message that says what was wrong and what is accepted.
class RequestError : public std::runtime_error {
public:
    RequestError(RequestErrorKind kind, std::string param, const std::string& message)
        : std::runtime_error(message), kind_(kind), param_(std::move(param)) {}
    RequestErrorKind kind() const { return kind_; }
    int status() const { return request_error_http(kind_).status; }
    std::string type() const { return request_error_http(kind_).type; }
    const std::string& param() const { return param_; }

private:
    RequestErrorKind kind_;
    std::string param_;
};

// {"error": {"message": ..., "type": ..., "param": ... or null, "code": ... or null}}
std::string error_body_json(const std::string& message, const std::string& type, const std::string& param = "",
                            const std::string& code = "");

// The server's own per-request limits, checked with the library's rule (field_text_check). They
// may be smaller than the library's (REQUEST_MAX_TEXT_BYTES), never larger.
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

// Checks one piece of text for the named field with the library's text rule (text_check,
// engine/text/request_check.h: UTF-8, at most max_bytes with bytes_before already accepted);
// throws RequestError (400, param `field`) with the library's message.
void field_text_check(const std::string& text, const std::string& field, size_t max_bytes, size_t bytes_before = 0);

}  // namespace qtts
