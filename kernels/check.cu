#include "kernels/check.cuh"

#include <cstdio>

namespace qtts::kernels {

const char* cuda_error_text(cudaError_t status) {
    // One static buffer per thread: the text is consumed immediately by check_fail().
    thread_local char text[256];
    std::snprintf(text, sizeof(text), "%s: %s", cudaGetErrorName(status), cudaGetErrorString(status));
    return text;
}

void check_fail(const char* statement, const char* what, const char* function, const char* file, int line) {
    char where[256];
    std::snprintf(where, sizeof(where), " (in %s at %s:%d)", function, file, line);
    throw KernelError(std::string(statement) + " failed: " + what + where);
}

}  // namespace qtts::kernels
