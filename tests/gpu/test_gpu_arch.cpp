// Desktop and edge GPUs (issue 23) on whatever GPU runs the tests:
//   * `qtts version` names the device, its compute capability, the compiled architectures and
//     the kernel path, and the path agrees with the device and with the context's PDL switch;
//   * the shared-memory fallbacks of smaller GPUs (99 KiB per block on sm_86/89) give the same
//     results as the large-memory kernels, bit for bit (run here by capping the limit);
//   * --gpu-memory-limit: what qtts holds stays under the limit (its tracked peak and the
//     device's view), stream slots are fitted to it, and a demand for more streams than fit
//     fails at load with a clear message.
// Skipped (exit 77, tests/support/test_main.cpp) without a GPU.
#include <catch2/catch.hpp>

#ifdef QTTS_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include "engine/api/qtts.h"
#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/gpu_lm_launch.h"
#include "engine/model/make_model.h"
#include "engine/model/safetensors.h"
#include "engine/runtime/speech_model.h"
#include "engine/runtime/utterance.h"
#include "kernels/arch.cuh"
#include "kernels/gemv.cuh"
#include "kernels/skinny.cuh"
#include "test_streams.h"
#include "test_support.h"

namespace fs = std::filesystem;
namespace k = qtts::kernels;
using qtts::BackendOptions;
using qtts::cuda::DeviceArray;

namespace {

qtts::cuda::GpuContext& context() {
    static qtts::cuda::GpuContext c(0);
    return c;
}

// A product of random bf16 weights [out, in] and x [rows, in]
// on the device; run() launches it with the shared memory per block capped at `cap` bytes (0: the
// device's own limit) into a NaN-filled output and returns the output (all finite, checked).
struct CappedProduct {
    DeviceArray<uint16_t> w;
    DeviceArray<float> x, y;
    k::GemvArgs a;

    CappedProduct(int rows, int in, int out, uint64_t seed)
        : w(size_t(out) * in), x(size_t(rows) * in), y(size_t(rows) * out) {
        const auto xf = qtts_test::random_floats(size_t(rows) * in, seed, -2.0f, 2.0f);
        const auto wf = qtts_test::random_floats(size_t(out) * in, seed + 1, -0.05f, 0.05f);
        std::vector<uint16_t> wb(wf.size());
        for (size_t i = 0; i < wb.size(); ++i) wb[i] = qtts::f32_to_bf16(wf[i]);
        REQUIRE(cudaMemcpy(w.get(), wb.data(), wb.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess);
        REQUIRE(cudaMemcpy(x.get(), xf.data(), xf.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        a = qtts::cuda::gemv_product(w.get(), out, in, rows, x.get(), y.get());
    }

    std::vector<float> run(size_t cap, const std::function<void(const k::GemvArgs&)>& launch) {
        const size_t n = size_t(a.rows) * size_t(a.out);
        REQUIRE(cudaMemset(y.get(), 0xff, n * 4) == cudaSuccess);  // NaN: every output must be written
        k::smem_block_cap_set(cap);
        try {
            launch(a);
        } catch (...) {
            k::smem_block_cap_set(0);
            throw;
        }
        k::smem_block_cap_set(0);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        std::vector<float> out(n);
        REQUIRE(cudaMemcpy(out.data(), y.get(), n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
        CHECK(std::all_of(out.begin(), out.end(), [](float v) { return std::isfinite(v); }));
        return out;
    }
};

// The qtts program beside this test (tools/gpu-run.sh stages them together) or in the build.
std::string qtts_exe() {
    std::error_code ec;
    const fs::path self = fs::read_symlink("/proc/self/exe", ec);
    if (!ec && fs::exists(self.parent_path() / "qtts")) return (self.parent_path() / "qtts").string();
    const std::string built = std::string(QTTS_BINARY_DIR) + "/qtts";
    REQUIRE(fs::exists(built));
    return built;
}

std::string run_capture(const std::string& cmd) {
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    REQUIRE(pclose(p) == 0);
    return out;
}

// The value of "key: value" in `text` ("" when the key is absent).
std::string field(const std::string& text, const std::string& key) {
    const size_t at = text.find("\n" + key + ": ");
    if (at == std::string::npos) return "";
    const size_t from = at + key.size() + 3;
    return text.substr(from, text.find('\n', from) - from);
}

}  // namespace

TEST_CASE("qtts version names the device, its architecture, the compiled ones and the kernel path", "[gpu][arch]") {
    const std::string out = "\n" + run_capture(qtts_exe() + " version 2>/dev/null");
    INFO(out);
    cudaDeviceProp prop{};
    REQUIRE(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    CHECK(field(out, "cuda device") == std::string(prop.name));
    CHECK(field(out, "cuda compute capability") == std::to_string(prop.major) + "." + std::to_string(prop.minor));
    CHECK_FALSE(field(out, "cuda archs compiled").empty());
    CHECK(field(out, "cuda archs compiled") != "none");
    const std::string path = field(out, "cuda kernel path");
    const qtts::CudaReport report = qtts::cuda_report(0);
    REQUIRE(report.usable);
    CHECK(path.rfind(report.kernel_path + " (code from compute_" + std::to_string(report.kernel_ptx), 0) == 0);
    // The path follows the device and the code it got, and the context's PDL switch follows the path.
    const bool hopper = prop.major >= 9 && report.kernel_ptx >= 90;
    CHECK(report.kernel_path == (hopper ? "hopper" : "portable"));
    CHECK(context().kernel_path() ==
          (hopper ? k::KernelPath::KERNEL_PATH_HOPPER : k::KernelPath::KERNEL_PATH_PORTABLE));
    CHECK(context().pdl() == hopper);
    WARN("kernel path on " << prop.name << ": " << path << (hopper ? " (PDL on)" : " (PDL off)"));
}

TEST_CASE("gemv rows per block shrink to a smaller GPU's shared memory with the same results", "[gpu][arch]") {
    // 8 rows over 6144 inputs (the 1.7B talker's down projection, batched) stage 192 KiB of
    // input: sm_90 takes it in one block; capped at sm_86/89's 99 KiB the launcher takes 2 rows
    // per block. Every row is computed as in a one-row launch, so the outputs are equal bit for bit.
    CappedProduct p(8, 6144, 256, 11);
    const auto gemv = [](const k::GemvArgs& a) { k::gemv(a, context().launch()); };
    const auto big = p.run(0, gemv), small = p.run(99 * 1024, gemv);
    CHECK(std::memcmp(big.data(), small.data(), big.size() * 4) == 0);
}

TEST_CASE("skinny products keep their weights in registers where a smaller GPU's shared memory is short",
          "[gpu][arch][skinny]") {
    // 12 rows against 1024 features (64 tiles: one 16-warp block per SM, whose weight ring takes
    // 144 KiB) and 4096 features (two 8-warp blocks per SM, 72 KiB each). Uncapped (sm_90) and
    // capped at sm_80's 163 KiB a block both keep the ring; capped at sm_86/89's 99 KiB both keep
    // their weight steps in registers. The same bits either way.
    for (const int out : {1024, 4096}) {
        INFO("out " << out);
        CappedProduct p(12, 2048, out, 21);
        const auto skinny = [](const k::GemvArgs& a) { k::skinny_product(a, context().launch()); };
        const auto ring = p.run(0, skinny);
        for (const size_t cap : {size_t(163) * 1024, size_t(99) * 1024}) {
            INFO("cap " << cap);
            const auto capped = p.run(cap, skinny);
            CHECK(std::memcmp(ring.data(), capped.data(), ring.size() * 4) == 0);
        }
    }
}

TEST_CASE("the GPU memory limit is honoured: slots fitted, peak under the limit", "[gpu][memory]") {
    const size_t limit = size_t(512) << 20;
    qtts::gpu_memory_peak_reset(0);
    const qtts::DeviceMemory before = qtts::cuda_memory(0);  // the CUDA context exists from here on
    const size_t tracked_before = qtts::gpu_memory_use(0).current_bytes;
    {
        BackendOptions o;
        o.name = "cuda";
        o.states = 64;
        o.states_fit = true;
        o.gpu_memory_limit = limit;
        const auto model = qtts::SpeechModel::load(qtts::default_model_dir(), o);
        const int slots = model->stream_slots();
        CHECK(slots >= 1);
        CHECK(slots <= 64);
        CHECK(model->gpu_states_created() == slots);
        // One utterance through the lease, so graphs, cuBLAS and the decoder have all run.
        qtts::Utterance utterance(model, model->prepare(qtts_test::greedy_request("Within the limit.", 6, 3)));
        std::vector<float> pcm;
        std::vector<qtts::FrameCodes> codes;
        while (utterance.chunk(4, &pcm, &codes) == qtts::UtteranceStatus::UTTERANCE_CHUNK) {
        }
        CHECK_FALSE(pcm.empty());
        const qtts::DeviceMemory after = qtts::cuda_memory(0);
        const size_t device_view = after.used_bytes > before.used_bytes ? after.used_bytes - before.used_bytes : 0;
        const size_t peak = qtts::gpu_memory_use(0).peak_bytes - tracked_before;
        WARN("limit " << (limit >> 20) << " MiB: " << slots << " slot(s), tracked peak " << (peak >> 20)
                      << " MiB, device view " << (device_view >> 20) << " MiB");
        CHECK(peak <= limit);
        CHECK(device_view <= limit);
    }
}

TEST_CASE("more streams than the GPU memory limit holds fail at load with the number that fits", "[gpu][memory]") {
    BackendOptions o;
    o.name = "cuda";
    o.states = 1000;
    o.warm_up = false;
    o.gpu_memory_limit = size_t(512) << 20;
    std::string message;
    try {
        qtts::SpeechModel::load(qtts::default_model_dir(), o);
        FAIL("1000 stream states were made under a 512 MiB limit");
    } catch (const qtts::Error& e) {
        CHECK(e.code() == qtts::ErrorCode::ERROR_CUDA);
        message = e.what();
    }
    INFO(message);
    CHECK_THAT(message, Catch::Contains("has room for") && Catch::Contains("--max-streams") &&
                            Catch::Contains("limit 512 MiB"));
    // Nothing is left behind: what qtts tracks on the device is back to what the context holds.
    CHECK(qtts::gpu_memory_use(0).current_bytes <= context().cublas_workspace_bytes());
}

#endif  // QTTS_HAVE_CUDA
