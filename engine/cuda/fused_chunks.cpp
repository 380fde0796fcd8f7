#include "engine/cuda/fused_chunks.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "kernels/chunk.cuh"

namespace qtts::cuda {

namespace k = ::qtts::kernels;

FusedChunkGraphs::FusedChunkGraphs(GpuLm& lm, GpuSpeechDecoder& decoder, const std::vector<int>& frame_counts,
                                   const std::vector<int>& early_audio)
    : lm_(lm), decoder_(decoder) {
    if (&decoder_.context() != &lm_.context())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "fused chunks: the LM and the decoder must share one GPU context");
    if (decoder_.config().num_quantizers > k::SAMPLE_MAX_GROUPS ||
        decoder_.config().num_quantizers > lm_.weights().num_code_groups)
        fail(ErrorCode::ERROR_UNSUPPORTED, "fused chunks: the decoder reads {} codes per frame, the LM makes {}",
             decoder_.config().num_quantizers, lm_.weights().num_code_groups);
    for (const int n : frame_counts)
        if (n >= 1 && n <= std::min(decoder_.max_chunk_frames(), k::CHUNK_MAX_FRAMES)) max_frames_ = std::max(max_frames_, n);
    if (max_frames_ == 0) return;
    staged_dev_ = DeviceArray<int32_t>(size_t(max_frames_ + 1) * k::SAMPLE_MAX_GROUPS + 1);
    staged_host_ = PinnedArray<int32_t>(staged_dev_.size());
    pcm_host_ = PinnedArray<float>(size_t(max_frames_) * decoder_.samples_per_frame());
    for (const int n : frame_counts) {
        if (n < 1 || n > max_frames_ || graphs_.count(n)) continue;
        GraphStats s;
        const bool early = std::find(early_audio.begin(), early_audio.end(), n) != early_audio.end();
        try {
            GraphExec exec = capture(n, early, &s);
            s.frames = n;
            stats_.push_back(s);
            graphs_.emplace(n, Graph{std::move(exec), early});
        } catch (const Error& e) {
            // A driver without conditional graph nodes, for example: the generator keeps the
            // separate LM and decoder replays for this size.
            QTTS_LOG_WARN("fused chunk graph x{} not available ({}); chunks of {} frames replay LM and decoder "
                          "separately", n, e.what(), n);
        }
    }
}

GraphExec FusedChunkGraphs::capture(int frames, bool early_audio, GraphStats* stats) {
    GpuContext& context = lm_.context();
    OwnerGuard::Scope owner(context.guard(), "fused chunk capture");
    DeviceScope scope(context.device());
    cudaStream_t stream = context.stream();
    CUDA_CHECK(cudaStreamSynchronize(stream));
    const auto t0 = std::chrono::steady_clock::now();

    // The parent graph: frame steps, bridge, IF node, copies (early audio: then the event and the
    // tail). The IF node is added by hand to the graph being captured and becomes the stream's
    // only dependency.
    cudaGraph_t body = nullptr;
    cudaGraph_t graph = stream_capture(stream, [&] {
        for (int i = 0; i + 1 < frames; ++i) lm_.frame_step_enqueue();
        if (early_audio) lm_.predictor_frame_enqueue();
        else lm_.frame_step_enqueue();
        cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
        cudaGraph_t capturing = nullptr;
        CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, &capturing));
        cudaGraphConditionalHandle condition = 0;
        CUDA_CHECK(cudaGraphConditionalHandleCreate(&condition, capturing, 0, cudaGraphCondAssignDefault));

        k::ChunkBridgeArgs bridge;
        bridge.state = lm_.device_state();
        bridge.lm_codes = lm_.codes_device();
        bridge.code_capacity = lm_.code_capacity();
        bridge.frames = frames;
        bridge.talker_pending = early_audio;
        bridge.groups = decoder_.config().num_quantizers;
        bridge.codebook_size = decoder_.config().codebook_size;
        bridge.staged = staged_dev_.get();
        bridge.decoder_codes = decoder_.codes_device();
        bridge.condition = condition;
        CUDA_CHECK_KERNEL(k::chunk_bridge(bridge, stream));

        const cudaGraphNode_t* deps = nullptr;
        const cudaGraphEdgeData* edges = nullptr;
        size_t n_deps = 0;
        CUDA_CHECK(cudaStreamGetCaptureInfo(stream, &status, nullptr, &capturing, &deps, &edges, &n_deps));
        cudaGraphNodeParams params = {};
        params.type = cudaGraphNodeTypeConditional;
        params.conditional.handle = condition;
        params.conditional.type = cudaGraphCondTypeIf;
        params.conditional.size = 1;
        cudaGraphNode_t if_node = nullptr;
        CUDA_CHECK(cudaGraphAddNode(&if_node, capturing, deps, edges, n_deps, &params));
        body = params.conditional.phGraph_out[0];
        CUDA_CHECK(cudaStreamUpdateCaptureDependencies(stream, &if_node, nullptr, 1, cudaStreamSetCaptureDependencies));

        const size_t staged_ints = size_t(frames + 1) * k::SAMPLE_MAX_GROUPS + 1;
        CUDA_CHECK(cudaMemcpyAsync(staged_host_.get(), staged_dev_.get(), staged_ints * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, stream));
        CUDA_CHECK(cudaMemcpyAsync(pcm_host_.get(), decoder_.pcm_device(),
                                   size_t(frames) * decoder_.samples_per_frame() * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream));
        if (!early_audio) return;
        audio_ready_.record_node(stream);

        // The tail: the last frame's talker step, then the row after the chunk to the host.
        lm_.talker_frame_enqueue(/*after_non_kernel=*/true);
        int32_t* next_row = staged_dev_.get() + size_t(frames) * k::SAMPLE_MAX_GROUPS;
        CUDA_CHECK_KERNEL(k::chunk_row_stage(lm_.device_state(), lm_.codes_device(), lm_.code_capacity(), next_row,
                                             stream));
        CUDA_CHECK(cudaMemcpyAsync(staged_host_.get() + size_t(frames) * k::SAMPLE_MAX_GROUPS, next_row,
                                   k::SAMPLE_MAX_GROUPS * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
    });

    // The IF body: the decoder's chunk, captured straight into the node's graph.
    try {
        stream_capture(stream, [&] { decoder_.chunk_enqueue_for_capture(frames); }, body);
    } catch (...) {
        cudaGraphDestroy(graph);
        throw;
    }
    return graph_instantiate(context, "fused chunk x" + std::to_string(frames), graph, ms_since(t0), stats);
}

FusedChunkGraphs::~FusedChunkGraphs() {
    // A tail still running writes into staged_host_: let it finish (no throw from here).
    if (pending_frames_) cudaStreamSynchronize(lm_.context().stream());
}

bool FusedChunkGraphs::run(int frames) {
    auto it = graphs_.find(frames);
    if (it == graphs_.end()) fail(ErrorCode::ERROR_INTERNAL, "fused chunk of {} frames: no graph", frames);
    land();  // the previous tail writes the staging rows this replay writes
    graph_replay(lm_.context(), it->second.exec);
    if (it->second.early_audio) {
        pending_frames_ = frames;
        audio_ready_.wait();
    } else {
        lm_.context().synchronize();
    }
    const bool decoded = staged_host_.get()[size_t(frames + 1) * k::SAMPLE_MAX_GROUPS] != 0;
    if (decoded) decoder_.frames_decoded_add(frames);
    return decoded;
}

const int32_t* FusedChunkGraphs::land() {
    const int frames = pending_frames_;
    if (frames == 0) return nullptr;
    pending_frames_ = 0;  // (a failed wait leaves the context to the caller's recovery, not to another wait)
    lm_.context().synchronize();
    return staged_host_.get() + size_t(frames) * k::SAMPLE_MAX_GROUPS;
}

}  // namespace qtts::cuda
