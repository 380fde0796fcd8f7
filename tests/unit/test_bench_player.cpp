// The simulated listener of `qtts bench-serve --paced` (apps/qtts/bench_player.h) on made-up
// timelines: when playback starts, which periods are underruns, how much silence they make, and
// when the player is done.
#include <catch2/catch.hpp>

#include "apps/qtts/bench_player.h"

using qtts_cli::BenchPlayer;

namespace {

// 20 ms periods of 480 samples (24 kHz), a 100 ms (2400-sample) prebuffer.
BenchPlayer player_make() { return BenchPlayer(2400, 480, 20.0); }

}  // namespace

TEST_CASE("bench player: audio ahead of playback never underruns and finishes when played out", "[bench]") {
    BenchPlayer p = player_make();
    p.push(1920);  // 80 ms: below the prebuffer
    CHECK_FALSE(p.advance(10.0, false));
    CHECK_FALSE(p.playing);
    p.push(1920);  // 160 ms buffered: playback starts now, with its first period
    CHECK_FALSE(p.advance(30.0, false));
    REQUIRE(p.playing);
    CHECK(p.play_start_ms == 30.0);
    CHECK(p.periods == 1);
    CHECK(p.buffered == 3840 - 480);
    // The rest of a 320 ms stream arrives long before it is needed.
    p.push(3840);
    CHECK_FALSE(p.advance(100.0, true));
    CHECK(p.periods == 4);  // at 30, 50, 70 and 90 ms
    // 7680 samples = 16 periods; the last one is due at 30 + 15 x 20 = 330 ms.
    CHECK_FALSE(p.advance(329.0, true));
    CHECK(p.advance(330.0, true));
    CHECK(p.underruns == 0);
    CHECK(p.underrun_samples == 0);
    CHECK(p.periods == 16);
}

TEST_CASE("bench player: a gap in production counts each short period and its missing samples", "[bench]") {
    BenchPlayer p = player_make();
    p.push(2400 + 240);  // 110 ms
    CHECK_FALSE(p.advance(0.0, false));
    // Due by 100 ms: periods at 0, 20, ..., 100 = 6 x 480 = 2880 > 2640 buffered: the sixth is
    // short by 240 samples.
    CHECK_FALSE(p.advance(100.0, false));
    CHECK(p.periods == 6);
    CHECK(p.underruns == 1);
    CHECK(p.underrun_samples == 240);
    // Nothing arrives for two more periods: both are silent.
    CHECK_FALSE(p.advance(140.0, false));
    CHECK(p.underruns == 3);
    CHECK(p.underrun_samples == 240 + 2 * 480);
    CHECK(p.underrun_events == 1);  // three short periods in a row: one gap
    // Late audio plays later: it is not skipped or counted again.
    p.push(960);
    CHECK_FALSE(p.advance(160.0, false));
    CHECK(p.underruns == 3);
    CHECK(p.buffered == 480);
    // A second gap is a second event.
    CHECK_FALSE(p.advance(200.0, false));
    CHECK(p.underruns == 4);
    CHECK(p.underrun_events == 2);
    p.push(480);
    // The stream ends: what is left plays out, the end is not an underrun.
    CHECK(p.advance(220.0, true));
    CHECK(p.underruns == 4);
    CHECK(p.underrun_events == 2);
    CHECK(p.done);
}

TEST_CASE("bench player: the last short period of a stream is not an underrun", "[bench]") {
    BenchPlayer p = player_make();
    p.push(500);  // less than the prebuffer, but the stream is over: play it
    CHECK_FALSE(p.advance(5.0, true));
    CHECK(p.playing);
    CHECK(p.play_start_ms == 5.0);
    CHECK(p.advance(25.0, true));  // 480 at 5 ms, the last 20 samples at 25 ms
    CHECK(p.underruns == 0);
    CHECK(p.periods == 2);
}

TEST_CASE("bench player: a stream that ends without audio finishes without playing", "[bench]") {
    BenchPlayer p = player_make();
    CHECK_FALSE(p.advance(50.0, false));
    CHECK(p.advance(60.0, true));
    CHECK_FALSE(p.playing);
    CHECK(p.play_start_ms == -1.0);
    CHECK(p.underruns == 0);
}

TEST_CASE("bench player: a late caller takes every missed period at once", "[bench]") {
    BenchPlayer p(1, 480, 20.0);  // starts at the first sample
    p.push(480 * 3);
    CHECK_FALSE(p.advance(0.0, false));
    CHECK(p.periods == 1);
    // Called again only at 100 ms: periods at 20..100 are due (5), 2 had audio, 3 are underruns.
    CHECK_FALSE(p.advance(100.0, false));
    CHECK(p.periods == 6);
    CHECK(p.underruns == 3);
    CHECK(p.underrun_samples == 3 * 480);
}
