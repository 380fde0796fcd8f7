// SpscRing: capacity rounding, partial reads/writes, wrap-around, the cache-line layout, and a
// two-thread stress test in which every item must arrive exactly once and in order.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "engine/common/spsc_ring.h"
#include "engine/common/error.h"
#include "test_support.h"

using qtts::SpscRing;

TEST_CASE("capacity is rounded up to a power of two", "[spsc]") {
    CHECK(SpscRing<float>(1).capacity() == 2);
    CHECK(SpscRing<float>(2).capacity() == 2);
    CHECK(SpscRing<float>(3).capacity() == 4);
    CHECK(SpscRing<float>(1000).capacity() == 1024);
    CHECK(SpscRing<float>(1024).capacity() == 1024);
    CHECK(SpscRing<float>(1025).capacity() == 2048);
    CHECK_THROWS_AS(SpscRing<float>(0), qtts::Error);
}

TEST_CASE("head and tail live on different cache lines", "[spsc]") {
    SpscRing<float> ring(64);
    const auto head = reinterpret_cast<uintptr_t>(ring.head_address());
    const auto tail = reinterpret_cast<uintptr_t>(ring.tail_address());
    CHECK(head / 64 != tail / 64);
    CHECK(head % 64 == 0);
    CHECK(tail % 64 == 0);
    CHECK(alignof(SpscRing<float>) >= 64);
}

TEST_CASE("writes and reads never exceed what fits or what is there", "[spsc]") {
    SpscRing<float> ring(8);
    const std::vector<float> in = qtts_test::random_floats(20, 7);
    std::vector<float> out(20, 0.0f);

    CHECK(ring.available_read() == 0);
    CHECK(ring.available_write() == 8);
    CHECK(ring.read(out.data(), 5) == 0);  // empty: returns at once

    CHECK(ring.write(in.data(), 5) == 5);
    CHECK(ring.available_read() == 5);
    CHECK(ring.available_write() == 3);
    CHECK(ring.write(in.data() + 5, 10) == 3);  // only 3 fit
    CHECK(ring.write(in.data() + 8, 1) == 0);   // full
    CHECK(ring.available_read() == 8);

    CHECK(ring.peek(out.data(), 2) == 2);
    CHECK(ring.available_read() == 8);  // peek consumed nothing
    CHECK(ring.read(out.data(), 6) == 6);
    CHECK(std::memcmp(out.data(), in.data(), 6 * sizeof(float)) == 0);
    CHECK(ring.read(out.data() + 6, 100) == 2);
    CHECK(std::memcmp(out.data(), in.data(), 8 * sizeof(float)) == 0);
    CHECK(ring.available_read() == 0);
    CHECK(ring.write(in.data(), 0) == 0);
    CHECK(ring.read(out.data(), 0) == 0);
}

TEST_CASE("data survives wrapping around the end many times", "[spsc]") {
    SpscRing<float> ring(16);
    const std::vector<float> in = qtts_test::random_floats(5000, 11);
    std::vector<float> out;
    std::vector<float> tmp(16);
    std::mt19937 rng(3);
    size_t written = 0;
    while (out.size() < in.size()) {
        const size_t w = std::min<size_t>(rng() % 17, in.size() - written);
        written += ring.write(in.data() + written, w);
        const size_t got = ring.read(tmp.data(), rng() % 17);
        out.insert(out.end(), tmp.begin(), tmp.begin() + long(got));
    }
    REQUIRE(out.size() == in.size());
    CHECK(out == in);
    CHECK(ring.total_written() == in.size());
    CHECK(ring.total_read() == in.size());
}

TEST_CASE("discard drops items without copying", "[spsc]") {
    SpscRing<uint64_t> ring(8);
    const uint64_t items[5] = {10, 11, 12, 13, 14};
    ring.write(items, 5);
    CHECK(ring.discard(2) == 2);
    uint64_t next = 0;
    CHECK(ring.read(&next, 1) == 1);
    CHECK(next == 12);
    CHECK(ring.discard(100) == 2);
    CHECK(ring.available_read() == 0);
}

template <typename T, typename MakeItem>
void stress_two_threads(size_t capacity, uint64_t total, MakeItem make_item, bool pre_touch = true) {
    SpscRing<T> ring(capacity, pre_touch);
    std::thread producer([&] {
        std::vector<T> chunk(97);
        std::mt19937 rng(1);
        uint64_t next = 0;
        while (next < total) {
            const size_t want = std::min<uint64_t>(1 + rng() % chunk.size(), total - next);
            for (size_t i = 0; i < want; ++i) chunk[i] = make_item(next + i);
            size_t sent = 0;
            while (sent < want) {
                const size_t n = ring.write(chunk.data() + sent, want - sent);
                if (n == 0) std::this_thread::yield();
                sent += n;
            }
            next += want;
        }
    });
    std::vector<T> block(61);
    std::mt19937 rng(2);
    uint64_t expected = 0;
    uint64_t mismatches = 0;
    while (expected < total) {
        const size_t n = ring.read(block.data(), 1 + rng() % block.size());
        if (n == 0) std::this_thread::yield();
        for (size_t i = 0; i < n; ++i) {
            if (!(block[i] == make_item(expected))) ++mismatches;
            ++expected;
        }
    }
    producer.join();
    CHECK(mismatches == 0);
    CHECK(expected == total);
    CHECK(ring.available_read() == 0);
}

TEST_CASE("two threads: every item arrives once and in order", "[spsc][threads]") {
    SECTION("64-bit sequence numbers, tiny ring (constant wrap-around)") {
        stress_two_threads<uint64_t>(8, 2'000'000, [](uint64_t i) { return i * 2654435761u + 1; });
    }
    SECTION("float PCM, realistic ring") {
        // Exact small integers so equality is meaningful for floats.
        stress_two_threads<float>(4096, 2'000'000, [](uint64_t i) { return float(i % 16777216u) - 8e6f; });
    }
    SECTION("a ring that is not pre-touched (the engine's stream rings): large, pages faulted in by the writes") {
        stress_two_threads<float>(size_t(1) << 20, 3'000'000, [](uint64_t i) { return float(i % 16777216u) - 8e6f; },
                                  false);
    }
}
