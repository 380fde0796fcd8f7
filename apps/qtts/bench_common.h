// Pieces every `qtts bench*` command shares.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "apps/qtts/bench_stats.h"  // bench_median, bench_percentile

namespace qtts {
struct ModelConfig;
struct Prompt;
}  // namespace qtts

namespace qtts_cli {

class Args;

// The model a benchmark runs: --model DIR; or --preset P, a random-weight checkpoint of that
// preset written on first use to <cache>/P (--cache DIR, else $QTTS_CACHE_DIR, else
// /tmp/qtts-bench); else the embedded demo model (model_dir_or_default). When it writes the
// checkpoint, *make_model_seconds (if given) receives how long that took.
std::string bench_model_dir(const Args& args, double* make_model_seconds = nullptr);

// The benchmarks' fixed request: "<|im_start|>assistant\n" + a 22-token English sentence +
// "<|im_end|>\n<|im_start|>assistant\n", the model's first speaker (CustomVoice) or a fixed
// x-vector (Base), non-streaming text layout. text_repeat > 1: the sentence that many times (a
// longer prompt of the same kind).
qtts::Prompt bench_prompt(const qtts::ModelConfig& config, int text_repeat = 1);

// Writes j (indented) to path and prints where; throws qtts::Error (ERROR_IO) when it cannot.
void bench_json_write(const std::string& path, const nlohmann::json& j);

// True when this build has CUDA and device `device` exists. Otherwise prints
// "qtts <command>: <why>; the benchmark measures <what> and needs a GPU" and returns false.
bool bench_gpu_present(const char* command, const char* what, int device);

// "1,2,4" -> {1, 2, 4}: sizes in 1..1000; throws ERROR_INVALID_ARGUMENT naming `option` otherwise.
std::vector<int> bench_sizes(const std::string& text, const char* option);

// The names of a comma-separated list ("auto,sk16"), trimmed; empty entries are skipped.
std::vector<std::string> bench_names(const std::string& text);

}  // namespace qtts_cli
