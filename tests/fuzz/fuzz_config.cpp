// Fuzz target: the three checkpoint JSON configs (config.json, speech_tokenizer/config.json,
// generation_config.json). The first byte picks the parser, the rest is the file's text. A config
// that parses must survive its own writer: to_json() and parse again give the same JSON.
#include <string>

#include "fuzz_support.h"
#include "engine/model/config.h"

namespace {

template <typename Parse, typename Write>
void round_trip(const std::string& text, Parse parse, Write write) {
    const auto config = parse(text, "fuzz.json");
    const std::string written = write(config);
    try {
        const auto again = parse(written, "written.json");
        qtts::fuzz::property(write(again) == written, "config -> JSON -> config is stable");
    } catch (const qtts::Error& e) {
        std::fprintf(stderr, "fuzz: the writer's JSON does not parse: %s\n%s\n", e.what(), written.c_str());
        std::abort();
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 1) return 0;
    const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
    try {
        switch (data[0] % 3) {
            case 0: round_trip(text, qtts::model_config_parse, qtts::model_config_to_json); break;
            case 1:
                round_trip(text, qtts::speech_tokenizer_config_parse, qtts::speech_tokenizer_config_to_json);
                break;
            default: round_trip(text, qtts::generation_config_parse, qtts::generation_config_to_json); break;
        }
    } catch (const qtts::Error& e) {
        qtts::fuzz::error_check(e);
    }
    return 0;
}
