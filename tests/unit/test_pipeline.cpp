// The whole live path: engine thread -> stream ring -> stream_pump -> jitter buffer -> a virtual
// audio device pulling at real-time pace with odd block sizes. What the device plays must be the
// stream's audio sample for sample (after the prebuffer's leading silence), with no underruns
// while production is faster than real time; stopping mid-stream (barge-in) silences the device
// within one period, cancels and frees the stream.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "audio_io/audio_output.h"
#include "audio_io/jitter_buffer.h"
#include "audio_io/stream_player.h"
#include "engine/api/qtts.h"
#include "test_streams.h"

using namespace qtts;
using namespace std::chrono_literals;

namespace {

constexpr int kFrames = 12;  // 0.96 s of audio per stream

SpeechRequest request_fixed() {
    SpeechRequest r;
    r.text = "Testing the live playback path.";
    r.greedy = true;
    r.max_frames = kFrames;
    return r;
}

Engine& shared_engine() {
    static Engine engine([] {
        EngineOptions o;  // the embedded default model on the CPU backend
        o.backend.name = "cpu";
        o.max_streams = 2;
        return o;
    }());
    return engine;
}

// The stream's audio read straight from the engine (no playback).
const std::vector<float>& audio_expected() {
    static const std::vector<float> audio = [] {
        auto stream = shared_engine().submit(request_fixed());
        std::vector<float> out = qtts_test::stream_read_all(*stream);
        REQUIRE(stream->finished());
        REQUIRE(stream->error().empty());
        return out;
    }();
    return audio;
}

// Where the played audio starts: the first sample the stream actually produced (the device
// hears silence while the jitter buffer prebuffers).
size_t first_nonzero(const std::vector<float>& v) {
    const auto it = std::find_if(v.begin(), v.end(), [](float x) { return x != 0.0f; });
    return size_t(it - v.begin());
}

}  // namespace

TEST_CASE("pipeline: the device plays the stream sample for sample at odd block sizes", "[pipeline][threads]") {
    const std::vector<float>& expected = audio_expected();
    REQUIRE(expected.size() == size_t(kFrames) * 1920);
    REQUIRE(first_nonzero(expected) < 10);  // the comparison below aligns on the first non-zero sample

    struct Shape {
        const char* name;
        std::vector<size_t> blocks;
        size_t random_max;
    };
    const Shape shapes[] = {{"1", {1}, 0}, {"441", {441}, 0}, {"1024", {1024}, 0}, {"random 1..2000", {}, 2000}};
    for (const Shape& shape : shapes) {
        INFO("device block sizes: " << shape.name);
        // Three chunks (240 ms) before the start instead of the default one: CI machines run
        // tests side by side on two cores, and this test is about exactness, not about the
        // start policy (test_jitter_buffer covers that).
        JitterBufferConfig jitter_config;
        jitter_config.start_watermark_samples = 3 * jitter_config.chunk_samples;
        JitterBuffer jitter(jitter_config);
        VirtualSinkConfig config;
        config.realtime = true;
        if (shape.random_max) {
            config.random_min = 1;
            config.random_max = shape.random_max;
            config.seed = 11;
        } else {
            config.block_sizes = shape.blocks;
        }
        VirtualAudioSink sink(config, render_source(jitter));
        sink.start();
        auto stream = shared_engine().submit(request_fixed());
        const StreamPumpResult pumped = stream_pump(*stream, &jitter);
        const bool played = playback_wait(jitter, 30.0);
        sink.stop();
        REQUIRE(played);
        CHECK_FALSE(pumped.stopped);
        CHECK(pumped.samples == expected.size());
        CHECK(jitter.underrun_events() == 0);
        CHECK(jitter.underrun_samples() == 0);
        CHECK(jitter.samples_played() == expected.size());

        const std::vector<float> heard = sink.recorded();
        const size_t start = first_nonzero(heard) - first_nonzero(expected);
        REQUIRE(heard.size() >= start + expected.size());
        CHECK(std::equal(expected.begin(), expected.end(), heard.begin() + long(start)));
        // After the stream, only silence.
        CHECK(std::all_of(heard.begin() + long(start + expected.size()), heard.end(), [](float x) { return x == 0.0f; }));
        const StreamMetrics m = stream->metrics();
        CHECK(m.frames == kFrames);
        CHECK(jitter.first_sample_time() >= 0.0);
    }
}

TEST_CASE("pipeline: barge-in silences the device within one period, cancels the stream, frees its slot",
          "[pipeline][threads]") {
    JitterBuffer jitter;
    VirtualSinkConfig config;
    config.realtime = true;
    config.block_sizes = {480};  // a 20 ms audio callback period
    VirtualAudioSink sink(config, render_source(jitter));
    sink.start();
    SpeechRequest r = request_fixed();
    r.max_frames = 400;  // 32 s: far longer than the test waits
    auto stream = shared_engine().submit(r);
    std::atomic<bool> stop{false};
    uint64_t pulled_at_flush = 0;
    uint64_t played_at_flush = 0;
    std::thread stopper([&] {
        while (jitter.samples_played() < 4800) std::this_thread::sleep_for(5ms);  // 0.2 s heard
        // The user speaks: the control thread flushes the player and stops the pump.
        pulled_at_flush = sink.frames_pulled();
        played_at_flush = jitter.samples_played();
        jitter.flush();
        stop.store(true, std::memory_order_release);
    });
    StreamPumpOptions options;
    options.stop = &stop;
    const StreamPumpResult pumped = stream_pump(*stream, &jitter, options);
    stopper.join();
    CHECK(pumped.stopped);
    CHECK(playback_wait(jitter, 60.0));
    // Keep listening a few periods past the flush: that is where silence must be.
    const auto listen_until = std::chrono::steady_clock::now() + 10s;
    while (sink.frames_pulled() < pulled_at_flush + 6 * 480 && std::chrono::steady_clock::now() < listen_until)
        std::this_thread::sleep_for(5ms);
    sink.stop();
    // At most the period being rendered when the flush came, then a 5 ms fade, then silence,
    // although the engine had made far more audio than was played (it runs ahead of real time).
    CHECK(jitter.samples_played() <= played_at_flush + 480);
    CHECK(jitter.samples_flushed() > 0);
    const std::vector<float> heard = sink.recorded();
    const size_t silent_from = size_t(pulled_at_flush) + 480 + 120;
    REQUIRE(heard.size() > silent_from);
    CHECK(std::all_of(heard.begin() + long(silent_from), heard.end(), [](float x) { return x == 0.0f; }));
    // The engine ends the cancelled stream within a chunk and lets go of it.
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!stream->generation_done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    CHECK(stream->generation_done());
    CHECK(stream->metrics().stop_reason == StopReason::STOP_CANCELLED);
    CHECK(stream->metrics().frames < 400);
    while (shared_engine().stats().active_streams != 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(5ms);
    CHECK(shared_engine().stats().active_streams == 0);
}
