// Typed errors for every failure of the library. The library never calls exit();
// entry points throw qtts::Error, the CLI prints it and exits non-zero.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace qtts {

enum class ErrorCode {
    ERROR_INVALID_ARGUMENT,  // bad user input: text, options, request fields
    ERROR_IO,                // a file could not be opened / read / written
    ERROR_FORMAT,            // a file's content is malformed (JSON, safetensors, audio)
    ERROR_SHAPE,             // a tensor has the wrong shape or dtype
    ERROR_NOT_FOUND,         // a file, tensor, speaker or language does not exist
    ERROR_UNSUPPORTED,       // valid but not supported by this build or model
    ERROR_CUDA,              // CUDA / cuBLAS failure
    ERROR_CANCELLED,         // the request was cancelled
    ERROR_BUSY,              // the engine is at its concurrency limit; retry later
    ERROR_INTERNAL,          // a bug: an invariant did not hold
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
public:
    Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
    ErrorCode code() const { return code_; }

private:
    ErrorCode code_;
};

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
