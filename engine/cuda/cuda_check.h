// Error checking for CUDA runtime and cuBLAS calls.
//
// CUDA_CHECK(cudaMalloc(...)) and CUBLAS_CHECK(cublasGemmEx(...)) throw qtts::Error with
// ERROR_CUDA naming the failed statement, the error, and the function, file and line. Both are
// built on CUDA_CHECK_GEN(statement, success_value, describe_fn), which any other status-code
// API (cuRAND, NVML...) can reuse. This header has no fmt/spdlog dependency so that .cu files
// can include it cheaply; the throwing code lives in cuda_check.cpp.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

namespace qtts::cuda {

// Throws qtts::Error(ERROR_CUDA, "<statement> failed: <what> (in <function> at <file>:<line>)").
[[noreturn]] void check_fail(const char* statement, const char* what, const char* function, const char* file,
                             int line);

// "cudaErrorMemoryAllocation: out of memory"
const char* cuda_error_text(cudaError_t status);
// "CUBLAS_STATUS_NOT_SUPPORTED: the functionality requested is not supported"
const char* cublas_error_text(cublasStatus_t status);

}  // namespace qtts::cuda

#define CUDA_CHECK_GEN(statement, success, describe)                                                   \
    do {                                                                                               \
        const auto qtts_check_status_ = (statement);                                                   \
        if (qtts_check_status_ != (success))                                                           \
            ::qtts::cuda::check_fail(#statement, describe(qtts_check_status_), __func__, __FILE__, __LINE__); \
    } while (0)

#define CUDA_CHECK(statement) CUDA_CHECK_GEN(statement, cudaSuccess, ::qtts::cuda::cuda_error_text)
#define CUBLAS_CHECK(statement) CUDA_CHECK_GEN(statement, CUBLAS_STATUS_SUCCESS, ::qtts::cuda::cublas_error_text)
// After a kernel launch with <<<>>> syntax (launch_kernel() returns its status instead).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
