// The qtts command line: every subcommand lives in its own cmd_*.cpp file and registers
// itself with QTTS_COMMAND, so adding a command never touches main.cpp.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace qtts_cli {

// Parsed "--name value", "--flag" and positional arguments. Options must be declared by the
// command (value options and flags) so that typos are reported instead of ignored.
class Args {
public:
    Args(std::vector<std::string> argv, std::vector<std::string> value_options,
         std::vector<std::string> flag_options);

    bool has(const std::string& name) const;  // option given (value or flag)
    std::optional<std::string> get(const std::string& name) const;
    std::string get_or(const std::string& name, const std::string& fallback) const;
    long long get_int(const std::string& name, long long fallback) const;
    double get_double(const std::string& name, double fallback) const;
    const std::vector<std::string>& positional() const { return positional_; }

private:
    std::map<std::string, std::string> values_;
    std::map<std::string, bool> flags_;
    std::vector<std::string> positional_;
};

using CommandFn = std::function<int(const std::vector<std::string>& args)>;

struct Command {
    std::string name;
    std::string summary;
    CommandFn run;
};

std::map<std::string, Command>& command_registry();

struct CommandRegistrar {
    CommandRegistrar(const std::string& name, const std::string& summary, CommandFn fn);
};

// --model DIR when given, else the embedded demo model (written to the cache on first use), with
// an info line saying so: the one default every command that loads a model shares.
std::string model_dir_or_default(const Args& args);

// --gpu-memory-limit SIZE (say, serve, bench): the one place the option is read. The size syntax
// is checked here (memory_size_parse: "6G", "3000M"); the library checks the value
// (backend_options_validate). 0 when the option is absent (no limit).
size_t gpu_memory_limit_option(const Args& args);
constexpr const char* GPU_MEMORY_LIMIT_HELP =
    "  --gpu-memory-limit S  CUDA: the most device memory qtts may take (e.g. 6G, 3000M; binary units);\n"
    "                        stream slots and their context are fitted to it (default: the free memory)\n";

// --max-context N (say, serve, bench-serve): CUDA talker positions per stream slot (prompt +
// frames: 12.5 a second of audio), the one place the option is read. Fewer positions take less
// device memory per slot, so more streams fit. BackendOptions' default when absent.
int max_context_option(const Args& args);
constexpr const char* MAX_CONTEXT_HELP =
    "  --max-context N       CUDA: positions per stream (prompt + 12.5 per second of audio; default 4096);\n"
    "                        fewer take less device memory per stream, so more streams fit\n";

// A voice-cloning reference clip from a file (say --ref-audio, voice create --audio): decoded
// (any format libsndfile reads, resampled to 24 kHz mono) and checked as the engine will (1-30 s,
// not silent), so a bad one fails before the seconds a model takes to load. A clip past 30 s
// fails on its header's length, before it is decoded. The engine takes samples, never files.
std::vector<float> reference_clip_read(const std::string& path);

// Options every command accepts (log level); returns the remaining arguments.
std::vector<std::string> apply_common_options(const std::vector<std::string>& args);

}  // namespace qtts_cli

#define QTTS_CLI_CONCAT_INNER(a, b) a##b
#define QTTS_CLI_CONCAT(a, b) QTTS_CLI_CONCAT_INNER(a, b)
#define QTTS_COMMAND(name, summary, fn) \
    static ::qtts_cli::CommandRegistrar QTTS_CLI_CONCAT(qtts_command_, __LINE__)(name, summary, fn)
