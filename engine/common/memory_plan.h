// Device memory arithmetic of the CUDA backend, as pure functions (no CUDA: unit-tested on any
// machine). The backend measures (free memory, what qtts already holds, what one stream slot
// took) and these decide how much it may take and how many stream slots, of which context, fit.
#pragma once

#include <cstddef>
#include <string>

namespace qtts {

// A memory size as users write it: a number with an optional binary unit, K/M/G/T with an
// optional "B" or "iB" (case-insensitive; K = 1024 bytes, G = 2^30), or plain bytes: "6G",
// "3000M", "1.5GiB", "512mb", "1048576". Throws qtts::Error (ERROR_INVALID_ARGUMENT) naming the
// text and the accepted forms for anything else, for zero, and for sizes past 2^60 bytes.
size_t memory_size_parse(const std::string& text);

// Bytes a new allocation may take now: the device's free memory, or what the limit leaves beside
// what qtts already holds when that is less, minus a margin (graphs, libraries, fragmentation);
// 0 when nothing is left. limit_bytes = 0: no limit.
size_t gpu_memory_room(size_t free_bytes, size_t limit_bytes, size_t used_bytes, size_t margin_bytes);

// The margin kept free beside the stream slots (graph instantiation, cuBLAS and driver growth,
// warm-up): 256 MiB, or an eighth of the limit when that is less (small limits on small GPUs).
size_t gpu_memory_margin(size_t limit_bytes);

// How many stream slots of per_slot_bytes fit in room_bytes, at most `wanted`.
struct StreamSlotPlan {
    int slots = 0;
    size_t per_slot_bytes = 0;
    size_t left_bytes = 0;  // room_bytes - slots * per_slot_bytes
};
StreamSlotPlan stream_slots_plan(size_t room_bytes, size_t per_slot_bytes, int wanted);

// The largest context (positions per stream), a multiple of `step` and at most `wanted`, whose
// slot fits: fixed_bytes + context * per_position_bytes <= room_bytes. `wanted` itself when it
// fits; 0 when not even `step` positions do. step >= 1, wanted >= 1.
int context_fit(size_t room_bytes, size_t fixed_bytes, size_t per_position_bytes, int wanted, int step);

}  // namespace qtts
