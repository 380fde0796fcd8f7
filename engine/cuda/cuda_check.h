// Error checking for CUDA runtime and cuBLAS calls in the engine.
//
// CUDA_CHECK(cudaMalloc(...)) and CUBLAS_CHECK(cublasGemmEx(...)) throw qtts::Error with
// ERROR_CUDA naming the failed statement, the error, and the function, file and line. Both are
// the generic CUDA_CHECK_GEN of kernels/check.cuh (any other status-code API, cuRAND, NVML...,
// can reuse it), and CUDA_CHECK describes the status with the kernels' cuda_error_text.
//
// Kernel launchers (kernels/) throw kernels::KernelError; CUDA_CHECK_KERNEL(k::gemv(...)) around
// a launcher call turns it into the same qtts::Error(ERROR_CUDA), naming the launch. This header
// has no fmt/spdlog dependency; the throwing code lives in cuda_check.cpp.
#pragma once

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "kernels/check.cuh"

namespace qtts::cuda {

// Throws qtts::Error(ERROR_CUDA, "<statement> failed: <what> (in <function> at <file>:<line>)").
[[noreturn]] void check_fail(const char* statement, const char* what, const char* function, const char* file,
                             int line);

// "CUBLAS_STATUS_NOT_SUPPORTED: the functionality requested is not supported"
const char* cublas_error_text(cublasStatus_t status);

}  // namespace qtts::cuda

#define CUDA_CHECK(statement) \
    CUDA_CHECK_GEN(statement, cudaSuccess, ::qtts::kernels::cuda_error_text, ::qtts::cuda::check_fail)
#define CUBLAS_CHECK(statement) \
    CUDA_CHECK_GEN(statement, CUBLAS_STATUS_SUCCESS, ::qtts::cuda::cublas_error_text, ::qtts::cuda::check_fail)
// After a kernel launch with <<<>>> syntax (launch_kernel() returns its status instead).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
// Around a kernels/ launcher call: its KernelError becomes qtts::Error(ERROR_CUDA).
#define CUDA_CHECK_KERNEL(launch)                                                                  \
    do {                                                                                           \
        try {                                                                                      \
            launch;                                                                                \
        } catch (const ::qtts::kernels::KernelError& qtts_kernel_error_) {                         \
            ::qtts::cuda::check_fail(#launch, qtts_kernel_error_.what(), __func__, __FILE__, __LINE__); \
        }                                                                                          \
    } while (0)
