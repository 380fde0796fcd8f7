#include "common/error.h"

namespace qtts {

const char* error_code_name(ErrorCode code) {
    switch (code) {
        case ErrorCode::ERROR_INVALID_ARGUMENT: return "invalid argument";
        case ErrorCode::ERROR_IO: return "i/o error";
        case ErrorCode::ERROR_FORMAT: return "format error";
        case ErrorCode::ERROR_SHAPE: return "shape error";
        case ErrorCode::ERROR_NOT_FOUND: return "not found";
        case ErrorCode::ERROR_UNSUPPORTED: return "unsupported";
        case ErrorCode::ERROR_CUDA: return "cuda error";
        case ErrorCode::ERROR_CANCELLED: return "cancelled";
        case ErrorCode::ERROR_BUSY: return "busy";
        case ErrorCode::ERROR_INTERNAL: return "internal error";
    }
    return "error";
}

}  // namespace qtts
