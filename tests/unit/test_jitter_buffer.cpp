// JitterBuffer: exact pass-through at any block size when production is ahead, prebuffering,
// click-free underrun handling with counted events and recovery, watermark raise / bound / decay,
// end-of-stream draining, back-to-back streams, first-sample timestamps, and a threaded run.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "audio_io/jitter_buffer.h"
#include "engine/common/error.h"
#include "test_support.h"

using qtts::JitterBuffer;
using qtts::JitterBufferConfig;
using qtts::JitterState;

namespace {

// Renders `frames` samples in blocks from `sizes` (cycled); returns what came out.
std::vector<float> render_blocks(JitterBuffer& jb, size_t frames, const std::vector<size_t>& sizes) {
    std::vector<float> out(frames, -7.0f);  // sentinel: render must overwrite every sample
    size_t done = 0;
    size_t k = 0;
    while (done < frames) {
        const size_t n = std::min(sizes[k++ % sizes.size()], frames - done);
        jb.render(out.data() + done, n, double(done) / 24000.0);
        done += n;
    }
    return out;
}

std::vector<size_t> random_sizes(size_t count, size_t lo, size_t hi, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<size_t> dist(lo, hi);
    std::vector<size_t> sizes(count);
    for (auto& s : sizes) s = dist(rng);
    return sizes;
}

float max_step(const std::vector<float>& x, size_t from = 1) {
    float m = 0.0f;
    for (size_t i = std::max<size_t>(from, 1); i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - x[i - 1]));
    return m;
}

bool all_zero(const float* x, size_t n) {
    return std::all_of(x, x + n, [](float v) { return v == 0.0f; });
}

JitterBufferConfig small_config() {
    JitterBufferConfig c;
    c.capacity_samples = 1 << 16;
    c.chunk_samples = 1920;
    return c;
}

}  // namespace

TEST_CASE("production ahead: output equals input sample for sample at odd block sizes", "[jitter]") {
    const std::vector<float> input = qtts_test::random_floats(30000, 42);
    const std::vector<std::vector<size_t>> patterns = {
        {1}, {441}, {1024}, {1, 441, 1024, 7, 333}, random_sizes(200, 1, 2048, 9)};
    for (const auto& sizes : patterns) {
        for (bool with_end : {true, false}) {
            CAPTURE(sizes.front(), sizes.size(), with_end);
            JitterBuffer jb(small_config());
            REQUIRE(jb.push(input.data(), input.size()) == input.size());
            if (with_end) jb.end_stream();
            const std::vector<float> out = render_blocks(jb, input.size() + 3000, sizes);
            CHECK(qtts_test::max_abs_error(out.data(), input.data(), input.size()) == 0.0);
            if (with_end) {
                CHECK(all_zero(out.data() + input.size(), 3000));
                CHECK(jb.finished());
                CHECK(jb.state() == JitterState::JITTER_IDLE);
                CHECK(jb.underrun_events() == 0);
            } else {
                // Without an end mark, running dry after the last sample is an underrun.
                CHECK(jb.underrun_events() == 1);
                CHECK_FALSE(jb.finished());
            }
            CHECK(jb.samples_played() == input.size());
        }
    }
}

TEST_CASE("production ahead while interleaved with rendering: exact pass-through", "[jitter]") {
    const std::vector<float> input = qtts_test::random_floats(1920 * 40, 5);
    JitterBuffer jb(small_config());
    const std::vector<size_t> sizes = random_sizes(500, 1, 700, 77);
    std::vector<float> out;
    size_t pushed = 0;
    size_t k = 0;
    // Keep at least two chunks buffered ahead of the reader at all times.
    while (out.size() < input.size()) {
        while (pushed < input.size() && pushed < out.size() + 2 * 1920 + 700) {
            pushed += jb.push(input.data() + pushed, std::min<size_t>(1920, input.size() - pushed));
        }
        if (pushed == input.size() && jb.stats().streams_ended == 0) jb.end_stream();
        std::vector<float> block(sizes[k++ % sizes.size()]);
        jb.render(block.data(), block.size());
        out.insert(out.end(), block.begin(), block.end());
    }
    CHECK(qtts_test::max_abs_error(out.data(), input.data(), input.size()) == 0.0);
    CHECK(jb.underrun_events() == 0);
}

TEST_CASE("prebuffer: silence until the start watermark is buffered", "[jitter]") {
    JitterBufferConfig config = small_config();
    config.start_watermark_samples = 1000;
    JitterBuffer jb(config);
    const std::vector<float> input = qtts_test::random_floats(1500, 8, 0.1f, 1.0f);

    std::vector<float> out(300, -1.0f);
    jb.render(out.data(), out.size());
    CHECK(all_zero(out.data(), out.size()));
    CHECK(jb.state() == JitterState::JITTER_IDLE);

    jb.push(input.data(), 999);  // one short of the watermark
    jb.render(out.data(), out.size());
    CHECK(all_zero(out.data(), out.size()));
    CHECK(jb.state() == JitterState::JITTER_PREBUFFER);

    jb.push(input.data() + 999, 501);
    jb.render(out.data(), out.size());
    CHECK(jb.state() == JitterState::JITTER_PLAYING);
    CHECK(qtts_test::max_abs_error(out.data(), input.data(), out.size()) == 0.0);
    CHECK(jb.underrun_events() == 0);
}

TEST_CASE("a stream shorter than the watermark plays once it is ended", "[jitter]") {
    JitterBuffer jb(small_config());  // watermark = 1920
    const std::vector<float> input = qtts_test::random_floats(500, 3);
    jb.push(input.data(), input.size());
    std::vector<float> out = render_blocks(jb, 1000, {441});
    CHECK(all_zero(out.data(), out.size()));  // waiting: not ended, below the watermark
    jb.end_stream();
    out = render_blocks(jb, 1000, {441});
    CHECK(qtts_test::max_abs_error(out.data(), input.data(), input.size()) == 0.0);
    CHECK(all_zero(out.data() + input.size(), 500));
    CHECK(jb.finished());
    CHECK(jb.underrun_events() == 0);
}

TEST_CASE("forced underrun: counted, click-free fade out and in, recovery", "[jitter]") {
    JitterBufferConfig config = small_config();
    JitterBuffer jb(config);
    const size_t chunk = config.chunk_samples;
    const std::vector<float> half(chunk, 0.5f);

    jb.push(half.data(), chunk);
    // One chunk, then 3000 samples of starvation, at an odd block size.
    std::vector<float> out = render_blocks(jb, chunk + 3000, {441});
    for (size_t i = 0; i < chunk; ++i) REQUIRE(out[i] == 0.5f);
    CHECK(jb.state() == JitterState::JITTER_UNDERRUN);
    CHECK(jb.underrun_events() == 1);
    CHECK(jb.underrun_samples() == 3000);  // every sample after the data ran out was synthesised
    CHECK(jb.start_watermark() == 2 * chunk);  // raised by one chunk
    // Fade-out: 120 samples (5 ms at 24 kHz) from 0.5 down to exactly 0, then silence.
    CHECK(out[chunk] < 0.5f);
    CHECK(out[chunk] > 0.49f);
    CHECK(out[chunk + 119] == 0.0f);
    CHECK(out[chunk + 118] > 0.0f);
    CHECK(all_zero(out.data() + chunk + 120, 3000 - 120));

    // One more chunk is below the raised watermark: still silent.
    jb.push(half.data(), chunk);
    std::vector<float> out2 = render_blocks(jb, 1000, {441});
    CHECK(all_zero(out2.data(), out2.size()));
    CHECK(jb.state() == JitterState::JITTER_UNDERRUN);

    // Reaching the watermark resumes with a fade-in.
    jb.push(half.data(), chunk);
    std::vector<float> out3 = render_blocks(jb, 1000, {441});
    CHECK(jb.state() == JitterState::JITTER_PLAYING);
    CHECK(out3[0] > 0.0f);
    CHECK(out3[0] < 0.01f);
    CHECK(out3[119] == 0.5f);
    for (size_t i = 120; i < out3.size(); ++i) REQUIRE(out3[i] == 0.5f);
    CHECK(jb.underrun_events() == 1);

    jb.end_stream();
    std::vector<float> out4 = render_blocks(jb, 2 * chunk, {1024});
    CHECK(jb.finished());
    CHECK(jb.state() == JitterState::JITTER_IDLE);
    CHECK(jb.samples_played() == 3 * chunk);

    // No clicks anywhere: with a constant 0.5 input every step is at most 0.5/120. (The stream's
    // own first and last samples are left untouched by design: a new stream starts exactly as
    // produced and an ended one stops exactly where the producer ended it.)
    std::vector<float> all = out;
    for (const auto* part : {&out2, &out3}) all.insert(all.end(), part->begin(), part->end());
    const size_t out4_played = 3 * chunk - 1000 - chunk;
    all.insert(all.end(), out4.begin(), out4.begin() + long(out4_played));
    CHECK(all_zero(out4.data() + out4_played, out4.size() - out4_played));
    CHECK(max_step(all, 1) < 0.5f / 100.0f);
}

TEST_CASE("underrun with a one-sample callback and random blocks keeps steps bounded", "[jitter]") {
    for (const auto& sizes : std::vector<std::vector<size_t>>{{1}, random_sizes(300, 1, 900, 4)}) {
        JitterBuffer jb(small_config());
        const std::vector<float> half(1920, 0.5f);
        std::vector<float> all;
        for (int round = 0; round < 4; ++round) {
            for (int c = 0; c < round + 1; ++c) jb.push(half.data(), half.size());
            std::vector<float> out = render_blocks(jb, 1920 * (round + 1) + 2500, sizes);
            all.insert(all.end(), out.begin(), out.end());
        }
        CHECK(jb.underrun_events() == 4);
        CHECK(max_step(all, 1) < 0.5f / 100.0f);
    }
}

TEST_CASE("the raised watermark is bounded and decays after a calm stretch", "[jitter]") {
    JitterBufferConfig config = small_config();
    config.chunk_samples = 100;
    config.max_watermark_samples = 300;
    config.watermark_decay_samples = 5000;
    JitterBuffer jb(config);
    const std::vector<float> input = qtts_test::random_floats(400, 1);
    for (int i = 0; i < 6; ++i) {
        jb.push(input.data(), 400);
        render_blocks(jb, 1000, {256});
    }
    CHECK(jb.underrun_events() == 6);
    CHECK(jb.start_watermark() == 300);  // 100 + 6 * 100, capped at 300

    // 12000 samples with no underrun: two decay steps of one chunk each (every 5000 samples).
    const std::vector<float> long_input = qtts_test::random_floats(12500, 2);
    jb.push(long_input.data(), long_input.size());
    render_blocks(jb, 12000, {256});
    CHECK(jb.underrun_events() == 6);
    CHECK(jb.start_watermark() == 100);
}

TEST_CASE("back-to-back streams play in order, each reported finished", "[jitter]") {
    JitterBuffer jb(small_config());
    const std::vector<float> a = qtts_test::random_floats(3000, 10);
    const std::vector<float> b = qtts_test::random_floats(700, 11);
    jb.push(a.data(), a.size());
    jb.end_stream();
    jb.push(b.data(), b.size());
    jb.end_stream();
    jb.end_stream();  // an empty third stream must also finish
    const std::vector<float> out = render_blocks(jb, 5000, {441});
    CHECK(qtts_test::max_abs_error(out.data(), a.data(), a.size()) == 0.0);
    CHECK(qtts_test::max_abs_error(out.data() + a.size(), b.data(), b.size()) == 0.0);
    CHECK(all_zero(out.data() + a.size() + b.size(), 5000 - a.size() - b.size()));
    CHECK(jb.streams_finished() == 3);
    CHECK(jb.finished());
    CHECK(jb.stats().streams_started == 3);
}

TEST_CASE("flush (barge-in): fade to silence in the next render, the rest of the stream dropped", "[jitter]") {
    JitterBuffer jb(small_config());
    const std::vector<float> a = qtts_test::random_floats(20000, 12);
    const std::vector<float> b = qtts_test::random_floats(3000, 13);
    const size_t block = 480;  // one 20 ms audio callback period
    jb.push(a.data(), 12000);
    std::vector<float> out = render_blocks(jb, 4 * block, {block});
    REQUIRE(qtts_test::max_abs_error(out.data(), a.data(), out.size()) == 0.0);
    REQUIRE(jb.state() == JitterState::JITTER_PLAYING);

    jb.flush();  // from "another thread": nothing happens before the next render
    jb.flush();  // two requests before one render are one flush
    const size_t ramp = 120;  // the default fade: 5 ms at 24 kHz
    out = render_blocks(jb, block, {block});
    CHECK(jb.state() == JitterState::JITTER_FLUSHING);
    // The first period after the flush: a bounded fade from the last sample played, then silence.
    CHECK(std::fabs(out[0] - a[4 * block - 1]) <= std::fabs(a[4 * block - 1]) / float(ramp) + 1e-6f);
    CHECK(max_step(out) <= 1.0f / float(ramp) + 1e-6f);
    CHECK(all_zero(out.data() + ramp, block - ramp));
    CHECK(jb.samples_flushed() == 12000 - 4 * block);

    // The producer did not see the barge-in yet and pushes more of the same stream: dropped too.
    jb.push(a.data() + 12000, 8000);
    out = render_blocks(jb, 4 * block, {block});
    CHECK(all_zero(out.data(), out.size()));
    CHECK_FALSE(jb.finished());
    jb.end_stream();  // the producer stops; the next stream plays from its first sample, untouched
    jb.push(b.data(), b.size());
    jb.end_stream();
    out = render_blocks(jb, 8 * block, {block});
    CHECK(jb.samples_flushed() == 20000 - 4 * block);
    CHECK(jb.samples_played() == 4 * block + b.size());
    const auto first = std::find_if(out.begin(), out.end(), [](float x) { return x != 0.0f; });
    REQUIRE(first != out.end());
    const size_t at = size_t(first - out.begin());
    REQUIRE(at + b.size() <= out.size());
    CHECK(qtts_test::max_abs_error(out.data() + at, b.data(), b.size()) == 0.0);
    CHECK(jb.streams_finished() == 2);
    CHECK(jb.finished());
    CHECK(jb.stats().flushes == 1);
}

TEST_CASE("flush with nothing playing or queued is ignored: the next stream plays", "[jitter]") {
    JitterBuffer jb(small_config());
    std::vector<float> out = render_blocks(jb, 960, {480});
    jb.flush();
    out = render_blocks(jb, 480, {480});
    CHECK(jb.state() == JitterState::JITTER_IDLE);
    const std::vector<float> a = qtts_test::random_floats(2000, 14);
    jb.push(a.data(), a.size());
    jb.end_stream();
    out = render_blocks(jb, 2400, {480});
    CHECK(qtts_test::max_abs_error(out.data(), a.data(), a.size()) == 0.0);
    CHECK(jb.samples_flushed() == 0);
    CHECK(jb.stats().flushes == 0);
    CHECK(jb.finished());
}

TEST_CASE("flush of a stream already ended drops its tail and finishes it", "[jitter]") {
    JitterBuffer jb(small_config());
    const std::vector<float> a = qtts_test::random_floats(6000, 15);
    jb.push(a.data(), a.size());
    jb.end_stream();
    std::vector<float> out = render_blocks(jb, 1000, {500});
    jb.flush();
    out = render_blocks(jb, 500, {500});
    CHECK(all_zero(out.data() + 120, 380));
    CHECK(jb.finished());
    CHECK(jb.state() == JitterState::JITTER_IDLE);
    CHECK(jb.samples_played() + jb.samples_flushed() == a.size());
}

TEST_CASE("the first sample's time is reported and the hook fires once per stream", "[jitter]") {
    JitterBuffer jb(small_config());
    struct Seen {
        int calls = 0;
        double time = -1;
    } seen;
    jb.set_first_sample_hook(
        [](void* user, double t) {
            auto* s = static_cast<Seen*>(user);
            ++s->calls;
            s->time = t;
        },
        &seen);
    CHECK(jb.first_sample_time() < 0);
    std::vector<float> block(441);
    jb.render(block.data(), block.size(), 10.0);  // idle
    const std::vector<float> input = qtts_test::random_floats(1920, 12, 0.1f, 1.0f);
    jb.push(input.data(), 1000);
    jb.render(block.data(), block.size(), 11.0);  // prebuffering
    jb.push(input.data() + 1000, 920);
    jb.render(block.data(), 100, 12.0);  // watermark reached: the first sample is at offset 0
    CHECK(jb.first_sample_time() == 12.0);
    CHECK(seen.calls == 1);
    CHECK(seen.time == 12.0);
    jb.render(block.data(), block.size(), 13.0);
    CHECK(seen.calls == 1);
}

TEST_CASE("the first sample's offset inside a buffer is added to out_time", "[jitter]") {
    JitterBuffer jb(small_config());
    const std::vector<float> a = qtts_test::random_floats(240, 13);
    jb.push(a.data(), a.size());
    jb.end_stream();
    jb.push(a.data(), a.size());
    jb.end_stream();
    std::vector<float> block(1000);
    jb.render(block.data(), block.size(), 5.0);  // stream 2 starts at offset 240 of this buffer
    CHECK(jb.first_sample_time() == Approx(5.0 + 240.0 / 24000.0));
}

TEST_CASE("push accepts only what fits; invalid configurations are refused", "[jitter]") {
    JitterBufferConfig config;
    config.capacity_samples = 4096;
    config.chunk_samples = 256;
    JitterBuffer jb(config);
    const std::vector<float> input = qtts_test::random_floats(5000, 14);
    CHECK(jb.push(input.data(), input.size()) == 4096);
    CHECK(jb.available_write() == 0);
    CHECK(jb.push(input.data(), 1) == 0);

    JitterBufferConfig bad = config;
    bad.chunk_samples = 0;
    CHECK_THROWS_AS(JitterBuffer(bad), qtts::Error);
    bad = config;
    bad.sample_rate = 0;
    CHECK_THROWS_AS(JitterBuffer(bad), qtts::Error);
    bad = config;
    bad.max_watermark_samples = 1 << 20;  // larger than the ring: could never be reached
    CHECK_THROWS_AS(JitterBuffer(bad), qtts::Error);
}

#if defined(__x86_64__) || defined(__i386__)
TEST_CASE("render flushes denormals to zero and restores the caller's FP mode", "[jitter]") {
    JitterBuffer jb(small_config());
    const unsigned before = _mm_getcsr();
    const std::vector<float> half(1920, 0.5f);
    jb.push(half.data(), half.size());
    render_blocks(jb, 3000, {441});  // underrun: the next start fades in
    const std::vector<float> tiny(2 * 1920, 1e-39f);  // denormal
    REQUIRE(std::fpclassify(tiny[0]) == FP_SUBNORMAL);
    jb.push(tiny.data(), tiny.size());
    std::vector<float> out(200);
    jb.render(out.data(), out.size());
    // Fade-in multiplies: with DAZ the denormal inputs read as 0, so every faded sample is 0.
    for (size_t i = 0; i < 119; ++i) REQUIRE(out[i] == 0.0f);
    CHECK((_mm_getcsr() & ~0x3Fu) == (before & ~0x3Fu));  // control bits restored (low 6 bits are sticky flags)
}
#endif

TEST_CASE("threads: producer chunks with gaps, consumer at random block sizes", "[jitter][threads]") {
    JitterBufferConfig config = small_config();
    config.chunk_samples = 480;
    // One-sample fades: a fade-in then has gain 1 and a fade-out is a single 0, so every non-zero
    // output must be an input sample, in order.
    config.ramp_samples = 1;
    JitterBuffer jb(config);
    const size_t total = 480 * 400;
    const std::vector<float> input = qtts_test::random_floats(total, 21, 0.25f, 1.0f);
    std::thread producer([&] {
        std::mt19937 rng(5);
        size_t pushed = 0;
        while (pushed < total) {
            const size_t n = std::min<size_t>(480, total - pushed);
            size_t sent = 0;
            while (sent < n) {
                sent += jb.push(input.data() + pushed + sent, n - sent);
                if (sent < n) std::this_thread::yield();
            }
            pushed += n;
            for (unsigned i = rng() % 50; i > 0; --i) std::this_thread::yield();  // irregular arrival
        }
        jb.end_stream();
    });
    const std::vector<size_t> sizes = random_sizes(1000, 1, 1024, 6);
    std::vector<float> out(2048);
    size_t k = 0;
    std::vector<float> played;
    played.reserve(total);
    uint64_t rendered = 0;
    while (!jb.finished()) {
        const size_t n = sizes[k++ % sizes.size()];
        jb.render(out.data(), n);
        rendered += n;
        for (size_t i = 0; i < n; ++i)
            if (out[i] != 0.0f) played.push_back(out[i]);
        if (k % 64 == 0) std::this_thread::yield();
    }
    producer.join();
    const qtts::JitterStats s = jb.stats();
    CHECK(s.samples_played == total);
    CHECK(s.samples_pushed == total);
    CHECK(s.streams_finished == 1);
    CHECK(s.state == JitterState::JITTER_IDLE);
    CHECK(rendered >= total + s.underrun_samples);
    REQUIRE(played.size() == total);
    CHECK(played == input);
}
