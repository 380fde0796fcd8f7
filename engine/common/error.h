// Raising errors inside the library: fail() formats the message, QTTS_ASSERT checks an
// invariant. The error type itself is public (engine/api/errors.h); the CLI prints it and exits
// non-zero.
#pragma once

#include <string>

#include <fmt/format.h>

#include "engine/api/errors.h"

namespace qtts {

// Throws qtts::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(ErrorCode code, fmt::format_string<Args...> format, Args&&... args) {
    throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace qtts

// Internal invariant check: a failure is a bug in qtts, reported as ERROR_INTERNAL.
#define QTTS_ASSERT(cond)                                                                       \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            ::qtts::fail(::qtts::ErrorCode::ERROR_INTERNAL, "assertion failed: {} ({}:{})", #cond, \
                         __FILE__, __LINE__);                                                   \
        }                                                                                       \
    } while (0)
