#include "kernels/batch.cuh"

#include <algorithm>

#include "kernels/check.cuh"

namespace qtts::kernels {

namespace {

constexpr int BATCH_THREADS = 256;

// grid: rows. Block r copies row r's codes and hidden vector.
__global__ void __launch_bounds__(BATCH_THREADS)
    slots_load_kernel(const StreamSlot* slots, int dim, int32_t* batch_codes, float* hidden_rows) {
    const int r = blockIdx.x;
    const StreamSlot slot = slots[r];  // written by the host before the step: read before the wait
    pdl_wait();
    pdl_trigger();
    if (threadIdx.x < SAMPLE_MAX_GROUPS)
        batch_codes[size_t(r) * SAMPLE_MAX_GROUPS + threadIdx.x] = slot.state ? slot.state->current[threadIdx.x] : 0;
    float* dst = hidden_rows + size_t(r) * dim;
    for (int i = threadIdx.x; i < dim; i += BATCH_THREADS) dst[i] = slot.hidden ? slot.hidden[i] : 0.0f;
}

// grid: rows. Stopped streams keep the output of their last real step.
__global__ void __launch_bounds__(BATCH_THREADS)
    slots_store_hidden_kernel(const StreamSlot* slots, int dim, const float* hidden_rows) {
    const int r = blockIdx.x;
    const StreamSlot slot = slots[r];  // written by the host before the step: read before the wait
    pdl_wait();
    pdl_trigger();
    if (!slot.state || !slot.hidden || slot.state->stopped) return;
    const float* src = hidden_rows + size_t(r) * dim;
    for (int i = threadIdx.x; i < dim; i += BATCH_THREADS) slot.hidden[i] = src[i];
}

}  // namespace

void slots_load(const StreamSlot* slots, int rows, int dim, int32_t* batch_codes, float* hidden_rows,
                const Launch& l) {
    if (!slots || rows < 1 || dim < 1 || !batch_codes || !hidden_rows)
        check_fail("slots_load", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(
        launch_kernel(l, dim3(rows), dim3(BATCH_THREADS), 0, slots_load_kernel, slots, dim, batch_codes, hidden_rows));
}

void slots_store_hidden(const StreamSlot* slots, int rows, int dim, const float* hidden_rows, const Launch& l) {
    if (!slots || rows < 1 || dim < 1 || !hidden_rows)
        check_fail("slots_store_hidden", "invalid arguments", __func__, __FILE__, __LINE__);
    KERNEL_CUDA_CHECK(
        launch_kernel(l, dim3(rows), dim3(BATCH_THREADS), 0, slots_store_hidden_kernel, slots, dim, hidden_rows));
}

}  // namespace qtts::kernels
