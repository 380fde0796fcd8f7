// One CUDA device as the engine thread sees it: the device index, a dedicated non-blocking
// stream, one cuBLAS handle bound to that stream with its own workspace (32 MiB on Hopper and
// newer, 4 MiB otherwise; graph rule 15), the kernel path the device got and with it the
// programmatic-dependent-launch switch, and the owner guard of everything allocated for this
// device.
//
// The kernel path (kernels/arch.cuh) is decided here, once, and logged: "hopper" when the
// device's code was built from sm_90+ (programmatic dependent launch on, L2 bulk prefetch in the
// kernels), "portable" otherwise (sm_80..89, or a PTX-only build JIT-compiled for any GPU). Every
// launch takes its PDL flag from launch(), so no kernel is launched with the attribute unless it
// waits for its predecessor with griddepcontrol.wait.
//
// Every GPU object built on a context belongs to the context's owner thread. Nothing assumes
// device 0: each entry point makes the context's device current first (DeviceScope).
#pragma once

#include <string>

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include "engine/cuda/device_buffer.h"
#include "engine/cuda/owner_guard.h"
#include "kernels/arch.cuh"
#include "kernels/common.cuh"

namespace qtts::cuda {

// Makes `device` current for the lifetime of the scope and restores the previous one.
class DeviceScope {
public:
    explicit DeviceScope(int device);
    ~DeviceScope();
    DeviceScope(const DeviceScope&) = delete;
    DeviceScope& operator=(const DeviceScope&) = delete;

private:
    int previous_ = -1;
    bool changed_ = false;
};

// Free memory of the current device (cudaMemGetInfo), in bytes.
size_t device_free_bytes();

class GpuContext {
public:
    // Throws qtts::Error (ERROR_CUDA) with a clear message when the device cannot be used.
    // `high_priority`: the stream gets the device's highest priority (the engine's LM stream, so
    // that a second context's work fills what its launches leave; stream_priority_set).
    explicit GpuContext(int device, bool high_priority = false);
    ~GpuContext();
    GpuContext(const GpuContext&) = delete;
    GpuContext& operator=(const GpuContext&) = delete;

    int device() const { return device_; }
    const std::string& device_name() const { return name_; }
    int sm_count() const { return sm_count_; }
    int compute_major() const { return major_; }
    int compute_minor() const { return minor_; }
    const kernels::KernelArch& kernel_arch() const { return arch_; }
    kernels::KernelPath kernel_path() const { return arch_.path; }
    cudaStream_t stream() const { return stream_; }
    cublasHandle_t cublas() const { return cublas_; }
    size_t cublas_workspace_bytes() const { return workspace_.bytes(); }

    // Launch options for the context stream.
    kernels::Launch launch() const { return {stream_, pdl_}; }
    bool pdl() const { return pdl_; }
    void pdl_set(bool enabled);  // ignored (stays off) on the portable path

    OwnerGuard& guard() { return guard_; }
    const OwnerGuard& guard() const { return guard_; }

    void synchronize();
    // Gives the context a new stream of the device's highest priority (true) or the default, lowest
    // one (false), after waiting for the old one; cuBLAS follows. Graphs replayed into a stream run
    // at its priority: the block scheduler then starts this stream's pending blocks before those of
    // lower-priority streams (a second context's work fills what is left). Owner thread, between
    // steps.
    void stream_priority_set(bool high);
    // Asks cuBLAS to spread this context's GEMMs over at most `sms` SMs (0: all; captured graphs
    // keep what was set when they were captured). Owner thread; CublasSmLimit (below) sets it for
    // a scope.
    void cublas_sm_limit(int sms);
    // After a failed call on this context (one stream's error): clears the thread's pending
    // runtime error and waits for the stream. True when the context still works; false after a
    // sticky error (illegal address, device lost), after which every call fails. Owner thread.
    bool recover();
    // Fault-injection seam for tests: an invalid runtime call through CUDA_CHECK, so the caller
    // gets the qtts::Error (ERROR_CUDA) a real failed call gives. Not a sticky error.
    [[noreturn]] void fault_raise();

private:
    bool hopper_path() const;  // sm_90+ device running code built for sm_90+

    int device_ = 0;
    std::string name_;
    int sm_count_ = 0;
    int major_ = 0;
    int minor_ = 0;
    kernels::KernelArch arch_;
    bool pdl_ = false;
    cudaStream_t stream_ = nullptr;
    cublasHandle_t cublas_ = nullptr;
    DeviceBuffer workspace_;
    OwnerGuard guard_;
};

// GpuContext::cublas_sm_limit(sms) for the lifetime of the scope, then every SM again (also when
// the scope is left by an exception, so no later GEMM or capture inherits the limit). sms 0 changes
// nothing. Owner thread of the context.
class CublasSmLimit {
public:
    CublasSmLimit(GpuContext& context, int sms);
    ~CublasSmLimit();
    CublasSmLimit(const CublasSmLimit&) = delete;
    CublasSmLimit& operator=(const CublasSmLimit&) = delete;

private:
    GpuContext& context_;
    const bool set_;
};

}  // namespace qtts::cuda
