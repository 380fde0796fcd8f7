// qtts bench --batch: step time of the batched frame step per bucket (apps/qtts/bench_batch.cpp).
#pragma once

#ifdef QTTS_HAVE_CUDA

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace qtts_cli {

// Measures the buckets (any order, duplicates ignored) on device `device`, prints a table and
// returns the results as JSON.
nlohmann::json bench_batch(const std::string& model_dir, int device, const std::vector<int>& buckets, int frames,
                           int chunk);

}  // namespace qtts_cli

#endif  // QTTS_HAVE_CUDA
