// One chunk, one launch: K frames of the talker + code predictor AND their audio in a single
// CUDA graph replay (docs/cuda.md, "Fused chunks").
//
// The graph of a K-frame chunk is
//   K - 1 frame steps (GpuLm::frame_step_enqueue, as in FrameGraphs), then the last frame's
//     predictor passes (GpuLm::predictor_frame_enqueue): the chunk's codes are complete
//   → chunk_bridge: copies the chunk's codes into a staging buffer and the K frames into the
//     decoder's input, and sets the graph's condition to "every code is a codebook entry"
//   → IF condition: the decoder's chunk of K frames (GpuSpeechDecoder, same kernels as its own
//     graphs)
//   → one copy of the staged codes + flag, one copy of the K·1920 samples, to pinned memory
//   → an event-record node: run() returns here, with the chunk's codes and audio on the host
//   → the tail: the last frame's talker step and codebook-0 draw of the frame after the chunk
//     (GpuLm::talker_frame_enqueue), chunk_row_stage, one copy of that row to pinned memory.
// So the audio of a chunk does not wait for the talker step that only the next chunk needs
// (~1.5 ms of the 1.7B's 3.6 ms frame: the first chunk's audio comes that much sooner), and the
// host hands the audio on while the tail runs. land() waits for the tail; only then is the row
// after the chunk (its codebook 0: a stop right after the chunk?) on the host.
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
    // are skipped). A size whose graph the driver refuses is logged and left to the unfused path.
    FusedChunkGraphs(GpuLm& lm, GpuSpeechDecoder& decoder, const std::vector<int>& frame_counts);
    FusedChunkGraphs(const FusedChunkGraphs&) = delete;
    FusedChunkGraphs& operator=(const FusedChunkGraphs&) = delete;

    ~FusedChunkGraphs();

    bool has(int frames) const { return graphs_.count(frames) != 0; }
    // Replays the K-frame graph and waits for its audio (the event before the tail). Returns true
    // when the decoder ran (the chunk had no end-of-speech token); codes() rows 0..K-1 and pcm()
    // then hold the chunk's results, and the tail is still running (pending()).
    bool run(int frames);
    // Waits for the last run's tail (at once when none is pending); codes() row K is then on the host.
    void land();
    bool pending() const { return pending_ != 0; }
    // [K + 1, 16] codes of the last run: the chunk's frames and (after land()) the row after it.
    const int32_t* codes() const { return staged_host_.get(); }
    const float* pcm() const { return pcm_host_.get(); }  // [K · samples_per_frame]
    const std::vector<GraphStats>& stats() const { return stats_; }

private:
    GraphExec capture(int frames, GraphStats* stats);

    GpuLm& lm_;
    GpuSpeechDecoder& decoder_;
    int max_frames_ = 0;
    DeviceArray<int32_t> staged_dev_;     // [max + 1, 16] + flag
    PinnedArray<int32_t> staged_host_;
    PinnedArray<float> pcm_host_;         // [max · spf]
    StreamMark audio_ready_;              // recorded by every graph before its tail
    int pending_ = 0;                     // frames of the run whose tail has not landed (0: none)
    std::map<int, GraphExec> graphs_;
    std::vector<GraphStats> stats_;
};

}  // namespace qtts::cuda
