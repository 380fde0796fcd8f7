// qtts-kernel-lab timeline: the product's frame graph replayed with the kernels' stamps on
// (a -DQTTS_KERNEL_TIMELINE=ON build), each launch's cost inside the chain.
#include "apps/kernel-lab/timeline_lab.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "apps/qtts/bench_stats.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/event_timer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/generation/sampling.h"
#include "engine/model/weights.h"
#include "kernels/timeline.cuh"

namespace qtts::kernel_lab {

namespace {

namespace qc = ::qtts::cuda;
namespace k = ::qtts::kernels;

// %globaltimer read back to back by one thread: the smallest step it takes shows its resolution.
__global__ void timer_steps_kernel(uint64_t* out, int n) {
    uint64_t last;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(last));
    for (int i = 0; i < n; ++i) {
        uint64_t t;
        do {
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        } while (t == last);
        out[i] = t - last;
        last = t;
    }
}

const char* file_name(uint32_t id) {
    static const char* const names[] = {"gemv_device.cuh", "attention.cu", "sampling.cu", "embedding.cu",
                                        "rmsnorm.cu",      "linear.cu",    "batch.cu",    "skinny.cu",
                                        "few_columns.cu",  "rope.cu",      "swiglu.cu",   "chunk.cu",
                                        "decoder.cu",      "gemv.cu",      "common.cuh"};
    for (const char* n : names)
        if (k::timeline_file_id(n) == id) return n;
    return "?";
}

// The block records' pass (kernels/timeline.cuh, TimelineRing::blocks): `frames` replays with a
// record for every block beside the launch records, joined by %gridid and time (a graph node
// keeps its %gridid from replay to replay, so a launch takes the blocks of its node released
// within 1 ms of its own release; a frame takes ~4 ms). Per launch of a frame
// (K of them), medians over the frames but the first and the last, in µs from the launch's
// release (block 0's wait returning): when its last block reached the wait and left it, when
// the median block and the last block finished (a block's last stamp: its wait or its last
// mark), the next launch's release, and the marks of the block that finished last (the decode
// attention's: its combining block, whose mark 3 says when its arrival was the last). A separate
// pass, because every block's atomic on the ring's counter shifts the costs the launch records
// measure.
int block_pass(qc::GpuContext& ctx, const qc::GraphExec& frame, int K, int frames) {
    const uint32_t capacity = uint32_t(frames) * 1024u, block_capacity = uint32_t(frames) * (1u << 18);
    qc::DeviceArray<k::TimelineRecord> records(capacity);
    qc::DeviceArray<k::TimelineBlockRecord> blocks(block_capacity);
    qc::DeviceArray<uint32_t> next(2);
    CUDA_CHECK(cudaMemset(next.get(), 0, 8));
    k::timeline_attach(k::TimelineRing{records.get(), next.get(), capacity, blocks.get(), next.get() + 1, block_capacity});
    for (int f = 0; f < frames; ++f) qc::graph_replay(ctx, frame);
    ctx.synchronize();
    k::timeline_attach(k::TimelineRing{});
    uint32_t counts[2] = {0, 0};
    CUDA_CHECK(cudaMemcpy(counts, next.get(), 8, cudaMemcpyDeviceToHost));
    if (counts[0] != uint32_t(frames * K) || counts[1] > block_capacity) {
        std::printf("  block pass: %u launch records for %d frames of %d, %u block records (room for %u)\n", counts[0],
                    frames, K, counts[1], block_capacity);
        return 1;
    }
    std::vector<k::TimelineRecord> r(counts[0]);
    std::vector<k::TimelineBlockRecord> b(counts[1]);
    CUDA_CHECK(cudaMemcpy(r.data(), records.get(), r.size() * sizeof r[0], cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(b.data(), blocks.get(), b.size() * sizeof b[0], cudaMemcpyDeviceToHost));
    std::unordered_map<uint64_t, std::vector<uint32_t>> by_grid;
    for (uint32_t i = 0; i < counts[1]; ++i) by_grid[b[i].grid].push_back(i);

    const auto us = [](uint64_t a, uint64_t c) { return (double(a) - double(c)) * 1e-3; };
    std::printf("  blocks: %d frames, %u block records; per launch, medians over frames 1..%d, us from its release\n",
                frames, counts[1], frames - 2);
    std::printf("  %4s %-22s %6s %8s %9s %9s %9s %9s %9s %8s %8s %8s %8s\n", "#", "kernel", "blocks", "recorded",
                "last in", "last out", "half done", "last done", "next rel", "lb mark0", "lb mark1", "lb mark2",
                "lb mark3");
    for (int j = 0; j < K; ++j) {
        std::vector<double> recorded, last_in, last_out, half_done, last_done, next_rel;
        std::vector<double> last_marks[k::TIMELINE_MARKS];  // of the block that finished last
        for (int f = 1; f + 1 < frames; ++f) {
            const k::TimelineRecord &c = r[size_t(f) * K + j], &n = r[size_t(f) * K + j + 1];
            const auto it = by_grid.find(c.grid);
            if (it == by_grid.end()) continue;
            double in = -1e9, out = -1e9;
            std::vector<double> done;
            const k::TimelineBlockRecord* last_block = nullptr;
            double last_block_done = -1e9;
            for (const uint32_t i : it->second) {
                const k::TimelineBlockRecord& x = b[i];
                if (std::abs(us(x.release, c.release)) > 1000.0) continue;  // the same graph node in another frame
                uint64_t last = x.release;
                for (const uint64_t m : x.mark) last = std::max(last, m);
                in = std::max(in, us(x.entry, c.release));
                out = std::max(out, us(x.release, c.release));
                done.push_back(us(last, c.release));
                if (done.back() > last_block_done) {
                    last_block_done = done.back();
                    last_block = &x;
                }
            }
            if (done.empty()) continue;
            for (int m = 0; m < k::TIMELINE_MARKS; ++m)
                if (last_block->mark[m]) last_marks[m].push_back(us(last_block->mark[m], c.release));
            std::sort(done.begin(), done.end());
            recorded.push_back(double(done.size()));
            last_in.push_back(in);
            last_out.push_back(out);
            half_done.push_back(done[done.size() / 2]);
            last_done.push_back(done.back());
            next_rel.push_back(us(n.release, c.release));
        }
        if (recorded.empty()) continue;
        char where[64];
        std::snprintf(where, sizeof where, "%s:%u", file_name(r[size_t(j)].file), r[size_t(j)].line);
        double lb[k::TIMELINE_MARKS];
        for (int m = 0; m < k::TIMELINE_MARKS; ++m)
            lb[m] = last_marks[m].empty() ? -1.0 : qtts_cli::bench_median(last_marks[m]);
        std::printf("  %4d %-22s %6u %8.0f %9.2f %9.2f %9.2f %9.2f %9.2f %8.2f %8.2f %8.2f %8.2f\n", j, where,
                    r[size_t(j)].blocks, qtts_cli::bench_median(recorded), qtts_cli::bench_median(last_in),
                    qtts_cli::bench_median(last_out), qtts_cli::bench_median(half_done),
                    qtts_cli::bench_median(last_done), qtts_cli::bench_median(next_rel), lb[0], lb[1], lb[2], lb[3]);
    }
    return 0;
}

}  // namespace

int lab_timeline(const std::string& model, int device, int frames, uint64_t seed) {
    if (!k::timeline_built()) {
        std::printf("qtts-kernel-lab timeline: this build records no timeline; configure a build with "
                    "-DQTTS_KERNEL_TIMELINE=ON\n");
        return 2;
    }
    qc::GpuContext ctx(device);
    const auto checkpoint = qtts::checkpoint_load(model);
    const auto weights = qc::GpuLmWeights::upload(checkpoint, device);
    qc::GpuLm lm(weights, ctx, qc::GpuLmOptions{});
    const int H = weights->talker.hidden;
    std::printf("qtts-kernel-lab timeline: %s, device %d (%s), PDL %s, %d frames, seed %llu\n", model.c_str(), device,
                ctx.device_name().c_str(), ctx.pdl() ? "on" : "off", frames, static_cast<unsigned long long>(seed));

    {  // the timer's resolution
        constexpr int n = 256;
        qc::DeviceArray<uint64_t> steps(n);
        timer_steps_kernel<<<1, 1, 0, ctx.stream()>>>(steps.get(), n);
        CUDA_CHECK(cudaGetLastError());
        std::vector<uint64_t> h(n);
        CUDA_CHECK(cudaMemcpyAsync(h.data(), steps.get(), n * 8, cudaMemcpyDeviceToHost, ctx.stream()));
        ctx.synchronize();
        std::sort(h.begin(), h.end());
        std::printf("  %%globaltimer steps: min %llu ns, median %llu ns, max %llu ns\n",
                    static_cast<unsigned long long>(h.front()), static_cast<unsigned long long>(h[n / 2]),
                    static_cast<unsigned long long>(h.back()));
    }

    // An utterance that never ends: random prompt rows and text track, the checkpoint's sampling.
    std::mt19937 rng{uint32_t(seed)};
    std::uniform_real_distribution<float> uni(-0.05f, 0.05f);
    const int L = 60, T = 40;
    std::vector<float> prefill(size_t(L) * H), trailing(size_t(T) * H);
    for (float& v : prefill) v = uni(rng);
    for (float& v : trailing) v = uni(rng);
    const qtts::GenerationParams params = qtts::generation_params_from_config(checkpoint->generation);
    qc::GpuGenerationSetup setup;
    setup.seed = seed;
    setup.talker = params.talker;
    setup.predictor = params.predictor;
    setup.min_new_tokens = 1 << 30;
    lm.generation_start(prefill.data(), L, trailing.data(), T, setup);
    const qc::GraphExec frame =
        qc::graph_capture(ctx, "timeline frame (lab)", [&] { lm.frame_step_enqueue(); }, nullptr);
    for (int i = 0; i < 4; ++i) qc::graph_replay(ctx, frame);

    const uint32_t capacity = uint32_t(frames) * 1024u;
    qc::DeviceArray<k::TimelineRecord> records(capacity);
    qc::DeviceArray<uint32_t> next(1);
    const auto frame_ms = [&] {
        return qc::time_on_stream(ctx.stream(), frames, [&] { qc::graph_replay(ctx, frame); });
    };
    k::timeline_attach(k::TimelineRing{});
    const double detached_ms = frame_ms();
    CUDA_CHECK(cudaMemset(next.get(), 0, 4));
    k::timeline_attach(k::TimelineRing{records.get(), next.get(), capacity});
    const double attached_ms = frame_ms();
    k::timeline_attach(k::TimelineRing{});
    uint32_t count = 0;
    CUDA_CHECK(cudaMemcpy(&count, next.get(), 4, cudaMemcpyDeviceToHost));
    count = std::min(count, capacity);
    std::vector<k::TimelineRecord> r(count);
    CUDA_CHECK(cudaMemcpy(r.data(), records.get(), size_t(count) * sizeof(k::TimelineRecord), cudaMemcpyDeviceToHost));
    std::printf("  frame (graph replay): %.4f ms without the ring, %.4f ms recording; %u records\n", detached_ms,
                attached_ms, count);
    if (count == 0 || count % uint32_t(frames) != 0) {
        std::printf("  the records do not split into %d equal frames\n", frames);
        return 1;
    }
    const int K = int(count / uint32_t(frames));
    for (int f = 1; f < frames; ++f)
        for (int j = 0; j < K; ++j) {
            const k::TimelineRecord &a = r[size_t(j)], &b = r[size_t(f) * K + j];
            if (a.file != b.file || a.line != b.line || a.blocks != b.blocks) {
                std::printf("  frame %d launch %d differs from frame 0's\n", f, j);
                return 1;
            }
        }

    // Per launch of a frame, over the frames but the last (whose successor is not recorded).
    struct Row {
        double chain = 0, waited = 0, launched = 0, after_end = -1;
        double mark[k::TIMELINE_MARKS] = {-1, -1, -1, -1};
    };
    std::vector<Row> rows(static_cast<size_t>(K));
    const auto us = [](uint64_t a, uint64_t b) { return (double(a) - double(b)) * 1e-3; };
    for (int j = 0; j < K; ++j) {
        std::vector<double> chain, waited, launched, after, marks[k::TIMELINE_MARKS];
        for (int f = 1; f + 1 < frames; ++f) {
            const size_t i = size_t(f) * K + j;
            const k::TimelineRecord &c = r[i], &n = r[i + 1], &p = r[i - 1];
            chain.push_back(us(n.release, c.release));
            waited.push_back(us(c.release, c.entry));
            launched.push_back(us(c.entry, p.release));
            for (int m = 0; m < k::TIMELINE_MARKS; ++m)
                if (c.mark[m]) marks[m].push_back(us(c.mark[m], c.release));
            if (c.mark[1]) after.push_back(us(n.release, c.mark[1]));
        }
        Row& row = rows[size_t(j)];
        row.chain = qtts_cli::bench_median(chain);
        row.waited = qtts_cli::bench_median(waited);
        row.launched = qtts_cli::bench_median(launched);
        for (int m = 0; m < k::TIMELINE_MARKS; ++m)
            if (!marks[m].empty()) row.mark[m] = qtts_cli::bench_median(marks[m]);
        if (!after.empty()) row.after_end = qtts_cli::bench_median(after);
    }

    double total = 0;
    for (const Row& row : rows) total += row.chain;
    std::printf("  one frame: %d launches, chain medians summed %.1f us\n", K, total);
    std::printf("  %4s %-22s %6s %5s %8s %8s %8s %8s %8s %8s %8s %8s\n", "#", "kernel", "blocks", "thr", "chain",
                "waited", "launched", "mark0", "mark1", "mark2", "mark3", "1->next");
    for (int j = 0; j < K; ++j) {
        const k::TimelineRecord& c = r[size_t(j)];
        const Row& row = rows[size_t(j)];
        char where[64];
        std::snprintf(where, sizeof where, "%s:%u", file_name(c.file), c.line);
        std::printf("  %4d %-22s %6u %5u %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f\n", j, where, c.blocks,
                    c.threads, row.chain, row.waited, row.launched, row.mark[0], row.mark[1], row.mark[2], row.mark[3],
                    row.after_end);
    }

    // By kernel and grid: launches a frame, their chain time summed and a launch's mean.
    std::map<std::tuple<uint32_t, uint32_t, uint32_t>, std::pair<int, double>> kinds;
    for (int j = 0; j < K; ++j) {
        const k::TimelineRecord& c = r[size_t(j)];
        auto& e = kinds[{c.file, c.line, c.blocks}];
        e.first += 1;
        e.second += rows[size_t(j)].chain;
    }
    std::printf("  %-22s %6s %8s %10s %10s\n", "by kernel", "blocks", "launches", "chain us", "a launch");
    for (const auto& [key, e] : kinds) {
        char where[64];
        std::snprintf(where, sizeof where, "%s:%u", file_name(std::get<0>(key)), std::get<1>(key));
        std::printf("  %-22s %6u %8d %10.1f %10.2f\n", where, std::get<2>(key), e.first, e.second, e.second / e.first);
    }
    return block_pass(ctx, frame, K, std::min(frames, 8));
}

}  // namespace qtts::kernel_lab
