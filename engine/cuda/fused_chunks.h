// One chunk, one launch: K frames of the talker + code predictor AND their audio in a single
// CUDA graph replay (docs/cuda.md, "Fused chunks").
//
// The graph of a K-frame chunk is
//   K frame steps (GpuLm::frame_step_enqueue, as in FrameGraphs)
//   → chunk_bridge: copies the chunk's codes (+ codebook 0 of the next frame) into a staging
//     buffer and the K frames into the decoder's input, and sets the graph's condition to
//     "every code is a codebook entry"
//   → IF condition: the decoder's chunk of K frames (GpuSpeechDecoder, same kernels as its own
//     graphs)
//   → one copy of the staged codes + flag, one copy of the K·1920 samples, to pinned memory.
// For an "early audio" size (a stream's first chunk, whose audio starts playback) the last frame
// step is split around the decoder instead: its predictor passes (the chunk's codes are then
// complete), the bridge, the IF node and the copies, an event-record node where run() returns,
// and only then the tail: that frame's talker step and codebook-0 draw (~1.5 ms of the 1.7B's
// 3.6 ms frame, needed by the next chunk only), chunk_row_stage and a copy of the row after the
// chunk. The first audio comes that much sooner; land() waits for the tail, and only then is
// the row after the chunk (a stop right after it?) on the host. Steady sizes keep the one-piece
// graph: a steady chunk's audio sooner buys nothing (the stream is far ahead of playback).
// A chunk that contains the end-of-speech token is never seen by the decoder (its state does not
// move); the generator then decodes the frames before the stop with the decoder's ordinary call.
// Every pointer in the graph is fixed (the chunk's position comes from the LM's device state), so
// one graph per K serves every chunk of every utterance of the (generator, decoder) pair it was
// captured for.
//
// Threading: the owner thread of the context, like the GpuLm and decoder it drives.
#pragma once

#include <map>
#include <vector>

#include "engine/cuda/device_buffer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/cuda/gpu_speech_decoder.h"

namespace qtts::cuda {

class FusedChunkGraphs {
public:
    // Captures one graph per size in `frame_counts` (sizes the decoder cannot take in one chunk
    // are skipped), early-audio graphs for the sizes also in `early_audio`. A size whose graph
    // the driver refuses is logged and left to the unfused path.
    FusedChunkGraphs(GpuLm& lm, GpuSpeechDecoder& decoder, const std::vector<int>& frame_counts,
                     const std::vector<int>& early_audio);
    FusedChunkGraphs(const FusedChunkGraphs&) = delete;
    FusedChunkGraphs& operator=(const FusedChunkGraphs&) = delete;

    ~FusedChunkGraphs();

    bool has(int frames) const { return graphs_.count(frames) != 0; }
    // Replays the K-frame graph and waits for its audio. Returns true when the decoder ran (the
    // chunk had no end-of-speech token); codes() and pcm() then hold the chunk's results, but for
    // an early-audio size the tail still runs (pending()) and codes() row K is not in yet.
    bool run(int frames);
    // Waits for the last run's tail and returns its row after the chunk (codes() row K); null,
    // at once, when no tail is pending.
    const int32_t* land();
    bool pending() const { return pending_frames_ != 0; }
    // [K + 1, 16] codes of the last run: the chunk's frames and the row after it.
    const int32_t* codes() const { return staged_host_.get(); }
    const float* pcm() const { return pcm_host_.get(); }  // [K · samples_per_frame]
    const std::vector<GraphStats>& stats() const { return stats_; }

private:
    struct Graph {
        GraphExec exec;
        bool early_audio = false;
    };
    GraphExec capture(int frames, bool early_audio, GraphStats* stats);

    GpuLm& lm_;
    GpuSpeechDecoder& decoder_;
    int max_frames_ = 0;
    DeviceArray<int32_t> staged_dev_;     // [max + 1, 16] + flag
    PinnedArray<int32_t> staged_host_;
    PinnedArray<float> pcm_host_;         // [max · spf]
    StreamMark audio_ready_;              // recorded by the early-audio graphs before their tail
    int pending_frames_ = 0;              // K of the last run while its tail has not landed
    std::map<int, Graph> graphs_;
    std::vector<GraphStats> stats_;
};

}  // namespace qtts::cuda
