// qtts bench-tokenizer: tokenizer throughput on generated mixed-language text, in MB/s.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/text/tokenizer.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;

// Sentences in ten languages plus code-like and numeric text; words are reshuffled so that the
// pre-token cache sees a realistic mix of repeats and new words rather than one loop.
const std::vector<std::string>& bench_sentences() {
    static const std::vector<std::string> sentences = {
        "The weather is lovely today, so we are walking to the park after lunch.",
        "Streaming speech synthesis must start talking before the whole text has arrived.",
        "\xE4\xBB\x8A\xE5\xA4\xA9\xE5\xA4\xA9\xE6\xB0\x94\xE5\xBE\x88\xE5\xA5\xBD\xEF\xBC\x8C\xE6\x88\x91\xE4\xBB\xAC"
        "\xE5\x8E\xBB\xE5\x85\xAC\xE5\x9B\xAD\xE6\x95\xA3\xE6\xAD\xA5\xE5\x90\xA7\xE3\x80\x82",
        "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF\xE3\x80\x81\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82"
        "\xE3\x82\xAB\xE3\x82\xBF\xE3\x82\xAB\xE3\x83\x8A\xE3\x81\xA8\xE3\x81\xB2\xE3\x82\x89\xE3\x81\x8C\xE3\x81\xAA\xE3\x80\x82",
        "\xEC\x95\x88\xEB\x85\x95\xED\x95\x98\xEC\x84\xB8\xEC\x9A\x94, \xEC\x84\xB8\xEA\xB3\x84!",
        "Gr\xC3\xBC\xC3\x9F" "e aus M\xC3\xBCnchen, die Stra\xC3\x9F" "e ist heute sehr ruhig.",
        "\xC3\x89mile Zola \xC3\xA9" "crivait \xC3\xA0 Paris pendant des ann\xC3\xA9" "es.",
        "\xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82, \xD0\xBA\xD0\xB0\xD0\xBA \xD0\xB4\xD0\xB5\xD0\xBB\xD0\xB0?",
        "\xC2\xBFQu\xC3\xA9 tal? \xC2\xA1Muy bien, gracias!",
        "Ol\xC3\xA1, tudo bem? N\xC3\xA3o sei o que dizer.",
        "Ciao, come stai? Sto bene, grazie.",
        "The invoice total is 1,234.56 dollars, due on 2024-03-15 at 17:30.",
        "Call getHTTPResponseCode() and check XMLHttpRequest.readyState == 4.",
        "emoji \xF0\x9F\x98\x80\xF0\x9F\x91\x8D and symbols \xC2\xA9\xC2\xAE\xE2\x84\xA2 \xE2\x86\x92 \xE2\x88\x91",
    };
    return sentences;
}

std::string bench_text(size_t bytes, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const auto& sentences = bench_sentences();
    std::string text;
    text.reserve(bytes + 256);
    while (text.size() < bytes) {
        const std::string& s = sentences[rng() % sentences.size()];
        if (rng() % 4 == 0) {
            // Rotate the sentence at a space so that pre-tokens at its ends vary.
            const size_t space = s.find(' ', rng() % s.size());
            text += space == std::string::npos ? s : s.substr(space + 1) + " " + s.substr(0, space);
        } else {
            text += s;
        }
        text += rng() % 8 == 0 ? "\n" : " ";
        if (rng() % 3 == 0) text += std::to_string(rng() % 100000) + " ";
    }
    return text;
}

int cmd_bench_tokenizer(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "mb", "regex", "runs"}, {"no-cache", "help"});
    if (args.has("help")) {
        std::printf(
            "usage: qtts bench-tokenizer --model DIR [--mb 1] [--runs 1] [--regex qwen2|mistral-fix] [--no-cache]\n\n"
            "Tokenises MB megabytes of generated mixed-language text and prints one JSON line\n"
            "{\"bench\":\"tokenizer\",\"mb\":..,\"seconds\":..,\"mb_per_s\":..}. The first run starts with an\n"
            "empty pre-token cache; with --runs N the fastest run is reported.\n");
        return 0;
    }
    const auto model = args.get("model");
    if (!model) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--model DIR is required (a folder holding vocab.json)");
    const double mb = args.get_double("mb", 1.0);
    if (!(mb > 0.0 && mb <= 1024.0)) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--mb must be in (0, 1024], got {}", mb);
    const long long runs = args.get_int("runs", 1);
    if (runs < 1 || runs > 100) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--runs must be in 1..100, got {}", runs);

    qtts::TokenizerOptions options;
    options.regex = qtts::pretokenizer_regex_parse(args.get_or("regex", "qwen2"));
    if (args.has("no-cache")) options.cache_entries = 0;

    using clock = std::chrono::steady_clock;
    const auto load_start = clock::now();
    const qtts::Tokenizer tokenizer = qtts::Tokenizer::load(*model, options);
    const double load_seconds = std::chrono::duration<double>(clock::now() - load_start).count();

    const std::string text = bench_text(size_t(mb * 1024.0 * 1024.0), 12345);
    double best = 1e30, best_cpu = 1e30;
    size_t tokens = 0;
    for (long long r = 0; r < runs; ++r) {
        // CPU time is reported too: on a shared machine the wall time includes waiting for a core.
        const std::clock_t cpu_start = std::clock();
        const auto start = clock::now();
        const std::vector<int32_t> ids = tokenizer.encode(text);
        best = std::min(best, std::chrono::duration<double>(clock::now() - start).count());
        best_cpu = std::min(best_cpu, double(std::clock() - cpu_start) / CLOCKS_PER_SEC);
        tokens = ids.size();
    }
    const double text_mb = double(text.size()) / (1024.0 * 1024.0);
    nlohmann::json out = {{"bench", "tokenizer"},
                          {"mb", text_mb},
                          {"seconds", best},
                          {"mb_per_s", text_mb / best},
                          {"cpu_seconds", best_cpu},
                          {"cpu_mb_per_s", text_mb / best_cpu},
                          {"tokens", tokens},
                          {"runs", runs},
                          {"regex", qtts::pretokenizer_regex_name(options.regex)},
                          {"cache", options.cache_entries > 0},
                          {"load_seconds", load_seconds}};
    std::printf("%s\n", out.dump().c_str());
    return 0;
}

}  // namespace

QTTS_COMMAND("bench-tokenizer", "measure text tokenizer throughput (MB/s) on mixed-language text", cmd_bench_tokenizer);
