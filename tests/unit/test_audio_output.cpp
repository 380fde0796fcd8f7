// Audio sinks and the real-time guarantees of the render path:
// - VirtualAudioSink pulls odd / random block sizes and records exactly what the jitter buffer
//   produced; threaded and real-time-paced modes finish a stream;
// - NullAudioSink ("--audio-device null") plays a stream out at real-time pace;
// - the headless guard throws the one clear message instead of initialising PortAudio;
// - the render path (JitterBuffer::render and VirtualAudioSink::pull) performs no heap allocation:
//   this file replaces the global operator new/delete with counting versions;
// - the render path takes no locks: its only shared state is std::atomic, and every atomic type
//   it uses is checked to be always lock-free (a non-lock-free atomic hides a mutex).
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "audio_io/audio_output.h"
#include "audio_io/jitter_buffer.h"
#include "engine/common/error.h"
#include "test_support.h"

// ---------------------------------------------------------------------------------------------
// Counting allocator (whole executable). Only the difference around a measured region matters.
// ---------------------------------------------------------------------------------------------

namespace {
std::atomic<uint64_t> g_allocations{0};

void* counted_alloc(std::size_t size) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(size ? size : 1)) return p;
    throw std::bad_alloc();
}

void* counted_aligned_alloc(std::size_t size, std::align_val_t align) {
    g_allocations.fetch_add(1, std::memory_order_relaxed);
    const std::size_t a = std::max<std::size_t>(std::size_t(align), sizeof(void*));
    void* p = nullptr;
    if (posix_memalign(&p, a, size ? size : 1) == 0) return p;
    throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t size) { return counted_alloc(size); }
void* operator new[](std::size_t size) { return counted_alloc(size); }
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    try {
        return counted_alloc(size);
    } catch (...) {
        return nullptr;
    }
}
void* operator new[](std::size_t size, const std::nothrow_t&) noexcept {
    try {
        return counted_alloc(size);
    } catch (...) {
        return nullptr;
    }
}
void* operator new(std::size_t size, std::align_val_t align) { return counted_aligned_alloc(size, align); }
void* operator new[](std::size_t size, std::align_val_t align) { return counted_aligned_alloc(size, align); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

using qtts::JitterBuffer;
using qtts::JitterBufferConfig;
using qtts::VirtualAudioSink;
using qtts::VirtualSinkConfig;

namespace {

JitterBufferConfig test_jitter_config() {
    JitterBufferConfig c;
    c.capacity_samples = 1 << 17;
    c.chunk_samples = 1920;
    return c;
}

// Waits (without a timing assertion) until pred() holds; gives up after a generous limit so a bug
// fails the test instead of hanging it.
template <typename Pred>
bool wait_for(Pred pred, double limit_s = 60.0) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(limit_s);
    while (!pred()) {
        if (std::chrono::steady_clock::now() > give_up) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
}

// Sets an environment variable for one scope.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const char* value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old, had_ = true;
        setenv(name, value, 1);
    }
    ~ScopedEnv() {
        if (had_)
            setenv(name_.c_str(), old_.c_str(), 1);
        else
            unsetenv(name_.c_str());
    }

private:
    std::string name_, old_;
    bool had_ = false;
};

}  // namespace

TEST_CASE("virtual sink: odd and random block sizes record exactly the stream", "[audio_output]") {
    const std::vector<float> input = qtts_test::random_floats(24000, 31);
    VirtualSinkConfig fixed;
    fixed.block_sizes = {1, 441, 1024, 7, 333};
    VirtualSinkConfig random;
    random.random_min = 1;
    random.random_max = 1500;
    random.seed = 99;
    for (const VirtualSinkConfig& config : {fixed, random}) {
        JitterBuffer jb(test_jitter_config());
        VirtualAudioSink sink(config, qtts::render_source(jb));
        REQUIRE(jb.push(input.data(), input.size()) == input.size());
        jb.end_stream();
        sink.pull(input.size() + 5000);
        const std::vector<float> rec = sink.recorded();
        REQUIRE(rec.size() == sink.frames_pulled());
        REQUIRE(rec.size() >= input.size() + 5000);
        CHECK(qtts_test::max_abs_error(rec.data(), input.data(), input.size()) == 0.0);
        for (size_t i = input.size(); i < rec.size(); ++i) REQUIRE(rec[i] == 0.0f);
        CHECK(jb.finished());
        CHECK(jb.underrun_events() == 0);
        CHECK(sink.blocks_pulled() > 10);
    }
}

TEST_CASE("virtual sink: its sample clock gives exact first-sample times", "[audio_output]") {
    JitterBuffer jb(test_jitter_config());
    VirtualSinkConfig config;
    config.block_sizes = {441};
    VirtualAudioSink sink(config, qtts::render_source(jb));
    sink.pull(1000);  // 3 blocks of silence: 1323 frames
    const std::vector<float> input = qtts_test::random_floats(1920, 32);
    jb.push(input.data(), input.size());
    sink.pull(1);
    CHECK(jb.first_sample_time() == Approx(1323.0 / 24000.0));
}

TEST_CASE("virtual sink: recording stops at its capacity and counts the rest", "[audio_output]") {
    JitterBuffer jb(test_jitter_config());
    VirtualSinkConfig config;
    config.block_sizes = {100};
    config.record_capacity = 250;
    VirtualAudioSink sink(config, qtts::render_source(jb));
    sink.pull(400);
    CHECK(sink.recorded().size() == 250);
    CHECK(sink.frames_not_recorded() == 150);
}

TEST_CASE("virtual sink thread (as fast as possible) with a producer thread", "[audio_output][threads]") {
    JitterBufferConfig jc = test_jitter_config();
    jc.ramp_samples = 1;  // one-sample fades: every non-zero output is an input sample
    JitterBuffer jb(jc);
    VirtualSinkConfig config;
    config.random_min = 1;
    config.random_max = 1024;
    // The free-running sink records silence while the producer is not scheduled: room for
    // 10 minutes of it (pages are only touched when written).
    config.record_capacity = 24000 * 600;
    VirtualAudioSink sink(config, qtts::render_source(jb));
    const std::vector<float> input = qtts_test::random_floats(48000, 33, 0.2f, 1.0f);
    sink.start();
    std::thread producer([&] {
        size_t pushed = 0;
        while (pushed < input.size()) {
            const size_t n = std::min<size_t>(1920, input.size() - pushed);
            size_t sent = 0;
            while (sent < n) sent += jb.push(input.data() + pushed + sent, n - sent);
            pushed += n;
            std::this_thread::yield();
        }
        jb.end_stream();
    });
    producer.join();
    const bool done = wait_for([&] { return jb.finished(); });
    sink.stop();
    REQUIRE(done);
    CHECK(jb.samples_played() == input.size());
    std::vector<float> nonzero;
    for (float v : sink.recorded())
        if (v != 0.0f) nonzero.push_back(v);
    if (sink.frames_not_recorded() == 0) {
        CHECK(nonzero == input);
    } else {
        // The producer was starved for so long (a loaded machine) that the sink's recording
        // filled up with silence: what it kept must still be the input's beginning, in order.
        WARN("recording full: " << sink.frames_not_recorded() << " frames not recorded; checking the "
                                << nonzero.size() << " recorded input samples");
        REQUIRE(nonzero.size() <= input.size());
        CHECK(std::equal(nonzero.begin(), nonzero.end(), input.begin()));
    }
}

TEST_CASE("virtual sink thread at real-time pace plays a stream out", "[audio_output][threads]") {
    JitterBuffer jb(test_jitter_config());
    VirtualSinkConfig config;
    config.block_sizes = {441};
    config.realtime = true;
    VirtualAudioSink sink(config, qtts::render_source(jb));
    const std::vector<float> input = qtts_test::random_floats(4800, 34);  // 0.2 s
    jb.push(input.data(), input.size());
    jb.end_stream();
    sink.start();
    const bool done = wait_for([&] { return jb.finished(); });
    sink.stop();
    REQUIRE(done);
    const std::vector<float> rec = sink.recorded();
    REQUIRE(rec.size() >= input.size());
    CHECK(qtts_test::max_abs_error(rec.data(), input.data(), input.size()) == 0.0);
}

TEST_CASE("null device plays a stream out at real-time pace", "[audio_output][threads]") {
    JitterBuffer jb(test_jitter_config());
    qtts::AudioSinkConfig config;
    config.device = "null";
    config.null_block_frames = 441;  // odd on purpose
    std::unique_ptr<qtts::AudioSink> sink = qtts::audio_sink_open(config, qtts::render_source(jb));
    CHECK(sink->describe().find("null") != std::string::npos);
    CHECK(sink->sample_rate() == 24000);
    const std::vector<float> input = qtts_test::random_floats(7200, 35);  // 0.3 s
    jb.push(input.data(), input.size());
    jb.end_stream();
    sink->start();
    CHECK(sink->is_running());
    const bool done = wait_for([&] { return jb.finished(); });
    sink->stop();
    CHECK_FALSE(sink->is_running());
    REQUIRE(done);
    CHECK(jb.samples_played() == input.size());
    CHECK(jb.first_sample_time() >= 0.0);
    CHECK(sink->time_now() > 0.0);
    sink->stop();  // idempotent
}

TEST_CASE("headless: a clear error instead of initialising PortAudio", "[audio_output]") {
    {
        ScopedEnv env("QTTS_AUDIO_PROBE", "headless");
        CHECK_FALSE(qtts::audio_probe_environment().output_possible);
        try {
            qtts::audio_list_devices();
            FAIL("expected the headless error");
        } catch (const qtts::Error& e) {
#ifdef QTTS_HAVE_PORTAUDIO
            CHECK(e.code() == qtts::ErrorCode::ERROR_NOT_FOUND);
            CHECK(std::string(e.what()).find("no audio output device found") != std::string::npos);
#else  // a build without PortAudio (QTTS_WITH_PORTAUDIO=OFF) says that instead, with the same ways out
            CHECK(e.code() == qtts::ErrorCode::ERROR_UNSUPPORTED);
            CHECK(std::string(e.what()).find("built without PortAudio") != std::string::npos);
#endif
            CHECK(std::string(e.what()).find("--audio-device null") != std::string::npos);
            CHECK(std::string(e.what()).find("-o file.wav") != std::string::npos);
        }
        JitterBuffer jb(test_jitter_config());
        qtts::AudioSinkConfig config;
        config.device = "default";
        CHECK_THROWS_AS(qtts::audio_sink_open(config, qtts::render_source(jb)), qtts::Error);
        config.device = "NULL";  // the null device never needs PortAudio
        CHECK(qtts::audio_sink_open(config, qtts::render_source(jb)) != nullptr);
    }
    {
        ScopedEnv env("QTTS_AUDIO_PROBE", "force");
        CHECK(qtts::audio_probe_environment().output_possible);
    }
    // The real probe on this machine: it must answer (never abort); when it finds nothing, the
    // device list throws the same message (still without touching PortAudio).
    const qtts::AudioEnvironment env = qtts::audio_probe_environment();
    CHECK_FALSE(env.evidence.empty());
    if (!env.output_possible) CHECK_THROWS_AS(qtts::audio_list_devices(), qtts::Error);
}

TEST_CASE("sink configuration errors", "[audio_output]") {
    JitterBuffer jb(test_jitter_config());
    qtts::AudioSinkConfig config;
    config.device = "null";
    CHECK_THROWS_AS(qtts::audio_sink_open(config, qtts::RenderSource{}), qtts::Error);
    config.sample_rate = 10;
    CHECK_THROWS_AS(qtts::audio_sink_open(config, qtts::render_source(jb)), qtts::Error);
    config.sample_rate = 24000;
    config.null_block_frames = 0;
    CHECK_THROWS_AS(qtts::audio_sink_open(config, qtts::render_source(jb)), qtts::Error);
    VirtualSinkConfig vc;
    vc.block_sizes = {};
    CHECK_THROWS_AS(VirtualAudioSink(vc, qtts::render_source(jb)), qtts::Error);
    vc.block_sizes = {0};
    CHECK_THROWS_AS(VirtualAudioSink(vc, qtts::render_source(jb)), qtts::Error);
    vc.random_max = 10;
    vc.random_min = 20;
    CHECK_THROWS_AS(VirtualAudioSink(vc, qtts::render_source(jb)), qtts::Error);
}

TEST_CASE("the render path makes no heap allocation", "[audio_output][realtime]") {
    JitterBufferConfig jc = test_jitter_config();
    jc.chunk_samples = 480;
    JitterBuffer jb(jc);
    const std::vector<float> input = qtts_test::random_floats(480 * 50, 36);
    std::vector<float> out(4096);
    std::vector<size_t> sizes = {1, 441, 1024, 7, 4096, 333, 2048, 64};

    // Exercise every state and transition: idle, prebuffer, playing, underrun (fade, silence,
    // fade-in), draining, back-to-back streams, the first-sample hook.
    int first_samples_seen = 0;
    jb.set_first_sample_hook([](void* user, double) { ++*static_cast<int*>(user); }, &first_samples_seen);
    uint64_t allocations_in_render = 0;
    for (int round = 0; round < 200; ++round) {
        const size_t push_n = 480 * size_t(1 + round % 5);
        jb.push(input.data(), push_n);
        if (round % 7 == 6) jb.end_stream();
        const uint64_t before = g_allocations.load();
        for (int i = 0; i < 8; ++i) jb.render(out.data(), sizes[size_t(round + i) % sizes.size()], double(i));
        allocations_in_render += g_allocations.load() - before;
    }
    CHECK(allocations_in_render == 0);
    const qtts::JitterStats s = jb.stats();
    CHECK(s.underrun_events > 0);     // the loop really went through underruns ...
    CHECK(s.streams_finished > 0);    // ... and drained streams
    CHECK(s.samples_played > 0);
    CHECK(first_samples_seen == int(s.streams_started));

    // The virtual sink's pull path (random block sizes, recording) allocates nothing either.
    JitterBuffer jb2(jc);
    VirtualSinkConfig vc;
    vc.random_min = 1;
    vc.random_max = 2000;
    vc.record_capacity = 100000;
    VirtualAudioSink sink(vc, qtts::render_source(jb2));
    jb2.push(input.data(), input.size());
    const uint64_t before = g_allocations.load();
    sink.pull(150000);  // plays, underruns, then goes past the recording capacity
    const uint64_t allocations_in_pull = g_allocations.load() - before;
    CHECK(allocations_in_pull == 0);
    CHECK(sink.frames_not_recorded() > 0);

    // Sanity check of the instrument itself: an allocation is seen.
    const uint64_t probe_before = g_allocations.load();
    std::vector<float>* probe = new std::vector<float>(10);
    const uint64_t probe_count = g_allocations.load() - probe_before;
    delete probe;
    CHECK(probe_count >= 1);
}

TEST_CASE("the render path's shared state is lock-free atomics only", "[audio_output][realtime]") {
    // A std::atomic that is not always lock-free is implemented with a lock; the jitter buffer, the
    // SPSC ring and the sinks use only these types on the audio thread.
    STATIC_REQUIRE(std::atomic<uint64_t>::is_always_lock_free);
    STATIC_REQUIRE(std::atomic<size_t>::is_always_lock_free);
    STATIC_REQUIRE(std::atomic<int>::is_always_lock_free);
    STATIC_REQUIRE(std::atomic<bool>::is_always_lock_free);
    STATIC_REQUIRE(std::atomic<double>::is_always_lock_free);
}
