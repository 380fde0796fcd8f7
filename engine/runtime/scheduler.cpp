#include "engine/runtime/scheduler.h"

#include <algorithm>
#include <cmath>

#include "engine/api/qtts.h"

namespace qtts {

double play_clock_deadline(const PlayClock& clock) {
    if (!clock.started) return 0.0;
    return clock.anchor_s + double(clock.samples) / SAMPLE_RATE;
}

bool play_clock_can_wait(const PlayClock& clock, double now_s) {
    return clock.started && play_clock_deadline(clock) - now_s >= AUDIO_DEFER_MIN_LEAD_S;
}

double play_clock_publish(PlayClock& clock, double now_s, int64_t samples, bool excused) {
    if (!clock.started) {
        clock.started = true;
        clock.anchor_s = now_s;
        clock.samples = samples;
        return 0.0;
    }
    const double gap = now_s - play_clock_deadline(clock);
    double counted = 0.0;
    if (gap > 0.0) {
        // The listener resumes with this chunk: its schedule moves by the gap either way.
        clock.anchor_s += gap;
        if (!excused) {
            ++clock.underruns;
            clock.underrun_s += gap;
            counted = gap;
        }
    }
    clock.samples += samples;
    return counted;
}

double play_clock_lag(const PlayClock& clock, double now_s, bool excused) {
    if (!clock.started) return 0.0;
    const double gap = excused ? 0.0 : std::max(0.0, now_s - play_clock_deadline(clock));
    return clock.underrun_s + gap;
}

bool schedule_before(const ScheduleKey& a, const ScheduleKey& b) {
    if (a.first_chunk != b.first_chunk) return a.first_chunk;
    if (a.held != b.held) return !a.held;
    return a.deadline_s < b.deadline_s;
}

void CapacityMeter::round_add(double busy_s, double audio_s) {
    if (busy_s <= 0.0) return;
    const double keep = std::exp(-busy_s / CAPACITY_WINDOW_S);
    busy_s_ = busy_s_ * keep + busy_s;
    audio_s_ = audio_s_ * keep + audio_s;
}

double CapacityMeter::capacity() const { return busy_s_ >= CAPACITY_MIN_BUSY_S ? audio_s_ / busy_s_ : 0.0; }

bool admission_allows(int64_t admitted, double capacity, double headroom) {
    if (admitted <= 0 || capacity <= 0.0) return true;
    return double(admitted + 1) <= headroom * capacity;
}

int prefill_slice_rows(int min_rows, int max_rows, double slack_s, double row_s) {
    if (!(row_s > 0.0) || !(slack_s > 0.0)) return std::min(min_rows, max_rows);
    const double covered = PREFILL_SLACK_SHARE * slack_s / row_s;  // rows the margin pays for
    if (covered >= double(max_rows)) return max_rows;
    return std::clamp(int(covered), std::min(min_rows, max_rows), max_rows);
}

void PrefillMeter::slice_add(int rows, double seconds) {
    if (rows <= 0 || !(seconds >= 0.0)) return;
    const double per_row = seconds / double(rows);
    row_s_ = row_s_ == 0.0 ? per_row : row_s_ + 0.25 * (per_row - row_s_);
}

}  // namespace qtts
