#include <cstdio>

#include "apps/qtts/cli.h"
#include "engine/common/device.h"

namespace {

int cmd_version(const std::vector<std::string>&) {
    std::printf("qtts %s\ncuda: %s\n", QTTS_VERSION, qtts::cuda_describe(0).c_str());
    return 0;
}

}  // namespace

QTTS_COMMAND("version", "print the version and the CUDA device qtts would use", cmd_version);
