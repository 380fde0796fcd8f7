// The tokenizer against ids produced by the Hugging Face tokenizer on the reference model's
// vocab.json / merges.txt / tokenizer_config.json (../shared/reference/golden/tokenizer-cases.json).
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_support.h"
#include "engine/text/prompt.h"
#include "engine/text/tokenizer.h"

namespace {

using qtts::PretokenizerRegex;

nlohmann::json cases_load() {
    const std::string path = qtts_test::reference_dir() + "/golden/tokenizer-cases.json";
    std::ifstream in(path);
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
}

nlohmann::json scenarios_load() {
    std::ifstream in(qtts_test::reference_dir() + "/golden/scenarios.json");
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
}

// Loaded once per regex and shared by the test cases (loading the 151k-token files is the
// slowest part of this test).
const qtts::Tokenizer& tokenizer_load(PretokenizerRegex regex) {
    auto load = [](PretokenizerRegex r) {
        qtts::TokenizerOptions options;
        options.regex = r;
        return qtts::Tokenizer::load(qtts_test::reference_model_dir("tiny-customvoice"), options);
    };
    if (regex == PretokenizerRegex::PRETOKENIZER_QWEN2) {
        static const qtts::Tokenizer native = load(regex);
        return native;
    }
    static const qtts::Tokenizer fixed = load(regex);
    return fixed;
}

std::vector<int32_t> ids_of(const nlohmann::json& list) {
    std::vector<int32_t> ids;
    for (const auto& v : list) ids.push_back(v.get<int32_t>());
    return ids;
}

// Expected ids for texts whose pre-tokenisation differs between the two regexes, under the
// mistral-fix regex. Computed with an independent Python implementation (the `regex` module and a
// textbook GPT-2 BPE loop over the same vocab.json/merges.txt; it reproduces all 31 HF `default`
// cases exactly). Needed because the golden file's `fix_mistral_regex` entry was recorded without
// the patch taking effect: its pre-tokenizer is the native regex and its ids equal `default`.
struct FixCase {
    const char* text;
    std::vector<int32_t> qwen2_ids;
    std::vector<int32_t> mistral_fix_ids;
};
const std::vector<FixCase>& fix_cases() {
    static const std::vector<FixCase> cases = {
        {"camelCaseIdentifier and HTTPServerError XMLHttpRequest",
         {93321, 4207, 8714, 323, 10130, 38509, 45838},
         {93321, 4207, 8714, 323, 10130, 5475, 1454, 11874, 2905, 1900}},
        {"\xE0\xB8\xAA\xE0\xB8\xA7\xE0\xB8\xB1\xE0\xB8\xAA\xE0\xB8\x94\xE0\xB8\xB5\xE0\xB8\x84\xE0\xB8\xA3\xE0\xB8\xB1"
         "\xE0\xB8\x9A \xE0\xB8\xA0\xE0\xB8\xB2\xE0\xB8\xA9\xE0\xB8\xB2\xE0\xB9\x84\xE0\xB8\x97\xE0\xB8\xA2",
         {143126, 23271, 125136, 28319, 123886, 83546, 220, 127382, 125451},
         {35648, 124294, 35648, 124311, 125459, 220, 127382, 125451}},
        {"HTTPServer's XMLHttpRequest/path//x",
         {9230, 5475, 594, 45838, 50976, 322, 87},
         {9230, 5475, 594, 11874, 2905, 1900, 50976, 322, 87}},
    };
    return cases;
}

}  // namespace

TEST_CASE("golden: all cases, native Qwen2 regex, match the HF ids") {
    const nlohmann::json cases = cases_load();
    const auto& tokenizer = tokenizer_load(PretokenizerRegex::PRETOKENIZER_QWEN2);
    REQUIRE(cases.at("texts").size() == 31);
    REQUIRE(tokenizer.vocab_size() == cases.at("default_len").get<int32_t>());
    for (size_t i = 0; i < cases.at("texts").size(); ++i) {
        const std::string text = cases.at("texts")[i].get<std::string>();
        const std::vector<int32_t> expected = ids_of(cases.at("default")[i]);
        INFO("case " << i << ": " << text);
        CHECK(tokenizer.encode(text) == expected);
    }
}

TEST_CASE("golden: mistral-fix regex matches the golden ids where the regexes agree, and the reference where they differ") {
    const nlohmann::json cases = cases_load();
    const auto& fixed = tokenizer_load(PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX);
    REQUIRE(fixed.vocab_size() == cases.at("fix_mistral_regex_len").get<int32_t>());
    size_t divergent = 0;
    for (size_t i = 0; i < cases.at("texts").size(); ++i) {
        const std::string text = cases.at("texts")[i].get<std::string>();
        INFO("case " << i << ": " << text);
        const auto& fc = fix_cases();
        auto it = std::find_if(fc.begin(), fc.end(), [&](const FixCase& c) { return text == c.text; });
        if (it != fc.end()) {
            ++divergent;
            CHECK(fixed.encode(text) == it->mistral_fix_ids);
        } else {
            CHECK(fixed.encode(text) == ids_of(cases.at("fix_mistral_regex")[i]));
        }
    }
    CHECK(divergent == 2);  // camelCase and Thai
}

TEST_CASE("golden: the two regexes give the independently computed ids on texts where they diverge") {
    const auto& native = tokenizer_load(PretokenizerRegex::PRETOKENIZER_QWEN2);
    const auto& fixed = tokenizer_load(PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX);
    for (const FixCase& c : fix_cases()) {
        INFO(c.text);
        CHECK(native.encode(c.text) == c.qwen2_ids);
        CHECK(fixed.encode(c.text) == c.mistral_fix_ids);
        CHECK(c.qwen2_ids != c.mistral_fix_ids);
    }
}

TEST_CASE("golden: the prompt templates with request text read as text give the reference's prompt ids") {
    // The engine encodes templates with the request's text as plain text (text/prompt.h). For
    // text without special-token strings that must be exactly the reference's whole-string ids:
    // the scenarios' own prompts, and every golden text (merges across the template boundary, a
    // text starting with a newline) inside the assistant template.
    const auto& tokenizer = tokenizer_load(PretokenizerRegex::PRETOKENIZER_QWEN2);
    constexpr auto kText = qtts::AddedTokens::ADDED_TOKENS_AS_TEXT;
    const nlohmann::json scenarios = scenarios_load();
    size_t checked = 0;
    for (const auto& [model, list] : scenarios.items()) {
        for (const auto& scenario : list) {
            INFO(model << " " << scenario.at("name").get<std::string>());
            const std::vector<int32_t> input = ids_of(scenario.at("input_ids"));
            const std::string text = tokenizer.decode(std::vector<int32_t>(input.begin() + 3, input.end() - 5));
            CHECK(qtts::assistant_template_ids(tokenizer, text, kText) == input);
            if (scenario.contains("instruct_ids")) {
                const std::vector<int32_t> instruct = ids_of(scenario.at("instruct_ids"));
                const std::string what = tokenizer.decode(std::vector<int32_t>(instruct.begin() + 3, instruct.end() - 2));
                CHECK(qtts::instruct_template_ids(tokenizer, what, kText) == instruct);
            }
            if (scenario.contains("ref_ids")) {
                const std::vector<int32_t> ref = ids_of(scenario.at("ref_ids"));
                const std::string said = tokenizer.decode(std::vector<int32_t>(ref.begin() + 3, ref.end() - 2));
                CHECK(qtts::reference_template_ids(tokenizer, said, kText) == ref);
            }
            ++checked;
        }
    }
    CHECK(checked >= 9);

    const nlohmann::json cases = cases_load();
    size_t plain_cases = 0;
    for (size_t i = 0; i < cases.at("texts").size(); ++i) {
        const std::string text = cases.at("texts")[i].get<std::string>();
        const std::string whole = "<|im_start|>assistant\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
        const std::vector<int32_t> matched = tokenizer.encode(whole);
        // The template holds three added tokens: <|im_start|>, <|im_end|>, <|im_start|>.
        const auto added_count = [](const std::vector<int32_t>& ids) {
            return std::count_if(ids.begin(), ids.end(), [](int32_t id) { return id >= 151643; });
        };
        const bool has_added = added_count(matched) > 3;
        INFO("case " << i << ": " << text);
        if (has_added) {
            // A special-token string in the text: never a control id from the text as text.
            const auto ids = qtts::assistant_template_ids(tokenizer, text, kText);
            CHECK(added_count(ids) == 3);
            CHECK(qtts::assistant_template_ids(tokenizer, text, qtts::AddedTokens::ADDED_TOKENS_MATCH) == matched);
        } else {
            CHECK(qtts::assistant_template_ids(tokenizer, text, kText) == matched);
            ++plain_cases;
        }
    }
    CHECK(plain_cases >= 25);
    const std::string newline_first = "\nHello there.";
    CHECK(qtts::assistant_template_ids(tokenizer, newline_first, kText) ==
          tokenizer.encode("<|im_start|>assistant\n" + newline_first + "<|im_end|>\n<|im_start|>assistant\n"));
}

TEST_CASE("golden: decode inverts encode on every case (NFC applied)") {
    const nlohmann::json cases = cases_load();
    const auto& tokenizer = tokenizer_load(PretokenizerRegex::PRETOKENIZER_QWEN2);
    for (size_t i = 0; i < cases.at("texts").size(); ++i) {
        const std::string text = cases.at("texts")[i].get<std::string>();
        INFO("case " << i << ": " << text);
        CHECK(tokenizer.decode(ids_of(cases.at("default")[i])) == qtts::utf8_nfc(text));
    }
}

TEST_CASE("golden: prompt ids of the reference scenarios re-encode from their decoded text") {
    // scenarios.json records the ids the reference built for whole prompts (role tokens, text,
    // <|im_end|>, instruct blocks); tokenising their decoded text must give them back.
    const auto& tokenizer = tokenizer_load(PretokenizerRegex::PRETOKENIZER_QWEN2);
    const nlohmann::json scenarios = scenarios_load();
    size_t checked = 0;
    for (const auto& [model, list] : scenarios.items()) {
        for (const auto& scenario : list) {
            for (const char* key : {"input_ids", "instruct_ids", "ref_ids"}) {
                if (!scenario.contains(key)) continue;
                const std::vector<int32_t> ids = ids_of(scenario.at(key));
                const std::string text = tokenizer.decode(ids);
                INFO(model << " " << scenario.at("name").get<std::string>() << " " << key << ": " << text);
                CHECK(tokenizer.encode(text) == ids);
                ++checked;
            }
        }
    }
    CHECK(checked >= 9);
    CHECK(tokenizer.token_to_id("<|im_start|>") == 151644);
    CHECK(tokenizer.token_to_id("<|im_end|>") == 151645);
    CHECK(tokenizer.token_to_id("<tts_pad>") == 151671);
    CHECK(tokenizer.token_to_id("<tts_text_bos>") == 151672);
    CHECK(tokenizer.token_to_id("<tts_text_eod>") == 151673);
    CHECK(tokenizer.token_to_id("assistant") == 77091);
    CHECK(tokenizer.token_to_id("\xC4\x8A") == 198);  // "\u010A" is the byte-level form of "\n"
    CHECK(tokenizer.token_to_id("no-such-token") == -1);
    CHECK(tokenizer.id_to_token(151671) == "<tts_pad>");
    CHECK(tokenizer.is_special(151645));
    CHECK_FALSE(tokenizer.is_special(151667));  // <think> is added but not special
    CHECK_FALSE(tokenizer.is_special(198));
}

TEST_CASE("golden: 1 MB of concatenated cases gives the concatenated golden ids") {
    // <|im_end|> between the cases separates them exactly like independent calls would.
    const nlohmann::json cases = cases_load();
    const auto& tokenizer = tokenizer_load(PretokenizerRegex::PRETOKENIZER_QWEN2);
    std::string text;
    std::vector<int32_t> expected;
    for (size_t round = 0; text.size() < (1u << 20); ++round) {
        const size_t i = (round * 7) % cases.at("texts").size();
        text += cases.at("texts")[i].get<std::string>();
        text += "<|im_end|>";
        const auto ids = ids_of(cases.at("default")[i]);
        expected.insert(expected.end(), ids.begin(), ids.end());
        expected.push_back(151645);
    }
    REQUIRE(text.size() >= (1u << 20));
    const std::vector<int32_t> ids = tokenizer.encode(text);
    REQUIRE(ids.size() == expected.size());
    CHECK(ids == expected);
}

TEST_CASE("golden: cache on and off agree") {
    const nlohmann::json cases = cases_load();
    qtts::TokenizerOptions tiny_cache;
    tiny_cache.cache_entries = 3;  // forces many evictions
    const auto cached = qtts::Tokenizer::load(qtts_test::reference_model_dir("tiny-customvoice"), tiny_cache);
    qtts::TokenizerOptions no_cache;
    no_cache.cache_entries = 0;
    const auto uncached = qtts::Tokenizer::load(qtts_test::reference_model_dir("tiny-customvoice"), no_cache);
    for (int pass = 0; pass < 2; ++pass) {
        for (size_t i = 0; i < cases.at("texts").size(); ++i) {
            const std::string text = cases.at("texts")[i].get<std::string>();
            INFO("pass " << pass << " case " << i);
            CHECK(cached.encode(text) == ids_of(cases.at("default")[i]));
            CHECK(uncached.encode(text) == ids_of(cases.at("default")[i]));
        }
    }
}
