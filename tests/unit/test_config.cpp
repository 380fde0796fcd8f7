// Config parsing accepts what the real files contain and names the key that is wrong.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/config.h"
#include "model/make_model.h"

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
