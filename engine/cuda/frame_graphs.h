// CUDA graphs of the per-frame work (graph rules 14-22).
//
// A FrameGraphs object captures, once at start-up, one graph per configured frame count K: K
// consecutive GpuLm::frame_step_enqueue() calls (talker step + 15 predictor passes + on-device
// sampling + next-input formation). Each graph is instantiated and uploaded immediately; its
// capture time, node count and memory are logged. No graph allocates (every buffer exists
// before capture), so all graphs share the device's one graph memory pool and it does not grow.
//
// run(K) replays the graph captured for K frames, or enqueues the same K steps eagerly when no
// graph has that size or graphs are disabled (`--no-cuda-graphs`, BackendOptions::cuda_graphs): the
// results are bitwise identical either way (the same kernels in the same order).
// Replays go through the context's OwnerGuard: another thread, or a replay while a capture or
// another replay is in progress, is refused.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime_api.h>

#include "engine/cuda/gpu_lm.h"

namespace qtts::cuda {

// An instantiated graph (owning).
class GraphExec {
public:
    GraphExec() = default;
    explicit GraphExec(cudaGraphExec_t exec) : exec_(exec) {}
    ~GraphExec() { reset(); }
    GraphExec(const GraphExec&) = delete;
    GraphExec& operator=(const GraphExec&) = delete;
    GraphExec(GraphExec&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }
    GraphExec& operator=(GraphExec&& o) noexcept {
        if (this != &o) {
            reset();
            exec_ = o.exec_;
            o.exec_ = nullptr;
        }
        return *this;
    }
    cudaGraphExec_t get() const { return exec_; }
    void reset() {
        if (exec_) cudaGraphExecDestroy(exec_);
        exec_ = nullptr;
    }

private:
    cudaGraphExec_t exec_ = nullptr;
};

struct GraphStats {
    std::string name;
    int frames = 0;
    size_t nodes = 0;          // kernel and memory nodes in the graph
    double capture_ms = 0.0;   // stream capture (enqueue) time
    double instantiate_ms = 0.0;  // instantiate + upload
    long long device_bytes = 0;   // device memory taken by instantiate + upload (cudaMemGetInfo delta)
};

// Captures whatever `enqueue` puts on the context stream into an instantiated, uploaded graph.
GraphExec graph_capture(GpuContext& context, const std::string& name, const std::function<void()>& enqueue,
                        GraphStats* stats);
// Runs `enqueue` under stream capture (thread-local mode) and returns the captured graph, which
// the caller owns; with `into`, the work is captured into that existing graph instead (a
// conditional node's body) and `into` is returned. Capture is ended and cleaned up if enqueue throws.
cudaGraph_t stream_capture(cudaStream_t stream, const std::function<void()>& enqueue, cudaGraph_t into = nullptr);
// Instantiates and uploads a graph built by the caller (takes ownership of `graph`, destroys it),
// logs and reports its stats like graph_capture.
GraphExec graph_instantiate(GpuContext& context, const std::string& name, cudaGraph_t graph, double capture_ms,
                            GraphStats* stats);
double ms_since(std::chrono::steady_clock::time_point t0);
// Replays a graph on the context stream (owner thread, not re-entrant).
void graph_replay(GpuContext& context, const GraphExec& graph);

class FrameGraphs {
public:
    FrameGraphs(GpuLm& lm, bool enabled);

    // Captures one graph per frame count (the device state is not modified by capture).
    void capture(const std::vector<int>& frame_counts);
    bool enabled() const { return enabled_; }
    bool has(int frames) const { return enabled_ && graphs_.count(frames) != 0; }
    // K frame steps: graph replay when captured, else eager.
    void run(int frames);
    const std::vector<GraphStats>& stats() const { return stats_; }
    // Device memory of all captured graphs together (the budget the tests check).
    long long device_bytes() const;

private:
    GpuLm& lm_;
    bool enabled_;
    std::map<int, GraphExec> graphs_;
    std::vector<GraphStats> stats_;
};

}  // namespace qtts::cuda
