#include <cstdio>

#include "apps/qtts/cli.h"
#include "engine/common/device.h"

namespace {

// One line per fact, "key: value", so scripts and tests can read them.
int cmd_version(const std::vector<std::string>&) {
    std::printf("qtts %s\n", QTTS_VERSION);
    std::printf("cuda: %s\n", qtts::cuda_describe(0).c_str());
    const qtts::CudaReport report = qtts::cuda_report(0);
    std::printf("cuda archs compiled: %s\n", report.archs_compiled.empty() ? "none" : report.archs_compiled.c_str());
    if (report.usable) {
        std::printf("cuda device: %s\n", report.name.c_str());
        std::printf("cuda compute capability: %d.%d\n", report.major, report.minor);
        std::printf("cuda kernel path: %s (code from compute_%d, running as sm_%d)\n", report.kernel_path.c_str(),
                    report.kernel_ptx, report.kernel_sass);
    } else {
        std::printf("cuda kernel path: none (%s)\n", report.why.c_str());
    }
    return 0;
}

}  // namespace

QTTS_COMMAND("version", "print the version, the CUDA device qtts would use and its kernel path", cmd_version);
