// The error type of the qtts library (part of the public API, engine/api/qtts.h). The library
// never calls exit(): entry points throw qtts::Error with a code and a one-line message.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace qtts
