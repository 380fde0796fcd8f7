// The few functions the public API declares (names for enums).
#include "engine/api/qtts.h"

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


const char* stop_reason_name(StopReason reason) {
    switch (reason) {
        case StopReason::STOP_NONE: return "none";
        case StopReason::STOP_EOS: return "eos";
        case StopReason::STOP_FRAME_BUDGET: return "frame_budget";
        case StopReason::STOP_MAX_FRAMES: return "max_frames";
        case StopReason::STOP_CANCELLED: return "cancelled";
        case StopReason::STOP_ERROR: return "error";
    }
    return "?";
}

const char* text_layout_name(TextLayout layout) {
    return layout == TextLayout::TEXT_LAYOUT_STREAMING ? "streaming" : "non-streaming";
}

}  // namespace qtts
