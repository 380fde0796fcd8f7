// The backend as the runtime sees it: one utterance's talker + code predictor state AND its
// speech decoder, on whichever backend the model runs (CPU reference or CUDA). The runtime asks
// for chunks of frames and gets their codes and their audio; it never decodes. Both backends
// produce the same codes (docs/cuda.md, "Numerics"), and chunking never changes the samples
// (the decoders stream exactly).
//
//   std::unique_ptr<ChunkGenerator> gen = model->generator_new();   // engine thread
//   gen->reference_decode(ref_codes, ref_frames);                    // in-context cloning only
//   gen->start(prompt, params, seed);                                // one segment (sentence)
//   while (gen->chunk(4, &codes, &pcm) == ChunkStatus::CHUNK_STATUS_FULL) { ... }
//   gen->stop_reason();
//
// The engine alone picks chunk sizes: a backend computes exactly the frames it is asked for in
// one call (CUDA: one graph replay when that size was captured, BackendOptions::chunk_sizes),
// keeps no count of its own and buffers nothing past the chunk. The decoder state continues
// across start() calls, so the segments of one utterance are one continuous stream.
// The stop rules are cpu::Generator's (engine/cpu/generator.h): same stop reasons, streaming
// text calls. One difference is allowed: the CUDA generator may report WAITING_FOR_TEXT one
// frame earlier, because it prepares the next frame's talker input ahead of time.
// Not thread-safe: the thread that created it (the engine thread) drives and destroys it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/generation/frame.h"
#include "engine/generation/sampling.h"
#include "engine/text/prompt.h"

namespace qtts {

// Why a chunk() call returned.
enum class ChunkStatus {
    CHUNK_STATUS_FULL,              // exactly the requested frames were made
    CHUNK_STATUS_WAITING_FOR_TEXT,  // fewer (maybe none): the text track needs a token not yet appended
    CHUNK_STATUS_DONE,              // fewer (maybe none): the segment ended; see stop_reason()
};
inline const char* chunk_status_name(ChunkStatus status) {
    switch (status) {
        case ChunkStatus::CHUNK_STATUS_FULL: return "full";
        case ChunkStatus::CHUNK_STATUS_WAITING_FOR_TEXT: return "waiting_for_text";
        case ChunkStatus::CHUNK_STATUS_DONE: return "done";
    }
    return "?";
}

class ChunkGenerator {
public:
    virtual ~ChunkGenerator() = default;

    // Embeds a built prompt and runs the talker prefill for one segment (restarts the frame
    // count and stop state; the decoder continues the utterance's audio).
    virtual void start(const Prompt& prompt, const GenerationParams& params, uint64_t seed) = 0;
    // Generates up to `frames` (>= 1) frames of the current segment, appends their codes to
    // *codes and their frames × SAMPLES_PER_FRAME samples to *pcm (host memory on return).
    // Fewer frames only at a stop (end of speech, frame limit) or when incremental text ran dry.
    // FULL may be followed by a DONE with no frames (the stop is seen one call later).
    virtual ChunkStatus chunk(int frames, std::vector<FrameCodes>* codes, std::vector<float>* pcm) = 0;
    virtual void text_append(const int32_t* ids, size_t n) = 0;
    virtual void text_close() = 0;
    virtual StopReason stop_reason() const = 0;
    virtual int frames_emitted() const = 0;  // frames of the current segment so far

    // In-context cloning: the reference codes ([frames, 16] row-major) are the decoder's left
    // context, and their audio is not part of the output. Decoding them once into the streaming
    // state (audio thrown away), before the first chunk, makes every generated frame sound
    // exactly as if decoded after the reference.
    virtual void reference_decode(const int32_t* codes, int frames) = 0;

    // Sliced starts (cpu-fast; the engine's EngineOptions::prefill_slice): start() in parts, so
    // that a long prompt's talker prefill can run a few rows at a time between the engine's steps
    // for other streams. start_open() does what start() does except the prefill and returns the
    // prefill's rows; start_advance(rows) runs up to `rows` (>= 1) more of them and returns how
    // many are left; at 0 the segment has started, in the state start() leaves (bitwise). Nothing
    // else is called in between. Backends whose prefill does not split exactly (the fp32
    // reference's BLAS products, CUDA's prefill passes) say false and start whole; their
    // start_open() is start() and leaves nothing.
    virtual bool start_slices() const { return false; }
    virtual int start_open(const Prompt& prompt, const GenerationParams& params, uint64_t seed) {
        start(prompt, params, seed);
        return 0;
    }
    virtual int start_advance(int rows) {
        (void)rows;
        return 0;
    }

    // Batching backends (CUDA, cpu-fast; SpeechModel::batch_run): true when the next chunk(frames) can take
    // its frames from a step of `frames` frames shared with other streams, computed before
    // chunk() is called: no stop seen, the text track reaches past them, and the frame limit is
    // not reached (a limit inside the chunk: the step makes all `frames` where the backend has
    // room, and chunk() keeps those up to the limit). May wait for the rest of this generator's
    // previous chunk on the device (CUDA: the tail after a fused chunk's audio). Default: never.
    virtual bool batch_ready(int frames) {
        (void)frames;
        return false;
    }
    // Batching backends, after batch_ready: the frames the current segment can still make before
    // its frame limit (a shared step need not make more for it). -1: not known (no limit, or a
    // backend that does not batch).
    virtual int frames_left() const { return -1; }

    // Batching backends that decode a step's chunks beside the next step (CUDA,
    // SpeechModel::batch_run with defer_audio): the frames the last chunk() emitted whose samples
    // it did not append, because a batched decoder pass on a second device stream still makes
    // them. audio_take() appends them (waiting for that pass when it still runs) and owes nothing
    // after; it must come before the next chunk(). 0 on every other path.
    virtual int audio_owed() const { return 0; }
    virtual void audio_take(std::vector<float>* pcm) { (void)pcm; }
};

// One segment start of a batched start (SpeechModel::batch_start): what ChunkGenerator::start
// takes, for one generator, and what became of it.
struct GenerationStart {
    ChunkGenerator* generator = nullptr;
    Prompt prompt;
    GenerationParams params;
    uint64_t seed = 0;
    std::string error;  // set when this start was refused (its prompt or parameters); the others went on
};

// A batched start where the prefills are not shared (cpu-fast; CUDA with batch_exact): each
// generator's start() in turn. A start refused for its own request (ERROR_INVALID_ARGUMENT) gets
// its `error` and the others go on; any other error (the backend's) is thrown.
inline void generation_starts_each(std::vector<GenerationStart>& starts) {
    for (GenerationStart& s : starts) {
        try {
            s.generator->start(s.prompt, s.params, s.seed);
        } catch (const Error& e) {
            if (e.code() != ErrorCode::ERROR_INVALID_ARGUMENT) throw;  // the backend, not this request
            s.error = e.what();
        }
    }
}

}  // namespace qtts
