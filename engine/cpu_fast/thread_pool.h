// A persistent pool of worker threads for the fast CPU backend: one parallel section per matrix
// product, the caller taking part 0. Workers spin briefly between sections (a frame runs hundreds
// of products back to back) and sleep on a condition variable when idle; a section allocates
// nothing.
//
//   ThreadPool pool(4);
//   pool.run([&](int part, int parts) { rows part*n/parts .. (part+1)*n/parts });
//
// run() may be called from any thread; concurrent calls are serialised (one section at a time).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace qtts::cpu_fast {

class ThreadPool {
public:
    // threads >= 1 parts per section (the caller plus threads - 1 workers); 0 = the machine's cores.
    explicit ThreadPool(int threads);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const { return parts_; }

    // Calls fn(part, parts) once for every part in 0..size()-1, in parallel, and returns when all
    // are done. fn must not throw and must not call run() on this pool.
    template <typename Fn>
    void run(Fn&& fn) {
        section_run(
            [](void* ctx, int part, int parts) { (*static_cast<std::remove_reference_t<Fn>*>(ctx))(part, parts); },
            &fn);
    }

    // Threads a pool built with 0 gets: std::thread::hardware_concurrency(), at least 1.
    static int default_threads();

private:
    using Task = void (*)(void* ctx, int part, int parts);
    void section_run(Task task, void* ctx);
    void worker_main(int part);

    int parts_ = 1;
    std::vector<std::thread> workers_;
    std::mutex run_mutex_;  // one section at a time

    // The current section, published by `generation_`.
    Task task_ = nullptr;
    void* ctx_ = nullptr;
    std::atomic<uint64_t> generation_{0};
    std::atomic<int> pending_{0};   // workers still running the current section
    std::atomic<int> sleepers_{0};  // workers waiting on cv_
    std::atomic<bool> stop_{false};
    std::mutex sleep_mutex_;
    std::condition_variable cv_;
};

}  // namespace qtts::cpu_fast

namespace qtts::cpu_fast {

// Measured streaming-read bandwidth of this machine in GB/s (1e9 bytes/s): the pool's threads
// each sum their slice of a `bytes` buffer (much larger than the caches), best of `repeats`
// passes after one warm pass. What the fast backend's products are compared against.
double memory_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t(512) << 20, int repeats = 5);

}  // namespace qtts::cpu_fast
