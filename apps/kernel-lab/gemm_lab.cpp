// qtts-kernel-lab gemm and wide: the split path's GEMMs against cuBLASLt algorithms picked by
// measurement, and the split path's products against the lab's one-launch wide product
// (gemm_lab.h).
#include "apps/kernel-lab/gemm_lab.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "engine/common/error.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/event_timer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_context.h"
#include "apps/kernel-lab/rows_gemm.h"
#include "apps/kernel-lab/wide_product.h"
#include "apps/qtts/bench_stats.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "engine/model/weights.h"
#include "kernels/skinny.cuh"

namespace qtts::kernel_lab {
namespace {

namespace qc = qtts::cuda;
using qc::bf16_t;

// One product shape of the batched step: W [out, in] of every layer (or head) that has it, and
// how many launches of it a frame makes.
struct GemmShape {
    std::string name;
    int out = 0, in = 0;
    std::vector<const bf16_t*> weights;
    int per_frame = 0;
};

std::vector<GemmShape> step_shapes(const qc::GpuLmWeights& w) {
    std::vector<GemmShape> shapes;
    const int passes = w.num_code_groups - 1;  // predictor passes per frame (the first has 2 positions)
    for (int s = 0; s < 2; ++s) {
        const qc::GpuStack& S = s == 0 ? w.talker : w.predictor;
        const std::string who = s == 0 ? "talker " : "predictor ";
        const int per_layer = s == 0 ? 1 : passes;
        GemmShape qkv{who + "qkv", S.qkv_dim(), S.hidden, {}, 0};
        GemmShape o{who + "o", S.hidden, S.q_dim(), {}, 0};
        GemmShape gate_up{who + "gate/up", 2 * S.intermediate, S.hidden, {}, 0};
        GemmShape down{who + "down", S.hidden, S.intermediate, {}, 0};
        for (const auto& L : S.layers) {
            qkv.weights.push_back(L.qkv);
            o.weights.push_back(L.o);
            gate_up.weights.push_back(L.gate_up);
            down.weights.push_back(L.down);
        }
        for (GemmShape* g : {&qkv, &o, &gate_up, &down}) {
            g->per_frame = per_layer * int(S.layers.size());
            shapes.push_back(*g);
        }
    }
    shapes.push_back({"codec head", w.codec_vocab, w.talker.hidden, {w.codec_head}, 1});
    shapes.push_back({"predictor lm_head", w.predictor_vocab, w.predictor.hidden, w.predictor_head, passes});
    if (w.predictor_proj_w)
        shapes.push_back({"predictor input projection", w.predictor.hidden, w.talker.hidden, {w.predictor_proj_w}, passes});
    return shapes;
}

// A cuBLASLt descriptor set for y [n, out] = xb [n, in] · W[out, in]^T, row-major (column-major:
// y^T = W^T(op T) · xb^T), as split_gemm passes it to cublasGemmEx.
struct LtProblem {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    LtProblem(int out, int in, int n) {
        CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
        const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a, CUDA_R_16BF, in, out, in));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, in, n, in));
        CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&c, CUDA_R_32F, out, n, out));
    }
    ~LtProblem() {
        cublasLtMatrixLayoutDestroy(c);
        cublasLtMatrixLayoutDestroy(b);
        cublasLtMatrixLayoutDestroy(a);
        cublasLtMatmulDescDestroy(op);
    }
    LtProblem(const LtProblem&) = delete;
    LtProblem& operator=(const LtProblem&) = delete;
};

struct Candidate {
    cublasLtMatmulAlgo_t algo{};
    size_t workspace = 0;
};

uint32_t algo_attr(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
    uint32_t v = 0;
    size_t written = 0;
    if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) != CUBLAS_STATUS_SUCCESS) return 0;
    return v;
}

std::string algo_name(const cublasLtMatmulAlgo_t& algo) {
    char buf[128];
    std::snprintf(buf, sizeof buf, "id %u tile %u stages %u split-K %u red %u cluster %u",
                  algo_attr(algo, CUBLASLT_ALGO_CONFIG_ID), algo_attr(algo, CUBLASLT_ALGO_CONFIG_TILE_ID),
                  algo_attr(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), algo_attr(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM),
                  algo_attr(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME),
                  algo_attr(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
    return buf;
}

// The heuristic's proposals (at most 16), and of its first four a split-K variant per split
// count it accepts (reductions in the workspace or in place: both are ordered, so results repeat
// run to run, which the lab checks): at most 48 candidates, ~1 s of checks and timing a shape.
// `align_a`: the alignment every W pointer of the shape has (the heuristic otherwise assumes
// 256 bytes and may propose algorithms that refuse the layers' weights).
std::vector<Candidate> candidates(cublasLtHandle_t lt, const LtProblem& p, size_t workspace_cap, uint32_t align_a) {
    cublasLtMatmulPreference_t pref = nullptr;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_cap,
                                                      sizeof(workspace_cap)));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a,
                                                      sizeof(align_a)));
    std::vector<cublasLtMatmulHeuristicResult_t> found(16);
    int count = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(lt, p.op, p.a, p.b, p.c, p.c, pref, int(found.size()), found.data(), &count);
    cublasLtMatmulPreferenceDestroy(pref);
    std::vector<Candidate> out;
    if (st != CUBLAS_STATUS_SUCCESS) return out;
    auto known = [&](const cublasLtMatmulAlgo_t& a) {
        return std::any_of(out.begin(), out.end(),
                           [&](const Candidate& c) { return std::memcmp(&c.algo, &a, sizeof(a)) == 0; });
    };
    for (int i = 0; i < count; ++i) {
        if (found[size_t(i)].state != CUBLAS_STATUS_SUCCESS) continue;
        if (!known(found[size_t(i)].algo)) out.push_back({found[size_t(i)].algo, found[size_t(i)].workspaceSize});
        if (i >= 4) continue;
        for (const uint32_t splits : {2u, 4u, 8u, 16u}) {
            for (const uint32_t scheme : {uint32_t(CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
                                          uint32_t(CUBLASLT_REDUCTION_SCHEME_INPLACE)}) {
                cublasLtMatmulAlgo_t a = found[size_t(i)].algo;
                if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits, sizeof(splits)) !=
                        CUBLAS_STATUS_SUCCESS ||
                    cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme,
                                                         sizeof(scheme)) != CUBLAS_STATUS_SUCCESS)
                    continue;
                cublasLtMatmulHeuristicResult_t check{};
                if (cublasLtMatmulAlgoCheck(lt, p.op, p.a, p.b, p.c, p.c, &a, &check) != CUBLAS_STATUS_SUCCESS ||
                    check.workspaceSize > workspace_cap || known(a))
                    continue;
                out.push_back({a, check.workspaceSize});
            }
        }
    }
    return out;
}

// A graph of `launches` back-to-back products, launch i on weights[i % weights.size()] (so the
// weights stream from memory as in the step, where the layers follow each other), replayed;
// microseconds per launch, or a negative value when the launches cannot be captured.
double graph_us(qc::GpuContext& ctx, int launches, const std::function<void(int)>& launch) {
    cudaGraph_t graph = nullptr;
    try {
        graph = qc::stream_capture(ctx.stream(), [&] {
            for (int i = 0; i < launches; ++i) launch(i);
        });
    } catch (const std::exception&) {
        cudaGetLastError();
        return -1.0;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
        cudaGetLastError();
        return -1.0;
    }
    CUDA_CHECK(cudaGraphLaunch(exec, ctx.stream()));
    std::vector<double> ms;
    for (int r = 0; r < 5; ++r)
        ms.push_back(qc::time_on_stream(ctx.stream(), 1, [&] { CUDA_CHECK(cudaGraphLaunch(exec, ctx.stream())); }));
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    return qtts_cli::bench_median(ms) * 1e3 / launches;
}

std::vector<float> download(const qc::DeviceArray<float>& d, size_t n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * 4, cudaMemcpyDeviceToHost));
    return h;
}

// x rows [rows, in] uniform in (-2, 2), split as the step splits them: bf16 hi rows, then the lo
// rows (x - hi): [2 rows, in].
std::vector<uint16_t> split_rows_random(int rows, int in) {
    std::mt19937 rng(20261202);
    std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
    std::vector<uint16_t> xb(size_t(2 * rows) * size_t(in));
    auto to_bf16 = [](float f) {
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    };
    auto from_bf16 = [](uint16_t b) {
        const uint32_t u = uint32_t(b) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    };
    for (int r = 0; r < rows; ++r)
        for (int i = 0; i < in; ++i) {
            const float x = uni(rng);
            const uint16_t hi = to_bf16(x);
            xb[size_t(r) * in + i] = hi;
            xb[size_t(rows + r) * in + i] = to_bf16(x - from_bf16(hi));
        }
    return xb;
}

// What the gemm and rows modes share: the split rows for the most rows asked (split_rows_random,
// on the device) and three outputs for the widest product.
struct GemmBuffers {
    int most_n = 0;  // 2 x the most rows
    qc::DeviceArray<uint16_t> xb;
    qc::DeviceArray<float> y_ref, y_a, y_b;
    const bf16_t* rows() const { return reinterpret_cast<const bf16_t*>(xb.get()); }
    GemmBuffers(const std::vector<GemmShape>& shapes, const std::vector<int>& rows_list) {
        int widest_in = 0, widest_out = 0, most_rows = 0;
        for (const GemmShape& g : shapes) {
            widest_in = std::max(widest_in, g.in);
            widest_out = std::max(widest_out, g.out);
        }
        for (const int r : rows_list) most_rows = std::max(most_rows, r);
        most_n = 2 * most_rows;
        const std::vector<uint16_t> host = split_rows_random(most_rows, widest_in);
        xb = qc::DeviceArray<uint16_t>(host.size());
        CUDA_CHECK(cudaMemcpy(xb.get(), host.data(), host.size() * 2, cudaMemcpyHostToDevice));
        const size_t y_floats = size_t(most_n) * widest_out;
        y_ref = qc::DeviceArray<float>(y_floats);
        y_a = qc::DeviceArray<float>(y_floats);
        y_b = qc::DeviceArray<float>(y_floats);
    }
};

// cublasGemmEx as split_gemm calls it: y [n, out] = xb [n, in] · W^T on the shape's i-th weights
// (cycling through them).
void gemm_ex(qc::GpuContext& ctx, const GemmShape& g, int n, const bf16_t* xb, int i, float* y) {
    const float one = 1.0f, zero = 0.0f;
    const bf16_t* w = g.weights[size_t(i) % g.weights.size()];
    CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, g.out, n, g.in, &one, w, CUDA_R_16BF, g.in, xb,
                              CUDA_R_16BF, g.in, &zero, y, CUDA_R_32F, g.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// A shape's reference: cublasGemmEx's result on the first weights (into `y_ref`, poisoned first),
// its largest magnitude, and cublasGemmEx's time per launch (into `y_time`).
struct GemmReference {
    std::vector<float> y;
    double max_abs = 0.0;
    double us = 0.0;
};
GemmReference gemm_reference(qc::GpuContext& ctx, const GemmShape& g, int n, const bf16_t* xb,
                             qc::DeviceArray<float>& y_ref, qc::DeviceArray<float>& y_time) {
    GemmReference r;
    CUDA_CHECK(cudaMemsetAsync(y_ref.get(), 0xff, y_ref.bytes(), ctx.stream()));
    gemm_ex(ctx, g, n, xb, 0, y_ref.get());
    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    r.y = download(y_ref, size_t(n) * g.out);
    for (float v : r.y) r.max_abs = std::max(r.max_abs, double(std::fabs(v)));
    r.us = graph_us(ctx, 64, [&](int i) { gemm_ex(ctx, g, n, xb, i, y_time.get()); });
    return r;
}

// A candidate's check: `run(y)` twice on outputs poisoned two ways, then its largest difference
// from the reference (relative to the reference's largest magnitude) and whether the two runs
// agree bitwise. `launched` false: a run threw (the candidate is left out).
struct GemmCheck {
    bool launched = false;
    double err = 0.0;
    bool repeats = false;
};
GemmCheck gemm_check(qc::GpuContext& ctx, const std::function<void(float*)>& run, const GemmReference& ref,
                     qc::DeviceArray<float>& y_a, qc::DeviceArray<float>& y_b) {
    GemmCheck c;
    CUDA_CHECK(cudaMemsetAsync(y_a.get(), 0xff, y_a.bytes(), ctx.stream()));
    CUDA_CHECK(cudaMemsetAsync(y_b.get(), 0x7f, y_b.bytes(), ctx.stream()));
    try {
        run(y_a.get());
        run(y_b.get());
        CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
    } catch (const std::exception&) {
        cudaGetLastError();
        return c;
    }
    c.launched = true;
    const size_t n = ref.y.size();
    const std::vector<float> a = download(y_a, n), b = download(y_b, n);
    for (size_t i = 0; i < n; ++i) {
        const double d = std::fabs(double(a[i]) - double(ref.y[i]));
        c.err = std::max(c.err, std::isfinite(d) ? d : 1e30);
    }
    c.err /= std::max(ref.max_abs, 1e-30);
    c.repeats = std::memcmp(a.data(), b.data(), n * 4) == 0;
    return c;
}

}  // namespace

int lab_gemm(const std::string& model, const std::vector<int>& rows_list, int device) {
    qc::GpuContext ctx(device);
    const auto weights = qc::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const std::vector<GemmShape> shapes = step_shapes(*weights);
    cublasLtHandle_t lt = nullptr;
    CUBLAS_CHECK(cublasLtCreate(&lt));
    const size_t workspace_cap = size_t(32) << 20;
    qc::DeviceArray<uint8_t> workspace(workspace_cap);

    GemmBuffers buffers(shapes, rows_list);

    std::printf("qtts-kernel-lab gemm: %s, device %d (%s); us per launch in graphs of 64 over the layers' weights\n",
                model.c_str(), device, ctx.device_name().c_str());
    std::printf("  %-28s %5s %9s %9s %7s %6s %10s  %s\n", "product", "rows", "GemmEx", "best Lt", "gain", "tried",
                "max |rel|", "best algorithm");
    int failures = 0;
    const float one = 1.0f, zero = 0.0f;
    for (const int rows : rows_list) {
        const int n = 2 * rows;
        double frame_default = 0.0, frame_best = 0.0;
        for (const GemmShape& g : shapes) {
            // The reference result: cublasGemmEx on the first weights, as the product runs today.
            const GemmReference ref = gemm_reference(ctx, g, n, buffers.rows(), buffers.y_ref, buffers.y_a);
            const double t_default = ref.us;

            uint32_t align_a = 256;
            for (const bf16_t* w : g.weights)
                while (reinterpret_cast<uintptr_t>(w) % align_a != 0) align_a /= 2;
            const LtProblem p(g.out, g.in, n);
            const std::vector<Candidate> cands = candidates(lt, p, workspace_cap, align_a);
            double t_best = -1.0, best_err = 0.0;
            std::string best_name = "-";
            int tried = 0;
            for (const Candidate& c : cands) {
                auto lt_run = [&](int i, float* y) {
                    const bf16_t* w = g.weights[size_t(i) % g.weights.size()];
                    CUBLAS_CHECK(cublasLtMatmul(lt, p.op, &one, w, p.a, buffers.rows(), p.b, &zero, y, p.c, y, p.c, &c.algo,
                                                workspace.get(), c.workspace, ctx.stream()));
                };
                // Checked twice on poisoned outputs: against cublasGemmEx, and run to run bitwise.
                const GemmCheck check = gemm_check(ctx, [&](float* y) { lt_run(0, y); }, ref, buffers.y_a, buffers.y_b);
                if (!check.launched) continue;
                ++tried;
                const double err = check.err;
                const bool repeats = check.repeats;
                // fp32 sums of the same bf16 products in another order: ~1e-6 of the largest value.
                if (err > 1e-4 || !repeats) {
                    std::printf("  %-28s %5d  MISMATCH %s: max |rel| %.2e, repeats bitwise: %s\n", g.name.c_str(), rows,
                                algo_name(c.algo).c_str(), err, repeats ? "yes" : "no");
                    ++failures;
                    continue;
                }
                const double t = graph_us(ctx, 64, [&](int i) { lt_run(i, buffers.y_a.get()); });
                if (t > 0.0 && (t_best < 0.0 || t < t_best)) {
                    t_best = t;
                    best_err = err;
                    best_name = algo_name(c.algo) + " ws " + std::to_string(c.workspace >> 10) + " KB";
                }
            }
            const double gain = t_best > 0.0 ? t_default / t_best : 0.0;
            std::printf("  %-28s %5d %9.2f %9.2f %6.2fx %6d %10.1e  %s\n", g.name.c_str(), rows, t_default, t_best, gain,
                        tried, best_err, best_name.c_str());
            frame_default += t_default * g.per_frame;
            frame_best += (t_best > 0.0 ? std::min(t_best, t_default) : t_default) * g.per_frame;
        }
        std::printf("  frame at %d rows: GEMMs %.3f ms with cublasGemmEx, %.3f ms with the best algorithm per "
                    "shape (%.1f%% less; launches per frame as the step makes them, predictor pass 1's two "
                    "positions counted as one)\n",
                    rows, frame_default / 1e3, frame_best / 1e3, 100.0 * (1.0 - frame_best / frame_default));
    }
    cublasLtDestroy(lt);
    std::printf("%s\n", failures ? "FAILED: an algorithm disagrees with cublasGemmEx (above)"
                                  : "every algorithm tried agrees");
    return failures ? 1 : 0;
}


int lab_rows(const std::string& model, const std::vector<int>& rows_list, int device) {
    qc::GpuContext ctx(device);
    const auto weights = qc::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const std::vector<GemmShape> shapes = step_shapes(*weights);
    const std::vector<RowsGemmConfig> configs{{8, 1}, {4, 1}, {2, 1}, {4, 2}, {2, 2}, {1, 1}};
    GemmBuffers buffers(shapes, rows_list);
    const int most_n = buffers.most_n;
    size_t partial_floats = 1, counter_count = 1;
    for (const GemmShape& g : shapes)
        for (const RowsGemmConfig& c : configs) {
            partial_floats = std::max(partial_floats, rows_gemm_partial_floats(g.out, g.in, most_n, c));
            counter_count = std::max(counter_count, rows_gemm_counter_count(g.out, c));
        }
    qc::DeviceArray<float> partial(partial_floats);
    qc::DeviceArray<uint32_t> counters(counter_count);
    CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));

    std::printf("qtts-kernel-lab rows: %s, device %d (%s); the split path's GEMMs, cublasGemmEx against rows_gemm "
                "(warps_m x warps_k), us per launch in graphs of 64 over the layers' weights (PDL on)\n",
                model.c_str(), device, ctx.device_name().c_str());
    std::printf("  %-28s %5s %9s", "product", "rows", "GemmEx");
    for (const RowsGemmConfig& c : configs) std::printf("   %dx%d", c.warps_m, c.warps_k);
    std::printf("   best  gain  max |rel|\n");
    int failures = 0;
    const bf16_t* xb_ptr = buffers.rows();
    for (const int rows : rows_list) {
        const int n = 2 * rows;
        double frame_default = 0.0, frame_best = 0.0;
        for (const GemmShape& g : shapes) {
            const GemmReference ref = gemm_reference(ctx, g, n, xb_ptr, buffers.y_ref, buffers.y_a);
            const double t_default = ref.us;
            std::printf("  %-28s %5d %9.2f", g.name.c_str(), rows, t_default);
            double t_best = -1.0, worst_err = 0.0;
            std::string best = "-";
            for (const RowsGemmConfig& c : configs) {
                if (!rows_gemm_supported(g.out, g.in, n, c)) {
                    std::printf(" %6s", "-");
                    continue;
                }
                auto ours = [&](int i, float* y) {
                    rows_gemm(g.weights[size_t(i) % g.weights.size()], g.out, g.in, xb_ptr, n, y, c, partial.get(),
                              counters.get(), ctx.launch());
                };
                // Checked on poisoned outputs: against cublasGemmEx, and run to run bitwise.
                const GemmCheck check = gemm_check(ctx, [&](float* y) { ours(0, y); }, ref, buffers.y_a, buffers.y_b);
                worst_err = std::max(worst_err, check.err);
                if (!check.launched || check.err > 1e-4 || !check.repeats) {
                    std::printf(" %6s", "BAD");
                    ++failures;
                    continue;
                }
                const double t = graph_us(ctx, 64, [&](int i) { ours(i, buffers.y_a.get()); });
                std::printf(" %6.2f", t);
                if (t > 0.0 && (t_best < 0.0 || t < t_best)) {
                    t_best = t;
                    best = std::to_string(c.warps_m) + "x" + std::to_string(c.warps_k);
                }
            }
            std::printf(" %6s %5.2fx %9.1e\n", best.c_str(), t_best > 0.0 ? t_default / t_best : 0.0, worst_err);
            frame_default += t_default * g.per_frame;
            frame_best += (t_best > 0.0 ? std::min(t_best, t_default) : t_default) * g.per_frame;
        }
        std::printf("  frame at %d rows: GEMMs %.3f ms with cublasGemmEx, %.3f ms with the faster of it and the best "
                    "rows_gemm per shape (%.1f%% less)\n",
                    rows, frame_default / 1e3, frame_best / 1e3, 100.0 * (1.0 - frame_best / frame_default));
    }
    std::printf("%s\n", failures ? "FAILED: rows_gemm disagrees with cublasGemmEx (BAD above)" : "rows_gemm agrees everywhere");
    return failures ? 1 : 0;
}

namespace {

namespace k = qtts::kernels;

// One product of a layer (or a head) as the batched step runs it, on every layer's weights.
struct WideCase {
    std::string name;
    int out = 0, in = 0;  // out: features (SwiGLU: of each half)
    k::GemvInput input = k::GemvInput::GEMV_INPUT_PLAIN;
    k::GemvOutput output = k::GemvOutput::GEMV_OUTPUT_STORE;
    std::vector<const bf16_t*> weights;  // [out, in], or [2 out, in] gate then up rows
    std::vector<const float*> norms;     // per weight, RMSNorm input
    float eps = 1e-6f;
    int per_frame = 0;                   // launches a frame makes
};

std::vector<WideCase> wide_cases(const qc::GpuLmWeights& w) {
    using GI = k::GemvInput;
    using GO = k::GemvOutput;
    std::vector<WideCase> cases;
    for (int s = 0; s < 2; ++s) {
        const qc::GpuStack& S = s == 0 ? w.talker : w.predictor;
        const std::string who = s == 0 ? "talker " : "predictor ";
        WideCase qkv{who + "qkv (norm)", S.qkv_dim(), S.hidden, GI::GEMV_INPUT_RMSNORM, GO::GEMV_OUTPUT_STORE, {}, {}, S.eps};
        WideCase o{who + "o (+res)", S.hidden, S.q_dim(), GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_ADD, {}, {}, S.eps};
        WideCase gu{who + "gate/up (swiglu)", S.intermediate, S.hidden, GI::GEMV_INPUT_RMSNORM, GO::GEMV_OUTPUT_SWIGLU,
                    {}, {}, S.eps};
        WideCase down{who + "down (+res)", S.hidden, S.intermediate, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_ADD, {}, {}, S.eps};
        for (const auto& L : S.layers) {
            qkv.weights.push_back(L.qkv);
            qkv.norms.push_back(L.input_norm);
            o.weights.push_back(L.o);
            gu.weights.push_back(L.gate_up);
            gu.norms.push_back(L.post_norm);
            down.weights.push_back(L.down);
        }
        const int passes = s == 0 ? 1 : w.num_code_groups - 1;  // the predictor's first has 2 positions
        for (WideCase* c : {&qkv, &o, &gu, &down}) {
            c->per_frame = passes * int(S.layers.size());
            cases.push_back(*c);
        }
    }
    cases.push_back({"codec head", w.codec_vocab, w.talker.hidden, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_STORE,
                     {w.codec_head}, {}, w.talker.eps, 1});
    WideCase head{"predictor lm_head (norm)", w.predictor_vocab, w.predictor.hidden, GI::GEMV_INPUT_RMSNORM,
                  GO::GEMV_OUTPUT_STORE, w.predictor_head, {}, w.predictor.eps, w.num_code_groups - 1};
    head.norms.assign(head.weights.size(), w.predictor.norm);
    cases.push_back(head);
    return cases;
}

k::GemvArgs wide_args(const WideCase& c, size_t i, int rows, const float* x, float* y) {
    const size_t at = i % c.weights.size();
    k::GemvArgs a = qc::gemv_product(c.weights[at], c.out, c.in, rows, x, y);
    if (c.output == k::GemvOutput::GEMV_OUTPUT_SWIGLU) a.w2 = c.weights[at] + size_t(c.out) * size_t(c.in);
    a.output = c.output;
    if (c.input == k::GemvInput::GEMV_INPUT_RMSNORM) a = qc::gemv_normed(a, c.norms[at], c.eps);
    return a;
}

// The split path's product (what the batched step runs past skinny_max_rows), as GemvArgs.
void split_path(cublasHandle_t cublas, const qc::SplitScratch& scratch, const k::GemvArgs& a, const k::Launch& l) {
    using E = k::LinearEpilogue;
    const bool swiglu = a.output == k::GemvOutput::GEMV_OUTPUT_SWIGLU;
    const E epilogue = swiglu ? E::LINEAR_EPILOGUE_SWIGLU
                              : (a.output == k::GemvOutput::GEMV_OUTPUT_ADD ? E::LINEAR_EPILOGUE_ADD : E::LINEAR_EPILOGUE_STORE);
    qc::linear_split(l, cublas, scratch, a.x, a.rows, a.in, a.ldx,
                     a.input == k::GemvInput::GEMV_INPUT_RMSNORM ? a.norm_w : nullptr, a.eps, a.w,
                     swiglu ? 2 * a.out : a.out, a.out, a.bias, epilogue, a.y, a.ldy, 2 * a.rows);
}

}  // namespace

int lab_wide(const std::string& model, const std::vector<int>& rows_list, int device) {
    qc::GpuContext ctx(device);
    const auto weights = qc::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const std::vector<WideCase> cases = wide_cases(*weights);
    int sms = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int widest_in = 0, widest_out = 0, most_rows = 0;
    for (const WideCase& c : cases) {
        widest_in = std::max(widest_in, c.in);
        widest_out = std::max(widest_out, 2 * c.out);
    }
    for (const int r : rows_list) most_rows = std::max(most_rows, std::min(r, WIDE_MAX_ROWS));
    const size_t x_floats = size_t(most_rows) * widest_in, y_floats = size_t(most_rows) * widest_out;
    std::mt19937 rng(20261202);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    std::vector<float> x_host(x_floats), y0(y_floats);
    for (auto& v : x_host) v = uni(rng);
    for (auto& v : y0) v = uni(rng);
    qc::DeviceArray<float> d_x(x_floats), y_ref(y_floats), y_wide(y_floats), y_time(y_floats);
    CUDA_CHECK(cudaMemcpy(d_x.get(), x_host.data(), x_floats * 4, cudaMemcpyHostToDevice));
    qc::DeviceArray<uint16_t> xb(2 * x_floats);
    qc::DeviceArray<float> y2(2 * y_floats);
    const qc::SplitScratch scratch{reinterpret_cast<bf16_t*>(xb.get()), y2.get()};

    std::printf("qtts-kernel-lab wide: %s, device %d (%s, %d SMs); us per launch in graphs of 64 over the layers' "
                "weights\n", model.c_str(), device, ctx.device_name().c_str(), sms);
    std::printf("  %-28s %5s %7s %10s %10s %10s %10s %10s\n", "product", "rows", "splits", "split path", "wide",
                "skinny", "vs split", "vs CPU");
    int failures = 0;
    for (const int rows : rows_list) {
        if (rows > WIDE_MAX_ROWS) continue;
        double frame_split = 0.0, frame_wide = 0.0;
        for (const WideCase& c : cases) {
            const k::GemvArgs a0 = wide_args(c, 0, rows, d_x.get(), y_wide.get());
            if (!wide_supported(a0)) {
                std::printf("  %-28s %5d  (shape not supported)\n", c.name.c_str(), rows);
                continue;
            }
            const int splits = wide_splits(a0, sms);
            qc::DeviceArray<float> partial(std::max<size_t>(wide_partial_floats(a0, splits), 1));
            qc::DeviceArray<uint32_t> counters(wide_counter_count(a0));
            CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
            const size_t n_out = size_t(rows) * size_t(c.out);
            // The split path's result and the wide product's, from the same y (ADD).
            CUDA_CHECK(cudaMemcpy(y_ref.get(), y0.data(), n_out * 4, cudaMemcpyHostToDevice));
            CUDA_CHECK(cudaMemcpy(y_wide.get(), y0.data(), n_out * 4, cudaMemcpyHostToDevice));
            k::GemvArgs ar = a0;
            ar.y = y_ref.get();
            split_path(ctx.cublas(), scratch, ar, ctx.launch());
            bool launched = true;
            try {
                wide_product(a0, splits, partial.get(), counters.get(), ctx.launch());
                CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
            } catch (const std::exception& e) {
                std::printf("  %-28s %5d  FAILED to run: %s\n", c.name.c_str(), rows, e.what());
                launched = false;
            }
            if (!launched) {
                ++failures;
                continue;
            }
            const std::vector<float> ref = download(y_ref, n_out), got = download(y_wide, n_out);
            double ref_max = 0.0, err = 0.0;
            for (size_t i = 0; i < n_out; ++i) {
                ref_max = std::max(ref_max, double(std::fabs(ref[i])));
                const double d = std::fabs(double(got[i]) - double(ref[i]));
                err = std::max(err, std::isfinite(d) ? d : 1e30);
            }
            err /= std::max(ref_max, 1e-30);
            // A CPU fp64 check of 48 outputs (the split path's arithmetic is the reference only
            // for the comparison above): x normed as the product does, the bf16 weights read back.
            double cpu_err = 0.0;
            std::uniform_int_distribution<int> pick_r(0, rows - 1), pick_f(0, c.out - 1);
            for (int t = 0; t < 48; ++t) {
                const int r = pick_r(rng), f = pick_f(rng);
                std::vector<double> xr(x_host.begin() + size_t(r) * c.in, x_host.begin() + size_t(r + 1) * c.in);
                if (c.input == k::GemvInput::GEMV_INPUT_RMSNORM) {
                    std::vector<float> nw(size_t(c.in));
                    CUDA_CHECK(cudaMemcpy(nw.data(), c.norms[0], size_t(c.in) * 4, cudaMemcpyDeviceToHost));
                    double ss = 0.0;
                    for (double v : xr) ss += v * v;
                    const double inv = 1.0 / std::sqrt(ss / c.in + double(c.eps));
                    for (int i = 0; i < c.in; ++i) xr[size_t(i)] *= inv * nw[size_t(i)];
                }
                std::vector<uint16_t> wrow(size_t(c.in)), urow;
                CUDA_CHECK(cudaMemcpy(wrow.data(), c.weights[0] + size_t(f) * c.in, size_t(c.in) * 2, cudaMemcpyDeviceToHost));
                if (c.output == k::GemvOutput::GEMV_OUTPUT_SWIGLU) {
                    urow.resize(size_t(c.in));
                    CUDA_CHECK(cudaMemcpy(urow.data(), c.weights[0] + size_t(c.out + f) * c.in, size_t(c.in) * 2,
                                          cudaMemcpyDeviceToHost));
                }
                auto bf = [](uint16_t b) {
                    const uint32_t u = uint32_t(b) << 16;
                    float v;
                    std::memcpy(&v, &u, 4);
                    return double(v);
                };
                double gate = 0.0, up = 0.0;
                for (int i = 0; i < c.in; ++i) {
                    gate += bf(wrow[size_t(i)]) * xr[size_t(i)];
                    if (!urow.empty()) up += bf(urow[size_t(i)]) * xr[size_t(i)];
                }
                double want = gate;
                if (c.output == k::GemvOutput::GEMV_OUTPUT_SWIGLU) want = gate / (1.0 + std::exp(-gate)) * up;
                if (c.output == k::GemvOutput::GEMV_OUTPUT_ADD) want += double(y0[size_t(r) * c.out + f]);
                cpu_err = std::max(cpu_err, std::fabs(want - double(got[size_t(r) * c.out + f])) / std::max(ref_max, 1e-30));
            }
            // fp32 sums of the same split products in another order: ~1e-6 of the largest value.
            const bool ok = err <= 1e-4 && cpu_err <= 1e-4;
            failures += ok ? 0 : 1;

            const double t_split = graph_us(ctx, 64, [&](int i) {
                k::GemvArgs a = wide_args(c, size_t(i), rows, d_x.get(), y_time.get());
                split_path(ctx.cublas(), scratch, a, ctx.launch());
            });
            const double t_wide = graph_us(ctx, 64, [&](int i) {
                wide_product(wide_args(c, size_t(i), rows, d_x.get(), y_time.get()), splits, partial.get(),
                             counters.get(), ctx.launch());
            });
            double t_skinny = -1.0;
            if (rows <= k::SKINNY_MAX_ROWS && k::skinny_supported(a0))
                t_skinny = graph_us(ctx, 64, [&](int i) {
                    k::skinny_product(wide_args(c, size_t(i), rows, d_x.get(), y_time.get()), ctx.launch());
                });
            std::printf("  %-28s %5d %7d %10.2f %10.2f %10.2f %10.1e %10.1e%s\n", c.name.c_str(), rows, splits, t_split,
                        t_wide, t_skinny, err, cpu_err, ok ? "" : "   MISMATCH");
            frame_split += t_split * c.per_frame;
            frame_wide += (t_wide > 0.0 ? t_wide : t_split) * c.per_frame;
        }
        std::printf("  frame at %d rows: products %.3f ms on the split path, %.3f ms wide (%.1f%% less; launches "
                    "per frame as the step makes them)\n",
                    rows, frame_split / 1e3, frame_wide / 1e3, 100.0 * (1.0 - frame_wide / frame_split));
    }
    std::printf("%s\n", failures ? "FAILED: the wide product disagrees (above)" : "the wide product agrees everywhere");
    return failures ? 1 : 0;
}

}  // namespace qtts::kernel_lab
