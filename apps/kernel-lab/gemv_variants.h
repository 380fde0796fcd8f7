// Gemv variants of the kernel lab (apps/kernel-lab/gemv_variants.cu): the shipped kernel and the
// ones kept for measurement, behind one launcher.
#pragma once

#include "kernels/gemv.cuh"

namespace qtts::kernel_lab {

enum class GemvVariant {
    GEMV_VARIANT_VEC1,
    GEMV_VARIANT_VEC,
    GEMV_VARIANT_SMEM,
    GEMV_VARIANT_ROWS2,
    GEMV_VARIANT_TURNS
};

constexpr GemvVariant GEMV_VARIANTS[] = {GemvVariant::GEMV_VARIANT_VEC1, GemvVariant::GEMV_VARIANT_VEC,
                                         GemvVariant::GEMV_VARIANT_SMEM, GemvVariant::GEMV_VARIANT_ROWS2,
                                         GemvVariant::GEMV_VARIANT_TURNS};

// Same arguments and results as kernels::gemv; throws kernels::KernelError.
void gemv_variant(GemvVariant variant, const kernels::GemvArgs& args, const kernels::Launch& launch);
// Whether the variant takes these arguments (rows2 and turns: one input row).
bool gemv_variant_supports(GemvVariant variant, const kernels::GemvArgs& args);
// Whether the variant must give the shipped kernel's bits (rows2, turns: each row in vec1's order).
bool gemv_variant_exact(GemvVariant variant);
const char* gemv_variant_name(GemvVariant variant);

}  // namespace qtts::kernel_lab
