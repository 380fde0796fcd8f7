#include "engine/cuda/gpu_context.h"

#include <cstdlib>
#include <cstring>

#include <cublas_v2.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cuda {

DeviceScope::DeviceScope(int device) {
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
        CUDA_CHECK(cudaSetDevice(device));
        changed_ = true;
    }
}

DeviceScope::~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
}

GpuContext::GpuContext(int device, bool high_priority) : device_(device) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        cudaGetLastError();
        fail(ErrorCode::ERROR_CUDA, "no usable CUDA device ({}: {}); run with the CPU backend instead",
             cudaGetErrorName(status), cudaGetErrorString(status));
    }
    if (device < 0 || device >= count)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "CUDA device {} does not exist: {} device(s) present (use --device 0..{})",
             device, count, count - 1);
    DeviceScope scope(device_);
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = prop.name;
    sm_count_ = prop.multiProcessorCount;
    major_ = prop.major;
    minor_ = prop.minor;
    CUDA_CHECK_KERNEL(arch_ = kernels::kernel_arch_current());
    // Programmatic dependent launch needs an sm_90+ device AND kernels that wait with
    // griddepcontrol.wait (code built for sm_90+); pdl_set() turns it off for measurements.
    pdl_ = hopper_path();
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, high_priority ? greatest : least));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    workspace_.allocate(size_t(major_ >= 9 ? 32 : 4) << 20);
    CUBLAS_CHECK(cublasSetWorkspace(cublas_, workspace_.get(), workspace_.bytes()));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
    QTTS_LOG_INFO("CUDA device {}: {} (sm_{}{}, {} SMs, {:.0f} GiB), cuBLAS workspace {} MiB, PDL {}", device_, name_,
                  prop.major, prop.minor, sm_count_, prop.totalGlobalMem / 1073741824.0, workspace_.bytes() >> 20,
                  pdl_ ? "on" : "off");
    size_t smem_limit = 0;
    CUDA_CHECK_KERNEL(smem_limit = kernels::smem_block_limit());
    QTTS_LOG_INFO("CUDA device {}: kernel path {} (code from compute_{}, running as sm_{}; {}), shared memory {} KiB "
                  "per block",
                  device_, kernels::kernel_path_name(arch_.path), arch_.ptx_version, arch_.binary_version,
                  arch_.path == kernels::KernelPath::KERNEL_PATH_HOPPER
                      ? "programmatic dependent launch and L2 bulk prefetch"
                      : "stream-ordered launches, no L2 bulk prefetch",
                  smem_limit >> 10);
}

GpuContext::~GpuContext() {
    int previous = -1;
    cudaGetDevice(&previous);
    cudaSetDevice(device_);
    if (stream_) cudaStreamSynchronize(stream_);
    if (cublas_) cublasDestroy(cublas_);
    workspace_.release();
    if (stream_) cudaStreamDestroy(stream_);
    if (previous >= 0) cudaSetDevice(previous);
}

bool GpuContext::hopper_path() const {
    return major_ >= 9 && arch_.path == kernels::KernelPath::KERNEL_PATH_HOPPER;
}

void GpuContext::pdl_set(bool enabled) { pdl_ = enabled && hopper_path(); }

void GpuContext::synchronize() {
    guard_.check("GpuContext::synchronize");
    DeviceScope scope(device_);
    CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void GpuContext::cublas_sm_limit(int sms) {
    guard_.check("GpuContext::cublas_sm_limit");
    QTTS_ASSERT(sms >= 0);
    CUBLAS_CHECK(cublasSetSmCountTarget(cublas_, sms));
}

CublasSmLimit::CublasSmLimit(GpuContext& context, int sms) : context_(context), set_(sms > 0) {
    if (set_) context_.cublas_sm_limit(sms);
}

CublasSmLimit::~CublasSmLimit() {
    if (!set_) return;
    // Resetting a handle setting has no device work that could fail; a failure here is only logged
    // (a destructor must not throw while an exception may be unwinding).
    if (cublasSetSmCountTarget(context_.cublas(), 0) != CUBLAS_STATUS_SUCCESS)
        QTTS_LOG_WARN("cuBLAS SM count target could not be reset on device {}", context_.device());
}

void GpuContext::stream_priority_set(bool high) {
    guard_.check("GpuContext::stream_priority_set");
    DeviceScope scope(device_);
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t next = nullptr;
    CUDA_CHECK(cudaStreamCreateWithPriority(&next, cudaStreamNonBlocking, high ? greatest : least));
    CUDA_CHECK(cudaStreamSynchronize(stream_));
    CUBLAS_CHECK(cublasSetStream(cublas_, next));
    CUDA_CHECK(cudaStreamDestroy(stream_));
    stream_ = next;
}

size_t device_free_bytes() {
    size_t free = 0, total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
}

bool GpuContext::recover() {
    guard_.check("GpuContext::recover");
    DeviceScope scope(device_);
    (void)cudaGetLastError();  // the failed call's error, so the next launch check does not see it
    const cudaError_t sync = cudaStreamSynchronize(stream_);
    const cudaError_t after = cudaGetLastError();
    return sync == cudaSuccess && after == cudaSuccess;
}

void GpuContext::fault_raise() {
    guard_.check("GpuContext::fault_raise");
    DeviceScope scope(device_);
    CUDA_CHECK(cudaMemcpyAsync(nullptr, nullptr, 1, cudaMemcpyDeviceToDevice, stream_));
    fail(ErrorCode::ERROR_INTERNAL, "fault_raise: the invalid CUDA call did not fail");
}

}  // namespace qtts::cuda
