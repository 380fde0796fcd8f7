// qtts-kernel-lab gemm: the split path's GEMMs, cublasGemmEx against cuBLASLt algorithms picked
// by measurement (gemm_lab.h).
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
#include "engine/cuda/gpu_lm.h"
#include "engine/model/weights.h"

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
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2] * 1e3 / launches;
}

std::vector<float> download(const qc::DeviceArray<float>& d, size_t n) {
    std::vector<float> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), d.get(), n * 4, cudaMemcpyDeviceToHost));
    return h;
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

    int widest_in = 0, widest_out = 0, most_rows = 0;
    for (const GemmShape& g : shapes) {
        widest_in = std::max(widest_in, g.in);
        widest_out = std::max(widest_out, g.out);
    }
    for (const int r : rows_list) most_rows = std::max(most_rows, r);
    const int most_n = 2 * most_rows;
    // x rows split as the step splits them: bf16 hi rows, then the lo rows (x - hi).
    std::mt19937 rng(20261202);
    std::uniform_real_distribution<float> uni(-2.0f, 2.0f);
    std::vector<uint16_t> xb(size_t(most_n) * widest_in);
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
    for (int r = 0; r < most_rows; ++r)
        for (int i = 0; i < widest_in; ++i) {
            const float x = uni(rng);
            const uint16_t hi = to_bf16(x);
            xb[size_t(r) * widest_in + i] = hi;
            xb[size_t(most_rows + r) * widest_in + i] = to_bf16(x - from_bf16(hi));
        }
    qc::DeviceArray<uint16_t> d_xb(xb.size());
    CUDA_CHECK(cudaMemcpy(d_xb.get(), xb.data(), xb.size() * 2, cudaMemcpyHostToDevice));
    const size_t y_floats = size_t(most_n) * widest_out;
    qc::DeviceArray<float> y_ref(y_floats), y_a(y_floats), y_b(y_floats);

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
            const auto xb_ptr = reinterpret_cast<const bf16_t*>(d_xb.get());
            auto gemm_ex = [&](int i, float* y) {
                const bf16_t* w = g.weights[size_t(i) % g.weights.size()];
                CUBLAS_CHECK(cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, g.out, n, g.in, &one, w, CUDA_R_16BF,
                                          g.in, xb_ptr, CUDA_R_16BF, g.in, &zero, y, CUDA_R_32F, g.out,
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
            };
            // The reference result: cublasGemmEx on the first weights, as the product runs today.
            CUDA_CHECK(cudaMemsetAsync(y_ref.get(), 0xff, y_ref.bytes(), ctx.stream()));
            gemm_ex(0, y_ref.get());
            CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
            const size_t n_out = size_t(n) * g.out;
            const std::vector<float> ref = download(y_ref, n_out);
            double ref_max = 0.0;
            for (float v : ref) ref_max = std::max(ref_max, double(std::fabs(v)));
            const double t_default = graph_us(ctx, 64, [&](int i) { gemm_ex(i, y_a.get()); });

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
                    CUBLAS_CHECK(cublasLtMatmul(lt, p.op, &one, w, p.a, xb_ptr, p.b, &zero, y, p.c, y, p.c, &c.algo,
                                                workspace.get(), c.workspace, ctx.stream()));
                };
                // Checked twice on poisoned outputs: against cublasGemmEx, and run to run bitwise.
                CUDA_CHECK(cudaMemsetAsync(y_a.get(), 0xff, y_a.bytes(), ctx.stream()));
                CUDA_CHECK(cudaMemsetAsync(y_b.get(), 0x7f, y_b.bytes(), ctx.stream()));
                try {
                    lt_run(0, y_a.get());
                    lt_run(0, y_b.get());
                    CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
                } catch (const std::exception&) {
                    cudaGetLastError();
                    continue;
                }
                ++tried;
                const std::vector<float> a = download(y_a, n_out), b = download(y_b, n_out);
                double err = 0.0;
                for (size_t i = 0; i < n_out; ++i) {
                    const double d = std::fabs(double(a[i]) - double(ref[i]));
                    err = std::max(err, std::isfinite(d) ? d : 1e30);
                }
                err /= std::max(ref_max, 1e-30);
                const bool repeats = std::memcmp(a.data(), b.data(), n_out * 4) == 0;
                // fp32 sums of the same bf16 products in another order: ~1e-6 of the largest value.
                if (err > 1e-4 || !repeats) {
                    std::printf("  %-28s %5d  MISMATCH %s: max |rel| %.2e, repeats bitwise: %s\n", g.name.c_str(), rows,
                                algo_name(c.algo).c_str(), err, repeats ? "yes" : "no");
                    ++failures;
                    continue;
                }
                const double t = graph_us(ctx, 64, [&](int i) { lt_run(i, y_a.get()); });
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

}  // namespace qtts::kernel_lab
