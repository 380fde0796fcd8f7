// The kernel lab's `timeline` mode (apps/kernel-lab/timeline_lab.cu): where a frame's time goes
// inside the chain, from the stamps a profiling build's kernels record (kernels/timeline.cuh).
#pragma once

#include <cstdint>
#include <string>

namespace qtts::kernel_lab {

// Replays the product's one-frame graph (GpuLm::frame_step_enqueue) `frames` times on the
// checkpoint with the ring attached and prints, for every launch of a frame, its median cost in
// the chain (the next launch's release minus its own), how long block 0 waited resident, and
// block 0's marks; then the same summed by kernel and grid. Also the frame time with the ring
// attached and detached, and the timer's resolution. Returns 2 in a build without the timeline.
int lab_timeline(const std::string& model, int device, int frames, uint64_t seed);

}  // namespace qtts::kernel_lab
