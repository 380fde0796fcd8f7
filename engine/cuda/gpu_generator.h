// The frame-by-frame generation loop on the CUDA backend: the same interface and the same codes
// as cpu::Generator (cpu/generator.h), so the two backends are interchangeable.
//
// Frames are produced on the device in chunks: the first chunk is short (time to first audio),
// later ones longer. A chunk is one replay of a frame graph (or eager steps when no graph has
// that size), then ONE device-to-host copy of the chunk's codes and one sync; next_frame() then
// hands the frames out one by one, applying the same stop rules as the CPU generator (EOS, frame
// budget, max_frames). Frames computed past a stop are discarded.
//
// Audio (issue 7, "one chunk, one launch"): with a speech decoder attached (decoder_attach), the
// generator also produces every emitted frame's samples, taken with audio_take(). A chunk whose
// size has a fused graph (cuda/fused_chunks.h) is ONE replay: frame steps, the device-side
// hand-off of the codes, the decoder under a graph condition, the copies; one sync. A chunk
// that holds the end-of-speech token skips the decoder inside that replay, and only the frames
// before the stop are then decoded (ordinary decoder call); chunk sizes without a fused graph
// decode right after their codes arrive. Either way the decoder sees exactly the emitted frames,
// in order, and continues across start() calls (the segments of one utterance).
//
// Streaming text: the talker step of frame k needs text-track row k while the text is open, so
// next_frame() returns FRAME_STATUS_WAITING_FOR_TEXT one frame earlier than the CPU generator
// does (the codes are the same).
#pragma once

#include <memory>
#include <vector>

#include "engine/cpu/generator.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/fused_chunks.h"
#include "engine/cuda/gpu_lm.h"
#include "engine/cuda/gpu_speech_decoder.h"

namespace qtts::cuda {

struct GpuGeneratorOptions {
    GpuLmOptions lm;
    int first_chunk_frames = 1;   // frames of the first chunk (time to first audio)
    int chunk_frames = 4;         // frames per chunk afterwards
    bool graphs = true;           // CUDA graphs (also off when QTTS_NO_CUDA_GRAPHS is set)
    std::vector<int> graph_frames = {1, 4};  // frame counts that get a captured graph
    // With a decoder attached: one fused graph per graph_frames size (graphs on, and
    // QTTS_NO_FUSED_CHUNKS unset); false keeps separate LM and decoder replays.
    bool fused_chunks = true;
};

class GpuGenerator {
public:
    // Allocates the GPU state and captures the frame graphs (start-up cost, logged).
    GpuGenerator(std::shared_ptr<const GpuLmWeights> weights, GpuContext& context, GpuGeneratorOptions options = {});

    void start(const float* prefill, int L, const float* trailing, int T, const GenerationParams& params,
               uint64_t seed, int text_tokens, bool text_closed = true);
    void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed);

    FrameStatus next_frame(FrameCodes& codes);

    void text_append(const int32_t* ids, size_t n);
    void text_close();
    bool text_closed() const { return text_closed_; }

    StopReason stop_reason() const { return stop_reason_; }
    int frames_emitted() const { return frames_; }
    int frame_limit() const { return frame_limit_; }
    int context_length() const { return prompt_length_ + frames_; }

    void chunk_frames_set(int first, int steady);

    // ---- audio ---------------------------------------------------------------------------
    // Gives the generator its speech decoder (same GPU context; its graph sizes should include
    // graph_frames) and captures the fused chunk graphs.
    void decoder_attach(std::unique_ptr<GpuSpeechDecoder> decoder);
    GpuSpeechDecoder* decoder() { return decoder_.get(); }
    // A new audio stream: the decoder back to position 0, held audio dropped (between utterances).
    void decoder_reset();
    // Appends the samples of every frame next_frame() returned since the last call (decoder
    // attached; nothing otherwise).
    void audio_take(std::vector<float>* pcm);
    // Chunk sizes replayed as one fused graph (empty without a decoder or with fusion off).
    std::vector<int> fused_sizes() const;
    bool graphs_enabled() const { return graphs_.enabled(); }
    GpuLm& lm() { return lm_; }
    FrameGraphs& graphs() { return graphs_; }

private:
    void begin(const GenerationParams& params, int L, int text_tokens, bool text_closed);
    void frame_limit_update();
    void chunk_run(int frames);
    void chunk_decode(int first, int frames);  // host codes -> audio_, frames before a stop only

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
    StopReason stop_reason_ = StopReason::STOP_NONE;
    std::vector<int32_t> host_codes_;  // [code_capacity, 16]
    PinnedArray<int32_t> chunk_codes_; // [max chunk + 1, 16]

    std::unique_ptr<GpuSpeechDecoder> decoder_;  // before fused_, which refers to it
    std::unique_ptr<FusedChunkGraphs> fused_;
    std::vector<float> audio_;     // decoded samples not yet taken, in frame order
    size_t audio_emitted_ = 0;     // leading samples of audio_ that belong to emitted frames
    std::vector<int32_t> decode_codes_;  // [frames, nq] packed for the decoder
};

}  // namespace qtts::cuda
