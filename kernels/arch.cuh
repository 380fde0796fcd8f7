// Which kernel code a GPU runs, and what it may ask of that GPU.
//
// The binary carries machine code for several architectures (CMakeLists.txt, QTTS_CUDA_ARCHS)
// and the driver picks one per device: the SASS built for it, else a JIT compile of the newest
// PTX it can take. Device code built for sm_90+ uses the Hopper instructions (griddepcontrol for
// programmatic dependent launch, cp.async.bulk L2 prefetch; kernels/common.cuh); code built for
// an older target has the portable path (plain stream order, no bulk prefetch). The host must
// know which one a device got: programmatic dependent launch may only be requested for kernels
// that wait on their predecessor with griddepcontrol.wait.
//
// Plain C++ (host code compiled by g++ includes it).
#pragma once

#include <cstddef>

namespace qtts::kernels {

enum class KernelPath {
    KERNEL_PATH_HOPPER,    // compiled for sm_90+: programmatic dependent launch + L2 bulk prefetch
    KERNEL_PATH_PORTABLE,  // compiled for sm_80..89 (or their PTX): stream order, no bulk prefetch
};
const char* kernel_path_name(KernelPath path);  // "hopper", "portable"

struct KernelArch {
    int ptx_version = 0;     // the virtual architecture the device's code came from (80, 90, ...)
    int binary_version = 0;  // the SASS the device runs (90 on an H200, also for JIT-compiled PTX)
    KernelPath path = KernelPath::KERNEL_PATH_PORTABLE;
};

// The kernels as the driver loads them for the CURRENT device (a probe kernel's attributes).
// Throws KernelError when this binary has no code the device can run.
KernelArch kernel_arch_current();

// Largest dynamic + static shared memory one block may use on the current device
// (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB on sm_90, 163 KiB on sm_80/87, 99 KiB on
// sm_86/89), lowered to the cap of smem_block_cap_set when one is set. Cached per device.
size_t smem_block_limit();
// Tests: pretend every device allows at most `bytes` per block (0: the device's own limit), so
// the fallbacks of smaller GPUs run on a large one. Not for concurrent use with launches.
void smem_block_cap_set(size_t bytes);

}  // namespace qtts::kernels
