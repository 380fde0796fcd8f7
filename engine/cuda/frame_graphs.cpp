#include "engine/cuda/frame_graphs.h"

#include <chrono>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cuda {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

GraphExec graph_capture(GpuContext& context, const std::string& name, const std::function<void()>& enqueue,
                        GraphStats* stats) {
    OwnerGuard::Scope owner(context.guard(), "graph capture");
    DeviceScope scope(context.device());
    cudaStream_t stream = context.stream();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();
    cudaGraph_t graph = stream_capture(stream, enqueue);
    return graph_instantiate(context, name, graph, ms_since(t0), stats);
}

cudaGraph_t stream_capture(cudaStream_t stream, const std::function<void()>& enqueue, cudaGraph_t into) {
    if (into)
        CUDA_CHECK(cudaStreamBeginCaptureToGraph(stream, into, nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal));
    else
        CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaGraph_t graph = nullptr;
    try {
        enqueue();
    } catch (...) {
        cudaStreamEndCapture(stream, &graph);
        if (graph && !into) cudaGraphDestroy(graph);
        cudaGetLastError();
        throw;
    }
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    return graph;
}

GraphExec graph_instantiate(GpuContext& context, const std::string& name, cudaGraph_t graph, double capture_ms,
                            GraphStats* stats) {
    DeviceScope scope(context.device());
    cudaStream_t stream = context.stream();
    size_t nodes = 0;
    const cudaError_t counted = cudaGraphGetNodes(graph, nullptr, &nodes);
    if (counted != cudaSuccess) cudaGraphDestroy(graph);
    CUDA_CHECK(counted);

    const size_t free_before = device_free_bytes();
    const auto t1 = std::chrono::steady_clock::now();
    cudaGraphExec_t exec = nullptr;
    const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    CUDA_CHECK(status);
    GraphExec result(exec);
    CUDA_CHECK(cudaGraphUpload(exec, stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const double instantiate_ms = ms_since(t1);
    const size_t free_after = device_free_bytes();
    GraphStats s;
    s.name = name;
    s.nodes = nodes;
    s.capture_ms = capture_ms;
    s.instantiate_ms = instantiate_ms;
    s.device_bytes = static_cast<long long>(free_before) - static_cast<long long>(free_after);
    size_t pool_used = 0;
    cudaDeviceGetGraphMemAttribute(context.device(), cudaGraphMemAttrUsedMemCurrent, &pool_used);
    QTTS_LOG_INFO("captured graph '{}' on device {}: {} nodes, capture {:.1f} ms, instantiate+upload {:.1f} ms, "
                  "device memory {:+.1f} MB, graph pool in use {:.1f} MB",
                  name, context.device(), nodes, capture_ms, instantiate_ms, s.device_bytes / 1e6, pool_used / 1e6);
    if (stats) *stats = s;
    return result;
}

void graph_replay(GpuContext& context, const GraphExec& graph) {
    OwnerGuard::Scope owner(context.guard(), "graph replay");
    if (!graph.get()) fail(ErrorCode::ERROR_INTERNAL, "graph replay: no graph was captured");
    DeviceScope scope(context.device());
    CUDA_CHECK(cudaGraphLaunch(graph.get(), context.stream()));
}

FrameGraphs::FrameGraphs(GpuLm& lm, bool enabled) : lm_(lm), enabled_(enabled) {}

void FrameGraphs::capture(const std::vector<int>& frame_counts) {
    if (!enabled_) return;
    for (const int frames : frame_counts) {
        if (frames < 1 || graphs_.count(frames)) continue;
        GraphStats s;
        GraphExec exec = graph_capture(
            lm_.context(), "frame x" + std::to_string(frames),
            [this, frames] {
                for (int i = 0; i < frames; ++i) lm_.frame_step_enqueue();
            },
            &s);
        s.frames = frames;
        stats_.push_back(s);
        graphs_.emplace(frames, std::move(exec));
    }
}

void FrameGraphs::run(int frames) {
    if (frames <= 0) return;
    auto it = enabled_ ? graphs_.find(frames) : graphs_.end();
    if (it != graphs_.end()) {
        graph_replay(lm_.context(), it->second);
        return;
    }
    OwnerGuard::Scope owner(lm_.context().guard(), "eager frame steps");
    for (int i = 0; i < frames; ++i) lm_.frame_step_enqueue();
}

long long FrameGraphs::device_bytes() const {
    long long total = 0;
    for (const GraphStats& s : stats_) total += s.device_bytes;
    return total;
}

}  // namespace qtts::cuda
