// Fuzz target: a WebSocket client text message on /v1/audio/stream, through the parsing the
// server applies to it: the JSON text, the `type`, then speech_params_parse_ws_start for
// `start` and field_text_check for the `text` of `append` / `end`.
//
// Not reached: the session's state machine (WsSession::message_handle in server_ws.cpp, which
// needs a live socket and stream); tests/net drives that end to end.
#include "fuzz_service.h"

namespace {

using json = nlohmann::json;

void message_parse(const std::string& data, const qtts::SpeechService& service, const qtts::SpeechLimits& limits) {
    json msg;
    try {
        msg = json::parse(data);
    } catch (const json::exception&) {
        return;  // answered with an invalid_request_error, as the server does
    }
    if (!msg.is_object() || !msg.contains("type") || !msg["type"].is_string()) return;
    const std::string type = msg["type"].get<std::string>();
    if (type == "start") {
        const qtts::SpeechParams p = qtts::speech_params_parse_ws_start(msg, service, limits);
        qtts::fuzz::accepted_check(p, limits);
        qtts::fuzz::property(p.request.incremental, "a WebSocket request is incremental");
        qtts::fuzz::property(!p.format_name.empty(), "the `started` event has a format to echo");
    } else if (type == "append" || type == "end") {
        auto it = msg.find("text");
        if (it != msg.end() && it->is_string()) qtts::field_text_check(it->get<std::string>(), "text", limits.max_text_bytes);
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const qtts::fuzz::ParseOnlyService service;
    static const qtts::SpeechLimits limits{256};
    try {
        message_parse(std::string(reinterpret_cast<const char*>(data), size), service, limits);
    } catch (const qtts::RequestError& e) {
        qtts::fuzz::request_error_check(e);
    }
    return 0;
}
