// Error checking inside kernels/, which includes nothing of engine/: a failed CUDA call in a
// launcher, or a launcher given arguments its kernel cannot run, throws kernels::KernelError
// naming the statement, the error, and the function, file and line. The engine converts it to
// qtts::Error(ERROR_CUDA) where it calls a launcher (CUDA_CHECK_KERNEL, engine/cuda/cuda_check.h).
//
// CUDA_CHECK_GEN(statement, success_value, describe_fn, raise_fn) is the one generic check;
// KERNEL_CUDA_CHECK here and the engine's CUDA_CHECK / CUBLAS_CHECK specialise it. Plain C++:
// engine/cuda/cuda_check.h includes it from g++-compiled code.
#pragma once

#include <stdexcept>
#include <string>

#include <cuda_runtime_api.h>

namespace qtts::kernels {

class KernelError : public std::runtime_error {
public:
    explicit KernelError(const std::string& message) : std::runtime_error(message) {}
};

// "cudaErrorMemoryAllocation: out of memory" (the one status-to-text of the project; the engine
// reuses it).
const char* cuda_error_text(cudaError_t status);

// Throws KernelError("<statement> failed: <what> (in <function> at <file>:<line>)").
[[noreturn]] void check_fail(const char* statement, const char* what, const char* function, const char* file,
                             int line);

}  // namespace qtts::kernels

#define CUDA_CHECK_GEN(statement, success, describe, raise)                                  \
    do {                                                                                     \
        const auto qtts_check_status_ = (statement);                                         \
        if (qtts_check_status_ != (success))                                                 \
            raise(#statement, describe(qtts_check_status_), __func__, __FILE__, __LINE__);   \
    } while (0)

#define KERNEL_CUDA_CHECK(statement) \
    CUDA_CHECK_GEN(statement, cudaSuccess, ::qtts::kernels::cuda_error_text, ::qtts::kernels::check_fail)
