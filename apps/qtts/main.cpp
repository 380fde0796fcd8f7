// qtts: real-time streaming text-to-speech for the Qwen3-TTS 12 Hz models.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "apps/qtts/cli.h"
#include "engine/common/error.h"

namespace {

void print_usage() {
    std::printf("qtts %s: streaming text-to-speech for Qwen3-TTS 12 Hz models\n\n", QTTS_VERSION);
    std::printf("usage: qtts <command> [options]   (qtts <command> --help for details)\n\ncommands:\n");
    for (const auto& [name, cmd] : qtts_cli::command_registry()) {
        std::printf("  %-12s %s\n", name.c_str(), cmd.summary.c_str());
    }
    std::printf("\ncommon options: --log-level trace|debug|info|warn|error|off (or QTTS_LOG_LEVEL), -q\n");
}

}  // namespace

int main(int argc, char** argv) {
    std::vector<std::string> args(argv + 1, argv + argc);
    if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
        print_usage();
        return args.empty() ? 2 : 0;
    }
    if (args[0] == "--version") {
        std::printf("qtts %s\n", QTTS_VERSION);
        return 0;
    }
    auto& registry = qtts_cli::command_registry();
    auto it = registry.find(args[0]);
    if (it == registry.end()) {
#ifndef QTTS_HAVE_SERVER
        if (args[0] == "serve") {
            std::fprintf(stderr, "qtts: this build has no network server (configured with QTTS_BUILD_SERVER=OFF)\n");
            return 2;
        }
#endif
        std::fprintf(stderr, "qtts: unknown command '%s' (run 'qtts --help')\n", args[0].c_str());
        return 2;
    }
    try {
        std::vector<std::string> rest = qtts_cli::apply_common_options({args.begin() + 1, args.end()});
        return it->second.run(rest);
    } catch (const qtts::Error& e) {
        std::fprintf(stderr, "qtts %s: error (%s): %s\n", args[0].c_str(), qtts::error_code_name(e.code()),
                     e.what());
        return 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "qtts %s: error: %s\n", args[0].c_str(), e.what());
        return 1;
    }
}
