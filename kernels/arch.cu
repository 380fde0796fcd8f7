#include "kernels/arch.cuh"

#include <atomic>

#include "kernels/common.cuh"

namespace qtts::kernels {

namespace {

// Never launched: its attributes tell which of the binary's code the driver chose for a device.
__global__ void arch_probe_kernel(int* out) {
    if (out) *out = 0;
}

constexpr int MAX_DEVICES = 64;
std::atomic<size_t> g_smem_limit[MAX_DEVICES];  // 0 = not queried yet
std::atomic<size_t> g_smem_cap{0};

}  // namespace

const char* kernel_path_name(KernelPath path) {
    return path == KernelPath::KERNEL_PATH_HOPPER ? "hopper" : "portable";
}

KernelArch kernel_arch_current() {
    cudaFuncAttributes attributes{};
    KERNEL_CUDA_CHECK(cudaFuncGetAttributes(&attributes, arch_probe_kernel));
    KernelArch arch;
    arch.ptx_version = attributes.ptxVersion;
    arch.binary_version = attributes.binaryVersion;
    // Device code built from compute_90 or newer has the Hopper instructions compiled in.
    arch.path = arch.ptx_version >= 90 ? KernelPath::KERNEL_PATH_HOPPER : KernelPath::KERNEL_PATH_PORTABLE;
    return arch;
}

size_t smem_block_limit() {
    int device = 0;
    KERNEL_CUDA_CHECK(cudaGetDevice(&device));
    size_t limit = device >= 0 && device < MAX_DEVICES ? g_smem_limit[device].load() : 0;
    if (limit == 0) {
        int optin = 0;
        KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        limit = size_t(optin);
        if (device >= 0 && device < MAX_DEVICES) g_smem_limit[device].store(limit);
    }
    const size_t cap = g_smem_cap.load();
    return cap > 0 && cap < limit ? cap : limit;
}

void smem_block_cap_set(size_t bytes) { g_smem_cap.store(bytes); }

}  // namespace qtts::kernels
