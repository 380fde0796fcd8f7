// Shared main for every test executable. The CTest label (QTTS_TEST_LABEL) decides what the
// test needs; when it is missing the test prints why and exits 77, which CTest reports as
// "Skipped" (never as passed).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/common/device.h"
#include "test_support.h"

int main(int argc, char* argv[]) {
    const char* label_env = std::getenv("QTTS_TEST_LABEL");
    const std::string label = label_env ? label_env : "";
    if (label == "golden" && !qtts_test::reference_available()) {
        std::printf("SKIPPED: the golden reference folder %s is absent (it lives in ../shared/reference "
                    "beside the project; set QTTS_REFERENCE_DIR to point elsewhere)\n",
                    qtts_test::reference_dir().c_str());
        return 77;
    }
    if (label == "gpu" && qtts::cuda_device_count() == 0) {
        std::printf("SKIPPED: no CUDA device: %s\n", qtts::cuda_describe(0).c_str());
        return 77;
    }
    return Catch::Session().run(argc, argv);
}
