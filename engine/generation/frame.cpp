#include "engine/generation/frame.h"

namespace qtts {

const char* frame_status_name(FrameStatus status) {
    switch (status) {
        case FrameStatus::FRAME_STATUS_FRAME: return "frame";
        case FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT: return "waiting_for_text";
        case FrameStatus::FRAME_STATUS_DONE: return "done";
    }
    return "?";
}

}  // namespace qtts
