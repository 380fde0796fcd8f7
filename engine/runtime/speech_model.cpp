#include "engine/runtime/speech_model.h"
#include "engine/cpu/cpu_chunk_generator.h"
#include "engine/cpu_fast/fast_chunk_generator.h"
#include "engine/runtime/utterance.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/strings.h"
#include "engine/runtime/voice.h"
#include "engine/text/request_check.h"
#include "engine/text/text_split.h"

#ifdef QTTS_HAVE_CUDA
#include "engine/cuda/gpu_decoder_pool.h"
#include "engine/cuda/gpu_generator_pool.h"
#endif

namespace qtts {

namespace {

// CUDA warm-up (BackendOptions::warm_up). Graphs are per generator state, so every state
// speaks a short sentence, all leased at once (so each is taken, not one again and again): one
// chunk of each configured size in order (the engine's first chunk, then a steady one), which
// replays each chunk graph with its decoder. Kernels and library code are loaded per process on
// first launch, and which ones run depends on the prompt length (prefill GEMM shapes) and the
// text layout, so one state also sweeps prompt lengths and speaks in the streaming layout.
// Sampled, as requests are (a fixed seed).
void gpu_warm_up(const std::shared_ptr<const SpeechModel>& model) {
    const auto t0 = std::chrono::steady_clock::now();
    const BackendOptions& options = model->backend_options();
    const std::vector<int>& sizes = options.chunk_sizes;
    const ModelConfig& config = model->checkpoint().config;
    PreparedSpeech prepared;
    prepared.base.language = "auto";
    prepared.base.layout = model->default_layout();
    if (config.type == ModelType::MODEL_TYPE_CUSTOM_VOICE) prepared.base.speaker = model->default_speaker();
    if (config.type == ModelType::MODEL_TYPE_BASE)  // a neutral x-vector: the prompt shape of a cloned voice
        prepared.base.x_vector.assign(size_t(config.talker.hidden_size), 0.0f);
    prepared.params = generation_params_from_config(model->checkpoint().generation);
    prepared.seed = 1;
    prepared.max_frames = 0;
    for (const int n : sizes) prepared.max_frames += n;
    std::vector<float> pcm;
    std::vector<FrameCodes> codes;
    int64_t frames = 0;
    const auto speak = [&](Utterance& utterance) {
        for (const int n : sizes)
            if (utterance.chunk(n, &pcm, &codes) != UtteranceStatus::UTTERANCE_CHUNK) break;
        frames += utterance.frames();
    };

    PreparedSpeech short_text = prepared;
    short_text.segments.push_back(model->assistant_ids("Warming up."));
    std::vector<std::unique_ptr<Utterance>> leased;
    for (int i = 0; i < options.states; ++i) leased.push_back(std::make_unique<Utterance>(model, short_text));
    for (auto& utterance : leased) speak(*utterance);
    leased.clear();  // the states go back to the pool

    // Prompt lengths: the prefill's matrix products pick their kernels by row count (1..128 rows
    // per prefill chunk), and each kernel is loaded on its first launch, so one state sweeps the
    // row counts in steps of 8 (a first chunk each), then the streaming layout once.
    std::string text;
    for (size_t rows = 8; rows <= 136; rows += 8) {
        while (model->text_ids(text).size() < rows) text += "Every request should find a warm engine. ";
        PreparedSpeech sized = prepared;
        sized.segments.push_back(model->assistant_ids(text));
        Utterance utterance(model, sized);
        if (utterance.chunk(sizes.front(), &pcm, &codes) == UtteranceStatus::UTTERANCE_CHUNK)
            frames += utterance.frames();
    }
    PreparedSpeech streaming = prepared;
    streaming.base.layout = TextLayout::TEXT_LAYOUT_STREAMING;
    streaming.segments.push_back(model->assistant_ids(text));
    Utterance utterance(model, streaming);
    speak(utterance);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    QTTS_LOG_INFO("warm-up: {} generator state(s), {} frames, {:.0f} ms", options.states, frames, ms);
}

}  // namespace

void backend_options_validate(const BackendOptions& options) {
    // The name (and device) are checked by lm_backend_choose, which knows what this build can run.
    if (options.states < 1)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the backend needs at least one stream state (got {})", options.states);
    if (options.max_context < 1)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "max_context must be >= 1 position (got {})", options.max_context);
    if (options.gpu_memory_limit != 0 && options.gpu_memory_limit < GPU_MEMORY_LIMIT_MIN)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the GPU memory limit must be at least {} MiB (got {:.0f} MiB)",
             GPU_MEMORY_LIMIT_MIN >> 20, options.gpu_memory_limit / 1048576.0);
    if (options.prefill_chunk < 0 || options.prefill_chunk > 1024)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "prefill_chunk must be 1..1024 rows, or 0 (got {})", options.prefill_chunk);
    if (options.cpu_format != "bf16" && options.cpu_format != "int8")
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown CPU weight format '{}': use bf16 or int8", options.cpu_format);
    if (options.threads < 0 || options.threads > 256)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "threads must be 0 (every core) or 1..256 (got {})", options.threads);
    if (options.chunk_sizes.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "chunk_sizes must name at least one chunk size");
    for (const int n : options.chunk_sizes)
        if (n < 1) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "chunk sizes must be >= 1 frame (got {})", n);
}

// ---------------------------------------------------------------------------------------------
// SpeechModel
// ---------------------------------------------------------------------------------------------

SpeechModel::SpeechModel(std::shared_ptr<const Checkpoint> ckpt, Tokenizer tok)
    : checkpoint_(std::move(ckpt)), tokenizer_(std::move(tok)) {}

std::shared_ptr<const SpeechModel> SpeechModel::load(const std::string& model_dir, const BackendOptions& options) {
    backend_options_validate(options);
    // The backend first: a bad name or `cuda` without a usable GPU fails before any loading.
    const LmBackendChoice choice = lm_backend_choose(options.name, options.device);
    auto ckpt = checkpoint_load(model_dir);
    Tokenizer tok = Tokenizer::load(model_dir);
    std::shared_ptr<SpeechModel> model(new SpeechModel(ckpt, std::move(tok)));
    model->backend_ = choice;
    model->options_ = options;
    const BackendOptions& opts = model->options_;
    if (choice.backend == LmBackend::LM_BACKEND_CUDA) {
#ifdef QTTS_HAVE_CUDA
        // The weights first (LM, then decoder); then the states, fitted to what is left (states_grow).
        model->gpu_ = cuda::GpuGeneratorPool::create(ckpt, opts);
        if (opts.gpu_decoder) {
            model->gpu_decoder_ = cuda::GpuDecoderPool::create(model->gpu_, *ckpt, opts);
            if (opts.fused_chunks) {
                // Each generator state gets a decoder of its own for good (fused chunk graphs are
                // captured per pair); the decoder pool keeps the weights.
                std::weak_ptr<cuda::GpuDecoderPool> pool = model->gpu_decoder_;
                model->gpu_->decoders_attach([pool] {
                    auto decoders = pool.lock();
                    if (!decoders) fail(ErrorCode::ERROR_INTERNAL, "the GPU decoder pool is gone");
                    return decoders->state_take();
                });
            }
        }
        model->gpu_->states_grow(opts.states);
        if (opts.batching) model->gpu_->batch_enable(model->gpu_->states_created());
        // What the memory allowed (states_fit: perhaps fewer states, some given back to the batched
        // steps; perhaps a lowered context): from here on the options say what was made (warm-up,
        // stream_slots()).
        model->options_.states = model->gpu_->states_created();
        model->options_.max_context = model->gpu_->max_context();
#else
        fail(ErrorCode::ERROR_INTERNAL, "the CUDA backend was chosen in a build without CUDA");
#endif
    } else if (choice.backend == LmBackend::LM_BACKEND_CPU_FAST) {
        model->fast_lm();  // pack now, not in the first request
    } else if (opts.lm_eager) {
        model->lm_shared();  // convert now, not in the first request
    }
    // (An automatic fallback to the CPU was already logged, with its reason, by lm_backend_choose.)
    if (!(opts.name == "auto" && choice.backend != LmBackend::LM_BACKEND_CUDA))
        QTTS_LOG_INFO("LM backend: {} ({})", model->backend_name(), choice.reason);
    model->decoder_ = std::make_unique<cpu::CpuSpeechDecoder>(*ckpt, cpu::CpuSpeechDecoderOptions{});
    if (choice.backend == LmBackend::LM_BACKEND_CUDA && opts.warm_up) {
        gpu_warm_up(model);
#ifdef QTTS_HAVE_CUDA
        // The warm-up loaded kernels and library code on first use, which takes device memory the
        // slot plan did not see: within a memory limit, idle slots go back until it holds again.
        model->gpu_->memory_settle();
        model->options_.states = model->gpu_->states_created();
#endif
    }
    return model;
}

std::shared_ptr<const cpu::LmWeights> SpeechModel::lm_shared() const {
    std::call_once(lm_once_, [this] { lm_ = cpu::LmWeights::load(checkpoint_); });
    return lm_;
}

const cpu_fast::FastLm& SpeechModel::fast_lm() const {
    std::call_once(fast_once_, [this] {
        const auto t0 = std::chrono::steady_clock::now();
        fast_.weights = cpu_fast::FastLmWeights::load(checkpoint_, cpu_fast::weight_format_parse(options_.cpu_format),
                                                      cpu_fast::pack_cache_dir_from_env());
        fast_.pool = std::make_shared<cpu_fast::ThreadPool>(options_.threads);
        fast_.decoder = std::make_shared<const cpu_fast::FastSpeechDecoder>(
            checkpoint_->speech_config.decoder, checkpoint_->decoder, cpu_fast::FAST_DECODER_FORMAT_DEFAULT, fast_.pool);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        QTTS_LOG_INFO("cpu-fast: {} weights, {:.0f} MB packed, {:.0f} MB read per frame, {} decoder ({:.0f} MB), "
                      "{} thread(s), {} kernels, packed in {:.0f} ms (pack cache: {})",
                      cpu_fast::weight_format_name(fast_.weights->format()), double(fast_.weights->packed_bytes()) / 1e6,
                      double(fast_.weights->frame_bytes()) / 1e6, cpu_fast::conv_format_name(fast_.decoder->format()),
                      double(fast_.decoder->packed_bytes()) / 1e6, fast_.pool->size(),
                      cpu_fast::matvec_isa_name(cpu_fast::matvec_isa_best()), ms,
                      cpu_fast::pack_cache_status_name(fast_.weights->cache_status()));
    });
    return fast_;
}

const cpu::SpeakerEncoder& SpeechModel::speaker_encoder() const {
    std::call_once(speaker_encoder_once_, [this] {
        const Checkpoint& ckpt = *checkpoint_;
        if (!ckpt.config.speaker_encoder || !ckpt.speaker_encoder)
            fail(ErrorCode::ERROR_UNSUPPORTED, "{}: this checkpoint has no speaker encoder", ckpt.dir);
        speaker_encoder_ = std::make_unique<const cpu::SpeakerEncoder>(*ckpt.config.speaker_encoder, *ckpt.speaker_encoder);
    });
    return *speaker_encoder_;
}

const cpu::SpeechEncoder& SpeechModel::speech_encoder() const {
    std::call_once(speech_encoder_once_, [this] {
        const Checkpoint& ckpt = *checkpoint_;
        if (!ckpt.encoder)
            fail(ErrorCode::ERROR_UNSUPPORTED, "{}: the speech tokenizer has no encoder weights", ckpt.dir);
        speech_encoder_ = std::make_unique<const cpu::SpeechEncoder>(ckpt.speech_config, *ckpt.encoder);
    });
    return *speech_encoder_;
}

std::string SpeechModel::backend_name() const {
    if (backend_.backend == LmBackend::LM_BACKEND_CUDA) return "cuda:" + std::to_string(backend_.device);
    return lm_backend_name(backend_.backend);
}

bool SpeechModel::backend_recover() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_) return gpu_->recover();
#endif
    return true;
}

void SpeechModel::backend_fault_raise() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_) gpu_->context().fault_raise();
#endif
    fail(ErrorCode::ERROR_INTERNAL, "injected fault (test seam) on the {} backend", backend_name());
}

std::unique_ptr<ChunkGenerator> SpeechModel::generator_new() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_) {
        // The state's own decoder (fused chunks), else a GPU decoder lease, else the CPU decoder.
        std::unique_ptr<DecoderStream> decoder;
        if (!gpu_->decoders_attached()) {
            if (gpu_decoder_) decoder = gpu_decoder_->acquire();
            else decoder = std::make_unique<CpuDecoderStream>(*decoder_);
        }
        return gpu_->acquire(std::move(decoder));
    }
#endif
    if (backend_.backend == LmBackend::LM_BACKEND_CPU_FAST) return std::make_unique<FastChunkGenerator>(fast_lm(), *decoder_);
    return std::make_unique<CpuChunkGenerator>(lm_shared(), *decoder_);
}

int SpeechModel::batch_max() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_) return gpu_->batch_max();
#endif
    // cpu-fast: every stream's next chunk can join a step (FastBatchStep); the reference
    // backend stays one stream at a time.
    const bool fast = backend_.backend == LmBackend::LM_BACKEND_CPU_FAST;
    return fast && options_.batching && options_.states >= 2 ? options_.states : 0;
}

int SpeechModel::batch_run(const std::vector<ChunkGenerator*>& generators, int frames, bool defer_audio,
                           const std::function<void()>& meanwhile) const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_ && gpu_->batch_max() > 0) return gpu_->batch_run(generators, frames, defer_audio, meanwhile);
#endif
    (void)defer_audio;  // the CPU decodes each chunk in its chunk() call
    if (batch_max() == 0)
        fail(ErrorCode::ERROR_INTERNAL, "batch_run on the {} backend, which does not batch", backend_name());
    QTTS_ASSERT(!generators.empty() && int(generators.size()) <= batch_max());
    if (meanwhile) meanwhile();  // nothing is owed here; the step below runs on this thread
    std::vector<FastChunkGenerator*> chunkers;
    std::vector<cpu_fast::FastGenerator*> fast;
    for (ChunkGenerator* g : generators) {
        auto* chunker = dynamic_cast<FastChunkGenerator*>(g);
        QTTS_ASSERT(chunker);
        chunkers.push_back(chunker);
        fast.push_back(&chunker->fast_generator());
    }
    if (!fast_batch_) fast_batch_ = std::make_unique<cpu_fast::FastBatchStep>();
    fast_batch_codes_.resize(generators.size());
    fast_batch_->run(fast, frames, fast_batch_codes_);
    for (size_t i = 0; i < chunkers.size(); ++i) chunkers[i]->batch_computed(fast_batch_codes_[i], frames);
    return 0;
}

void SpeechModel::batch_start(std::vector<GenerationStart>& starts) const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_ && gpu_->batch_max() > 0) {
        gpu_->batch_start(starts);
        return;
    }
#endif
    if (batch_max() == 0)
        fail(ErrorCode::ERROR_INTERNAL, "batch_start on the {} backend, which does not batch", backend_name());
    // The prompt prefills one after another: a prefill is already one product over all its rows.
    generation_starts_each(starts);
}

void SpeechModel::owner_adopt() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_) gpu_->owner_adopt();
#endif
}

int SpeechModel::gpu_states_created() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_) return gpu_->states_created();
#endif
    return 0;
}

int SpeechModel::gpu_decoder_states_created() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_decoder_) return gpu_decoder_->states_created();
#endif
    return 0;
}

std::vector<int> SpeechModel::gpu_fused_chunk_sizes() const {
#ifdef QTTS_HAVE_CUDA
    if (gpu_) return gpu_->fused_sizes();
#endif
    return {};
}

TextLayout SpeechModel::default_layout() const {
    return checkpoint_->config.type == ModelType::MODEL_TYPE_BASE ? TextLayout::TEXT_LAYOUT_STREAMING
                                                                  : TextLayout::TEXT_LAYOUT_NON_STREAMING;
}

std::string SpeechModel::default_speaker() const {
    const auto& ids = checkpoint_->config.talker.speaker_ids;
    if (ids.empty()) return "";
    if (ids.count("vivian")) return "vivian";
    return ids.begin()->first;
}

std::vector<std::string> SpeechModel::speakers() const {
    std::vector<std::string> out;
    for (const auto& [name, id] : checkpoint_->config.talker.speaker_ids) out.push_back(name);
    return out;
}

std::vector<std::string> SpeechModel::languages() const {
    std::vector<std::string> out{"auto"};
    for (const auto& [name, id] : checkpoint_->config.talker.language_ids) out.push_back(name);
    return out;
}

std::vector<int32_t> SpeechModel::assistant_ids(const std::string& text, AddedTokens text_tokens) const {
    return assistant_template_ids(tokenizer_, text, text_tokens);
}

std::vector<int32_t> SpeechModel::instruct_ids(const std::string& instruct, AddedTokens text_tokens) const {
    return instruct_template_ids(tokenizer_, instruct, text_tokens);
}

PreparedSpeech SpeechModel::prepare(const SpeechRequest& request, const SpeechRequestDebug& debug) const {
    const ModelConfig& config = checkpoint_->config;
    PreparedSpeech prep;
    PromptRequest& base = prep.base;

    // Text: complete text must be non-empty valid UTF-8 within the size limit (the one text rule).
    text_check(request.text, "text", REQUEST_MAX_TEXT_BYTES);
    text_check(request.instruct, "instruct", REQUEST_MAX_INSTRUCT_BYTES);
    prep.incremental = request.incremental;
    prep.text_tokens = debug.raw_tokens ? AddedTokens::ADDED_TOKENS_MATCH : AddedTokens::ADDED_TOKENS_AS_TEXT;
    if (debug.input_ids.empty() && !request.incremental && text_is_blank(request.text))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text is empty: give some text to speak");

    base.layout = request.text_layout ? *request.text_layout : default_layout();
    if (request.incremental && base.layout != TextLayout::TEXT_LAYOUT_STREAMING) {
        if (request.text_layout)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "incremental text needs the streaming text layout");
        base.layout = TextLayout::TEXT_LAYOUT_STREAMING;
    }
    base.language = request.language.empty() ? "auto" : ascii_lower(request.language);
    base.speaker = ascii_lower(request.speaker);
    if (config.type == ModelType::MODEL_TYPE_CUSTOM_VOICE && base.speaker.empty()) base.speaker = default_speaker();
    if (!debug.instruct_ids.empty()) base.instruct_ids = debug.instruct_ids;
    else if (!request.instruct.empty()) base.instruct_ids = instruct_ids(request.instruct, prep.text_tokens);
    if (config.type == ModelType::MODEL_TYPE_BASE) {
        Voice voice;
        if (!request.voice_path.empty()) {
            if (!request.ref_audio.empty())
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "give either a saved voice or reference audio, not both");
            voice = voice_load(request.voice_path);
        } else if (!request.ref_audio.empty()) {
            voice = voice_create(*this, request.ref_audio, request.ref_text,
                                 request.x_vector_only);
        } else {
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "Base (voice cloning) models need a voice: pass a saved voice (--voice FILE.qv) or reference audio "
                 "(--ref-audio FILE with --ref-text TRANSCRIPT, or --x-vector-only)");
        }
        voice_check_compatible(voice, *checkpoint_);
        base.x_vector = voice.x_vector;
        // In-context cloning unless the voice or the request asks for the x-vector alone.
        if (!voice.x_vector_only && !request.x_vector_only) {
            base.ref_ids = voice.ref_ids;
            base.ref_codes = voice.ref_codes;
            base.ref_frames = voice.ref_frames;
        }
    } else if (!request.voice_path.empty() || !request.ref_audio.empty()) {
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "voices and reference audio are for Base (voice cloning) models; this is a {} model",
             model_type_name(config.type));
    }

    // Segments: debugging ids as given, else the text split at sentence boundaries.
    if (!debug.input_ids.empty()) {
        prep.segments.push_back(debug.input_ids);
    } else if (!request.incremental) {
        for (const std::string& seg : text_split_sentences(request.text)) prep.segments.push_back(assistant_ids(seg, prep.text_tokens));
        if (prep.segments.empty()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text is empty: give some text to speak");
    }
    // Validate speaker/language/ids now, on the caller's thread, with the first segment (or a
    // placeholder for incremental text), so a bad request fails before it is queued. Only the
    // checks run: the Utterance builds each segment's prompt once, on the engine thread. The
    // other segments come from the tokenizer, so they hold well-formed ids.
    {
        PromptRequest probe = base;
        probe.input_ids = prep.segments.empty() ? assistant_ids("a") : prep.segments.front();
        prompt_request_check(config, probe);
    }

    prep.params = request.greedy ? generation_params_greedy(checkpoint_->generation)
                                 : generation_params_from_config(checkpoint_->generation);
    if (request.max_frames < 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "max_frames must be >= 0");
    prep.max_frames = request.max_frames;
    prep.seed = request.seed ? *request.seed : std::random_device{}();
    return prep;
}

}  // namespace qtts
