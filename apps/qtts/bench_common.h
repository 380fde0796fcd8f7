// Pieces every `qtts bench*` command shares.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

namespace qtts_cli {

// Writes j (indented) to path and prints where; throws qtts::Error (ERROR_IO) when it cannot.
void bench_json_write(const std::string& path, const nlohmann::json& j);

// True when this build has CUDA and device `device` exists. Otherwise prints
// "qtts <command>: <why>; the benchmark measures <what> and needs a GPU" and returns false.
bool bench_gpu_present(const char* command, const char* what, int device);

}  // namespace qtts_cli
