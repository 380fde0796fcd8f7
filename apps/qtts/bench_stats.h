// The benchmarks' order statistics, header-only so that the kernel lab (apps/kernel-lab), which
// does not link the qtts program's sources, reports its timings the same way.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace qtts_cli {

// Median (upper middle element) and nearest-rank percentile (p in 0..100); 0 for no samples.
inline double bench_median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

inline double bench_percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t rank = size_t(std::ceil(p / 100.0 * double(v.size())));
    return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace qtts_cli
