// Config parsing accepts what the real files contain and names the key that is wrong; the list
// option parser the tools share.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/strings.h"
#include "engine/model/config.h"
#include "engine/model/make_model.h"
#include "test_errors.h"

using namespace qtts;
using json = nlohmann::json;

TEST_CASE("spk_id accepts an int or a one-element list", "[config]") {
    json j = json::parse(model_config_to_json(model_preset("tiny-customvoice").config));
    j["talker_config"]["spk_id"]["vivian"] = json::array({3065});
    j["talker_config"]["spk_id"]["Ryan"] = 3061;
    const ModelConfig c = model_config_parse(j.dump(), "config.json");
    CHECK(c.talker.speaker_ids.at("vivian") == 3065);
    CHECK(c.talker.speaker_ids.at("ryan") == 3061);  // names are case-insensitive
    CHECK(c.talker.speaker_dialect.at("eric") == "sichuan_dialect");
    CHECK(c.talker.speaker_dialect.at("vivian").empty());

    j["talker_config"]["spk_id"]["vivian"] = json::array({1, 2});
    CHECK_THROWS_WITH(model_config_parse(j.dump(), "config.json"), Catch::Contains("spk_id['vivian']"));
}

TEST_CASE("configs round-trip through JSON for every preset", "[config]") {
    for (const auto& name : model_preset_names()) {
        const ModelPreset p = model_preset(name);
        const ModelConfig c = model_config_parse(model_config_to_json(p.config), name);
        CHECK(c.talker.hidden_size == p.config.talker.hidden_size);
        CHECK(c.talker.code_predictor.num_layers == p.config.talker.code_predictor.num_layers);
        CHECK(c.type == p.config.type);
        CHECK(c.speaker_encoder.has_value() == p.config.speaker_encoder.has_value());
        const SpeechTokenizerConfig s = speech_tokenizer_config_parse(speech_tokenizer_config_to_json(p.speech_config), name);
        CHECK(s.decoder.decoder_dim == p.speech_config.decoder.decoder_dim);
        CHECK(s.encoder.codebook_dim == p.speech_config.encoder.codebook_dim);
    }
}

TEST_CASE("bad config files give clear errors", "[config]") {
    CHECK_THROWS_WITH(model_config_parse("{oops", "x/config.json"), Catch::Contains("x/config.json") && Catch::Contains("invalid JSON"));
    CHECK_THROWS_WITH(model_config_parse("[1,2]", "c.json"), Catch::Contains("JSON object"));
    CHECK_THROWS_WITH(model_config_parse("{}", "c.json"), Catch::Contains("talker_config"));
    json j = json::parse(model_config_to_json(model_preset("tiny-customvoice").config));
    j["talker_config"]["hidden_size"] = "big";
    CHECK_THROWS_WITH(model_config_parse(j.dump(), "c.json"), Catch::Contains("talker_config.hidden_size"));
    j = json::parse(model_config_to_json(model_preset("tiny-customvoice").config));
    j["talker_config"]["num_key_value_heads"] = 3;
    CHECK_THROWS_WITH(model_config_parse(j.dump(), "c.json"), Catch::Contains("multiple"));
    j = json::parse(model_config_to_json(model_preset("tiny-customvoice").config));
    j["tts_model_type"] = "robot";
    CHECK_THROWS_WITH(model_config_parse(j.dump(), "c.json"), Catch::Contains("robot"));
    CHECK_THROWS_WITH(generation_config_parse(R"({"top_p": 2.0})", "g.json"), Catch::Contains("out of range"));
    CHECK_THROWS_WITH(file_read_text("/nonexistent/qtts/config.json"), Catch::Contains("cannot open"));
}

TEST_CASE("unknown presets are listed", "[config]") {
    CHECK_THROWS_WITH(model_preset("0.6b-voicedesign"), Catch::Contains("1.7b-voicedesign"));
}

// Found by fuzz_config (tests/fuzz): numbers outside an int were converted anyway (1e300 into
// an int is undefined behaviour; 2^40 wrapped). They are refused, naming the key.
TEST_CASE("config numbers must fit their fields", "[config]") {
    const json base = json::parse(model_config_to_json(model_preset("tiny-customvoice").config));
    auto with_talker = [&](const char* key, const json& value) {
        json j = base;
        j["talker_config"][key] = value;
        return j.dump();
    };
    for (const json& too_big : {json(1e300), json(int64_t(1) << 40), json(-(int64_t(1) << 40)),
                                json(uint64_t(18446744073709551615ull)), json(2.5)}) {
        INFO(too_big.dump());
        qtts_test::require_error([&] { model_config_parse(with_talker("hidden_size", too_big), "c.json"); },
                                 ErrorCode::ERROR_FORMAT, "talker_config.hidden_size");
    }
    // An integral float is an integer.
    CHECK(model_config_parse(with_talker("vocab_size", 3072.0), "c.json").talker.vocab_size == 3072);

    json j = base;
    j["talker_config"]["spk_id"]["vivian"] = 1e12;
    qtts_test::require_error([&] { model_config_parse(j.dump(), "c.json"); }, ErrorCode::ERROR_FORMAT, "spk_id['vivian']");
    j = base;
    j["talker_config"]["codec_language_id"]["english"] = json::array({1e12});
    qtts_test::require_error([&] { model_config_parse(j.dump(), "c.json"); }, ErrorCode::ERROR_FORMAT,
                             "codec_language_id['english']");
    j = base;
    j["talker_config"]["rope_scaling"]["mrope_section"] = json::array({24, 1e300});
    qtts_test::require_error([&] { model_config_parse(j.dump(), "c.json"); }, ErrorCode::ERROR_FORMAT, "mrope_section");
    // A float field that does not fit a float.
    qtts_test::require_error([&] { model_config_parse(with_talker("rms_norm_eps", 1e300), "c.json"); },
                             ErrorCode::ERROR_FORMAT, "talker_config.rms_norm_eps");

    // The fuzzer's input.
    qtts_test::require_error(
        [] { generation_config_parse(R"({"top_k": 1e300, "max_new_tokens": 18446744073709551615})", "g.json"); },
        ErrorCode::ERROR_FORMAT, "top_k");
}

// The decoder's upsampling product overflowed an int for rates like [65536, 65536] (undefined
// behaviour; it could even wrap onto decode_upsample_rate), and a zero rate was accepted.
TEST_CASE("decoder upsampling rates are checked without overflow", "[config]") {
    const json base = json::parse(speech_tokenizer_config_to_json(model_preset("tiny-customvoice").speech_config));
    json j = base;
    j["decoder_config"]["upsample_rates"] = json::array({65536, 65536, 65536});
    j["decoder_config"]["upsampling_ratios"] = json::array();
    qtts_test::require_error([&] { speech_tokenizer_config_parse(j.dump(), "st.json"); }, ErrorCode::ERROR_FORMAT,
                             "decode_upsample_rate");
    j = base;
    j["decoder_config"]["upsample_rates"] = json::array({8, 0, 4, 3});
    qtts_test::require_error([&] { speech_tokenizer_config_parse(j.dump(), "st.json"); }, ErrorCode::ERROR_FORMAT,
                             "must be positive");
    j = base;
    j["decoder_config"]["upsample_rates"] = json::array({-8, -5, 4, 3});  // the product is right, the rates are not
    qtts_test::require_error([&] { speech_tokenizer_config_parse(j.dump(), "st.json"); }, ErrorCode::ERROR_FORMAT,
                             "must be positive");
}

TEST_CASE("int_list_parse reads whole numbers in range and names the entry it refuses", "[config]") {
    std::vector<int> v;
    std::string bad = "untouched";
    CHECK(int_list_parse("1,4, 10 ,64", 1, 64, &v, &bad));
    CHECK(v == std::vector<int>{1, 4, 10, 64});
    CHECK(bad == "untouched");
    const std::vector<std::pair<std::string, std::string>> refused = {
        {"", ""}, {"1,,4", ""}, {"1,4a", "4a"}, {"0", "0"}, {"65", "65"}, {"-3", "-3"}, {"1,", ""},
        {"99999999999999999999", "99999999999999999999"}, {"x", "x"}};
    for (const auto& [text, entry] : refused) {
        INFO("'" << text << "'");
        v.clear();
        CHECK_FALSE(int_list_parse(text, 1, 64, &v, &bad));
        CHECK(bad == entry);
    }
}
