#include "apps/qtts/bench_common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/common/device.h"
#include "engine/common/error.h"

namespace qtts_cli {

void bench_json_write(const std::string& path, const nlohmann::json& j) {
    std::ofstream f(path);
    if (!f) qtts::fail(qtts::ErrorCode::ERROR_IO, "cannot write {}", path);
    f << j.dump(2) << "\n";
    if (!f) qtts::fail(qtts::ErrorCode::ERROR_IO, "writing {} failed", path);
    std::printf("  wrote %s\n", path.c_str());
}

bool bench_gpu_present(const char* command, const char* what, int device) {
#ifdef QTTS_HAVE_CUDA
    if (qtts::cuda_device_count() > 0) return true;
#endif
    std::fprintf(stderr, "qtts %s: %s; the benchmark measures %s and needs a GPU\n", command,
                 qtts::cuda_describe(device).c_str(), what);
    return false;
}

double bench_median(std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

double bench_percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const size_t rank = size_t(std::ceil(p / 100.0 * double(v.size())));
    return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::vector<int> bench_sizes(const std::string& text, const char* option) {
    std::vector<int> out;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const int v = std::atoi(item.c_str());
        if (v < 1 || v > 1000)
            qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--{}: '{}' is not a size in 1..1000", option, item);
        out.push_back(v);
    }
    if (out.empty()) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--{}: no sizes given", option);
    return out;
}

}  // namespace qtts_cli
