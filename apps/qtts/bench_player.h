// The simulated listener of `qtts bench-serve --paced`: what a player with a jitter buffer does
// with a stream, without a sound device. Time is given from outside (ms since the request was
// submitted), so the same code runs on the benchmark's clock and on a test's made-up timeline.
//
// Prebuffer: nothing plays until `prebuffer` samples arrived (or the stream ended with less).
// Playing: one period of `period` samples is due at the start of playback and then every
// `period_ms`; a period that finds fewer samples than it needs before the stream ended is an
// underrun: the missing part is silence, and audio that arrives later plays later (the player
// does not skip ahead), as a jitter buffer would. The last period of an ended stream may be
// short without counting. A run of short periods in a row is one underrun event. Periods a late
// caller missed are taken all at once on its next call.
//
// One thread; no allocation.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace qtts_cli {

struct BenchPlayer {
    BenchPlayer(int64_t prebuffer_samples, int64_t period_samples, double period_ms_)
        : prebuffer(std::max<int64_t>(1, prebuffer_samples)),
          period(std::max<int64_t>(1, period_samples)),
          period_ms(period_ms_) {}

    // `samples` more arrived from the stream.
    void push(int64_t samples) {
        buffered += samples;
        received += samples;
    }

    // Plays up to time `t_ms`; `ended`: the stream is over and every sample was pushed. True once
    // the player is done (everything played, or the stream ended without audio).
    bool advance(double t_ms, bool ended) {
        if (!playing && received > 0 && (buffered >= prebuffer || ended)) {
            playing = true;
            play_start_ms = t_ms;
        }
        if (playing) {
            const int64_t due = int64_t(std::floor((t_ms - play_start_ms) / period_ms)) + 1;
            for (; periods < due && !done; ++periods) {
                if (buffered >= period) {
                    buffered -= period;
                    starving = false;
                } else if (ended) {
                    buffered = 0;  // the stream's last, short period
                    done = true;
                } else {
                    ++underruns;
                    if (!starving) ++underrun_events;
                    starving = true;
                    underrun_samples += period - buffered;
                    buffered = 0;
                }
            }
            if (ended && buffered == 0) done = true;
        } else if (ended && received == 0) {
            done = true;
        }
        return done;
    }

    int64_t prebuffer;             // samples before playback starts (>= 1)
    int64_t period;                // samples per period (>= 1)
    double period_ms;
    int64_t buffered = 0;          // arrived, not played yet
    int64_t received = 0;          // arrived in all
    bool playing = false;
    bool done = false;
    double play_start_ms = -1.0;   // when the first period played (-1: not yet)
    int64_t periods = 0;           // periods played (including short ones)
    int64_t underruns = 0;         // periods that found less than they needed before the end
    int64_t underrun_samples = 0;  // silence made up for them
    int64_t underrun_events = 0;   // runs of consecutive short periods (a jitter buffer's count)
    bool starving = false;         // the last period was short
};

}  // namespace qtts_cli
