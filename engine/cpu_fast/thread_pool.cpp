#include "engine/cpu_fast/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace qtts::cpu_fast {

namespace {
// Spin iterations before a waiting worker sleeps: long enough to cover the gap between two
// products of one frame (microseconds), short enough not to burn a core between frames.
constexpr int SPIN_LIMIT = 1 << 14;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}
}  // namespace

int ThreadPool::default_threads() { return std::max(1, int(std::thread::hardware_concurrency())); }

ThreadPool::ThreadPool(int threads) : parts_(threads > 0 ? threads : default_threads()) {
    workers_.reserve(size_t(parts_ - 1));
    for (int p = 1; p < parts_; ++p) workers_.emplace_back([this, p] { worker_main(p); });
}

ThreadPool::~ThreadPool() {
    stop_.store(true);
    generation_.fetch_add(1);
    {
        std::lock_guard<std::mutex> lock(sleep_mutex_);
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
}

void ThreadPool::section_run(Task task, void* ctx) {
    if (parts_ == 1) {
        task(ctx, 0, 1);
        return;
    }
    std::lock_guard<std::mutex> one_section(run_mutex_);
    task_ = task;
    ctx_ = ctx;
    pending_.store(parts_ - 1);
    generation_.fetch_add(1);  // seq_cst: pairs with the sleeper count below
    if (sleepers_.load() > 0) {
        { std::lock_guard<std::mutex> lock(sleep_mutex_); }
        cv_.notify_all();
    }
    task(ctx, 0, parts_);
    // Spin for the workers; on a machine busy with other work (a worker descheduled), give the
    // core away between checks instead of burning the time slice the worker needs.
    for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
        if (spins < SPIN_LIMIT) cpu_relax();
        else std::this_thread::yield();
    }
}

void ThreadPool::worker_main(int part) {
    uint64_t seen = 0;
    for (;;) {
        uint64_t g = generation_.load(std::memory_order_acquire);
        for (int spins = 0; g == seen; g = generation_.load(std::memory_order_acquire)) {
            if (++spins < SPIN_LIMIT) {
                cpu_relax();
                continue;
            }
            std::unique_lock<std::mutex> lock(sleep_mutex_);
            sleepers_.fetch_add(1);
            cv_.wait(lock, [&] { return generation_.load() != seen; });
            sleepers_.fetch_sub(1);
            spins = 0;
        }
        seen = g;
        if (stop_.load()) return;
        task_(ctx_, part, parts_);
        pending_.fetch_sub(1, std::memory_order_release);
    }
}

}  // namespace qtts::cpu_fast

#include <chrono>
#include <cstring>
#include <memory>

namespace qtts::cpu_fast {

double memory_read_bandwidth_gbs(ThreadPool& pool, size_t bytes, int repeats) {
    const size_t words = bytes / sizeof(uint64_t);
    std::unique_ptr<uint64_t[]> buffer(new uint64_t[words]);
    // Every page written (and so really mapped) by the thread that will read it.
    pool.run([&](int part, int parts) {
        const size_t a = words * size_t(part) / size_t(parts), b = words * size_t(part + 1) / size_t(parts);
        for (size_t i = a; i < b; ++i) buffer[i] = i * 0x9E3779B97F4A7C15ull;
    });
    std::vector<uint64_t> sums(size_t(pool.size()));
    double best = 0.0;
    for (int pass = 0; pass <= repeats; ++pass) {
        const auto t0 = std::chrono::steady_clock::now();
        pool.run([&](int part, int parts) {
            const size_t a = words * size_t(part) / size_t(parts), b = words * size_t(part + 1) / size_t(parts);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            size_t i = a;
            for (; i + 4 <= b; i += 4) {
                s0 += buffer[i];
                s1 += buffer[i + 1];
                s2 += buffer[i + 2];
                s3 += buffer[i + 3];
            }
            for (; i < b; ++i) s0 += buffer[i];
            sums[size_t(part)] = s0 + s1 + s2 + s3;  // kept, so the loads are not optimised away
        });
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (pass > 0 && s > 0.0) best = std::max(best, double(words * sizeof(uint64_t)) / s / 1e9);
    }
    volatile uint64_t sink = 0;
    for (const uint64_t v : sums) sink = sink + v;
    (void)sink;
    return best;
}

}  // namespace qtts::cpu_fast
