#include "audio_io/server/request_params.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "engine/text/request_check.h"
#include "engine/text/text_split.h"
#include "engine/common/strings.h"

namespace qtts {

namespace {

using json = nlohmann::json;

[[noreturn]] void bad_request(const std::string& param, const std::string& message) {
    throw RequestError(RequestErrorKind::REQUEST_ERROR_INVALID, param, message);
}

std::string list_join(const std::vector<std::string>& items) {
    std::string out;
    for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
    return out;
}

const char* json_type_name(const json& v) { return v.type_name(); }

// A string field, or fallback when absent or null.
std::string string_field(const json& obj, const char* name, const std::string& fallback = "") {
    auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_string()) bad_request(name, fmt::format("`{}` must be a string, got {}", name, json_type_name(*it)));
    return it->get<std::string>();
}

bool bool_field(const json& obj, const char* name, bool fallback) {
    auto it = obj.find(name);
    if (it == obj.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) bad_request(name, fmt::format("`{}` must be true or false, got {}", name, json_type_name(*it)));
    return it->get<bool>();
}

[[noreturn]] void seed_refuse(const std::string& got) { bad_request("seed", seed_range_message(got)); }

std::optional<uint64_t> seed_field(const json& obj) {
    auto it = obj.find("seed");
    if (it == obj.end() || it->is_null()) return std::nullopt;
    if (it->is_number_unsigned()) return it->get<uint64_t>();  // nlohmann keeps all of 0..2^64-1 exact
    if (it->is_number_integer()) seed_refuse(std::to_string(it->get<int64_t>()));
    if (it->is_number_float()) seed_refuse(it->dump());  // a fraction, or a whole number past 2^64-1
    seed_refuse(json_type_name(*it));
}

// Maps a user-given name onto the service's spelling, case-insensitively.
std::string name_match(const std::string& given, const std::vector<std::string>& accepted, const char* field,
                       const char* what) {
    const std::string want = ascii_lower(given);
    for (const auto& name : accepted)
        if (ascii_lower(name) == want) return name;
    bad_request(field, fmt::format("unknown {} '{}'; accepted: {}", what, given, list_join(accepted)));
}

// voice, language, instructions and seed: shared by the three entry points.
void common_fields_parse(const json& obj, const SpeechService& service, const SpeechLimits& limits, SpeechRequest& r) {
    const std::string voice = string_field(obj, "voice");
    if (!voice.empty()) {
        const auto voices = service.voices();
        if (voices.empty())
            bad_request("voice", fmt::format("this model ({}) has no preset voices; leave out `voice` (got '{}')",
                                             service.model_name(), voice));
        r.speaker = name_match(voice, voices, "voice", "voice");
    }
    const std::string language = string_field(obj, "language", "auto");
    const auto languages = service.languages();
    r.language = languages.empty() ? language : name_match(language, languages, "language", "language");
    r.instruct = string_field(obj, "instructions");
    field_text_check(r.instruct, "instructions", limits.max_text_bytes);
    r.seed = seed_field(obj);
}

json object_parse(const std::string& text, const char* what) {
    json body;
    try {
        body = json::parse(text);
    } catch (const json::exception& e) {
        // parse_error, and out_of_range for a number past a double's range (1e999). nlohmann
        // rejects ill-formed UTF-8 inside strings here as well.
        bad_request("", fmt::format("{} is not valid JSON: {}", what, e.what()));
    }
    if (!body.is_object()) bad_request("", fmt::format("{} must be a JSON object, got {}", what, json_type_name(body)));
    return body;
}

}  // namespace

const char* audio_format_name(AudioFormat format) {
    switch (format) {
        case AudioFormat::AUDIO_FORMAT_OGG_OPUS: return "ogg_opus";
        case AudioFormat::AUDIO_FORMAT_OPUS_PACKETS: return "opus_packets";
        case AudioFormat::AUDIO_FORMAT_WAV: return "wav";
        case AudioFormat::AUDIO_FORMAT_PCM: return "pcm";
    }
    return "unknown";
}

std::string audio_format_content_type(AudioFormat format) {
    switch (format) {
        case AudioFormat::AUDIO_FORMAT_OGG_OPUS: return "audio/ogg; codecs=opus";
        case AudioFormat::AUDIO_FORMAT_OPUS_PACKETS: return "audio/opus";
        case AudioFormat::AUDIO_FORMAT_WAV: return "audio/wav";
        case AudioFormat::AUDIO_FORMAT_PCM: return "audio/pcm; rate=24000; channels=1; encoding=s16le";
    }
    return "application/octet-stream";
}

std::string error_body_json(const std::string& message, const std::string& type, const std::string& param,
                            const std::string& code) {
    json error = {{"message", message}, {"type", type}};
    error["param"] = param.empty() ? json(nullptr) : json(param);
    error["code"] = code.empty() ? json(nullptr) : json(code);
    // Replace, never throw, if a message carries bytes that are not UTF-8 (e.g. echoed input).
    return json{{"error", error}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

HttpError request_error_http(RequestErrorKind kind) {
    switch (kind) {
        case RequestErrorKind::REQUEST_ERROR_INVALID: return {400, "invalid_request_error"};
        case RequestErrorKind::REQUEST_ERROR_NOT_FOUND: return {404, "not_found_error"};
        case RequestErrorKind::REQUEST_ERROR_METHOD: return {405, "invalid_request_error"};
        case RequestErrorKind::REQUEST_ERROR_TIMEOUT: return {408, "timeout_error"};
        case RequestErrorKind::REQUEST_ERROR_TOO_LARGE: return {413, "request_too_large"};
        case RequestErrorKind::REQUEST_ERROR_HEADER_TOO_LARGE: return {431, "request_too_large"};
        case RequestErrorKind::REQUEST_ERROR_BUSY: return {429, "rate_limit_error"};
        case RequestErrorKind::REQUEST_ERROR_INTERNAL: return {500, "server_error"};
        case RequestErrorKind::REQUEST_ERROR_UNAVAILABLE: return {503, "unavailable_error"};
    }
    return {500, "server_error"};
}

RequestErrorKind request_error_kind(ErrorCode code) {
    switch (code) {
        case ErrorCode::ERROR_INVALID_ARGUMENT:
        case ErrorCode::ERROR_NOT_FOUND:
        case ErrorCode::ERROR_FORMAT:
        case ErrorCode::ERROR_UNSUPPORTED: return RequestErrorKind::REQUEST_ERROR_INVALID;
        case ErrorCode::ERROR_BUSY: return RequestErrorKind::REQUEST_ERROR_BUSY;
        case ErrorCode::ERROR_CANCELLED: return RequestErrorKind::REQUEST_ERROR_UNAVAILABLE;
        case ErrorCode::ERROR_IO:
        case ErrorCode::ERROR_SHAPE:
        case ErrorCode::ERROR_CUDA:
        case ErrorCode::ERROR_INTERNAL: return RequestErrorKind::REQUEST_ERROR_INTERNAL;
    }
    return RequestErrorKind::REQUEST_ERROR_INTERNAL;
}

void field_text_check(const std::string& text, const std::string& field, size_t max_bytes, size_t bytes_before) {
    try {
        text_check(text, field, max_bytes, bytes_before);
    } catch (const Error& e) {
        bad_request(field, e.what());
    }
}

SpeechParams speech_params_parse_http(const std::string& body_text, const SpeechService& service,
                                      const SpeechLimits& limits) {
    const json body = object_parse(body_text, "the request body");
    SpeechParams p;
    SpeechRequest& r = p.request;

    string_field(body, "model");  // any name: this server speaks with the one model it loaded
    auto input = body.find("input");
    if (input == body.end() || input->is_null()) bad_request("input", "`input` is required: the text to speak");
    if (!input->is_string()) bad_request("input", fmt::format("`input` must be a string, got {}", json_type_name(*input)));
    r.text = input->get<std::string>();
    field_text_check(r.text, "input", limits.max_text_bytes);
    if (text_is_blank(r.text)) bad_request("input", "`input` is empty; give the text to speak");

    common_fields_parse(body, service, limits, r);

    const std::string format = ascii_lower(string_field(body, "response_format", "opus"));
    if (format == "opus") {
        p.format = AudioFormat::AUDIO_FORMAT_OGG_OPUS;
    } else if (format == "wav") {
        p.format = AudioFormat::AUDIO_FORMAT_WAV;
    } else if (format == "pcm") {
        p.format = AudioFormat::AUDIO_FORMAT_PCM;
    } else {
        bad_request("response_format",
                    fmt::format("response_format '{}' is not supported; accepted: opus (Ogg Opus), wav, pcm "
                                "(s16le, 24 kHz mono)",
                                format));
    }

    auto speed = body.find("speed");
    if (speed != body.end() && !speed->is_null()) {
        if (!speed->is_number()) bad_request("speed", fmt::format("`speed` must be a number, got {}", json_type_name(*speed)));
        const double v = speed->get<double>();
        if (std::fabs(v - 1.0) > 1e-9)
            bad_request("speed", fmt::format("`speed` {} is not supported; only 1.0 is accepted", v));
    }

    p.stream = bool_field(body, "stream", false);
    const std::string stream_format = ascii_lower(string_field(body, "stream_format"));
    if (!stream_format.empty()) {
        if (stream_format == "audio") {
            p.stream = true;
        } else if (stream_format == "sse") {
            p.stream = true;
            p.sse = true;
        } else {
            bad_request("stream_format", fmt::format("stream_format '{}' is not supported; accepted: audio, sse", stream_format));
        }
    }
    return p;
}

SpeechParams speech_params_parse_ws_start(const json& message, const SpeechService& service, const SpeechLimits& limits) {
    SpeechParams p;
    SpeechRequest& r = p.request;
    r.incremental = true;
    r.text = string_field(message, "text");
    field_text_check(r.text, "text", limits.max_text_bytes);
    common_fields_parse(message, service, limits, r);
    const std::string format = ascii_lower(string_field(message, "format", "opus"));
    if (format == "opus") {
        p.format = AudioFormat::AUDIO_FORMAT_OPUS_PACKETS;
    } else if (format == "ogg") {
        p.format = AudioFormat::AUDIO_FORMAT_OGG_OPUS;
    } else if (format == "pcm") {
        p.format = AudioFormat::AUDIO_FORMAT_PCM;
    } else {
        bad_request("format", fmt::format("format '{}' is not supported; accepted: opus (raw packets), ogg, pcm", format));
    }
    p.format_name = format;
    p.text_complete = bool_field(message, "end", false);
    p.stream = true;
    return p;
}

SpeechParams speech_params_parse_tcp_line(const std::string& line, const SpeechService& service,
                                          const SpeechLimits& limits) {
    SpeechParams p;
    p.format = AudioFormat::AUDIO_FORMAT_OGG_OPUS;
    p.stream = true;
    size_t first = 0;
    while (first < line.size() && std::isspace(static_cast<unsigned char>(line[first]))) ++first;
    if (first < line.size() && line[first] == '{') {
        const json obj = object_parse(line, "the JSON line");
        auto input = obj.find("input");
        if (input == obj.end() || !input->is_string()) bad_request("input", "the JSON line needs `input`: the text to speak");
        p.request.text = input->get<std::string>();
        common_fields_parse(obj, service, limits, p.request);
    } else {
        p.request.text = line;
    }
    field_text_check(p.request.text, "input", limits.max_text_bytes);
    if (text_is_blank(p.request.text)) bad_request("input", "the line is empty; send the text to speak followed by a newline");
    return p;
}

}  // namespace qtts
