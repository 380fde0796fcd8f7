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
    while (pending_.load(std::memory_order_acquire) != 0) cpu_relax();
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
