#include "bench_common.h"

#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "common/device.h"
#include "common/error.h"

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

}  // namespace qtts_cli
