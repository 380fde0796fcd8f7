// The frame vocabulary every backend and the runtime share: a frame is one 80 ms step of the
// 12 Hz codec, MAX_CODE_GROUPS codes (codebook 0 from the talker, the rest from the code
// predictor); a generator reports each step with a FrameStatus and ends with a StopReason
// (engine/api/qtts.h).
#pragma once

#include <array>
#include <cstdint>

#include "engine/api/qtts.h"

namespace qtts {

using FrameCodes = std::array<int32_t, MAX_CODE_GROUPS>;

enum class FrameStatus {
    FRAME_STATUS_FRAME,             // `codes` holds the next frame
    FRAME_STATUS_WAITING_FOR_TEXT,  // the text track needs a token that has not been appended yet
    FRAME_STATUS_DONE,              // finished; see stop_reason()
};
const char* frame_status_name(FrameStatus status);

}  // namespace qtts
