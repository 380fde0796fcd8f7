#include "kernels/gemv.cuh"

#include <atomic>

#include "kernels/check.cuh"
#include "kernels/gemv_device.cuh"

namespace qtts::kernels {

namespace {

template <int NB, int NMAT, bool DB>
void gemv_launch_as(const GemvArgs& a, const Launch& l, bool prefetch_rest) {
    const dim3 grid((a.out + GEMV_WARPS - 1) / GEMV_WARPS, (a.rows + NB - 1) / NB);
    const size_t smem = size_t(NB) * size_t(a.in) * sizeof(float);
    static std::atomic<uint64_t> raised{0};
    smem_limit_raise(gemv_vec_kernel<NB, NMAT, DB>, smem, raised);
    KERNEL_CUDA_CHECK(
        launch_kernel(l, grid, dim3(GEMV_THREADS), smem, gemv_vec_kernel<NB, NMAT, DB>, a, prefetch_rest));
}

// A one-row launch whose rows take three chunks or more and are not prefetched (the 1.7B
// talker's down product: 6144 inputs, 16 MiB ahead) double-buffers its chunks, so that each
// chunk's loads are in flight while the one before is summed ("Forty-sixth session": the talker
// step -0.8%). Its 256 blocks fit two an SM, within the double-buffered kernel's three.
template <int NB, int NMAT>
void gemv_launch(const GemvArgs& a, const Launch& l) {
    const bool prefetch_rest = gemv_prefetches_rest<NMAT>(a);
    if constexpr (NB == 1) {
        if (!prefetch_rest && gemv_chunks<NMAT>(a) >= 3) {
            gemv_launch_as<NB, NMAT, true>(a, l, false);
            return;
        }
    }
    gemv_launch_as<NB, NMAT, false>(a, l, prefetch_rest);
}

// Rows per block: as many as the launch has (up to 8), fewer when their inputs would not fit in
// the device's shared memory (8 rows over 6144 inputs need 192 KiB: sm_90 only). Every row is
// computed exactly as in a one-row launch, so the choice changes no result.
template <int NMAT>
void gemv_dispatch(const GemvArgs& a, const Launch& l) {
    int nb = a.rows <= 1 ? 1 : a.rows <= 2 ? 2 : a.rows <= 4 ? 4 : 8;
    while (nb > 1 && !smem_fits(size_t(nb) * size_t(a.in) * sizeof(float))) nb /= 2;
    if (nb == 1)
        gemv_launch<1, NMAT>(a, l);
    else if (nb == 2)
        gemv_launch<2, NMAT>(a, l);
    else if (nb == 4)
        gemv_launch<4, NMAT>(a, l);
    else
        gemv_launch<8, NMAT>(a, l);
}

}  // namespace

void gemv(const GemvArgs& a, const Launch& l) {
    if (a.rows < 1 || a.rows > GEMV_MAX_BATCH_ROWS || a.in <= 0 || a.in % 8 != 0 || a.out <= 0 || !a.w || !a.y ||
        (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU && !a.w2) ||
        (a.input == GemvInput::GEMV_INPUT_GATHER && (!a.table || !a.index)) ||
        (a.input != GemvInput::GEMV_INPUT_GATHER && !a.x) || (a.input == GemvInput::GEMV_INPUT_RMSNORM && !a.norm_w))
        check_fail("gemv", "invalid arguments (rows 1..256, in a positive multiple of 8, pointers set)", __func__,
                   __FILE__, __LINE__);
    if (a.output == GemvOutput::GEMV_OUTPUT_SWIGLU)
        gemv_dispatch<2>(a, l);
    else
        gemv_dispatch<1>(a, l);
}

}  // namespace qtts::kernels
