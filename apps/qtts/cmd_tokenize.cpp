// qtts tokenize: shows the text ids the engine feeds the talker for a text (no chat template, no
// special tokens added), for checking against the Hugging Face tokenizer.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/text/tokenizer.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;

void print_help() {
    std::printf(
        "usage: qtts tokenize [--model DIR] [--json] [--raw-tokens] [--regex qwen2|mistral-fix] (TEXT... | --file F)\n\n"
        "Prints the token ids of TEXT (several words are joined with single spaces) as 'id<TAB>token'\n"
        "lines, or with --json one object {\"ids\": [...], \"tokens\": [...]}. No special tokens are added.\n"
        "Special-token strings in the text (e.g. <|im_end|>) are plain text, as in every request the\n"
        "engine takes; --raw-tokens turns them into their ids (Hugging Face with add_special_tokens=False).\n\n"
        "  --model DIR    model folder with vocab.json, merges.txt, tokenizer_config.json\n"
        "                 (default: the embedded demo model: the real added tokens, a byte-only vocabulary)\n"
        "  --file F       read the text from file F instead of the command line\n"
        "  --raw-tokens   match special-token strings (<|im_start|>, <tts_pad>, ...) as control tokens\n"
        "  --regex NAME   pre-tokenizer regex: qwen2 (default) or mistral-fix\n"
        "  --json         print one JSON object\n");
}

std::string text_read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorCode::ERROR_NOT_FOUND, "cannot open text file '{}'", path);
    std::ostringstream buffer;
    buffer << in.rdbuf();
    return buffer.str();
}

int cmd_tokenize(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "file", "regex"}, {"json", "help", "raw-tokens"});
    if (args.has("help")) {
        print_help();
        return 0;
    }

    std::string text;
    if (auto file = args.get("file")) {
        if (!args.positional().empty())
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "give the text either on the command line or with --file, not both");
        text = text_read_file(*file);
    } else {
        for (size_t i = 0; i < args.positional().size(); ++i) text += (i ? " " : "") + args.positional()[i];
    }
    if (text.empty()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "no text to tokenize (pass TEXT or --file F with content)");

    qtts::TokenizerOptions options;
    options.regex = qtts::pretokenizer_regex_parse(args.get_or("regex", "qwen2"));
    const qtts::Tokenizer tokenizer = qtts::Tokenizer::load(qtts_cli::model_dir_or_default(args), options);
    const std::vector<int32_t> ids = tokenizer.encode(
        text, args.has("raw-tokens") ? qtts::AddedTokens::ADDED_TOKENS_MATCH : qtts::AddedTokens::ADDED_TOKENS_AS_TEXT);

    if (args.has("json")) {
        nlohmann::json out;
        out["ids"] = ids;
        nlohmann::json tokens = nlohmann::json::array();
        for (int32_t id : ids) tokens.push_back(tokenizer.id_to_token(id));
        out["tokens"] = std::move(tokens);
        std::printf("%s\n", out.dump().c_str());
    } else {
        for (int32_t id : ids) std::printf("%d\t%s\n", id, tokenizer.id_to_token(id).c_str());
    }
    return 0;
}

}  // namespace

QTTS_COMMAND("tokenize", "print the text token ids of a text (Qwen2 BPE)", cmd_tokenize);
