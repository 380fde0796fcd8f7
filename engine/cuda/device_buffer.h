// Owning device and pinned-host allocations (RAII). Everything the real-time path touches is
// allocated once, before any graph capture (graph rule 14), through these types. Device
// allocations are counted per device (engine/common/device.h, gpu_memory_use), so that what qtts
// holds and its peak can be reported and held against --gpu-memory-limit.
#pragma once

#include <cstddef>
#include <utility>

#include <cuda_runtime_api.h>

#include "engine/common/device.h"
#include "engine/cuda/cuda_check.h"

namespace qtts::cuda {

// cudaMalloc'd bytes on the current device. Not copyable; movable.
class DeviceBuffer {
public:
    DeviceBuffer() = default;
    explicit DeviceBuffer(size_t bytes) { allocate(bytes); }
    ~DeviceBuffer() { release(); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    DeviceBuffer(DeviceBuffer&& o) noexcept
        : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), device_(o.device_) {}
    DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
        if (this != &o) {
            release();
            ptr_ = std::exchange(o.ptr_, nullptr);
            bytes_ = std::exchange(o.bytes_, 0);
            device_ = o.device_;
        }
        return *this;
    }

    void allocate(size_t bytes) {
        release();
        if (bytes == 0) return;
        CUDA_CHECK(cudaGetDevice(&device_));
        CUDA_CHECK(cudaMalloc(&ptr_, bytes));
        bytes_ = bytes;
        gpu_memory_allocated(device_, bytes_);
    }
    void release() noexcept {
        if (ptr_) {
            cudaFree(ptr_);
            gpu_memory_released(device_, bytes_);
        }
        ptr_ = nullptr;
        bytes_ = 0;
    }

    void* get() const { return ptr_; }
    size_t bytes() const { return bytes_; }
    template <typename T>
    T* as() const {
        return static_cast<T*>(ptr_);
    }

private:
    void* ptr_ = nullptr;
    size_t bytes_ = 0;
    int device_ = 0;  // where ptr_ lives (the accounting's key)
};

// A typed device array.
template <typename T>
class DeviceArray {
public:
    DeviceArray() = default;
    explicit DeviceArray(size_t count) : buffer_(count * sizeof(T)), count_(count) {}
    T* get() const { return buffer_.as<T>(); }
    size_t size() const { return count_; }
    size_t bytes() const { return buffer_.bytes(); }

private:
    DeviceBuffer buffer_;
    size_t count_ = 0;
};

// Page-locked host memory (for asynchronous copies).
template <typename T>
class PinnedArray {
public:
    PinnedArray() = default;
    explicit PinnedArray(size_t count) {
        if (count) CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&ptr_), count * sizeof(T)));
        count_ = count;
    }
    ~PinnedArray() {
        if (ptr_) cudaFreeHost(ptr_);
    }
    PinnedArray(const PinnedArray&) = delete;
    PinnedArray& operator=(const PinnedArray&) = delete;
    PinnedArray(PinnedArray&& o) noexcept : ptr_(std::exchange(o.ptr_, nullptr)), count_(std::exchange(o.count_, 0)) {}
    PinnedArray& operator=(PinnedArray&& o) noexcept {
        if (this != &o) {
            if (ptr_) cudaFreeHost(ptr_);
            ptr_ = std::exchange(o.ptr_, nullptr);
            count_ = std::exchange(o.count_, 0);
        }
        return *this;
    }
    T* get() const { return ptr_; }
    T& operator[](size_t i) const { return ptr_[i]; }
    size_t size() const { return count_; }
    // Room for at least `count` values: a new (uninitialised) allocation when it has less. The
    // caller makes sure no copy still reads or writes the old one.
    void ensure(size_t count) {
        if (count > count_) *this = PinnedArray(count);
    }

private:
    T* ptr_ = nullptr;
    size_t count_ = 0;
};

// A CUDA event without timing, for "has the work enqueued before this point finished?" on one
// stream: e.g. a pinned staging buffer may be refilled once the copy that reads it is done,
// without waiting for everything else on the stream (cudaStreamSynchronize). Not copyable.
class StreamMark {
public:
    StreamMark() { CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
    ~StreamMark() { cudaEventDestroy(event_); }
    StreamMark(const StreamMark&) = delete;
    StreamMark& operator=(const StreamMark&) = delete;

    void record(cudaStream_t stream) { CUDA_CHECK(cudaEventRecord(event_, stream)); }
    // Under stream capture: an event-record node in the graph, so that each replay records the
    // event when the work captured before it is done (the host can wait for part of a replay).
    void record_node(cudaStream_t stream) { CUDA_CHECK(cudaEventRecordWithFlags(event_, stream, cudaEventRecordExternal)); }
    // Blocks until the work enqueued before the last record() is done (at once when never recorded).
    void wait() const { CUDA_CHECK(cudaEventSynchronize(event_)); }

private:
    cudaEvent_t event_ = nullptr;
};

}  // namespace qtts::cuda
