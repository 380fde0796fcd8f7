// The kernel lab's `stream` mode: how fast one block per SM streams global memory into a ring of
// shared-memory slots by bulk copies, for slot sizes 4-64 KiB and 2-48 slots in flight. It asks
// why the persistent predictor's weight ring (persistent_pass.h) reached only ~2 TB/s, with a
// cost per slot fill (docs/performance.md, "Forty-first session").
#pragma once

namespace qtts::kernel_lab {

// Prints the time and GB/s of each ring shape; returns 0.
int lab_stream(int device);

}  // namespace qtts::kernel_lab
