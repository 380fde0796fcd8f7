// Request validation of the network server: the OpenAI-style body, the WebSocket `start`
// message, the TCP line, UTF-8 checking, the JSON error body and the server options.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "audio_io/http_server.h"
#include "audio_io/speech_params.h"
#include "common/error.h"

using json = nlohmann::json;
using qtts::AudioFormat;
using qtts::RequestError;

namespace {

class NamesOnlyService : public qtts::SpeechService {
public:
    explicit NamesOnlyService(std::vector<std::string> voices) : voices_(std::move(voices)) {}
    std::shared_ptr<qtts::Stream> submit(const qtts::SpeechRequest&) override { return nullptr; }
    std::vector<std::string> voices() const override { return voices_; }
    std::vector<std::string> languages() const override { return {"auto", "English", "Japanese"}; }
    std::string model_name() const override { return "names-only"; }
    std::string backend_name() const override { return "none"; }

private:
    std::vector<std::string> voices_;
};

// The RequestError a body produces (fails the test when it is accepted).
RequestError rejection(const std::string& body, const qtts::SpeechService& service, size_t max_text = 100) {
    qtts::SpeechLimits limits;
    limits.max_text_bytes = max_text;
    try {
        qtts::speech_params_parse_http(body, service, limits);
    } catch (const RequestError& e) {
        return e;
    }
    FAIL("accepted: " << body);
    return RequestError(0, "", "", "");
}

}  // namespace

TEST_CASE("a full OpenAI-style body maps onto the engine request", "[unit]") {
    NamesOnlyService svc({"Vivian", "Ryan"});
    const auto p = qtts::speech_params_parse_http(
        R"({"model":"tts-1","input":"Hello.","voice":"ryan","instructions":"calm","response_format":"WAV",
            "speed":1,"language":"english","seed":42,"stream":true,"unknown_field":[1,2]})",
        svc, {});
    CHECK(p.request.text == "Hello.");
    CHECK(p.request.speaker == "Ryan");  // the service's spelling
    CHECK(p.request.instruct == "calm");
    CHECK(p.request.language == "English");
    CHECK(p.request.seed == uint64_t(42));
    CHECK(!p.request.incremental);
    CHECK(p.format == AudioFormat::AUDIO_FORMAT_WAV);
    CHECK(p.stream);
    CHECK(!p.sse);

    const auto d = qtts::speech_params_parse_http(R"({"input":"Hi"})", svc, {});
    CHECK(d.format == AudioFormat::AUDIO_FORMAT_OGG_OPUS);  // documented default
    CHECK(!d.stream);
    CHECK(d.request.speaker.empty());
    CHECK(d.request.language == "auto");
    CHECK(!d.request.seed);

    const auto sse = qtts::speech_params_parse_http(R"({"input":"Hi","stream_format":"sse","response_format":"pcm"})", svc, {});
    CHECK(sse.stream);
    CHECK(sse.sse);
    CHECK(sse.format == AudioFormat::AUDIO_FORMAT_PCM);
}

TEST_CASE("every malformed body is a 400 naming the field", "[unit]") {
    NamesOnlyService svc({"Vivian"});
    struct Case {
        std::string body;
        std::string param;
        std::string says;
    };
    const std::vector<Case> cases = {
        {"{", "", "not valid JSON"},
        {"\"text\"", "", "JSON object"},
        {R"({"voice":"Vivian"})", "input", "required"},
        {R"({"input":""})", "input", "empty"},
        {R"({"input":["a"]})", "input", "string"},
        {R"({"input":"hi","voice":"alloy"})", "voice", "Vivian"},
        {R"({"input":"hi","voice":7})", "voice", "string"},
        {R"({"input":"hi","language":"Elvish"})", "language", "Japanese"},
        {R"({"input":"hi","speed":0.5})", "speed", "1.0"},
        {R"({"input":"hi","speed":"fast"})", "speed", "number"},
        {R"({"input":"hi","response_format":"flac"})", "response_format", "opus"},
        {R"({"input":"hi","stream":"yes"})", "stream", "true or false"},
        {R"({"input":"hi","stream_format":"ws"})", "stream_format", "sse"},
        {R"({"input":"hi","seed":-3})", "seed", "non-negative"},
        {R"({"input":"hi","seed":1.5})", "seed", "non-negative"},
        {R"({"input":"hi","model":5})", "model", "string"},
        {"{\"input\":\"" + std::string(101, 'x') + "\"}", "input", "limit is 100"},
        {"{\"input\":\"hi\",\"instructions\":\"" + std::string(101, 'x') + "\"}", "instructions", "limit"},
        {std::string("{\"input\":\"\xff\"}"), "", "not valid JSON"},
    };
    for (const auto& c : cases) {
        INFO(c.body);
        const RequestError e = rejection(c.body, svc);
        CHECK(e.status() == 400);
        CHECK(e.type() == "invalid_request_error");
        CHECK(e.param() == c.param);
        CHECK_THAT(e.what(), Catch::Contains(c.says));
    }
    // A model without preset voices explains itself.
    NamesOnlyService design({});
    const RequestError e = rejection(R"({"input":"hi","voice":"alloy"})", design);
    CHECK_THAT(e.what(), Catch::Contains("no preset voices"));
}

TEST_CASE("UTF-8 validation rejects every ill-formed sequence", "[unit]") {
    CHECK(qtts::utf8_valid(""));
    CHECK(qtts::utf8_valid("plain ascii"));
    CHECK(qtts::utf8_valid("caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x98\x80"));
    CHECK(qtts::utf8_valid("\xf4\x8f\xbf\xbf"));       // U+10FFFF
    CHECK_FALSE(qtts::utf8_valid("\x80"));              // lone continuation
    CHECK_FALSE(qtts::utf8_valid("\xc3"));              // truncated
    CHECK_FALSE(qtts::utf8_valid("\xc3\x28"));          // bad continuation
    CHECK_FALSE(qtts::utf8_valid("\xc0\xaf"));          // overlong '/'
    CHECK_FALSE(qtts::utf8_valid("\xe0\x80\xaf"));      // overlong, 3 bytes
    CHECK_FALSE(qtts::utf8_valid("\xf0\x80\x80\xaf"));  // overlong, 4 bytes
    CHECK_FALSE(qtts::utf8_valid("\xed\xa0\x80"));      // surrogate U+D800
    CHECK_FALSE(qtts::utf8_valid("\xf4\x90\x80\x80"));  // U+110000
    CHECK_FALSE(qtts::utf8_valid("\xff"));
}

TEST_CASE("WebSocket start and TCP lines", "[unit]") {
    NamesOnlyService svc({"Vivian"});
    const auto ws = qtts::speech_params_parse_ws_start(json{{"type", "start"}, {"voice", "VIVIAN"}, {"format", "ogg"}}, svc, {});
    CHECK(ws.request.incremental);
    CHECK(ws.request.text.empty());
    CHECK(ws.request.speaker == "Vivian");
    CHECK(ws.format == AudioFormat::AUDIO_FORMAT_OGG_OPUS);
    CHECK(qtts::speech_params_parse_ws_start(json{{"type", "start"}}, svc, {}).format == AudioFormat::AUDIO_FORMAT_OPUS_PACKETS);
    CHECK_THROWS_AS(qtts::speech_params_parse_ws_start(json{{"format", "wav"}}, svc, {}), RequestError);
    CHECK_THROWS_AS(qtts::speech_params_parse_ws_start(json{{"text", 3}}, svc, {}), RequestError);

    const auto plain = qtts::speech_params_parse_tcp_line("Hello there.", svc, {});
    CHECK(plain.request.text == "Hello there.");
    CHECK(plain.format == AudioFormat::AUDIO_FORMAT_OGG_OPUS);
    const auto js = qtts::speech_params_parse_tcp_line(R"( {"input":"Hi","voice":"vivian","seed":3})", svc, {});
    CHECK(js.request.text == "Hi");
    CHECK(js.request.speaker == "Vivian");
    CHECK(js.request.seed == uint64_t(3));
    CHECK_THROWS_AS(qtts::speech_params_parse_tcp_line("   ", svc, {}), RequestError);
    CHECK_THROWS_AS(qtts::speech_params_parse_tcp_line("{\"voice\":\"Vivian\"}", svc, {}), RequestError);
    CHECK_THROWS_AS(qtts::speech_params_parse_tcp_line("bad \xff", svc, {}), RequestError);
}

// Found by fuzz_ws_message (tests/fuzz): the server read `end` (and echoed `format`) from the raw
// message after the stream had started, so {"end": "yes"} or {"format": null} threw a JSON type
// error past the parser, with the stream submitted and its slot taken. The parser now reads both.
// Found by fuzz_ws_message: a number past a double's range is not a parse_error for nlohmann
// (out_of_range 406), and it went past the 400 answer.
TEST_CASE("numbers too large for JSON doubles are a 400", "[unit]") {
    NamesOnlyService svc({"Vivian"});
    CHECK(rejection(R"({"input":"hi","seed":1e999})", svc).status() == 400);
    CHECK(rejection(R"({"input":"hi","speed":-1e400})", svc).status() == 400);
    CHECK_THROWS_AS(qtts::speech_params_parse_tcp_line(R"({"input":"hi","seed":1e999})", svc, {}), RequestError);
}

TEST_CASE("WebSocket start parses end and the format name up front", "[unit]") {
    NamesOnlyService svc({"Vivian"});
    const auto one_shot =
        qtts::speech_params_parse_ws_start(json{{"type", "start"}, {"format", "OGG"}, {"text", "Hi."}, {"end", true}}, svc, {});
    CHECK(one_shot.text_complete);
    CHECK(one_shot.format_name == "ogg");
    const auto open = qtts::speech_params_parse_ws_start(json{{"type", "start"}, {"format", nullptr}, {"end", nullptr}}, svc, {});
    CHECK_FALSE(open.text_complete);
    CHECK(open.format_name == "opus");
    CHECK(open.format == AudioFormat::AUDIO_FORMAT_OPUS_PACKETS);
    for (const json& end : {json("yes"), json(1), json::array()}) {
        INFO(end.dump());
        try {
            qtts::speech_params_parse_ws_start(json{{"type", "start"}, {"end", end}}, svc, {});
            FAIL("accepted end = " << end.dump());
        } catch (const RequestError& e) {
            CHECK(e.status() == 400);
            CHECK(e.param() == "end");
        }
    }
}

TEST_CASE("the error body has the OpenAI shape and survives non-UTF-8 messages", "[unit]") {
    const json e = json::parse(qtts::error_body_json("bad voice", "invalid_request_error", "voice"));
    CHECK(e["error"]["message"] == "bad voice");
    CHECK(e["error"]["type"] == "invalid_request_error");
    CHECK(e["error"]["param"] == "voice");
    CHECK(e["error"]["code"].is_null());
    const json f = json::parse(qtts::error_body_json("bytes \xff here", "server_error", "", "x"));
    CHECK(f["error"]["param"].is_null());
    CHECK(f["error"]["code"] == "x");
}

TEST_CASE("server options are validated with the accepted ranges", "[unit]") {
    qtts::ServerOptions o;
    CHECK_NOTHROW(qtts::server_options_validate(o));
    o.host = "localhost";
    CHECK_NOTHROW(qtts::server_options_validate(o));
    o.host = "example.invalid";
    CHECK_THROWS_WITH(qtts::server_options_validate(o), Catch::Contains("not an IP address"));
    o = {};
    o.port = 70000;
    CHECK_THROWS_WITH(qtts::server_options_validate(o), Catch::Contains("0..65535"));
    o = {};
    o.max_streams = 0;
    CHECK_THROWS_WITH(qtts::server_options_validate(o), Catch::Contains("max streams"));
    o = {};
    o.bitrate = 1000;
    CHECK_THROWS_WITH(qtts::server_options_validate(o), Catch::Contains("6000..510000"));
    o = {};
    o.max_audio_seconds = -1;
    CHECK_THROWS_AS(qtts::server_options_validate(o), qtts::Error);
}
