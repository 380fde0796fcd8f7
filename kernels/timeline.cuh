// Kernel timeline: when each kernel of a graph was released, in profiling builds only.
//
// What: in a build configured with -DQTTS_KERNEL_TIMELINE=ON, block (0, 0, 0) of every kernel
// that calls pdl_wait() records, in a ring of device memory the host attaches
// (timeline_attach), when its first thread reached the wait (`entry`), when the wait let it go
// (`release`) and up to TIMELINE_MARKS moments the kernel names itself (timeline_mark: the end of
// block 0's work and some phases in the decode kernels). The record's `file` is
// timeline_file_id() of the calling source file's name and `line` the line of its pdl_wait().
// Why: with programmatic dependent launch the kernels of a frame overlap, so a kernel's time
// alone is not what it costs the chain; the release of the next kernel minus its own is. The
// kernel lab's `timeline` mode reads the ring after graph replays (docs/cuda.md, "Kernel lab").
// Which thread: the host functions run on the thread that owns the context, between replays,
// never while a kernel that records is in flight.
// Cost: one atomic on the ring's counter by one thread before the wait (its latency overlaps the
// wait), two reads of %globaltimer and one 72-byte store a launch. An ordinary build compiles
// none of it: pdl_wait() is the bare instruction, timeline_mark() nothing, and timeline_attach()
// refuses.
// Block records (optional, TimelineRing::blocks): the first thread of every block of every launch
// records the same moments for its block, with the launch's %gridid (which the launch record
// carries too; a graph node keeps it from replay to replay, so the reader also matches by time)
// and the block's SM: when a launch's last blocks arrived and finished, which block 0 alone
// cannot tell. It costs every block an atomic on one counter after its wait, so the lab takes
// these in a pass of their own and reads the launch costs from a pass without.
#pragma once

#include <cstdint>

namespace qtts::kernels {

constexpr int TIMELINE_MARKS = 4;

struct TimelineRecord {
    uint32_t file = 0;     // timeline_file_id() of the source file of the kernel's pdl_wait()
    uint32_t line = 0;     // its line
    uint32_t blocks = 0;   // the launch's grid, all dimensions
    uint32_t threads = 0;  // threads a block
    uint64_t entry = 0;    // %globaltimer (ns) when block 0 reached the wait
    uint64_t release = 0;  // ... when the wait returned
    uint64_t mark[TIMELINE_MARKS] = {};  // timeline_mark(i); 0: not set
    uint64_t grid = 0;     // %gridid of the launch (the key of its block records)
};

// One block of a launch (TimelineRing::blocks): the moments of its first thread.
struct TimelineBlockRecord {
    uint64_t grid = 0;     // %gridid of the launch
    uint32_t block = 0;    // linear block index
    uint32_t sm = 0;       // %smid it ran on
    uint64_t entry = 0;    // %globaltimer (ns) when the block reached the wait
    uint64_t release = 0;  // ... when the wait returned
    uint64_t mark[TIMELINE_MARKS] = {};  // timeline_mark(i) by the block's first thread; 0: not set
};

// records[capacity] and the counter of records taken (device memory, zeroed by the host); a
// launch past the capacity records nothing. The same for blocks[block_capacity] (null: no block
// records).
struct TimelineRing {
    TimelineRecord* records = nullptr;
    uint32_t* next = nullptr;
    uint32_t capacity = 0;
    TimelineBlockRecord* blocks = nullptr;
    uint32_t* blocks_next = nullptr;
    uint32_t block_capacity = 0;
};

// Whether this build records (QTTS_KERNEL_TIMELINE).
bool timeline_built();
// Hands `ring` to the kernels of every kernel source file; a default ring stops the recording.
// Fails (check_fail) in a build without the timeline.
void timeline_attach(const TimelineRing& ring);
// Timeline builds: each kernel source file registers how its copy of the ring is set.
int timeline_register(void (*set)(const TimelineRing&));

// FNV-1a hash of the last component of `path` (the record's `file` for __FILE__).
constexpr uint32_t timeline_file_id(const char* path) {
    const char* name = path;
    for (const char* p = path; *p; ++p)
        if (*p == '/') name = p + 1;
    uint32_t h = 2166136261u;
    for (; *name; ++name) h = (h ^ uint32_t(uint8_t(*name))) * 16777619u;
    return h;
}

}  // namespace qtts::kernels

// The device part builds on pdl_wait(): kernels/common.cuh includes this header right after it,
// and a file that includes this header first gets it through common.cuh here.
#ifdef __CUDACC__
#ifdef QTTS_KERNEL_TIMELINE

#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/common.cuh"

namespace qtts::kernels {
namespace {

// Each kernel source file (no relocatable device code) has its own copy of the ring and of the
// sequence number block 0 took, and registers its setter when the program starts.
__device__ TimelineRing timeline_ring;
__shared__ uint32_t timeline_seq;        // block 0: its launch record
__shared__ uint32_t timeline_block_seq;  // every block: its block record

void timeline_ring_set(const TimelineRing& ring) {
    KERNEL_CUDA_CHECK(cudaMemcpyToSymbol(timeline_ring, &ring, sizeof ring));
}
[[maybe_unused]] const int timeline_registered = timeline_register(&timeline_ring_set);

__device__ __forceinline__ uint64_t timeline_now() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ uint64_t timeline_grid() {
    uint64_t g;
    asm volatile("mov.u64 %0, %%gridid;" : "=l"(g));
    return g;
}

__device__ __forceinline__ uint32_t timeline_sm() {
    uint32_t s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

constexpr uint32_t TIMELINE_NONE = 0xffffffffu;  // no record taken

__device__ __forceinline__ bool timeline_first_thread() { return (threadIdx.x | threadIdx.y | threadIdx.z) == 0; }

__device__ __forceinline__ bool timeline_recorder() {
    return timeline_first_thread() && (blockIdx.x | blockIdx.y | blockIdx.z) == 0;
}

// pdl_wait() in a timeline build: the wait between the stamps of each block's first thread;
// block 0 writes the launch record (its slot taken before the wait, as before the block records
// came), every block its block record when the ring has them (its slot taken after the wait, so
// that a pass without them costs the other blocks one load of the ring, two timer reads and a
// shared store).
__device__ __forceinline__ void timeline_wait(uint32_t file, uint32_t line) {
    if (!timeline_first_thread()) {
        pdl_wait();
        return;
    }
    const TimelineRing ring = timeline_ring;  // one load: the launch fields used before the wait, the blocks' after
    uint32_t seq = TIMELINE_NONE;
    const uint64_t entry = timeline_now();
    if (timeline_recorder()) {
        if (ring.records) seq = atomicAdd(ring.next, 1u);
        seq = seq < ring.capacity ? seq : TIMELINE_NONE;
        timeline_seq = seq;
    }
    pdl_wait();
    const uint64_t release = timeline_now();
    uint32_t block_seq = TIMELINE_NONE;
    if (ring.blocks) {
        block_seq = atomicAdd(ring.blocks_next, 1u);
        block_seq = block_seq < ring.block_capacity ? block_seq : TIMELINE_NONE;
    }
    timeline_block_seq = block_seq;
    if (seq == TIMELINE_NONE && block_seq == TIMELINE_NONE) return;
    const uint64_t grid = timeline_grid();
    if (seq != TIMELINE_NONE) {
        TimelineRecord r;
        r.file = file;
        r.line = line;
        r.blocks = gridDim.x * gridDim.y * gridDim.z;
        r.threads = blockDim.x * blockDim.y * blockDim.z;
        r.entry = entry;
        r.release = release;
        r.grid = grid;
        ring.records[seq] = r;
    }
    if (block_seq != TIMELINE_NONE) {
        TimelineBlockRecord b;
        b.grid = grid;
        b.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
        b.sm = timeline_sm();
        b.entry = entry;
        b.release = release;
        ring.blocks[block_seq] = b;
    }
}

// Moment `i` of a block (called by its first thread; others and untracked launches skip it):
// into the launch record (block 0) and the block's record.
__device__ __forceinline__ void timeline_mark(int i) {
    if (!timeline_first_thread()) return;
    const bool launch = timeline_recorder() && timeline_seq != TIMELINE_NONE;
    const bool block = timeline_block_seq != TIMELINE_NONE;
    if (!launch && !block) return;
    const uint64_t now = timeline_now();
    if (launch) timeline_ring.records[timeline_seq].mark[i] = now;
    if (block) timeline_ring.blocks[timeline_block_seq].mark[i] = now;
}

}  // namespace
}  // namespace qtts::kernels

#define pdl_wait()                                                                                                   \
    timeline_wait(std::integral_constant<uint32_t, ::qtts::kernels::timeline_file_id(__FILE__)>::value, __LINE__)

#else  // ordinary builds

namespace qtts::kernels {
__device__ __forceinline__ void timeline_mark(int) {}
}  // namespace qtts::kernels

#endif  // QTTS_KERNEL_TIMELINE
#endif  // __CUDACC__
