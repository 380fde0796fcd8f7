// The read-only speech model shared by every stream: checkpoint, tokenizer, backend weights and
// the pools of per-stream backend state. prepare() turns a request into a PreparedSpeech on any
// thread; an Utterance (runtime/utterance.h) speaks it on the engine thread.
//
//   auto model = SpeechModel::load(dir, {});
//   PreparedSpeech prep = model->prepare(request);      // any thread; throws on bad input
//   Utterance utt(model, std::move(prep));              // engine thread from here on
//
// Backends: the talker + code predictor run on the CPU reference or on CUDA (lm_backend.h picks;
// BackendOptions::name, engine/api/qtts.h). With CUDA the model opens the device and uploads
// the LM weights once at load, on the loading thread, which then owns every GPU object (the
// engine loads on its own thread). Each Utterance takes its own ChunkGenerator from generator_new(): on CUDA a GPU
// generator state (KV caches) from the model's pool, so concurrent streams never share state,
// with its decoder: the state's own GPU decoder in fused chunk graphs, a GPU decoder state from
// a second pool (fused_chunks false), or the CPU decoder (gpu_decoder false); all are reset and
// returned when the utterance ends. On the CPU backend: cpu::Generator with the CPU decoder.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/cpu/generator.h"
#include "engine/cpu/lm.h"
#include "engine/cpu/speaker_encoder.h"
#include "engine/cpu/speech_decoder.h"
#include "engine/cpu/speech_encoder.h"
#include "engine/cpu_fast/fast_generator.h"
#include "engine/cpu_fast/fast_lm.h"
#include "engine/model/weights.h"
#include "engine/api/qtts.h"
#include "engine/generation/chunk_generator.h"
#include "engine/runtime/engine_debug.h"
#include "engine/runtime/lm_backend.h"
#include "engine/generation/sampling.h"
#include "engine/text/prompt.h"
#include "engine/text/tokenizer.h"

namespace qtts {

namespace cuda {
class GpuGeneratorPool;
class GpuDecoderPool;
}

// The limits on one request (REQUEST_MAX_TEXT_BYTES, REQUEST_MAX_INSTRUCT_BYTES) are public:
// engine/api/qtts.h, documented in docs/generation.md.

// Checks a backend configuration where it enters (SpeechModel::load, the Engine's constructor):
// ERROR_INVALID_ARGUMENT naming the bad field. Code below these entry points asserts.
void backend_options_validate(const BackendOptions& options);

struct PreparedSpeech {
    PromptRequest base;                       // speaker, language, layout, instruct ids, voice
    std::vector<std::vector<int32_t>> segments;  // assistant-template ids of each text segment
    bool incremental = false;
    // How added-token strings in the text are read (SpeechRequest::raw_tokens): appended text too.
    AddedTokens text_tokens = AddedTokens::ADDED_TOKENS_AS_TEXT;
    GenerationParams params;
    uint64_t seed = 0;
    int max_frames = 0;  // over the whole utterance; 0 = per-segment budget rule only
};

class SpeechModel {
public:
    static std::shared_ptr<const SpeechModel> load(const std::string& model_dir, const BackendOptions& options = {});

    const Checkpoint& checkpoint() const { return *checkpoint_; }
    const Tokenizer& tokenizer() const { return tokenizer_; }
    // CPU reference LM weights (fp32). Loaded at start-up on the CPU backend; on CUDA they are
    // only converted when first asked for (tools, tests), since generation does not need them.
    const cpu::LmWeights& lm() const { return *lm_shared(); }
    std::shared_ptr<const cpu::LmWeights> lm_shared() const;
    // The fast CPU backend's packed weights and thread pool (BackendOptions::cpu_format, threads).
    // Packed at load on the cpu-fast backend; elsewhere on first use (benchmarks, tests).
    const cpu_fast::FastLm& fast_lm() const;
    const cpu::CpuSpeechDecoder& decoder() const { return *decoder_; }
    // Base models: the cloning encoders, built on first use (weights converted once) and shared by
    // every request after that (their embed/encode calls are const and thread-safe). Throw
    // ERROR_UNSUPPORTED when the checkpoint has no such network.
    const cpu::SpeakerEncoder& speaker_encoder() const;
    const cpu::SpeechEncoder& speech_encoder() const;

    LmBackend backend() const { return backend_.backend; }
    std::string backend_name() const;  // "cpu" or "cuda:N"
    // A fresh chunk generator on this model's backend, with its decoder, for one utterance. CUDA:
    // a generator state from the pool and a decoder (owner thread only), given back when the
    // returned object is destroyed.
    std::unique_ptr<ChunkGenerator> generator_new() const;
    const BackendOptions& backend_options() const { return options_; }
    // Batched LM steps (CUDA and cpu-fast with BackendOptions::batching and states >= 2): the most streams one
    // step takes (0: no batching on this backend), and the step itself: the next chunk of each
    // generator (from generator_new(), each batch_ready(frames)) computed together; their
    // chunk(frames) calls then take those frames (and, where the backend decoded them in one
    // batched pass, their audio); returns how many streams' chunks that pass decoded. Owner thread.
    int batch_max() const;
    // With `defer_audio` the backend may leave the step's decoder pass running beside whatever
    // comes next: the chunk() calls then emit codes with their samples owed
    // (ChunkGenerator::audio_owed, audio_take). `meanwhile` (when set) runs once during the call,
    // when the samples owed by an earlier step can be taken: on CUDA while the device runs this
    // step (its audio_take calls then take nothing off the step's path); elsewhere first.
    int batch_run(const std::vector<ChunkGenerator*>& generators, int frames, bool defer_audio = false,
                  const std::function<void()>& meanwhile = {}) const;
    // Batched starts (same backends): the segment starts of several generators with their prompt
    // prefills run together (cpu-fast: one after another). A start whose prompt or parameters are refused gets its `error` (its
    // generator unchanged) and the others start; throws when the device step fails (every
    // generator's state unknown). Owner thread.
    void batch_start(std::vector<GenerationStart>& starts) const;
    // CUDA: hands every GPU object to the calling thread (load on one thread, generate on another).
    // No-op on the CPU backend.
    void owner_adopt() const;
    // After one utterance failed with an exception (owner thread): clears the backend's pending
    // error state. False when the backend can no longer work (a sticky CUDA error: every stream
    // on the device is lost); always true on the CPU.
    bool backend_recover() const;
    // Fault-injection seam for tests (owner thread): throws the qtts::Error a failed backend call
    // gives (CUDA: a real invalid runtime call, ERROR_CUDA; CPU: ERROR_INTERNAL).
    [[noreturn]] void backend_fault_raise() const;
    // CUDA: generator states created so far (0 on the CPU backend).
    int gpu_states_created() const;
    // Streams the backend holds at once as loaded: CUDA, the generator states made at load (with
    // BackendOptions::states_fit, what the memory allowed); the CPU backends, BackendOptions::states.
    int stream_slots() const { return options_.states; }
    bool gpu_decoder() const { return gpu_decoder_ != nullptr; }
    // CUDA with the GPU decoder: decoder states created so far (0 otherwise).
    int gpu_decoder_states_created() const;
    // Chunk sizes that run as one fused graph replay (LM frames + audio); empty when none.
    std::vector<int> gpu_fused_chunk_sizes() const;

    // The library's one validation point for a request (Engine::submit calls it on the caller's
    // thread): validates and lays out a request; throws qtts::Error for empty/huge/invalid text,
    // unknown speaker or language, missing voice for Base models, bad debugging ids. What it
    // accepted is trusted downstream (the Utterance asserts, it does not check again).
    PreparedSpeech prepare(const SpeechRequest& request, const SpeechRequestDebug& debug = {}) const;

    // "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n" as ids (text/prompt.h:
    // added-token strings in the text stay text unless text_tokens says to match them).
    std::vector<int32_t> assistant_ids(const std::string& text,
                                       AddedTokens text_tokens = AddedTokens::ADDED_TOKENS_AS_TEXT) const;
    // "<|im_start|>user\n{instruct}<|im_end|>\n" as ids (the same rule).
    std::vector<int32_t> instruct_ids(const std::string& instruct,
                                      AddedTokens text_tokens = AddedTokens::ADDED_TOKENS_AS_TEXT) const;
    // Text ids of a piece of request text (no template; added-token strings stay text).
    std::vector<int32_t> text_ids(const std::string& text) const {
        return tokenizer_.encode(text, AddedTokens::ADDED_TOKENS_AS_TEXT);
    }

    TextLayout default_layout() const;
    std::string default_speaker() const;  // CustomVoice: "vivian" when present, else the first
    std::vector<std::string> speakers() const;
    std::vector<std::string> languages() const;

private:
    std::shared_ptr<const Checkpoint> checkpoint_;
    Tokenizer tokenizer_;
    LmBackendChoice backend_;
    BackendOptions options_;  // as loaded (validated)
    mutable std::once_flag lm_once_;
    mutable std::shared_ptr<const cpu::LmWeights> lm_;  // set once under lm_once_
    mutable std::once_flag fast_once_;
    mutable cpu_fast::FastLm fast_;  // set once under fast_once_
    // cpu-fast with batching: the batched steps' activations (owner thread, made on first use).
    mutable std::unique_ptr<cpu_fast::FastBatchStep> fast_batch_;
    mutable std::vector<std::vector<FrameCodes>> fast_batch_codes_;  // each step's frames, per stream
    std::shared_ptr<cuda::GpuGeneratorPool> gpu_;       // CUDA backend only
    std::shared_ptr<cuda::GpuDecoderPool> gpu_decoder_;  // CUDA backend with options.gpu_decoder
    std::unique_ptr<cpu::CpuSpeechDecoder> decoder_;     // both backends (tools, gpu_decoder = false)
    mutable std::once_flag speaker_encoder_once_, speech_encoder_once_;
    mutable std::unique_ptr<const cpu::SpeakerEncoder> speaker_encoder_;  // set once, on first use
    mutable std::unique_ptr<const cpu::SpeechEncoder> speech_encoder_;    // set once, on first use
    SpeechModel(std::shared_ptr<const Checkpoint> ckpt, Tokenizer tok);
};

}  // namespace qtts
