// Logging: spdlog behind one logger named "qtts". The level comes from QTTS_LOG_LEVEL
// (trace, debug, info, warn, error, off) or from the CLI's --log-level flag.
#pragma once

#include <string>

#include <spdlog/spdlog.h>

namespace qtts {

// Returns the library logger (created on first use, writes to stderr).
spdlog::logger& log();

// Sets the level from a name; throws qtts::Error for an unknown name.
void log_set_level(const std::string& level_name);

}  // namespace qtts

#define QTTS_LOG_TRACE(...) ::qtts::log().trace(__VA_ARGS__)
#define QTTS_LOG_DEBUG(...) ::qtts::log().debug(__VA_ARGS__)
#define QTTS_LOG_INFO(...) ::qtts::log().info(__VA_ARGS__)
#define QTTS_LOG_WARN(...) ::qtts::log().warn(__VA_ARGS__)
#define QTTS_LOG_ERROR(...) ::qtts::log().error(__VA_ARGS__)
