// The engine thread's scheduling rules, apart from the engine so they can be read and tested on
// their own numbers (docs/engine.md, "Scheduling"):
//   - a stream's play clock: when would a listener who plays it in real time run dry?
//   - the order in which a round serves its streams (first chunks, then earliest deadline);
//   - the engine's measured capacity and the admission rule built on it;
//   - how much of a long prompt's prefill a round may run (sliced starts).
// Plain values and pure functions; the engine thread owns every object of these types.
#pragma once

#include <cstdint>

namespace qtts {

// A strict listener of one stream: it starts playing at the stream's first audio and plays in
// real time, with no prebuffer; when it runs dry it waits for the next chunk and resumes with it
// (as a jitter buffer does after an underrun). Times are seconds on the engine's clock.
struct PlayClock {
    bool started = false;     // the first audio was published
    double anchor_s = 0.0;    // when the listener would have started sample 0 (moved later by each underrun)
    int64_t samples = 0;      // samples published so far
    int64_t underruns = 0;    // times the listener ran dry before the next chunk came
    double underrun_s = 0.0;  // time it spent dry, in all
};

// When the listener will have played everything published so far (0 before the first audio).
double play_clock_deadline(const PlayClock& clock);

// Records a chunk of `samples` published at `now_s`. When the deadline passed before it, the
// listener ran dry: that is an underrun (counted, its gap added to underrun_s, the anchor moved
// by the gap) unless `excused`: the stream waited for its text or for its reader since its last
// chunk, so the gap was not the engine's; the listener then resumes without an underrun counted.
// Returns the gap counted as an underrun (0 for none).
double play_clock_publish(PlayClock& clock, double now_s, int64_t samples, bool excused);

// How far the listener is behind the schedule it started on, at `now_s`: the time it spent dry so
// far plus the current gap when it is dry now (not while `excused`: waiting for text or reader).
double play_clock_lag(const PlayClock& clock, double now_s, bool excused);

// A steady chunk's audio may be published a round late, its decoder pass running beside the
// engine's next step (docs/engine.md, "The decoder pass beside the next step"), only when the
// stream's listener has at least this much audio left: a round at 64 streams takes ~50 ms, one
// that also starts a wave of newcomers ~130 ms more.
constexpr double AUDIO_DEFER_MIN_LEAD_S = 0.5;
// Whether the listener has AUDIO_DEFER_MIN_LEAD_S of audio left at `now_s` (false before the
// first audio).
bool play_clock_can_wait(const PlayClock& clock, double now_s);

// Where a stream stands in a round's order.
struct ScheduleKey {
    bool first_chunk = false;  // its first chunk is not made yet (time to first audio)
    bool held = false;         // waiting for text or for its reader: nothing to make for it now
    double deadline_s = 0.0;   // play_clock_deadline: the earlier, the more urgent
};

// The order of a round: first chunks first, then streams that can be served by earliest
// deadline, then held streams. A strict weak order; ties keep their place (the engine sorts with
// a stable sort, so equal streams stay in arrival order).
bool schedule_before(const ScheduleKey& a, const ScheduleKey& b);

// How many real-time streams the engine can carry, measured: audio seconds made (all streams)
// per second of busy engine time (rounds that made audio), over the recent past. Older rounds
// fade exponentially with CAPACITY_WINDOW_S of busy time. Rounds with nothing to make (streams
// ahead of real time, idle) are not busy time and leave it unchanged.
class CapacityMeter {
public:
    static constexpr double CAPACITY_WINDOW_S = 5.0;   // busy seconds that carry the estimate
    static constexpr double CAPACITY_MIN_BUSY_S = 0.25;  // busy time before it reports anything

    void round_add(double busy_s, double audio_s);
    // Real-time streams the engine sustains; 0 while it has not measured enough.
    double capacity() const;

private:
    double busy_s_ = 0.0;
    double audio_s_ = 0.0;
};

// Admission: may an engine with `admitted` streams (queued + active) take one more, given its
// measured `capacity` (CapacityMeter; 0 = not measured yet) and the `headroom` fraction of it the
// admitted streams may use? Every stream counts as one real-time stream. Yes while nothing was
// measured, and always for the first stream (an engine slower than real time still serves one
// listener rather than none); otherwise when admitted + 1 <= headroom x capacity.
bool admission_allows(int64_t admitted, double capacity, double headroom);

// Sliced starts (EngineOptions::prefill_slice; docs/engine.md, "Sliced starts"): the prompt rows
// a start may prefill in this round while other streams play. At least `min_rows` (the option);
// more where the playing streams' buffered audio covers it: PREFILL_SLACK_SHARE of `slack_s`
// (how long until the first of their listeners runs dry; the rest is left for the round's other
// work) at `row_s` seconds a prefill row (PrefillMeter; 0 = not measured yet: `min_rows`). At
// most `max_rows`.
constexpr double PREFILL_SLACK_SHARE = 0.5;
int prefill_slice_rows(int min_rows, int max_rows, double slack_s, double row_s);

// The engine's measured prefill speed: seconds per prompt row over the slices it ran, older
// slices fading (each new one weighs a quarter); 0 before the first.
class PrefillMeter {
public:
    void slice_add(int rows, double seconds);
    double row_s() const { return row_s_; }

private:
    double row_s_ = 0.0;
};

}  // namespace qtts
