// The frame-by-frame generation loop on the CUDA backend: the same interface and the same codes
// as cpu::Generator (cpu/generator.h), so the two backends are interchangeable.
//
// Frames are produced on the device in chunks: the first chunk is short (time to first audio),
// later ones longer. A chunk is one replay of a frame graph (or eager steps when no graph has
// that size), then ONE device-to-host copy of the chunk's codes and one sync; next_frame() then
// hands the frames out one by one, applying the same stop rules as the CPU generator (EOS, frame
// budget, max_frames). Frames computed past a stop are discarded.
//
// Streaming text: the talker step of frame k needs text-track row k while the text is open, so
// next_frame() returns FRAME_STATUS_WAITING_FOR_TEXT one frame earlier than the CPU generator
// does (the codes are the same).
#pragma once

#include <memory>
#include <vector>

#include "cpu/generator.h"
#include "cuda/frame_graphs.h"
#include "cuda/gpu_lm.h"

namespace qtts::cuda {

struct GpuGeneratorOptions {
    GpuLmOptions lm;
    int first_chunk_frames = 1;   // frames of the first chunk (time to first audio)
    int chunk_frames = 4;         // frames per chunk afterwards
    bool graphs = true;           // CUDA graphs (also off when QTTS_NO_CUDA_GRAPHS is set)
    std::vector<int> graph_frames = {1, 4};  // frame counts that get a captured graph
};

class GpuGenerator {
public:
    // Allocates the GPU state and captures the frame graphs (start-up cost, logged).
    GpuGenerator(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, GpuGeneratorOptions options = {});

    void start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
               uint64_t seed, int text_tokens, bool text_closed = true);
    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed);

    cpu::FrameStatus next_frame(cpu::FrameCodes& codes);

    void text_append(const int32_t* ids, size_t n);
    void text_close();
    bool text_closed() const { return text_closed_; }

    cpu::StopReason stop_reason() const { return stop_reason_; }
    int frames_emitted() const { return frames_; }
    int frame_limit() const { return frame_limit_; }
    int context_length() const { return prompt_length_ + frames_; }

    void chunk_frames_set(int first, int steady);
    bool graphs_enabled() const { return graphs_.enabled(); }
    GpuLm& lm() { return lm_; }
    FrameGraphs& graphs() { return graphs_; }

private:
    void begin(const GenerationParams& params, int L, int text_tokens, bool text_closed);
    void frame_limit_update();
    void chunk_run(int frames);

    GpuContext& context_;
    GpuGeneratorOptions options_;
    GpuLm lm_;
    FrameGraphs graphs_;
    GenerationParams params_;
    int32_t eos_id_ = 2150;
    int prompt_length_ = 0;
    int text_tokens_ = 0;
    bool text_closed_ = true;
    bool started_ = false;
    bool done_ = false;
    int frames_ = 0;    // frames emitted
    int computed_ = 0;  // frames whose 16 codes are on the host (codebook 0 of frame computed_ too)
    int frame_limit_ = 0;
    bool limit_is_explicit_ = false;
    cpu::StopReason stop_reason_ = cpu::StopReason::STOP_REASON_NONE;
    std::vector<int32_t> host_codes_;  // [code_capacity, 16]
    PinnedArray<int32_t> chunk_codes_; // [max chunk + 1, 16]
};

}  // namespace qtts::cuda
