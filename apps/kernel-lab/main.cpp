// qtts-kernel-lab: the kernels measured one at a time, outside the product (docs/cuda.md,
// "Kernel lab").
//
//   qtts-kernel-lab gemv [--seed S] [--device N]
//       every gemv variant (apps/kernel-lab/gemv_variants.h) checked against the CPU reference
//       on random inputs (the seed is printed; --seed repeats a run), then timed: median of 50
//       single launches, L2 flushed before each.
//   qtts-kernel-lab frame --model DIR [--device N]
//       each kernel of a frame alone on the checkpoint's shapes: a graph of 64 launches, replayed;
//       also the batched step's one-launch tensor-core products at 4-32 rows.
//   qtts-kernel-lab gemm --model DIR [--rows LIST] [--device N]
//       the split path's GEMMs at each row count (default 24,32,48,64): cublasGemmEx against
//       every cuBLASLt algorithm proposed for the shape, checked, then timed (gemm_lab.h).
//   qtts-kernel-lab wide --model DIR [--rows LIST] [--device N]
//       the batched step's products at each row count: the split path against the lab's
//       one-launch wide product (wide_product.h), checked, then timed.
//   qtts-kernel-lab rows --model DIR [--rows LIST] [--device N]
//       the split path's GEMMs at each row count: cublasGemmEx against the lab's rows_gemm in
//       several block shapes (rows_gemm.h), checked, then timed.
//   qtts-kernel-lab persist --model DIR [--seed S] [--device N]
//       the code predictor's 15 passes as the product's launches against one launch of the lab's
//       persistent kernel (persistent_pass.h): compared bitwise, then timed.
//   qtts-kernel-lab attno --model DIR [--seed S] [--device N]
//       the same passes with each layer's attention folded into its o product (attention_o.h)
//       against the product's launches: compared bitwise, then timed.
//   qtts-kernel-lab parts --model DIR [--seed S] [--device N]
//       the predictor's passes and a talker step as the product launches them, timed whole and
//       with one kind of launch left out: what each kind costs inside the chain.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "apps/kernel-lab/gemm_lab.h"
#include "apps/kernel-lab/gemv_variants.h"
#include "apps/kernel-lab/persistent_lab.h"
#include "apps/kernel-lab/stream_lab.h"
#include "apps/kernel-lab/timeline_lab.h"
#include "apps/qtts/bench_stats.h"
#include "engine/common/error.h"
#include "engine/common/strings.h"
#include "engine/cuda/event_timer.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "engine/model/weights.h"
#include "kernels/attention.cuh"
#include "kernels/embedding.cuh"
#include "kernels/gemv.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/sampling.cuh"
#include "kernels/skinny.cuh"

namespace {

namespace k = qtts::kernels;
namespace lab = qtts::kernel_lab;
using bf16_t_ptr = const k::bf16_t*;

// A product's weights in one layer (w2: SwiGLU's up rows; norm: its RMSNorm weight), and the same
// product in every layer of a stack (or every head).
struct ProductWeights {
    bf16_t_ptr w, w2;
    const float* norm;
};
using ProductLayers = std::vector<ProductWeights>;

using qtts::cuda::time_on_stream;

float bf16_to_f32(uint16_t b) {
    const uint32_t u = uint32_t(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16_rne(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// ---- gemv: variants vs the CPU reference, then timed ----------------------------------------

struct GemvCase {
    const char* name;
    int out, in, rows;
    k::GemvInput input;
    k::GemvOutput output;
};

// y (as the kernel leaves it) for the case, in fp64 from the same bf16 weights and fp32 inputs.
std::vector<float> gemv_reference(const GemvCase& c, const std::vector<uint16_t>& w, const std::vector<uint16_t>& w2,
                                  const std::vector<float>& x, const std::vector<float>& norm,
                                  const std::vector<float>& y0) {
    std::vector<float> y = y0;
    for (int r = 0; r < c.rows; ++r) {
        std::vector<double> xr(x.begin() + size_t(r) * c.in, x.begin() + size_t(r + 1) * c.in);
        if (c.input == k::GemvInput::GEMV_INPUT_RMSNORM) {
            double ss = 0.0;
            for (double v : xr) ss += v * v;
            const double inv = 1.0 / std::sqrt(ss / c.in + 1e-6);
            for (int i = 0; i < c.in; ++i) xr[size_t(i)] *= inv * norm[size_t(i)];
        }
        for (int o = 0; o < c.out; ++o) {
            double a = 0.0, b = 0.0;
            for (int i = 0; i < c.in; ++i) {
                a += double(bf16_to_f32(w[size_t(o) * c.in + i])) * xr[size_t(i)];
                if (!w2.empty()) b += double(bf16_to_f32(w2[size_t(o) * c.in + i])) * xr[size_t(i)];
            }
            float& out = y[size_t(r) * c.out + o];
            if (c.output == k::GemvOutput::GEMV_OUTPUT_SWIGLU)
                out = float(a / (1.0 + std::exp(-a)) * b);
            else if (c.output == k::GemvOutput::GEMV_OUTPUT_ADD)
                out += float(a);
            else
                out = float(a);
        }
    }
    return y;
}

int lab_gemv(uint64_t seed, int device) {
    qtts::cuda::GpuContext ctx(device);
    std::printf("qtts-kernel-lab gemv: seed %llu (repeat with --seed %llu), device %d (%s)\n",
                (unsigned long long)seed, (unsigned long long)seed, device, ctx.device_name().c_str());
    using GI = k::GemvInput;
    using GO = k::GemvOutput;
    // 1.7B talker / predictor shapes of one frame.
    const GemvCase cases[] = {
        {"qkv (norm)", 4096, 2048, 1, GI::GEMV_INPUT_RMSNORM, GO::GEMV_OUTPUT_STORE},
        {"o (+res)", 2048, 2048, 1, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_ADD},
        {"gate/up (norm, swiglu)", 6144, 2048, 1, GI::GEMV_INPUT_RMSNORM, GO::GEMV_OUTPUT_SWIGLU},
        {"down (+res)", 2048, 6144, 1, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_ADD},
        {"pass-1 qkv (2 rows)", 2048, 1024, 2, GI::GEMV_INPUT_RMSNORM, GO::GEMV_OUTPUT_STORE},
        {"8 rows", 1024, 1024, 8, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_STORE},
    };
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
    qtts::cuda::DeviceArray<uint8_t> flush(size_t(256) << 20);  // larger than the H200's 60 MB L2
    int failures = 0;
    std::printf("  %-24s %-16s %12s %10s %9s\n", "case", "variant", "max |err|", "us", "GB/s");
    for (const GemvCase& c : cases) {
        const bool two = c.output == GO::GEMV_OUTPUT_SWIGLU;
        std::vector<uint16_t> w(size_t(c.out) * c.in), w2(two ? w.size() : 0);
        for (auto& v : w) v = f32_to_bf16_rne(uni(rng) * 0.05f);
        for (auto& v : w2) v = f32_to_bf16_rne(uni(rng) * 0.05f);
        std::vector<float> x(size_t(c.rows) * c.in), norm(size_t(c.in)), y0(size_t(c.rows) * c.out);
        for (auto& v : x) v = uni(rng);
        for (auto& v : norm) v = 1.0f + 0.5f * uni(rng);
        for (auto& v : y0) v = uni(rng);
        const std::vector<float> want = gemv_reference(c, w, w2, x, norm, y0);
        qtts::cuda::DeviceArray<uint16_t> dw(w.size()), dw2(std::max<size_t>(w2.size(), 1));
        qtts::cuda::DeviceArray<float> dx(x.size()), dn(norm.size()), dy(y0.size());
        CUDA_CHECK(cudaMemcpy(dw.get(), w.data(), w.size() * 2, cudaMemcpyHostToDevice));
        if (two) CUDA_CHECK(cudaMemcpy(dw2.get(), w2.data(), w2.size() * 2, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dx.get(), x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(dn.get(), norm.data(), norm.size() * 4, cudaMemcpyHostToDevice));
        k::GemvArgs a;
        a.w = dw.get();
        a.w2 = two ? dw2.get() : nullptr;
        a.out = c.out;
        a.in = c.in;
        a.rows = c.rows;
        a.input = c.input;
        a.x = dx.get();
        a.ldx = c.in;
        a.norm_w = dn.get();
        a.output = c.output;
        a.y = dy.get();
        a.ldy = c.out;
        std::vector<float> shipped;  // vec1's output (the first variant): rows2 and turns must equal it bitwise
        for (const lab::GemvVariant v : lab::GEMV_VARIANTS) {
            if (!lab::gemv_variant_supports(v, a)) continue;
            CUDA_CHECK(cudaMemcpy(dy.get(), y0.data(), y0.size() * 4, cudaMemcpyHostToDevice));
            lab::gemv_variant(v, a, ctx.launch());
            CUDA_CHECK(cudaStreamSynchronize(ctx.stream()));
            std::vector<float> got(y0.size());
            CUDA_CHECK(cudaMemcpy(got.data(), dy.get(), got.size() * 4, cudaMemcpyDeviceToHost));
            if (shipped.empty()) shipped = got;
            double err = 0.0;
            for (size_t i = 0; i < got.size(); ++i) err = std::max(err, double(std::fabs(got[i] - want[i])));
            // fp32 accumulation over up to 6144 products of |w x| <= 0.05: 1e-3 is ~100x the
            // rounding seen, far below a wrong row or a missed norm.
            const bool same_bits = std::memcmp(got.data(), shipped.data(), got.size() * 4) == 0;
            const bool ok = err <= 1e-3 && (!lab::gemv_variant_exact(v) || same_bits);
            failures += ok ? 0 : 1;
            std::vector<double> us;
            for (int i = 0; i < 50; ++i) {
                CUDA_CHECK(cudaMemsetAsync(flush.get(), i & 1, flush.bytes(), ctx.stream()));
                us.push_back(1e3 * time_on_stream(ctx.stream(), 1, [&] { lab::gemv_variant(v, a, ctx.launch()); }));
            }
            const double med = qtts_cli::bench_median(us);
            const double bytes = double(c.out) * c.in * 2 * (two ? 2 : 1);
            std::printf("  %-24s %-16s %12.2e %10.2f %9.0f%s%s\n", c.name, lab::gemv_variant_name(v), err, med,
                        bytes / (med * 1e3), same_bits ? "   (vec1's bits)" : "", ok ? "" : "   MISMATCH");
        }
    }
    std::printf("%s\n", failures ? "FAILED: a variant disagrees with the CPU reference" : "all variants match");
    return failures ? 1 : 0;
}

// ---- frame: each kernel of a frame alone ----------------------------------------------------

struct KernelTime {
    std::string name;
    double us = 0.0;
    double bytes = 0.0;  // weight bytes one launch reads
};

// Each kernel of the frame on its own: a graph of 64 back-to-back launches (PDL as configured),
// replayed 5 times; microseconds per launch. Inputs are non-zero (zeros can run faster).
std::vector<KernelTime> kernel_times(qtts::cuda::GpuContext& ctx, const qtts::cuda::GpuLmWeights& w) {
    namespace qc = qtts::cuda;
    namespace k = qtts::kernels;
    const qc::GpuStack& T = w.talker;
    const qc::GpuStack& P = w.predictor;
    const int ctx_len = 4096, pos = 300;
    const size_t act = size_t(std::max({T.qkv_dim(), 2 * T.intermediate, w.codec_vocab, 4 * T.hidden})) * 2;
    const size_t kv = size_t(T.n_kv) * ctx_len * T.head_dim;
    std::vector<float> host(std::max(act, kv));
    for (size_t i = 0; i < host.size(); ++i) host[i] = 0.01f * float(int(i * 2654435761u % 2001) - 1000) / 100.0f;
    auto make = [&](size_t n) {
        qc::DeviceArray<float> d(n);
        CUDA_CHECK(cudaMemcpy(d.get(), host.data(), n * 4, cudaMemcpyHostToDevice));
        return d;
    };
    auto x = make(act), y = make(act), y2 = make(act), kc = make(kv), vc = make(kv);
    qc::DeviceArray<float> partial(k::attention_partial_floats(T.n_heads, 1, k::attention_splits(ctx_len), T.head_dim));
    qc::DeviceArray<uint32_t> counters(k::attention_counter_count(T.n_kv, 2));
    CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
    std::vector<int32_t> ints(64, 5);
    ints[0] = pos;
    qc::DeviceArray<int32_t> d_ints(64), seen(size_t(w.codec_vocab)), codes(size_t(64) * 16);
    CUDA_CHECK(cudaMemcpy(d_ints.get(), ints.data(), 64 * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(seen.get(), 0, seen.bytes()));
    qc::DeviceArray<k::GenerationDeviceState> state(1);
    k::GenerationDeviceState st;
    st.seed = 1;
    st.frame = 3;
    st.position = pos;
    st.history_count = 5;
    st.code_capacity = 64;
    st.talker = {0, 0.9f, 50, 1.0f, 1.05f};
    st.predictor = {0, 0.9f, 50, 1.0f, 1.0f};
    CUDA_CHECK(cudaMemcpy(state.get(), &st, sizeof(st), cudaMemcpyHostToDevice));

    std::vector<KernelTime> out;
    // `launch(i)`: the i-th of the 64 launches of the graph.
    auto time = [&](const std::string& name, double bytes, const std::function<void(int)>& launch) {
        const qc::GraphExec g = qc::graph_capture(ctx, "kernel " + name, [&] {
            for (int i = 0; i < 64; ++i) launch(i);
        }, nullptr);
        qc::graph_replay(ctx, g);
        const double ms = time_on_stream(ctx.stream(), 5, [&] { qc::graph_replay(ctx, g); });
        out.push_back({name, ms * 1e3 / 64, bytes});
    };
    // A product's arguments on the given x and y buffers.
    auto product_args = [](const bf16_t_ptr wt, const bf16_t_ptr wt2, int out_rows, int in, int rows,
                           k::GemvInput input, const float* norm, k::GemvOutput output, const float* xp, float* yp) {
        k::GemvArgs a = qc::gemv_product(wt, out_rows, in, rows, xp, yp);
        a.w2 = wt2;
        a.input = input;
        a.norm_w = norm;
        a.output = output;
        return a;
    };
    // The timed launches of a product take its weights in every layer of the stack (every head) in
    // turn, so that they stream from DRAM as in a frame: 64 launches on one layer's weights read
    // them from L2 after the first, which flatters the kernels that read x more often (the
    // per-product tables of docs/performance.md before 2026-12-03's sixteenth session were timed
    // that way).
    // One product's arguments in every layer, and the weight bytes one launch reads.
    auto layer_args = [&](const ProductLayers& layers, int out_rows, int in, int rows, k::GemvInput input,
                          k::GemvOutput output, const float* xp, float* yp) {
        std::vector<k::GemvArgs> args;
        for (const ProductWeights& pw : layers)
            args.push_back(product_args(pw.w, pw.w2, out_rows, in, rows, input, pw.norm, output, xp, yp));
        return args;
    };
    auto weight_bytes = [](const ProductLayers& layers, int out_rows, int in) {
        return double(out_rows) * in * 2 * (layers[0].w2 ? 2 : 1);
    };
    auto gemv = [&](const char* name, const ProductLayers& layers, int out_rows, int in, int rows, k::GemvInput input,
                    k::GemvOutput output) {
        std::vector<k::GemvArgs> args = layer_args(layers, out_rows, in, rows, input, output, x.get(), y.get());
        for (k::GemvArgs& a : args) {  // the gathered input's table and ids (other inputs ignore them)
            a.table = w.codec_embedding;
            a.index = d_ints.get() + 1;
        }
        time(name, weight_bytes(layers, out_rows, in),
             [&, args](int i) { k::gemv(args[size_t(i) % args.size()], ctx.launch()); });
    };
    using GI = k::GemvInput;
    using GO = k::GemvOutput;
    // The four products of every layer of a stack.
    struct StackProducts {
        ProductLayers qkv, o, gate_up, down;
    };
    auto stack_products = [](const qc::GpuStack& S) {
        StackProducts p;
        for (const auto& L : S.layers) {
            p.qkv.push_back({L.qkv, nullptr, L.input_norm});
            p.o.push_back({L.o, nullptr, nullptr});
            p.gate_up.push_back({L.gate_up, L.gate_up + size_t(S.intermediate) * S.hidden, L.post_norm});
            p.down.push_back({L.down, nullptr, nullptr});
        }
        return p;
    };
    const StackProducts products[2] = {stack_products(T), stack_products(P)};
    ProductLayers predictor_heads;
    for (const bf16_t_ptr head : w.predictor_head) predictor_heads.push_back({head, nullptr, P.norm});
    const ProductLayers codec_head = {{w.codec_head, nullptr, nullptr}};  // one: stays in L2
    for (int s = 0; s < 2; ++s) {
        const qc::GpuStack& S = s == 0 ? T : P;
        const std::string who = s == 0 ? "talker " : "predictor ";
        const StackProducts& sp = products[s];
        gemv((who + "qkv gemv (norm)").c_str(), sp.qkv, S.qkv_dim(), S.hidden, 1, GI::GEMV_INPUT_RMSNORM,
             GO::GEMV_OUTPUT_STORE);
        gemv((who + "o gemv (+res)").c_str(), sp.o, S.hidden, S.q_dim(), 1, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_ADD);
        gemv((who + "gate/up gemv (swiglu)").c_str(), sp.gate_up, S.intermediate, S.hidden, 1, GI::GEMV_INPUT_RMSNORM,
             GO::GEMV_OUTPUT_SWIGLU);
        gemv((who + "down gemv (+res)").c_str(), sp.down, S.hidden, S.intermediate, 1, GI::GEMV_INPUT_PLAIN,
             GO::GEMV_OUTPUT_ADD);
        // The arguments the product passes (engine/cuda/gpu_lm_launch.h), on layer 0's caches.
        const k::AttentionArgs a = qc::attention_args(
            S, 0, x.get(), y2.get(), kc.get(), vc.get(), s == 0 ? ctx_len : 16, s == 0 ? k::attention_splits(ctx_len) : 1,
            partial.get(), counters.get(), 1, s == 0 ? d_ints.get() : nullptr, 8);
        time(who + (s == 0 ? "attention (ctx 300, split-K)" : "attention (pos 8)"),
             s == 0 ? double(pos) * S.kv_dim() * 8 : 0.0, [&, a](int) { k::attention(a, ctx.launch()); });
    }
    gemv("codec head gemv", codec_head, w.codec_vocab, T.hidden, 1, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_STORE);
    gemv("predictor lm_head gemv (norm)", predictor_heads, w.predictor_vocab, P.hidden, 1, GI::GEMV_INPUT_RMSNORM,
         GO::GEMV_OUTPUT_STORE);
    gemv("predictor pass-1 qkv gemv (2 rows)", products[1].qkv, P.qkv_dim(), P.hidden, 2, GI::GEMV_INPUT_RMSNORM,
         GO::GEMV_OUTPUT_STORE);
    if (w.predictor_proj_w) {  // one: stays in L2
        gemv("predictor input projection (gather)", {{w.predictor_proj_w, nullptr, nullptr}}, P.hidden, T.hidden, 1,
             GI::GEMV_INPUT_GATHER, GO::GEMV_OUTPUT_STORE);
    }
    // The batched step's one-launch tensor-core products (kernels/skinny.cuh) on the same shapes,
    // at 4-32 rows, with 16 and 8 output features per tile (the SwiGLU product always takes 8) and
    // one or two tiles per block; then the default features and tiles with the weight steps in
    // registers instead of the shared-memory ring ("wr").
    {
        const int max_rows = 32;
        const size_t widest_in = size_t(std::max({T.hidden, T.q_dim(), T.intermediate, P.hidden, P.intermediate}));
        const size_t widest_out = size_t(std::max({T.qkv_dim(), T.intermediate, w.codec_vocab, P.qkv_dim(), w.predictor_vocab}));
        auto xs = make(size_t(max_rows) * widest_in), ys = make(size_t(max_rows) * widest_out);
        auto skinny = [&](const std::string& name, const ProductLayers& layers, int out_rows, int in,
                          k::GemvInput input, k::GemvOutput output) {
            const bool swiglu = layers[0].w2 != nullptr;
            const double bytes = weight_bytes(layers, out_rows, in);
            for (const int rows : {4, 8, 12, 16, 24, 32}) {
                const std::vector<k::GemvArgs> args =
                    layer_args(layers, out_rows, in, rows, input, output, xs.get(), ys.get());
                for (const int features : {16, 8}) {
                    if (swiglu && features == 16) continue;
                    for (const int tiles : {1, 2}) {
                        time("skinny " + name + " x" + std::to_string(rows) + " f" + std::to_string(features) + " t" +
                                 std::to_string(tiles),
                             bytes, [&, args, features, tiles](int i) {
                                 k::skinny_product(args[size_t(i) % args.size()], ctx.launch(), features, tiles);
                             });
                    }
                }
                time("skinny " + name + " x" + std::to_string(rows) + " default, wr", bytes, [&, args](int i) {
                    k::skinny_product(args[size_t(i) % args.size()], ctx.launch(), 0, 0,
                                      k::SkinnyWeights::SKINNY_WEIGHTS_REGISTERS);
                });
            }
        };
        for (int s = 0; s < 2; ++s) {
            const qc::GpuStack& S = s == 0 ? T : P;
            const std::string who = s == 0 ? "talker " : "predictor ";
            const StackProducts& sp = products[s];
            skinny(who + "qkv", sp.qkv, S.qkv_dim(), S.hidden, GI::GEMV_INPUT_RMSNORM, GO::GEMV_OUTPUT_STORE);
            skinny(who + "o", sp.o, S.hidden, S.q_dim(), GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_ADD);
            skinny(who + "gate/up", sp.gate_up, S.intermediate, S.hidden, GI::GEMV_INPUT_RMSNORM,
                   GO::GEMV_OUTPUT_SWIGLU);
            skinny(who + "down", sp.down, S.hidden, S.intermediate, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_ADD);
        }
        skinny("predictor lm_head", predictor_heads, w.predictor_vocab, P.hidden, GI::GEMV_INPUT_RMSNORM,
               GO::GEMV_OUTPUT_STORE);
        skinny("codec head", codec_head, w.codec_vocab, T.hidden, GI::GEMV_INPUT_PLAIN, GO::GEMV_OUTPUT_STORE);
    }
    time("rmsnorm (1 row)", 0.0, [&](int) { k::rmsnorm(x.get(), 1, T.hidden, T.hidden, T.norm, 1e-6f, y2.get(), T.hidden, ctx.launch()); });
    {
        k::FrameEmbedArgs f;
        f.tables[0] = w.codec_embedding;
        for (int g = 1; g < w.num_code_groups; ++g) f.tables[g] = w.predictor_codec_embedding[size_t(g - 1)];
        f.groups = w.num_code_groups;
        f.dim = T.hidden;
        f.codes = d_ints.get() + 1;
        f.code_stride = 16;
        f.trailing_rows = d_ints.get() + 1;
        f.text_index = d_ints.get() + 1;
        f.pad = x.get();
        f.out = y2.get();
        f.ldo = T.hidden;
        time("frame embed (16 codebooks + text)", 0.0, [&, f](int) { k::frame_embed(f, ctx.launch()); });
    }
    // A draw of codebook `group` (0: the talker's rules) from x under the sampling state `s`.
    auto draw_args = [&](int group, k::GenerationDeviceState* s) {
        k::SampleArgs a;
        a.logits = x.get();
        a.n = group == 0 ? w.codec_vocab : w.predictor_vocab;
        a.state = s;
        a.group = group;
        a.seen = seen.get();
        a.codes = codes.get();
        a.suppress_begin = w.codec_vocab - 1024;
        return a;
    };
    for (const int group : {0, 5}) {
        const k::SampleArgs a = draw_args(group, state.get());
        time(group == 0 ? "sample codebook 0 (top-k 50)" : "sample predictor (top-k 50)", 0.0,
             [&, a](int) { k::sample(a, ctx.launch()); });
    }
    // Where a draw's time goes: the predictor's draw under other settings, each with its own
    // state. Greedy is the load and the argmax alone; top-k 5 / 50 / 500 keep the radix select
    // and change how many candidates the softmax, the compaction and thread 0's running sums see.
    struct DrawSetting {
        const char* name;
        k::SamplingDeviceParams params;
    };
    const DrawSetting settings[] = {{"sample predictor, greedy", {1, 1.0f, 0, 1.0f, 1.0f}},
                                    {"sample predictor, top-k 5", {0, 0.9f, 5, 1.0f, 1.0f}},
                                    {"sample predictor, top-k 50, temperature 1", {0, 1.0f, 50, 1.0f, 1.0f}},
                                    {"sample predictor, top-k 500", {0, 0.9f, 500, 1.0f, 1.0f}}};
    qc::DeviceArray<k::GenerationDeviceState> setting_states(std::size(settings));
    for (size_t i = 0; i < std::size(settings); ++i) {
        k::GenerationDeviceState s_i = st;
        s_i.predictor = settings[i].params;
        CUDA_CHECK(cudaMemcpy(setting_states.get() + i, &s_i, sizeof(s_i), cudaMemcpyHostToDevice));
        const k::SampleArgs a = draw_args(5, setting_states.get() + i);
        time(settings[i].name, 0.0, [&, a](int) { k::sample(a, ctx.launch()); });
    }
    return out;
}


int lab_frame(const std::string& model, int device) {
    qtts::cuda::GpuContext ctx(device);
    const auto weights = qtts::cuda::GpuLmWeights::upload(qtts::checkpoint_load(model), device);
    const std::vector<KernelTime> times = kernel_times(ctx, *weights);
    std::printf("  %-40s %9s %9s\n", "kernel (alone, 64 launches in a graph)", "us", "GB/s");
    for (const KernelTime& t : times)
        std::printf("  %-40s %9.2f %9.0f\n", t.name.c_str(), t.us, t.bytes > 0 ? t.bytes / (t.us * 1e3) : 0.0);
    return 0;
}

void usage() {
    std::printf(
        "usage: qtts-kernel-lab gemv [--seed S] [--device N]\n"
        "       qtts-kernel-lab frame --model DIR [--device N]\n"
        "       qtts-kernel-lab gemm --model DIR [--rows LIST] [--device N]\n"
        "       qtts-kernel-lab wide --model DIR [--rows LIST] [--device N]\n"
        "       qtts-kernel-lab rows --model DIR [--rows LIST] [--device N]\n"
        "       qtts-kernel-lab persist --model DIR [--seed S] [--device N]\n"
        "       qtts-kernel-lab attno --model DIR [--seed S] [--device N]\n"
        "       qtts-kernel-lab parts --model DIR [--seed S] [--device N]\n"
        "       qtts-kernel-lab stream [--device N]\n"
        "       qtts-kernel-lab timeline --model DIR [--frames N] [--seed S] [--device N]\n"
        "  gemv   check every gemv variant against the CPU reference on random inputs, then time it\n"
        "  frame  time each kernel of a frame alone on a checkpoint's shapes\n"
        "  gemm   the batched step's split-path GEMMs: cublasGemmEx against cuBLASLt's algorithms\n"
        "         (each checked, then timed) at each row count (default 24,32,48,64)\n"
        "  wide   the batched step's products on the split path against the lab's one-launch wide\n"
        "         product (checked, then timed) at each row count (default 24,32,48,64)\n"
        "  rows   the batched step's split-path GEMMs: cublasGemmEx against the lab's rows_gemm in\n"
        "         several block shapes (each checked, then timed) at each row count (24,32,48,64)\n"
        "  persist  the code predictor's passes as launches against one persistent launch (compared\n"
        "         bitwise, then timed)\n"
        "  attno  the code predictor's passes with the attention folded into the o product against\n"
        "         the product's launches (compared bitwise, then timed)\n"
        "  parts  the predictor's passes and a talker step timed whole and with one kind of launch\n"
        "         left out (what each kind costs inside the chain)\n"
        "  stream how fast one block per SM streams memory into a ring of shared-memory slots\n"
        "  timeline  the product's frame graph replayed N times (default 48) in a build with\n"
        "         -DQTTS_KERNEL_TIMELINE=ON: each launch's cost inside the chain, from its stamps;\n"
        "         then 8 replays with a record for every block (when a launch's last blocks\n"
        "         arrived and finished)\n");
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 2) {
        usage();
        return 2;
    }
    const std::string mode = argv[1];
    std::string model;
    int device = 0;
    uint64_t seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    std::vector<int> rows = {24, 32, 48, 64};
    int frames = 48;
    for (int i = 2; i < argc; ++i) {
        const std::string a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (a == "--seed" && v) {
            seed = std::strtoull(v, nullptr, 10);
            ++i;
        } else if (a == "--device" && v) {
            device = std::atoi(v);
            ++i;
        } else if (a == "--frames" && v) {
            frames = std::atoi(v);
            if (frames < 3 || frames > 1000) {
                usage();
                return 2;
            }
            ++i;
        } else if (a == "--model" && v) {
            model = v;
            ++i;
        } else if (a == "--rows" && v) {
            rows.clear();
            if (!qtts::int_list_parse(v, 1, 256, &rows)) {
                usage();
                return 2;
            }
            ++i;
        } else {
            usage();
            return 2;
        }
    }
    try {
        if (mode == "gemv") return lab_gemv(seed, device);
        if (mode == "frame" && !model.empty()) return lab_frame(model, device);
        if (mode == "gemm" && !model.empty()) return qtts::kernel_lab::lab_gemm(model, rows, device);
        if (mode == "wide" && !model.empty()) return qtts::kernel_lab::lab_wide(model, rows, device);
        if (mode == "rows" && !model.empty()) return qtts::kernel_lab::lab_rows(model, rows, device);
        if (mode == "persist" && !model.empty()) return qtts::kernel_lab::lab_persist(model, device, seed);
        if (mode == "attno" && !model.empty()) return qtts::kernel_lab::lab_attno(model, device, seed);
        if (mode == "parts" && !model.empty()) return qtts::kernel_lab::lab_parts(model, device, seed);
        if (mode == "stream") return qtts::kernel_lab::lab_stream(device);
        if (mode == "timeline" && !model.empty())
            return qtts::kernel_lab::lab_timeline(model, device, frames, seed);
        usage();
        return 2;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "qtts-kernel-lab: %s\n", e.what());
        return 1;
    }
}
