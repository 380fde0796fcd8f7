// qtts-kernel-lab stream: how fast one block per SM can stream global memory into a ring of
// slots in its shared memory (apps/kernel-lab/stream_lab.h).
#include "apps/kernel-lab/stream_lab.h"

#include <cstdio>
#include <vector>

#include "apps/kernel-lab/lab_device.cuh"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/event_timer.h"
#include "engine/cuda/gpu_context.h"
#include "kernels/check.cuh"

namespace qtts::kernel_lab {

namespace {

constexpr int STREAM_THREADS = 256;
constexpr int STREAM_MAX_SLOTS = 64;

// Block b streams bytes [b per_block, (b + 1) per_block) of src through `slots` slots of `slot`
// bytes: thread 0 keeps every slot's bulk copy in flight and refills a slot as soon as the block
// has read it (every thread sums one float of each 16 bytes, so the data is used).
__global__ void __launch_bounds__(STREAM_THREADS, 1)
    stream_kernel(const char* src, uint32_t per_block, uint32_t slot, uint32_t slots, float* sink) {
    extern __shared__ float4 stream_smem4[];
    __shared__ uint64_t bars[STREAM_MAX_SLOTS];
    char* ring = reinterpret_cast<char*>(stream_smem4);
    const uint32_t chunks = per_block / slot;
    const auto issue = [&](uint32_t c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const uint32_t bar = smem_address(&bars[c % slots]);
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(slot) : "memory");
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         smem_address(ring + (c % slots) * slot)),
                     "l"(src + size_t(blockIdx.x) * per_block + size_t(c) * slot), "r"(slot), "r"(bar)
                     : "memory");
#else
        (void)c, (void)src;
        __trap();
#endif
    };
    if (threadIdx.x == 0) {
        for (uint32_t i = 0; i < slots; ++i) mbar_init(&bars[i], 1);
        for (uint32_t c = 0; c < slots && c < chunks; ++c) issue(c);
    }
    __syncthreads();
    float acc = 0.0f;
    for (uint32_t c = 0; c < chunks; ++c) {
        mbar_wait(&bars[c % slots], (c / slots) & 1u, false);
        const float4* piece = reinterpret_cast<const float4*>(ring + (c % slots) * slot);
        for (uint32_t i = threadIdx.x; i < slot / 16; i += STREAM_THREADS) acc += piece[i].x;
        __syncthreads();
        if (threadIdx.x == 0 && c + slots < chunks) issue(c + slots);
    }
    sink[blockIdx.x * STREAM_THREADS + threadIdx.x] = acc;
}

}  // namespace

int lab_stream(int device) {
    qtts::cuda::GpuContext ctx(device);
    int sms = 0, optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    const uint32_t per_block = 4u << 20;  // 4 MiB a block: ~0.55 GB over 132 SMs
    qtts::cuda::DeviceArray<char> src{size_t(per_block) * sms};
    CUDA_CHECK(cudaMemset(src.get(), 1, src.bytes()));
    qtts::cuda::DeviceArray<float> sink{size_t(sms) * STREAM_THREADS};
    std::printf("qtts-kernel-lab stream: device %d (%s), %d blocks (one per SM), %u KiB a block\n", device,
                ctx.device_name().c_str(), sms, per_block >> 10);
    std::printf("  %8s %6s %10s %10s %10s\n", "slot", "slots", "in flight", "us", "GB/s");
    const uint32_t slot_sizes[] = {4096, 8192, 16384, 32768, 65536};
    const uint32_t slot_counts[] = {2, 4, 8, 16, 32, 48};
    for (uint32_t slot : slot_sizes) {
        for (uint32_t slots : slot_counts) {
            const size_t smem = size_t(slot) * slots;
            if (slots > uint32_t(STREAM_MAX_SLOTS) || smem + 1024 > size_t(optin)) continue;
            CUDA_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
            const auto launch = [&] {
                stream_kernel<<<sms, STREAM_THREADS, smem, ctx.stream()>>>(src.get(), per_block, slot, slots,
                                                                           sink.get());
                CUDA_CHECK(cudaGetLastError());
            };
            for (int i = 0; i < 2; ++i) launch();
            const double ms = qtts::cuda::time_on_stream(ctx.stream(), 10, launch);
            std::printf("  %8u %6u %8zu K %10.1f %10.0f\n", slot, slots, smem >> 10, ms * 1e3,
                        double(per_block) * sms / (ms * 1e6));
        }
    }
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    return 0;
}

}  // namespace qtts::kernel_lab
