// The prompt builder against the reference's talker inputs: prefill_embeds [L, H] and
// trailing_text [T, H] of every golden scenario (CustomVoice, VoiceDesign, Base x-vector and
// ICL in both text layouts), plus the validation rules of model doc §6.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/cpu/lm.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "test_support.h"
#include "engine/text/prompt.h"

namespace {

using qtts::cpu::LmWeights;

// Same arithmetic as the reference up to summation order: 1e-5 relative per row.
constexpr double TOLERANCE = 1e-5;

std::shared_ptr<const LmWeights> weights_load(const std::string& model) {
    static std::map<std::string, std::shared_ptr<const LmWeights>> cache;
    auto& w = cache[model];
    if (!w) w = LmWeights::load(qtts::checkpoint_load(qtts_test::reference_model_dir(model)));
    return w;
}

nlohmann::json scenarios_all() {
    std::ifstream in(qtts_test::reference_dir() + "/golden/scenarios.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
}

std::vector<int32_t> ids_of(const nlohmann::json& list) {
    std::vector<int32_t> ids;
    for (const auto& v : list) ids.push_back(v.get<int32_t>());
    return ids;
}

qtts::PromptRequest request_of(const nlohmann::json& spec, const qtts::SafetensorsFile& golden) {
    qtts::PromptRequest r;
    r.input_ids = ids_of(spec.at("input_ids"));
    if (spec.contains("instruct_ids")) r.instruct_ids = ids_of(spec.at("instruct_ids"));
    r.language = spec.at("language").get<std::string>();
    if (spec.contains("speaker")) r.speaker = spec.at("speaker").get<std::string>();
    r.layout = spec.at("non_streaming").get<bool>() ? qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING
                                                    : qtts::TextLayout::TEXT_LAYOUT_STREAMING;
    r.keep_instruct_on_0b6_custom_voice = true;  // the goldens come from the low-level generate()
    if (golden.find("ref_speaker_embedding")) r.x_vector = qtts::tensor_to_f32(golden.get("ref_speaker_embedding"));
    if (spec.value("icl", false)) {
        r.ref_ids = ids_of(spec.at("ref_ids"));
        const auto& codes = golden.get("ref_codes");
        const auto codes64 = qtts::tensor_to_i64(codes);
        r.ref_codes.assign(codes64.begin(), codes64.end());
        r.ref_frames = int(codes.shape[0]);
    }
    return r;
}

void rows_check(const char* what, const std::vector<float>& ours, const qtts::TensorView& golden_t, int H,
                const std::string& label) {
    INFO(label << " " << what);
    const std::vector<float> golden = qtts::tensor_to_f32(golden_t);
    REQUIRE(golden_t.shape.size() == 2);
    REQUIRE(golden_t.shape[1] == H);
    const size_t rows = size_t(golden_t.shape[0]);
    REQUIRE(ours.size() == rows * size_t(H));
    double worst = 0.0;
    for (size_t r = 0; r < rows; ++r) {
        const double err = qtts_test::rel_error(ours.data() + r * size_t(H), golden.data() + r * size_t(H), size_t(H));
        worst = std::max(worst, err);
        if (!(err <= TOLERANCE)) {
            FAIL_CHECK(what << " row " << r << " of " << rows << ": relative error " << err << " > " << TOLERANCE);
            return;
        }
    }
    std::printf("  %-36s %-15s %3zu rows, worst relative error %.3g\n", label.c_str(), what, rows, worst);
}

qtts::PromptRequest simple_request(const std::string& speaker, const std::string& language) {
    qtts::PromptRequest r;
    // "<|im_start|>assistant\nHello world, this is a test.<|im_end|>\n<|im_start|>assistant\n"
    r.input_ids = {151644, 77091, 198, 9707, 1879, 11, 419, 374, 264, 1273, 13, 151645, 198, 151644, 77091, 198};
    r.speaker = speaker;
    r.language = language;
    return r;
}

}  // namespace

TEST_CASE("prompt embeddings match the reference for every scenario", "[prompt][golden]") {
    const nlohmann::json all = scenarios_all();
    int checked = 0;
    for (const std::string model : {"tiny-customvoice", "tiny-voicedesign", "tiny-base"}) {
        const auto w = weights_load(model);
        for (const auto& spec : all.at(model)) {
            const std::string name = spec.at("name").get<std::string>();
            const std::string label = model + "--" + name;
            const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path(model, name));
            // The golden input ids are the ones in scenarios.json.
            const auto golden_ids = qtts::tensor_to_i64(golden->get("input_ids"));
            CHECK(std::vector<int32_t>(golden_ids.begin(), golden_ids.end()) == ids_of(spec.at("input_ids")));

            const qtts::Prompt prompt = qtts::prompt_build(w->config(), request_of(spec, *golden));
            rows_check("prefill_embeds", qtts::prompt_embed(prompt, *w, w->num_code_groups()),
                       golden->get("prefill_embeds"), w->hidden_size(), label);
            rows_check("trailing_text", qtts::prompt_embed_trailing(prompt, *w), golden->get("trailing_text"),
                       w->hidden_size(), label);
            ++checked;
        }
    }
    CHECK(checked == 9);
}

TEST_CASE("prompt layout: position counts of each variant", "[prompt][golden]") {
    const auto cv = weights_load("tiny-customvoice");
    const auto& config = cv->config();
    qtts::PromptRequest r = simple_request("Vivian", "English");  // case-insensitive names
    const int text = 8;                                            // ids[3:-5]

    r.layout = qtts::TextLayout::TEXT_LAYOUT_STREAMING;
    qtts::Prompt p = qtts::prompt_build(config, r);
    // 3 role + (think, think_bos, lang, think_eos, speaker, pad) + 1 body
    CHECK(p.positions.size() == 3 + 6 + 1);
    CHECK(p.trailing_ids.size() == size_t(text - 1 + 1));  // text[1:] + <tts_text_eod>
    CHECK(p.trailing_ids.back() == config.tts_eos_token_id);
    CHECK(p.text_tokens == text);

    r.text_complete = false;  // more text will come: no <tts_text_eod> yet
    p = qtts::prompt_build(config, r);
    CHECK(p.trailing_ids.size() == size_t(text - 1));
    CHECK(p.trailing_ids.back() == 13);

    r.text_complete = true;
    r.layout = qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING;
    p = qtts::prompt_build(config, r);
    CHECK(p.positions.size() == 3 + 6 + text + 2);
    CHECK(p.trailing_ids == std::vector<int32_t>{config.tts_pad_token_id});

    // "auto" drops the language slot (nothink form) unless the speaker has a dialect.
    r.language = "Auto";
    p = qtts::prompt_build(config, r);
    CHECK(p.positions.size() == 3 + 5 + text + 2);
    CHECK(p.positions[3].value == config.talker.codec_nothink_id);

    r.speaker = "eric";  // sichuan dialect speaker: auto → think form with the dialect id
    p = qtts::prompt_build(config, r);
    REQUIRE(p.positions.size() == 3 + 6 + text + 2);
    CHECK(p.positions[3].value == config.talker.codec_think_id);
    CHECK(p.positions[5].value == config.talker.language_ids.at("sichuan_dialect"));
    r.language = "english";  // an explicit non-Chinese language keeps the language id
    p = qtts::prompt_build(config, r);
    CHECK(p.positions[5].value == config.talker.language_ids.at("english"));
    r.language = "CHINESE";
    p = qtts::prompt_build(config, r);
    CHECK(p.positions[5].value == config.talker.language_ids.at("sichuan_dialect"));
}

TEST_CASE("prompt: a dialect named as the language is accepted with its own speaker only", "[prompt][golden]") {
    // The reference reaches a dialect through its speaker (language chinese or auto); naming the
    // dialect with that speaker asks for the same thing and must give the same prompt, which the
    // cv-auto-dialect golden checks to the last vector.
    const auto cv = weights_load("tiny-customvoice");
    const nlohmann::json all = scenarios_all();
    const nlohmann::json* dialect_spec = nullptr;
    for (const auto& spec : all.at("tiny-customvoice"))
        if (spec.at("name") == "cv-auto-dialect") dialect_spec = &spec;
    REQUIRE(dialect_spec != nullptr);
    REQUIRE(dialect_spec->at("speaker") == "eric");
    const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path("tiny-customvoice", "cv-auto-dialect"));
    qtts::PromptRequest r = request_of(*dialect_spec, *golden);
    for (const char* language : {"sichuan_dialect", "Sichuan_Dialect"}) {
        r.language = language;
        const qtts::Prompt prompt = qtts::prompt_build(cv->config(), r);
        rows_check("prefill_embeds", qtts::prompt_embed(prompt, *cv, cv->num_code_groups()), golden->get("prefill_embeds"),
                   cv->hidden_size(), std::string("cv-auto-dialect as ") + language);
        rows_check("trailing_text", qtts::prompt_embed_trailing(prompt, *cv), golden->get("trailing_text"),
                   cv->hidden_size(), std::string("cv-auto-dialect as ") + language);
    }

    // dylan speaks beijing_dialect: naming it equals "auto" and "chinese" for him.
    const auto values = [&](const std::string& speaker, const std::string& language) {
        std::vector<int32_t> out;
        for (const auto& p : qtts::prompt_build(cv->config(), simple_request(speaker, language)).positions)
            out.push_back(p.value);
        return out;
    };
    CHECK(values("dylan", "beijing_dialect") == values("dylan", "auto"));
    CHECK(values("dylan", "beijing_dialect") == values("dylan", "chinese"));
    CHECK(values("dylan", "beijing_dialect") != values("dylan", "english"));

    // Any other speaker is refused, naming the speaker the dialect belongs to.
    using Catch::Matchers::Contains;
    CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), simple_request("ryan", "sichuan_dialect")),
                      Contains("dialect spoken only by speaker eric") && Contains("'ryan'"));
    CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), simple_request("eric", "beijing_dialect")),
                      Contains("only by speaker dylan"));
    try {
        qtts::prompt_build(cv->config(), simple_request("vivian", "beijing_dialect"));
        FAIL("a dialect with another speaker must be refused");
    } catch (const qtts::Error& e) {
        CHECK(e.code() == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
    }
}

TEST_CASE("prompt: 0.6B CustomVoice drops the instruct unless asked to keep it", "[prompt][golden]") {
    const auto cv = weights_load("tiny-customvoice");
    REQUIRE(cv->config().size_tag == "0b6");
    qtts::PromptRequest r = simple_request("aiden", "chinese");
    r.instruct_ids = {151644, 872, 198, 100345, 99354, 101091, 3837, 106057, 99305, 1773, 151645, 198};
    const size_t without = qtts::prompt_build(cv->config(), r).positions.size();
    r.keep_instruct_on_0b6_custom_voice = true;
    const size_t with = qtts::prompt_build(cv->config(), r).positions.size();
    CHECK(with == without + r.instruct_ids.size());

    // VoiceDesign (1b7) always uses it.
    const auto vd = weights_load("tiny-voicedesign");
    qtts::PromptRequest v = simple_request("", "english");
    v.instruct_ids = r.instruct_ids;
    const size_t vd_with = qtts::prompt_build(vd->config(), v).positions.size();
    v.instruct_ids.clear();
    CHECK(qtts::prompt_build(vd->config(), v).positions.size() + r.instruct_ids.size() == vd_with);
}

TEST_CASE("prompt: invalid requests fail with clear errors", "[prompt][golden]") {
    const auto cv = weights_load("tiny-customvoice");
    const auto vd = weights_load("tiny-voicedesign");
    const auto base = weights_load("tiny-base");
    using Catch::Matchers::Contains;

    SECTION("unknown speaker lists the supported ones") {
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), simple_request("nobody", "english")),
                          Contains("unknown speaker 'nobody'") && Contains("vivian") && Contains("uncle_fu"));
    }
    SECTION("unknown language lists the supported ones") {
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), simple_request("ryan", "klingon")),
                          Contains("unknown language 'klingon'") && Contains("auto") && Contains("english"));
        // the error's list names each dialect with its speaker
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), simple_request("ryan", "klingon")),
                          Contains("sichuan_dialect (speaker eric only)") && Contains("beijing_dialect (speaker dylan only)"));
    }
    SECTION("CustomVoice needs a speaker") {
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), simple_request("", "english")), Contains("needs a speaker"));
    }
    SECTION("VoiceDesign has no speaker slot") {
        CHECK_THROWS_WITH(qtts::prompt_build(vd->config(), simple_request("vivian", "english")),
                          Contains("no preset speakers"));
    }
    SECTION("Base needs an x-vector of the talker width, and only Base takes one") {
        CHECK_THROWS_WITH(qtts::prompt_build(base->config(), simple_request("", "english")), Contains("x-vector"));
        qtts::PromptRequest r = simple_request("", "english");
        r.x_vector.assign(size_t(base->hidden_size()) + 1, 0.5f);
        CHECK_THROWS_AS(qtts::prompt_build(base->config(), r), qtts::Error);
        qtts::PromptRequest c = simple_request("ryan", "english");
        c.x_vector.assign(size_t(cv->hidden_size()), 0.5f);
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), c), Contains("only accepted by Base"));
    }
    SECTION("ICL needs transcript and codes, in range") {
        qtts::PromptRequest r = simple_request("", "english");
        r.x_vector.assign(size_t(base->hidden_size()), 0.5f);
        r.ref_ids = {151644, 77091, 198, 40, 1079, 151645, 198};
        CHECK_THROWS_WITH(qtts::prompt_build(base->config(), r), Contains("needs both"));
        r.ref_frames = 1;
        r.ref_codes.assign(16, 5);
        CHECK_NOTHROW(qtts::prompt_build(base->config(), r));
        r.ref_codes[3] = 2048;
        CHECK_THROWS_WITH(qtts::prompt_build(base->config(), r), Contains("outside [0, 2048)"));
        r.ref_codes[3] = 5;
        qtts::PromptRequest c = simple_request("ryan", "english");
        c.ref_ids = r.ref_ids;
        c.ref_codes = r.ref_codes;
        c.ref_frames = 1;
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), c), Contains("needs a Base model"));
    }
    SECTION("malformed template ids and empty text") {
        qtts::PromptRequest r = simple_request("ryan", "english");
        r.input_ids.erase(r.input_ids.begin());  // missing <|im_start|>
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), r), Contains("must start with"));
        r = simple_request("ryan", "english");
        r.input_ids = {151644, 77091, 198, 151645, 198, 151644, 77091, 198};
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), r), Contains("no text"));
        r = simple_request("ryan", "english");
        r.input_ids[4] = 151936;
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), r), Contains("outside the text vocabulary"));
    }
    SECTION("non-streaming needs the whole text") {
        qtts::PromptRequest r = simple_request("ryan", "english");
        r.text_complete = false;
        CHECK_THROWS_WITH(qtts::prompt_build(cv->config(), r), Contains("whole text"));
    }
}
