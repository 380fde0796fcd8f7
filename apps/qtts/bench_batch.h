// qtts bench --batch: step time of the batched frame step per bucket (apps/qtts/bench_batch.cpp).
#pragma once

#ifdef QTTS_HAVE_CUDA

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace qtts_cli {

// What `qtts bench --batch` runs besides the buckets.
struct BatchBenchOptions {
    std::vector<std::string> paths;  // product paths to time (gemv, split, auto, sk16, sk32, t1); empty: all
    bool step_only = false;          // only the step table: no prefill, product or overlap tables
    // After timing each bucket, one more replay between cudaProfilerStart and cudaProfilerStop, so
    // that a profiler started with profiling off (`ncu --profile-from-start off`) sees exactly one
    // replay's kernels (tools/ncu_step.py sums them per kernel).
    bool profile = false;
    // Positions of every stream's KV cache (the talker attention's split-K grid is sized for it);
    // 0: just what the run needs (at least 256). The engine's streams have 4096.
    int max_context = 0;
    // Two half batches side by side (pair_rows): for each h, 2h streams as one batch of 2h rows
    // against two batches of h rows on two contexts (streams, cuBLAS handles) replayed at once.
    std::vector<int> pairs;
};

// Measures the buckets (any order, duplicates ignored) on device `device`, prints a table and
// returns the results as JSON.
nlohmann::json bench_batch(const std::string& model_dir, int device, const std::vector<int>& buckets, int frames,
                           int chunk, const BatchBenchOptions& options);

}  // namespace qtts_cli

#endif  // QTTS_HAVE_CUDA
