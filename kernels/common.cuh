// Helpers shared by the kernel files: launch options (stream + programmatic dependent launch),
// bf16 unpacking, warp reductions and the Hopper grid-dependency / L2-prefetch instructions.
//
// The launcher API of every op family (kernels/<family>.cuh) is plain C++: host code compiled by
// g++ includes it. Device-only helpers below are guarded by __CUDACC__.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace qtts::kernels {

// How a launcher launches its kernel(s).
//   pdl: the kernel may start while the previous kernel on the stream is still running
//        (programmatic dependent launch, sm_90+; only GpuContext decides it, from the device and
//        the kernel path it got: kernels/arch.cuh). Every kernel in kernels/ is written for it:
//        before griddepcontrol.wait it only reads weights (constant) and prefetches them into
//        L2; everything that depends on the previous kernel comes after the wait.
struct Launch {
    cudaStream_t stream = nullptr;
    bool pdl = false;
};

// bf16 weights are passed around as raw 16-bit words so that host code needs no CUDA headers.
using bf16_t = uint16_t;

// Whether p is a multiple of `bytes` (the launchers' vector-load requirements).
inline bool is_aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace qtts::kernels

#ifdef __CUDACC__

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <string>
#include <utility>

#include "kernels/arch.cuh"
#include "kernels/check.cuh"

namespace qtts::kernels {

// Launches `kernel` with the PDL attribute when requested. Returns the launch status.
template <typename... KArgs, typename... Args>
cudaError_t launch_kernel(const Launch& l, dim3 grid, dim3 block, size_t smem, void (*kernel)(KArgs...),
                          Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = l.stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = l.pdl ? 1 : 0;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// Shared memory per block: the default limit is 48 KiB (static and dynamic together); beyond it a
// kernel must be allowed more, up to the device's opt-in limit (kernels/arch.cuh,
// smem_block_limit: 227 KiB on sm_90, 163 KiB on sm_80/87, only 99 KiB on sm_86/89). The dynamic
// part is compared with the limits less an allowance for the kernels' static arrays (a few
// hundred bytes): exactly 48 KiB of dynamic memory (a 4-row gemv over 3072 inputs) needs a raise.
// Launchers whose shared memory depends on the shapes ask smem_fits() first and take a smaller
// variant (fewer rows per block, keys read from global memory) when it says no.
constexpr size_t SMEM_STATIC_ALLOWANCE = 1024;
inline bool smem_fits(size_t smem) {
    return smem + SMEM_STATIC_ALLOWANCE <= 48 * 1024 || smem + SMEM_STATIC_ALLOWANCE <= smem_block_limit();
}

// Raises the dynamic shared-memory limit of `kernel` to what the device allows, once per device,
// when a launch needs more than the default 48 KiB. `raised` is one flag word per kernel (bit =
// device). A launch beyond the device's limit is refused here with a message (check_fail), not
// left to fail as an invalid launch.
template <typename Kernel>
void smem_limit_raise(Kernel kernel, size_t smem, std::atomic<uint64_t>& raised) {
    if (smem + SMEM_STATIC_ALLOWANCE <= 48 * 1024) return;
    if (!smem_fits(smem)) {
        const std::string what = "the launch needs " + std::to_string(smem + SMEM_STATIC_ALLOWANCE) +
                                 " bytes of shared memory per block; this GPU allows " +
                                 std::to_string(smem_block_limit());
        check_fail("smem_limit_raise", what.c_str(), __func__, __FILE__, __LINE__);
    }
    int device = 0;
    KERNEL_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = uint64_t(1) << (device & 63);
    if (raised.load() & bit) return;
    int optin = 0;
    KERNEL_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    cudaFuncAttributes attributes{};
    KERNEL_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
    const int dynamic_max = optin - int(attributes.sharedSizeBytes);
    KERNEL_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dynamic_max));
    raised.fetch_or(bit);
}

// The Hopper-only instructions. Each compiles to nothing for targets below sm_90 (the portable
// path, kernels/arch.cuh), which is correct because the host requests programmatic dependent
// launch only for devices whose kernels came from sm_90+ code (GpuContext): without the launch
// attribute a kernel starts after its predecessor completed, as in plain stream order, and the
// L2 prefetch is only a hint.

// Lets the next kernel on the stream be scheduled (it still waits in pdl_wait() for this one).
// Kernels call it right after their own pdl_wait(), so at most one kernel runs ahead: its
// prologue (weight prefetch) overlaps this kernel's work. Measured both ways on the gemv (H100,
// 1.7B frame, docs/performance.md "Forty-second session"): released at its start, several
// launches loading at once, the frame took 5.7% longer; released after its dot products, the
// predictor (whose rows are all loaded before the wait) took 8% longer. The exceptions release
// it once their own first loads after the wait are in, because the next launch's weight loads
// held those up (the kernel timeline):
//   - the products that add into y (o, down), once their input is staged ("Forty-third
//     session": the frame -0.8%; every product released there +1%; whether the release point or
//     the register allocation it brought made the gain is not settled), or, double-buffered (the
//     1.7B talker's down), once they have asked for their last chunk ("Forty-seventh session":
//     the talker step -0.6 to -0.9%);
//   - the decode attention, once its new rows are normalised, rotated and in place ("Forty-fourth
//     session": the 1.7B frame -3.1%; released after its scores instead, 1.2% slower than that);
//   - the draw, once its logits are in ("Forty-fourth session": the frame -0.4%).
// Not exceptions, measured ("Forty-fifth session"): the once-a-frame kernels (embedding,
// RMSNorm) released after their loads gained ~0.1%; o and down released at their end, +1.5 to +9%.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Waits until the previous kernel on the stream has completed and its writes are visible.
// A no-op when the kernel was launched without PDL.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace qtts::kernels

// Profiling builds (QTTS_KERNEL_TIMELINE) turn pdl_wait() into a stamped wait; timeline_mark().
#include "kernels/timeline.cuh"

namespace qtts::kernels {

// Asks the copy engine to pull [ptr, ptr + bytes) into L2 (fire and forget). ptr and bytes must
// be multiples of 16. Used for weights before pdl_wait(), so that they stream in while the
// previous kernel finishes; sparingly, since these requests queue ahead of that kernel's own
// loads (the gemv asks for at most GEMV_PREFETCH_MAX_BYTES, kernels/gemv_device.cuh).
__device__ __forceinline__ void prefetch_l2(const void* ptr, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const char* p = static_cast<const char*>(ptr);
    constexpr uint32_t CHUNK = 1u << 16;
    while (bytes > 0) {
        const uint32_t n = bytes < CHUNK ? bytes : CHUNK;
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(n) : "memory");
        p += n;
        bytes -= n;
    }
#else
    (void)ptr;
    (void)bytes;
#endif
}

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float bf16_to_float(uint16_t w) { return __uint_as_float(uint32_t(w) << 16); }

// Round-to-nearest-even fp32 -> bf16 bits (NaN kept quiet), as the host conversion does.
__device__ __forceinline__ uint16_t float_to_bf16(float f) {
    const uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
    const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return uint16_t((u + rounding) >> 16);
}

// v as a bf16 pair: hi = bf16(v), lo = bf16(v - hi) (~16 mantissa bits together), the operands
// of the split-bf16 products.
__device__ __forceinline__ void bf16_split(float v, bf16_t* hi, bf16_t* lo) {
    *hi = float_to_bf16(v);
    *lo = float_to_bf16(v - bf16_to_float(*hi));
}

// Dot product of 8 bf16 weights (one 16-byte load) with 8 fp32 values.
__device__ __forceinline__ float dot8(const uint4& w, const float4& a, const float4& b) {
    float s = bf16_lo(w.x) * a.x;
    s = fmaf(bf16_hi(w.x), a.y, s);
    s = fmaf(bf16_lo(w.y), a.z, s);
    s = fmaf(bf16_hi(w.y), a.w, s);
    s = fmaf(bf16_lo(w.z), b.x, s);
    s = fmaf(bf16_hi(w.z), b.y, s);
    s = fmaf(bf16_lo(w.w), b.z, s);
    s = fmaf(bf16_hi(w.w), b.w, s);
    return s;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Block-wide sum (any block size up to 1024 threads); every thread gets the total. The warps'
// sums are added in warp order, so the result is deterministic.
__device__ __forceinline__ float block_sum(float v, float* shared /* [32] */) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // `shared` may still be read from a previous call
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) total += shared[w];
    return total;
}

// Inclusive prefix sum over the warp's lanes: lane l gets v of lanes 0..l (integers: exact).
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T t = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += t;
    }
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Reads a value produced by another block of the same grid (bypasses the non-coherent L1).
__device__ __forceinline__ float load_coherent(const float* p) { return __ldcg(p); }

// A split-K block's arrival at its group's counter: every thread of the block calls it after
// storing its partial results. Returns, in every thread, whether this block is the count-th (the
// last) to arrive; the last block resets the counter for the next launch, and its later
// load_coherent reads see what every block of the group stored before arriving. After the
// barrier, one thread releases the block's stores (fence.acq_rel.gpu, cumulative over the
// barrier) and bumps the counter; the last block's thread then acquires the others' stores. This
// is the usual semaphore pattern (CUTLASS's, for one), in place of a sequentially consistent fence
// in every thread before and after.
__device__ __forceinline__ bool block_arrive_last(uint32_t* counter, uint32_t count) {
    __shared__ int last_s;
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
        const bool last = atomicAdd(counter, 1u) == count - 1u;
        if (last) {
            *counter = 0u;
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
        last_s = last ? 1 : 0;
    }
    __syncthreads();
    return last_s != 0;
}

// silu exactly as the CPU reference writes it.
__device__ __forceinline__ float silu_ref(float x) { return x / (1.0f + expf(-x)); }

// The position a kernel works at: read from device memory (graphs) or given by value.
__device__ __forceinline__ int position_read(const int32_t* dev, int host) { return dev ? *dev : host; }

}  // namespace qtts::kernels

#endif  // __CUDACC__
