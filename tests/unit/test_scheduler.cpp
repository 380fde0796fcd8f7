// The engine thread's scheduling rules on their own numbers (engine/runtime/scheduler.h): the
// real-time listener's deadline and underruns, the round's order, the capacity measurement and
// the admission rule.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/api/qtts.h"
#include "engine/runtime/scheduler.h"

using namespace qtts;

namespace {

constexpr int64_t kChunk = 4 * SAMPLES_PER_FRAME;        // 0.32 s of audio
constexpr double kChunkS = double(kChunk) / SAMPLE_RATE;  // 0.32

}  // namespace

TEST_CASE("play clock: the deadline is the first audio plus what was published, at real time", "[scheduler]") {
    PlayClock c;
    CHECK(play_clock_deadline(c) == 0.0);
    CHECK(play_clock_publish(c, 10.0, SAMPLES_PER_FRAME, false) == 0.0);  // the first audio is never late
    CHECK(c.started);
    CHECK(play_clock_deadline(c) == Approx(10.08));
    // The next chunk comes before the listener runs dry: no underrun, the deadline moves on.
    CHECK(play_clock_publish(c, 10.05, kChunk, false) == 0.0);
    CHECK(play_clock_deadline(c) == Approx(10.08 + kChunkS));
    CHECK(c.underruns == 0);
    CHECK(play_clock_lag(c, 10.1, false) == 0.0);
}

TEST_CASE("play clock: a chunk after the deadline is an underrun; the listener resumes with it", "[scheduler]") {
    PlayClock c;
    play_clock_publish(c, 0.0, kChunk, false);  // plays until 0.32
    CHECK(play_clock_lag(c, 0.5, false) == Approx(0.18));  // dry for 0.18 s now
    CHECK(play_clock_publish(c, 0.5, kChunk, false) == Approx(0.18));
    CHECK(c.underruns == 1);
    CHECK(c.underrun_s == Approx(0.18));
    // It resumed at 0.5 with the new chunk: the next deadline is 0.5 + 0.32, not 0.64.
    CHECK(play_clock_deadline(c) == Approx(0.82));
    // In time again: no new underrun, but the stream stays 0.18 s behind its first schedule.
    CHECK(play_clock_publish(c, 0.7, kChunk, false) == 0.0);
    CHECK(c.underruns == 1);
    CHECK(play_clock_lag(c, 0.8, false) == Approx(0.18));
    // Dry again at 1.2 (deadline 1.14): the current gap adds to the lag until the next chunk.
    CHECK(play_clock_lag(c, 1.2, false) == Approx(0.18 + 0.06));
}

TEST_CASE("play clock: a gap while the stream waited for text or its reader is not an underrun", "[scheduler]") {
    PlayClock c;
    play_clock_publish(c, 0.0, kChunk, false);
    CHECK(play_clock_lag(c, 2.0, true) == 0.0);  // waiting: no lag accrues
    CHECK(play_clock_publish(c, 2.0, kChunk, true) == 0.0);
    CHECK(c.underruns == 0);
    CHECK(c.underrun_s == 0.0);
    // The listener resumed with that chunk: its deadline counts from 2.0.
    CHECK(play_clock_deadline(c) == Approx(2.0 + kChunkS));
}

TEST_CASE("play clock: a chunk's audio may come a round late only while the listener has half a second left",
          "[scheduler]") {
    PlayClock c;
    CHECK_FALSE(play_clock_can_wait(c, 0.0));  // no audio yet: the first chunks are never deferred
    play_clock_publish(c, 1.0, SAMPLES_PER_FRAME, false);  // plays until 1.08
    CHECK_FALSE(play_clock_can_wait(c, 1.0));
    play_clock_publish(c, 1.01, kChunk, false);  // until 1.40
    CHECK_FALSE(play_clock_can_wait(c, 1.02));   // 0.38 s left
    play_clock_publish(c, 1.03, kChunk, false);  // until 1.72
    CHECK(play_clock_can_wait(c, 1.04));         // 0.68 s left
    CHECK(play_clock_can_wait(c, 1.72 - AUDIO_DEFER_MIN_LEAD_S - 0.01));
    CHECK_FALSE(play_clock_can_wait(c, 1.72 - AUDIO_DEFER_MIN_LEAD_S + 0.01));
}

TEST_CASE("round order: first chunks, then earliest deadline, then held streams; ties keep arrival order", "[scheduler]") {
    struct Item {
        int id;
        ScheduleKey key;
    };
    std::vector<Item> items = {
        {0, {false, false, 30.0}},  // far ahead
        {1, {false, true, 1.0}},    // held (reader behind): not urgent whatever its deadline
        {2, {true, false, 0.0}},    // newcomer
        {3, {false, false, 2.0}},   // about to run dry
        {4, {true, false, 0.0}},    // second newcomer
        {5, {false, false, 2.0}},   // same deadline as 3, arrived later
        {6, {false, true, 0.5}},    // held (waiting for text)
    };
    std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return schedule_before(a.key, b.key); });
    std::vector<int> order;
    for (const Item& i : items) order.push_back(i.id);
    CHECK(order == std::vector<int>{2, 4, 3, 5, 0, 6, 1});
    // A strict weak order: nothing comes before itself.
    for (const Item& i : items) CHECK_FALSE(schedule_before(i.key, i.key));
}

TEST_CASE("capacity: audio per busy second over the recent past; nothing before enough is measured", "[scheduler]") {
    CapacityMeter m;
    CHECK(m.capacity() == 0.0);
    m.round_add(0.1, 0.64);  // two streams, 0.32 s each, in 0.1 s
    CHECK(m.capacity() == 0.0);  // 0.1 s of busy time is not a measurement yet
    m.round_add(0.2, 1.28);
    CHECK(m.capacity() == Approx(6.4));
    m.round_add(0.0, 5.0);  // no busy time: ignored
    CHECK(m.capacity() == Approx(6.4));
    // The engine slows down (a bigger load, a slower device): the estimate follows within a
    // few windows of busy time and forgets the old speed.
    for (int i = 0; i < 200; ++i) m.round_add(0.1, 0.16);
    CHECK(m.capacity() == Approx(1.6).epsilon(0.01));
}

TEST_CASE("admission: one more real-time stream within the headroom of the measured capacity", "[scheduler]") {
    CHECK(admission_allows(5, 0.0, 0.9));   // not measured: admit (max_streams still applies)
    CHECK(admission_allows(0, 0.3, 0.9));   // the first stream always: slower than real time beats none
    CHECK(admission_allows(1, 3.0, 0.9));   // 2 <= 2.7
    CHECK_FALSE(admission_allows(2, 3.0, 0.9));  // 3 > 2.7
    CHECK(admission_allows(2, 3.0, 1.0));   // 3 <= 3
    CHECK_FALSE(admission_allows(1, 1.5, 1.0));
    CHECK(admission_allows(3, 1.5, 4.0));   // headroom above 1: an operator who knows batching gains
}

TEST_CASE("sliced starts: a slice is the option's rows, grown to what the playing streams' margin covers",
          "[scheduler]") {
    // Not measured yet, or no margin (a listener dry or about to be): the option's rows.
    CHECK(prefill_slice_rows(64, 4096, 2.0, 0.0) == 64);
    CHECK(prefill_slice_rows(64, 4096, 0.0, 0.01) == 64);
    CHECK(prefill_slice_rows(64, 4096, -0.3, 0.01) == 64);
    // Half the margin pays for rows at the measured speed: 0.5 x 3 s / 10 ms = 150 rows.
    CHECK(prefill_slice_rows(64, 4096, 3.0, 0.01) == 150);
    CHECK(prefill_slice_rows(64, 4096, 1.0, 0.01) == 64);  // 50 rows: never below the option
    // Capped; a margin with no end (every other stream held) gives the cap.
    CHECK(prefill_slice_rows(64, 4096, 1e6, 0.01) == 4096);
    CHECK(prefill_slice_rows(64, 4096, std::numeric_limits<double>::infinity(), 0.01) == 4096);
    CHECK(prefill_slice_rows(64, 100, 3.0, 0.01) == 100);
    CHECK(prefill_slice_rows(200, 100, 0.0, 0.0) == 100);

    PrefillMeter meter;
    CHECK(meter.row_s() == 0.0);
    meter.slice_add(10, 0.1);  // the first slice sets it: 10 ms a row
    CHECK(meter.row_s() == Approx(0.01));
    meter.slice_add(10, 0.5);  // 50 ms a row weighs a quarter
    CHECK(meter.row_s() == Approx(0.02));
    meter.slice_add(0, 1.0);   // nothing ran: ignored
    meter.slice_add(5, std::nan(""));
    CHECK(meter.row_s() == Approx(0.02));
}
