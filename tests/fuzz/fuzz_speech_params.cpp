// Fuzz target: the request parsers of the HTTP and TCP endpoints (audio_io/speech_params.*).
// The first byte picks the entry point: POST /v1/audio/speech body, or a plain TCP line.
// The WebSocket messages have their own target (fuzz_ws_message.cpp).
#include "fuzz_service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static const qtts::fuzz::ParseOnlyService service;
    static const qtts::SpeechLimits limits{256};  // small, so the fuzzer reaches the size limit
    if (size < 1) return 0;
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        const qtts::SpeechParams p = (data[0] & 1) ? qtts::speech_params_parse_tcp_line(text, service, limits)
                                                   : qtts::speech_params_parse_http(text, service, limits);
        qtts::fuzz::accepted_check(p, limits);
    } catch (const qtts::RequestError& e) {
        qtts::fuzz::request_error_check(e);
    }
    return 0;
}
