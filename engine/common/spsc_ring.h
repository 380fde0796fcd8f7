// A single-producer / single-consumer ring of trivially copyable items (PCM floats, end-of-stream
// marks). It is the hand-off between the engine thread and the audio callback, so both sides are
// wait-free: write() and read() copy what fits and return at once, never block, never allocate.
//
// Design (see docs/audio.md):
// - capacity is a power of two, so positions wrap with a mask instead of a division;
// - storage is allocated and written once in the constructor ("pre-touched"), so the first
//   callbacks do not take page faults; a ring whose producer is not real-time may skip that
//   (its writes fault the pages in, and the consumer only reads what was written);
// - head (next write position) and tail (next read position) are monotonically increasing 64-bit
//   counters on separate cache lines, so the two threads never false-share; each side also keeps a
//   private copy of the other side's counter on its own line and reloads it only when the copy
//   says the ring looks full (producer) or empty (consumer);
// - the producer publishes items with a release store of head and the consumer sees them with an
//   acquire load (and symmetrically for freed space through tail).
//
// Thread safety: write()/available_write() from exactly one producer thread; read()/peek()/
// discard()/available_read() from exactly one consumer thread. available_read()/available_write()
// may also be called from any other thread as an approximate (already stale) figure.
// reset() only while neither side is active.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>

#include "engine/common/error.h"

namespace qtts {

template <typename T>
class SpscRing {
    static_assert(std::is_trivially_copyable<T>::value, "SpscRing copies items with memcpy");
    static_assert(std::atomic<uint64_t>::is_always_lock_free, "the ring needs lock-free 64-bit atomics");

public:
    static constexpr size_t k_cache_line = 64;

    // Allocates room for at least min_capacity items (rounded up to a power of two, at least 2).
    // pre_touch: writes every page now, so neither side takes a page fault on first use (a
    // real-time producer). false: the producer's first writes fault the pages in, on its own
    // thread, as it goes; the consumer only ever reads items already written, so it meets no
    // fresh page either way (the engine's per-stream rings: 4 MB a stream, made in submit()).
    explicit SpscRing(size_t min_capacity, bool pre_touch = true) {
        if (min_capacity == 0 || min_capacity > (size_t(1) << 40)) {
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "SpscRing capacity must be in 1..2^40 items, got {}",
                 min_capacity);
        }
        size_t capacity = 2;
        while (capacity < min_capacity) capacity <<= 1;
        capacity_ = capacity;
        mask_ = capacity - 1;
        items_.reset(new T[capacity]);
        // Touch every page now so the real-time side never faults on first use.
        if (pre_touch) std::memset(static_cast<void*>(items_.get()), 0, capacity * sizeof(T));
    }

    SpscRing(const SpscRing&) = delete;
    SpscRing& operator=(const SpscRing&) = delete;

    size_t capacity() const { return capacity_; }

    // ---- producer side ----

    // Copies up to n items; returns how many were copied (0 when full). Never blocks.
    size_t write(const T* src, size_t n) {
        const uint64_t head = producer_.head.load(std::memory_order_relaxed);
        size_t room = capacity_ - size_t(head - producer_.tail_cache);
        if (room < n) {
            producer_.tail_cache = consumer_.tail.load(std::memory_order_acquire);
            room = capacity_ - size_t(head - producer_.tail_cache);
        }
        const size_t count = std::min(n, room);
        if (count == 0) return 0;
        copy_in(size_t(head & mask_), src, count);
        producer_.head.store(head + count, std::memory_order_release);
        return count;
    }

    // Free space as seen by the producer (exact on the producer thread, approximate elsewhere).
    size_t available_write() const {
        const uint64_t head = producer_.head.load(std::memory_order_relaxed);
        const uint64_t tail = consumer_.tail.load(std::memory_order_acquire);
        return capacity_ - size_t(head - tail);
    }

    // ---- consumer side ----

    // Copies up to n items out and frees their slots; returns how many. Never blocks.
    size_t read(T* dst, size_t n) {
        const size_t count = peek(dst, n);
        if (count > 0) {
            consumer_.tail.store(consumer_.tail.load(std::memory_order_relaxed) + count,
                                 std::memory_order_release);
        }
        return count;
    }

    // Copies up to n items out without consuming them.
    size_t peek(T* dst, size_t n) {
        const uint64_t tail = consumer_.tail.load(std::memory_order_relaxed);
        size_t ready = size_t(consumer_.head_cache - tail);
        if (ready < n) {
            consumer_.head_cache = producer_.head.load(std::memory_order_acquire);
            ready = size_t(consumer_.head_cache - tail);
        }
        const size_t count = std::min(n, ready);
        if (count > 0) copy_out(size_t(tail & mask_), dst, count);
        return count;
    }

    // Drops up to n items without copying them; returns how many were dropped.
    size_t discard(size_t n) {
        const uint64_t tail = consumer_.tail.load(std::memory_order_relaxed);
        consumer_.head_cache = producer_.head.load(std::memory_order_acquire);
        const size_t count = std::min(n, size_t(consumer_.head_cache - tail));
        if (count > 0) consumer_.tail.store(tail + count, std::memory_order_release);
        return count;
    }

    // Items ready to read (exact on the consumer thread, approximate elsewhere).
    size_t available_read() const {
        const uint64_t tail = consumer_.tail.load(std::memory_order_relaxed);
        const uint64_t head = producer_.head.load(std::memory_order_acquire);
        return size_t(head - tail);
    }

    // Total items ever written / read (monotonic counters).
    uint64_t total_written() const { return producer_.head.load(std::memory_order_acquire); }
    uint64_t total_read() const { return consumer_.tail.load(std::memory_order_acquire); }

    // Empties the ring. Only while neither the producer nor the consumer is running.
    void reset() {
        producer_.head.store(0, std::memory_order_relaxed);
        producer_.tail_cache = 0;
        consumer_.tail.store(0, std::memory_order_relaxed);
        consumer_.head_cache = 0;
    }

private:
    void copy_in(size_t start, const T* src, size_t count) {
        const size_t first = std::min(count, capacity_ - start);
        std::memcpy(static_cast<void*>(items_.get() + start), src, first * sizeof(T));
        if (count > first) std::memcpy(static_cast<void*>(items_.get()), src + first, (count - first) * sizeof(T));
    }

    void copy_out(size_t start, T* dst, size_t count) const {
        const size_t first = std::min(count, capacity_ - start);
        std::memcpy(static_cast<void*>(dst), items_.get() + start, first * sizeof(T));
        if (count > first) std::memcpy(static_cast<void*>(dst + first), items_.get(), (count - first) * sizeof(T));
    }

    // Written by the producer; tail_cache is the producer's private copy of consumer_.tail.
    struct alignas(k_cache_line) ProducerSide {
        std::atomic<uint64_t> head{0};
        uint64_t tail_cache = 0;
    };
    // Written by the consumer; head_cache is the consumer's private copy of producer_.head.
    struct alignas(k_cache_line) ConsumerSide {
        std::atomic<uint64_t> tail{0};
        uint64_t head_cache = 0;
    };

    ProducerSide producer_;
    ConsumerSide consumer_;
    // Read-only after construction; on its own line so it is never invalidated by index updates.
    alignas(k_cache_line) size_t capacity_ = 0;
    size_t mask_ = 0;
    std::unique_ptr<T[]> items_;

    // Each side fills whole cache lines, so head and tail can never share one.
    static_assert(alignof(ProducerSide) == k_cache_line && sizeof(ProducerSide) % k_cache_line == 0);
    static_assert(alignof(ConsumerSide) == k_cache_line && sizeof(ConsumerSide) % k_cache_line == 0);

public:
    // Addresses of the two indices, for the layout test.
    const void* head_address() const { return &producer_.head; }
    const void* tail_address() const { return &consumer_.tail; }
};

}  // namespace qtts
