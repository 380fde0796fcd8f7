#include "engine/common/log.h"

#include <cstdlib>
#include <memory>
#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "engine/common/error.h"

namespace qtts {

namespace {

spdlog::level::level_enum parse_level(const std::string& name) {
    if (name == "trace") return spdlog::level::trace;
    if (name == "debug") return spdlog::level::debug;
    if (name == "info") return spdlog::level::info;
    if (name == "warn" || name == "warning") return spdlog::level::warn;
    if (name == "error") return spdlog::level::err;
    if (name == "off" || name == "quiet") return spdlog::level::off;
    fail(ErrorCode::ERROR_INVALID_ARGUMENT,
         "unknown log level '{}' (expected trace, debug, info, warn, error or off)", name);
}

std::shared_ptr<spdlog::logger> make_logger() {
    auto logger = spdlog::stderr_color_mt("qtts");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    logger->set_level(spdlog::level::info);
    if (const char* env = std::getenv("QTTS_LOG_LEVEL")) {
        try {
            logger->set_level(parse_level(env));
        } catch (const Error& e) {
            logger->warn("ignoring QTTS_LOG_LEVEL: {}", e.what());
        }
    }
    return logger;
}

}  // namespace

spdlog::logger& log() {
    static std::shared_ptr<spdlog::logger> logger = make_logger();
    return *logger;
}

void log_set_level(const std::string& level_name) { log().set_level(parse_level(level_name)); }

}  // namespace qtts
