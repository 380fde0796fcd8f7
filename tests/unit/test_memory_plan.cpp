// The CUDA backend's memory arithmetic as pure functions (engine/common/memory_plan.h): the
// --gpu-memory-limit size syntax, the room left under a limit, how many stream slots fit and the
// context a slot is lowered to. No GPU needed.
#include <catch2/catch.hpp>

#include <string>

#include "engine/common/error.h"
#include "engine/common/memory_plan.h"

using qtts::Error;
using qtts::ErrorCode;

namespace {

constexpr size_t KiB = size_t(1) << 10;
constexpr size_t MiB = size_t(1) << 20;
constexpr size_t GiB = size_t(1) << 30;

// True when the text is refused as a bad argument (anything else, a pass included, is false).
bool refused(const std::string& text) {
    try {
        qtts::memory_size_parse(text);
    } catch (const Error& e) {
        return e.code() == ErrorCode::ERROR_INVALID_ARGUMENT;
    }
    return false;
}

}  // namespace

TEST_CASE("memory sizes parse with binary units", "[memory]") {
    CHECK(qtts::memory_size_parse("6G") == 6 * GiB);
    CHECK(qtts::memory_size_parse("6g") == 6 * GiB);
    CHECK(qtts::memory_size_parse("6GB") == 6 * GiB);
    CHECK(qtts::memory_size_parse("6GiB") == 6 * GiB);
    CHECK(qtts::memory_size_parse("3000M") == 3000 * MiB);
    CHECK(qtts::memory_size_parse("3000mb") == 3000 * MiB);
    CHECK(qtts::memory_size_parse("512K") == 512 * KiB);
    CHECK(qtts::memory_size_parse("1T") == 1024 * GiB);
    CHECK(qtts::memory_size_parse("1.5G") == 3 * GiB / 2);
    CHECK(qtts::memory_size_parse("1048576") == MiB);
    CHECK(qtts::memory_size_parse("1048576B") == MiB);
    CHECK(qtts::memory_size_parse(" 2G ") == 2 * GiB);
}

TEST_CASE("bad memory sizes are refused with a message", "[memory]") {
    for (const char* bad : {"", "G", "six", "6X", "6GG", "-1G", "0", "0M", "1.2.3G", "6 G B", "0.5", "2000000000T", "."})
        CHECK(refused(bad));
    try {
        qtts::memory_size_parse("6Q");
        FAIL("6Q was accepted");
    } catch (const Error& e) {
        CHECK_THAT(e.what(), Catch::Contains("6Q") && Catch::Contains("3000M"));
    }
}

TEST_CASE("the room under a limit is the smaller of free memory and the limit's rest, less the margin", "[memory]") {
    // No limit: free memory less the margin.
    CHECK(qtts::gpu_memory_room(10 * GiB, 0, 3 * GiB, 256 * MiB) == 10 * GiB - 256 * MiB);
    // A limit below what is free: the limit less what qtts holds.
    CHECK(qtts::gpu_memory_room(100 * GiB, 6 * GiB, 2 * GiB, 256 * MiB) == 4 * GiB - 256 * MiB);
    // A limit above what is free: the free memory decides.
    CHECK(qtts::gpu_memory_room(3 * GiB, 6 * GiB, 1 * GiB, 256 * MiB) == 3 * GiB - 256 * MiB);
    // Nothing left (qtts already holds the limit, or less than the margin is free).
    CHECK(qtts::gpu_memory_room(100 * GiB, 6 * GiB, 7 * GiB, 256 * MiB) == 0);
    CHECK(qtts::gpu_memory_room(100 * MiB, 0, 0, 256 * MiB) == 0);
}

TEST_CASE("the margin is 256 MiB, or an eighth of a small limit", "[memory]") {
    CHECK(qtts::gpu_memory_margin(0) == 256 * MiB);
    CHECK(qtts::gpu_memory_margin(6 * GiB) == 256 * MiB);
    CHECK(qtts::gpu_memory_margin(2 * GiB) == 256 * MiB);
    CHECK(qtts::gpu_memory_margin(1 * GiB) == 128 * MiB);
    CHECK(qtts::gpu_memory_margin(512 * MiB) == 64 * MiB);
}

TEST_CASE("stream slots: as many as fit, at most the wish", "[memory]") {
    qtts::StreamSlotPlan p = qtts::stream_slots_plan(10 * GiB, 1 * GiB, 16);
    CHECK(p.slots == 10);
    CHECK(p.left_bytes == 0);
    p = qtts::stream_slots_plan(10 * GiB + 5 * MiB, 1 * GiB, 4);
    CHECK(p.slots == 4);
    CHECK(p.left_bytes == 6 * GiB + 5 * MiB);
    p = qtts::stream_slots_plan(900 * MiB, 1 * GiB, 16);
    CHECK(p.slots == 0);
    CHECK(p.left_bytes == 900 * MiB);
    CHECK(p.per_slot_bytes == GiB);
}

TEST_CASE("the context is lowered in steps to what one slot may take", "[memory]") {
    const size_t per_position = 229376;  // 1.7B talker: 28 layers x 8 KV heads x 128 x fp32, K and V
    const size_t fixed = 192 * MiB;
    // Room for the whole context: unchanged.
    CHECK(qtts::context_fit(4 * GiB, fixed, per_position, 4096, 128) == 4096);
    // Exactly enough.
    CHECK(qtts::context_fit(fixed + 4096 * per_position, fixed, per_position, 4096, 128) == 4096);
    // One byte short: the next step down.
    CHECK(qtts::context_fit(fixed + 4096 * per_position - 1, fixed, per_position, 4096, 128) == 3968);
    // 500 MiB: (500 - 192) MiB / 224 KiB = 1408 positions.
    CHECK(qtts::context_fit(500 * MiB, fixed, per_position, 4096, 128) == 1408);
    // Not even one step, or not even the fixed part.
    CHECK(qtts::context_fit(fixed + 100 * per_position, fixed, per_position, 4096, 128) == 0);
    CHECK(qtts::context_fit(fixed - 1, fixed, per_position, 4096, 128) == 0);
    // A wish that is no multiple of the step is kept when it fits.
    CHECK(qtts::context_fit(4 * GiB, fixed, per_position, 1000, 128) == 1000);
}
