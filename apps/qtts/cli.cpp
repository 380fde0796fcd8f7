#include "apps/qtts/cli.h"

#include <algorithm>
#include <cstdlib>

#include "audio_io/audio_file.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/memory_plan.h"
#include "engine/model/make_model.h"
#include "engine/runtime/voice.h"

namespace qtts_cli {

using qtts::ErrorCode;
using qtts::fail;

Args::Args(std::vector<std::string> argv, std::vector<std::string> value_options,
           std::vector<std::string> flag_options) {
    auto is_in = [](const std::vector<std::string>& v, const std::string& s) {
        return std::find(v.begin(), v.end(), s) != v.end();
    };
    for (size_t i = 0; i < argv.size(); ++i) {
        const std::string& a = argv[i];
        if (a.size() > 2 && a.rfind("--", 0) == 0) {
            std::string name = a.substr(2);
            std::string inline_value;
            bool has_inline = false;
            if (auto eq = name.find('='); eq != std::string::npos) {
                inline_value = name.substr(eq + 1);
                name = name.substr(0, eq);
                has_inline = true;
            }
            if (is_in(flag_options, name)) {
                if (has_inline) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "option --{} takes no value", name);
                flags_[name] = true;
            } else if (is_in(value_options, name)) {
                if (has_inline) {
                    values_[name] = inline_value;
                } else {
                    if (i + 1 >= argv.size()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "option --{} needs a value", name);
                    values_[name] = argv[++i];
                }
            } else {
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown option --{}", name);
            }
        } else if (a.size() == 2 && a[0] == '-' && a[1] != '-') {
            // short aliases: -o FILE
            const std::string name = a == "-o" ? "out" : "";
            if (name.empty() || !is_in(value_options, name))
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown option {}", a);
            if (i + 1 >= argv.size()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "option {} needs a value", a);
            values_[name] = argv[++i];
        } else {
            positional_.push_back(a);
        }
    }
}

bool Args::has(const std::string& name) const { return values_.count(name) || flags_.count(name); }

std::optional<std::string> Args::get(const std::string& name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return std::nullopt;
    return it->second;
}

std::string Args::get_or(const std::string& name, const std::string& fallback) const {
    auto v = get(name);
    return v ? *v : fallback;
}

long long Args::get_int(const std::string& name, long long fallback) const {
    auto v = get(name);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    long long x = std::strtoll(v->c_str(), &end, 10);
    if (errno != 0 || end == v->c_str() || *end != '\0')
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "option --{} expects an integer, got '{}'", name, *v);
    return x;
}

double Args::get_double(const std::string& name, double fallback) const {
    auto v = get(name);
    if (!v) return fallback;
    char* end = nullptr;
    errno = 0;
    double x = std::strtod(v->c_str(), &end);
    if (errno != 0 || end == v->c_str() || *end != '\0')
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "option --{} expects a number, got '{}'", name, *v);
    return x;
}

std::string model_dir_or_default(const Args& args) {
    if (auto dir = args.get("model")) return *dir;
    const std::string dir = qtts::default_model_dir();
    QTTS_LOG_INFO("no --model given: using the embedded demo model (random weights) at {}", dir);
    return dir;
}

size_t gpu_memory_limit_option(const Args& args) {
    const auto text = args.get("gpu-memory-limit");
    if (!text) return 0;
    try {
        return qtts::memory_size_parse(*text);
    } catch (const qtts::Error& e) {
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--gpu-memory-limit: {}", e.what());
    }
}

int max_context_option(const Args& args) {
    const long long positions = args.get_int("max-context", qtts::BackendOptions{}.max_context);
    if (positions < 1 || positions > (1 << 20))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--max-context must be 1..{} positions, got {}", 1 << 20, positions);
    return int(positions);
}

std::vector<float> reference_clip_read(const std::string& path) {
    std::vector<float> audio = qtts::audio_read_mono_24k(path, qtts::VOICE_REF_MAX_SECONDS);
    qtts::reference_clip_validate(audio);
    return audio;
}

std::map<std::string, Command>& command_registry() {
    static std::map<std::string, Command> registry;
    return registry;
}

CommandRegistrar::CommandRegistrar(const std::string& name, const std::string& summary, CommandFn fn) {
    command_registry()[name] = Command{name, summary, std::move(fn)};
}

std::vector<std::string> apply_common_options(const std::vector<std::string>& args) {
    std::vector<std::string> rest;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--log-level" && i + 1 < args.size()) {
            qtts::log_set_level(args[++i]);
        } else if (args[i].rfind("--log-level=", 0) == 0) {
            qtts::log_set_level(args[i].substr(12));
        } else if (args[i] == "--quiet" || args[i] == "-q") {
            qtts::log_set_level("warn");
        } else {
            rest.push_back(args[i]);
        }
    }
    return rest;
}

}  // namespace qtts_cli
