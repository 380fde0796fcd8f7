// The split path's GEMMs (engine/cuda/gpu_lm_launch.h: split_gemm) timed against cuBLASLt
// algorithms chosen by measurement (docs/cuda.md, "Kernel lab").
//
// Why: past `skinny_max_rows` the batched step's products are a bf16 hi/lo split, one cuBLAS GEMM
// over 2 x rows columns and a combine; at 32-64 rows those GEMMs took ~4 ms of a 6.9 ms step
// (ncu, 64 rows) at 0.6-1.6 TB/s. cublasGemmEx takes cuBLAS's first heuristic; this mode asks
// cuBLASLt for every algorithm it proposes for the shape (and split-K variants of each), checks
// each against cublasGemmEx's result and for run-to-run equality, and times them the way the
// step runs them (a graph of back-to-back launches over the layers' weights).
#pragma once

#include <string>
#include <vector>

namespace qtts::kernel_lab {

// Returns 0, or 1 when an algorithm's result disagrees with cublasGemmEx's beyond fp32
// reordering (it is then reported and left out of the choice).
int lab_gemm(const std::string& model, const std::vector<int>& rows, int device);

// The batched step's products at each row count (up to 64) on the split path (what the step runs
// past skinny_max_rows: rmsnorm_split_bf16 + cublasGemmEx + combine) against the lab's one-launch
// wide product (wide_product.h) and, up to 32 rows, the shipped one-launch kernel; the wide
// product is checked against the split path (every output) and a CPU fp64 sum (48 outputs).
// Returns 0, or 1 when it disagrees.
int lab_wide(const std::string& model, const std::vector<int>& rows, int device);

// The split path's GEMMs (cublasGemmEx, what the step calls) against the lab's rows_gemm
// (rows_gemm.h) in several block shapes, each checked against cublasGemmEx and for run-to-run
// equality. Returns 0, or 1 when rows_gemm disagrees.
int lab_rows(const std::string& model, const std::vector<int>& rows, int device);

}  // namespace qtts::kernel_lab
