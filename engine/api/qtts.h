// The qtts engine: one long-lived object, one engine thread that owns every model buffer
// (CPU or GPU), and streams that carry PCM to any number of consumer threads.
//
// Thread safety: Engine::submit/stats/load, every EnginePool method and every Stream method may
// be called from any thread.
// Stream::read is wait-free (SPSC ring; exactly one consumer thread per stream).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/api/errors.h"

namespace qtts {

struct EngineDebug;  // test and debug seams (engine/runtime/engine_debug.h), not part of this API

// The audio every stream carries: 24 kHz mono float PCM, made in 80 ms codec frames of
// MAX_CODE_GROUPS codes each (the 12 Hz models use all 16).
constexpr int SAMPLE_RATE = 24000;
constexpr int SAMPLES_PER_FRAME = 1920;
constexpr int MAX_CODE_GROUPS = 16;

// The library's limits on one request, checked once by Engine::submit (and Stream::text_append for
// appended text) with the same rule at every edge: valid UTF-8 of at most this many bytes. A
// server may take a smaller per-request limit as its own option; it checks it with the same
// function (engine/text/request_check.h).
constexpr size_t REQUEST_MAX_TEXT_BYTES = 1 << 20;  // 1 MiB: `text` plus everything appended
constexpr size_t REQUEST_MAX_INSTRUCT_BYTES = 4096;

// How the target text is laid out (model doc §6.3/§6.4; the reference's non_streaming_mode).
enum class TextLayout {
    TEXT_LAYOUT_STREAMING,      // one text token per generated frame (the dual-track layout)
    TEXT_LAYOUT_NON_STREAMING,  // the whole text inside the prefill; every step adds <tts_pad>
};
const char* text_layout_name(TextLayout layout);

struct SpeechRequest {
    std::string text;                // the sentence(s) to speak; when `incremental`, the first piece
                                     // of the text (may be empty: all of it comes by text_append)
    std::string speaker;             // CustomVoice speaker (case-insensitive); empty = model default
    std::string language = "auto";   // a language name or "auto"
    std::string instruct;            // VoiceDesign description / CustomVoice style instruction
    std::optional<uint64_t> seed;    // fixed seed for reproducible sampling
    bool greedy = false;             // argmax decoding (tests, debugging)
    int max_frames = 0;              // 0 = the frame budget rule
    std::optional<TextLayout> text_layout;  // unset = the variant's default (streaming for Base)
    bool incremental = false;        // text arrives later through Stream::text_append, ends with text_close
    std::string voice_path;          // saved voice file (.qv) for Base models
    std::vector<float> ref_audio;    // Base models without voice_path: the reference clip to clone
                                     // from, SAMPLE_RATE mono samples (the caller decodes files:
                                     // audio_io/audio_file.h audio_read_mono_24k)
    std::string ref_text;            // transcript of ref_audio (in-context cloning)
    bool x_vector_only = false;      // Base models: use only the speaker x-vector (no reference codes/text)
    // Special-token strings in text and instruct ("<|im_end|>", ...) are always read as plain
    // text, so request text can never inject prompt structure. Token ids and raw token syntax are
    // debugging inputs: engine/runtime/engine_debug.h (SpeechRequestDebug).
};

enum class StopReason { STOP_NONE, STOP_EOS, STOP_FRAME_BUDGET, STOP_MAX_FRAMES, STOP_CANCELLED, STOP_ERROR };
const char* stop_reason_name(StopReason reason);

struct StreamMetrics {
    double ttfa_gen_ms = -1.0;    // submit -> first PCM chunk available to the consumer
    double generation_ms = 0.0;   // submit -> last chunk produced
    int64_t frames = 0;           // 80 ms codec frames produced
    int64_t samples = 0;          // PCM samples produced (frames * SAMPLES_PER_FRAME)
    double rtf = 0.0;             // generation wall time / audio duration
    int64_t stalls = 0;           // times the consumer found the ring empty before the end
    StopReason stop_reason = StopReason::STOP_NONE;
};

// Telemetry from the engine thread to a stream's consumer, as plain values (no allocation, no
// destructor), so even an audio callback may poll them.
enum class StreamEventKind : uint8_t {
    STREAM_EVENT_STARTED,  // the engine took the stream (prompt built, generation begins)
    STREAM_EVENT_CHUNK,    // a chunk of PCM is in the ring
    STREAM_EVENT_WAITING,  // incremental text ran dry: waiting for text_append / text_close
    STREAM_EVENT_DONE,     // generation ended (stop_reason says why); the last event
};
struct StreamEvent {
    StreamEventKind kind = StreamEventKind::STREAM_EVENT_STARTED;
    StopReason stop_reason = StopReason::STOP_NONE;  // DONE
    int32_t frames = 0;         // CHUNK: frames in this chunk
    int64_t frames_total = 0;   // frames produced so far
    double t_ms = 0.0;          // since submit, on the engine thread's clock
};

class Stream {
public:
    virtual ~Stream() = default;
    virtual uint64_t id() const = 0;

    // Copies up to n samples of SAMPLE_RATE mono float PCM; never blocks; returns the count copied.
    virtual size_t read(float* out, size_t n) = 0;
    // Blocks until audio is readable, the stream ended, or the timeout passed. True when
    // something changed (audio available or the stream ended).
    virtual bool wait(std::chrono::milliseconds timeout) = 0;
    // True once generation ended (for any reason) and every sample has been read.
    virtual bool finished() const = 0;
    // True once generation ended (audio may remain unread).
    virtual bool generation_done() const = 0;

    // Incremental text (requests made with `incremental = true`). Each piece must be valid UTF-8
    // and the request's text in all stays within REQUEST_MAX_TEXT_BYTES: a bad piece throws
    // qtts::Error (ERROR_INVALID_ARGUMENT, the message submit gives for the same text) and is
    // dropped; the stream goes on.
    virtual void text_append(const std::string& text) = 0;
    virtual void text_close() = 0;
    // Stops generation within one chunk; the engine frees the stream's slot. A chunk being made
    // when the cancel arrives is not published.
    virtual void cancel() = 0;
    // Barge-in: cancel() and drop the audio not yet read. From the reader's next read() on, read()
    // returns 0: what is buffered, and anything the engine publishes before it stops, is thrown
    // away by that read, so a player that reads the stream falls silent within one period.
    // finished() is true as soon as generation ended. Any thread; read() stays wait-free.
    virtual void discard() = 0;
    // Samples readable now (exact on the reader's thread, already stale elsewhere); 0 once
    // discard() was called. Wait-free: an audio callback may call it.
    virtual size_t available() const = 0;

    virtual StreamMetrics metrics() const = 0;
    // The error message when the stream failed after it was accepted (empty otherwise).
    virtual std::string error() const = 0;
    // Codes of every frame produced so far (16 per frame), for --codes-out and tests.
    virtual std::vector<std::vector<int32_t>> codes() const = 0;

    // Takes the oldest telemetry event; false when none is pending. Wait-free, no allocation; one
    // consumer thread (the reader). Events that find the queue full (a consumer that never
    // polls) are dropped and counted, never block the engine. Streams without telemetry: false.
    virtual bool event_poll(StreamEvent* out) {
        (void)out;
        return false;
    }
    virtual uint64_t events_dropped() const { return 0; }
};

// The engine's chunk sizes unless the caller picks others (EngineOptions): the one place these
// defaults live. The first chunk is short (time to first audio), later ones amortise the launches.
constexpr int FIRST_CHUNK_FRAMES_DEFAULT = 1;
constexpr int CHUNK_FRAMES_DEFAULT = 4;
// Sliced starts (EngineOptions::prefill_slice): prompt rows per round, and the most one may ask.
constexpr int PREFILL_SLICE_DEFAULT = 64;
constexpr int PREFILL_SLICE_MAX = 4096;

// The smallest BackendOptions::gpu_memory_limit accepted (below it not even the CUDA libraries'
// own buffers fit).
constexpr size_t GPU_MEMORY_LIMIT_MIN = size_t(256) << 20;

// Where and how the talker + code predictor and the speech decoder run: the one configuration
// struct that travels from the caller down to the backend (SpeechModel::load, then the CUDA
// generator and decoder pools by const reference). Checked once where it enters
// (backend_options_validate, engine/runtime/speech_model.h); code below asserts.
struct BackendOptions {
    // cpu (the fp32 reference), cpu-fast (packed weights), cuda, auto (CUDA when usable, else
    // cpu-fast with a logged reason)
    std::string name = "auto";
    int device = 0;              // CUDA device index
    bool cuda_graphs = true;     // false: eager GPU execution, same codes
    bool gpu_decoder = true;     // CUDA: false = the CPU speech decoder (same audio to ~1e-6)
    // CUDA + GPU decoder: each generator state owns a decoder and a chunk of a captured size is
    // one graph replay (LM frames + their audio, one sync; cuda/fused_chunks.h). false: separate
    // LM and decoder replays. Same samples either way.
    bool fused_chunks = true;
    // CUDA: before load returns, every generator state speaks a short greedy utterance (each
    // captured chunk size and the decoder replay once; library handles, pinned buffers and lazy
    // module loads are touched), so the first request takes the warm path. false: a cold first
    // request (benchmarks of the cold path). Nothing to warm on the CPU.
    bool warm_up = true;
    // CPU backend: convert the LM weights to fp32 at load (true) or when first needed (false:
    // tools that only use the tokenizer or the cloning encoders, e.g. `qtts voice`).
    bool lm_eager = true;
    // cpu-fast: the weight format of the talker and code predictor, "bf16" (exact for bf16
    // checkpoints: the reference's codes) or "int8" (per-row scales, half the bytes, ~1% logits
    // error). docs/cpu-fast.md has the quality and speed of each and why bf16 is the default.
    std::string cpu_format = "bf16";
    // cpu-fast: threads of the matrix products (the engine thread is one of them); 0 = every core.
    int threads = 0;
    int states = 1;              // CUDA: per-stream generator states made at load (the engine: max_streams)
    // CUDA: `states` is the most to make, not a demand: make as many as the memory holds (at
    // least one). The engine sets it when its max_streams is MAX_STREAMS_AUTO.
    bool states_fit = false;
    int max_context = 4096;      // CUDA: talker positions (prompt + frames) per utterance; lowered
                                 // (logged) when not even one stream of it fits the memory
    // CUDA: the most device memory qtts may take on its device, in bytes (weights, decoder, stream
    // states, graphs; measured from the device's free memory after the CUDA context exists); 0 =
    // whatever is free. `--gpu-memory-limit 6G` (memory_size_parse). At least 256 MiB when set.
    size_t gpu_memory_limit = 0;
    int prefill_chunk = 0;       // CUDA: prompt rows per prefill pass, 1..1024; 0 = the LM's own (benchmarks)
    // The chunk sizes the caller will ask for (ChunkGenerator::chunk): CUDA captures one graph
    // (fused with the decoder where it can) per size. The engine sets {first_chunk_frames,
    // chunk_frames}; other sizes still work, as eager steps. The first is a stream's first chunk:
    // CUDA's fused graph of that size hands its audio over before the talker step after it.
    std::vector<int> chunk_sizes = {FIRST_CHUNK_FRAMES_DEFAULT, CHUNK_FRAMES_DEFAULT};
    // CUDA: streams whose chunks are due in the same engine round share one device step for their
    // LM frames (the talker and code predictor read their weights once for all of them; graphs
    // for 2..states streams at each chunk size, captured at load). false: every stream takes its
    // own steps (one stream at a time). The batched products run on tensor cores from 2 rows,
    // within ~1e-5 relative of a stream's own one-row products: greedy codes come out as alone
    // unless two logits tie that closely, and a sampled draw can turn where it lies that close to
    // a boundary of its distribution.
    bool batching = true;
    // CUDA, with batching: every batched stream gets exactly the arithmetic it gets alone (its
    // products on the one-row kernels, each row bitwise as alone; newcomers' prompts prefilled one
    // by one), so its codes, greedy or sampled, are bitwise those of an unbatched engine (the
    // audio within the batched decoder's rounding). Slower batched steps from ~4 streams
    // (docs/performance.md); for reproducibility checks and the tests.
    bool batch_exact = false;
};

constexpr int MAX_STREAMS_AUTO = 0;
constexpr int MAX_STREAMS_DEFAULT = 16;

struct EngineOptions {
    std::string model_dir;          // empty = the embedded default model
    // The backend; the engine sets its `states` (max_streams) and `chunk_sizes` (the two below).
    BackendOptions backend;
    // Concurrent streams; more are refused with ERROR_BUSY. CUDA: one GPU generator state (KV
    // caches) per stream, all made at start-up. MAX_STREAMS_AUTO (the default): as many as the
    // device's memory (or BackendOptions::gpu_memory_limit) holds, at most MAX_STREAMS_DEFAULT
    // (the CPU backends: MAX_STREAMS_DEFAULT); Engine::load() reports the number chosen.
    int max_streams = MAX_STREAMS_AUTO;
    // The engine alone picks each chunk's size: a stream's first chunk (time to first audio),
    // then every later one, across sentence boundaries (docs/engine.md, "Chunks").
    int first_chunk_frames = FIRST_CHUNK_FRAMES_DEFAULT;
    int chunk_frames = CHUNK_FRAMES_DEFAULT;
    double ring_seconds = 30.0;     // PCM buffered per stream before the engine waits for the reader
    // The engine's name in its log lines (an EnginePool sets "cuda:1", "cpu#0"); empty = the backend's.
    std::string label;
    // Admission control (docs/engine.md, "Scheduling"): refuse a new stream with ERROR_BUSY when
    // the engine's measured capacity (real-time streams it sustains, from its recent rounds) could
    // not carry the admitted streams plus this one, each at real time, within
    // `admission_headroom` of it. Until the engine has measured itself it admits up to
    // max_streams, and it always admits a stream when it has none. Off by default in the library
    // (a program that makes files, or speaks to one listener, wants its streams whatever the
    // speed); `qtts serve` turns it on (--admission on|off).
    bool admission = false;
    double admission_headroom = 0.9;  // fraction of the measured capacity to fill, 0.05..4
    // Sliced starts (docs/engine.md, "Sliced starts"): while other streams play, a segment start
    // whose prompt prefill has more rows than a round's slice (this many rows, or more: below)
    // runs a slice per engine round, between the steps that keep the others playing, instead of
    // stalling them for the whole prefill (a paragraph or a voice-cloning reference: a hundred
    // rows and more, ~8-20 ms each on two CPU cores at 0.6B); an in-context clone's reference
    // codes, decoded before its first chunk, go a steady chunk's worth a round first. Backends
    // whose prefill splits exactly (cpu-fast); the others start whole. 0 = off; at most
    // PREFILL_SLICE_MAX.
    int prefill_slice = PREFILL_SLICE_DEFAULT;
    // A slice grows to what the playing streams' buffered audio covers (half the time until the
    // first of their listeners would run dry, at the engine's measured prefill speed), so a long
    // prompt still starts whole when nobody is near running dry; false: always prefill_slice rows
    // (tests, measurements).
    bool prefill_slice_by_deadline = true;
};

// What an application may want to know about the loaded model (qtts info, the server's
// /v1/audio/voices), without the checkpoint's internals.
struct ModelInfo {
    std::string dir;                     // the model directory
    std::string type;                    // "custom_voice", "voice_design" or "base"
    std::string size;                    // size tag: "0b6", "1b7"
    std::vector<std::string> speakers;   // CustomVoice speaker names (empty otherwise)
    std::vector<std::string> languages;  // "auto" and the model's languages
    int sample_rate = SAMPLE_RATE;
    int code_groups = MAX_CODE_GROUPS;   // codes per frame (Stream::codes)
};

struct EngineStats {
    int64_t requests = 0;
    int64_t active_streams = 0;
    int64_t completed = 0;
    int64_t errors = 0;
    int64_t cancelled = 0;
    double audio_seconds = 0.0;
    // Batched LM steps (the CUDA backend advances several streams' chunks in one device step):
    // batch_histogram[n] = steps that advanced n streams together (n >= 2; indices 0 and 1 stay 0;
    // a stream running alone takes its own single-stream step, not counted here).
    std::vector<int64_t> batch_histogram;
    // Stream chunks whose audio came out of a batched decoder pass (CUDA: a batched step's
    // streams that keep the same number of its frames, two or more, decoded together).
    int64_t batch_decoded_chunks = 0;
    // Of those, chunks whose pass ran beside the engine's next step (their audio published a
    // round later; streams with at least half a second of audio ahead of their listener).
    int64_t batch_overlapped_chunks = 0;
    // Streams whose first prompt prefill ran in a pass shared with other newcomers' (CUDA: the
    // newcomers of one round start together).
    int64_t batch_started = 0;
    // Sliced starts (EngineOptions::prefill_slice): slices run, and segment starts completed that
    // way (a start whose others stopped playing finishes in its last, larger slice).
    int64_t prefill_slices = 0;
    int64_t sliced_starts = 0;
    // Refusals by submit with ERROR_BUSY: at max_streams, or by admission control (capacity).
    int64_t refused_limit = 0;
    int64_t refused_capacity = 0;
    // A listener who plays each stream in real time from its first audio, with no prebuffer (the
    // stream's deadline, docs/engine.md "Scheduling"): times it would have run dry because the
    // engine was late (not counting waits for text or for the reader), the seconds it waited,
    // and the streams that ended having run dry at least once.
    int64_t underruns = 0;
    double underrun_seconds = 0.0;
    int64_t streams_lagged = 0;
    // Gauges, as of the engine's last round (0 when idle):
    int64_t batch_size = 0;      // streams in the round's batched LM step (0: none; CUDA and cpu-fast)
    int64_t queue_depth = 0;     // streams submitted whose first chunk is not made yet (not waiting for text)
    double lag_max_s = 0.0;      // behind real time: max and mean over active streams that have audio
    double lag_mean_s = 0.0;     //   (seconds their listener spent dry so far, plus the current gap)
    double capacity = 0.0;       // measured real-time streams the engine sustains (0: not measured yet)
    // Where the engine thread's wall time went since it started (seconds, as of its last round):
    // batched starts of newcomers' prompts and the slices of sliced starts (prefill_slice), the
    // batched first chunks, batched steady steps
    // (the LM step and, CUDA, the batched decoder pass), the per-stream passes (chunks made alone,
    // and every chunk read into its stream's ring and events), and waiting for work. `total_s`
    // less the five is the rounds' own bookkeeping (intake, ordering, gauges).
    struct ThreadTime {
        double starts_s = 0.0;
        double first_steps_s = 0.0;
        double steps_s = 0.0;
        double service_s = 0.0;
        double idle_s = 0.0;
        double total_s = 0.0;
        double other_s() const { return std::max(0.0, total_s - starts_s - first_steps_s - steps_s - service_s - idle_s); }
    };
    ThreadTime thread_time;
};

// How busy an engine is now (Engine::load): what a router compares. Read from atomics; cheap.
struct EngineLoad {
    int64_t active = 0;     // streams the engine thread is generating (queued ones not counted)
    int64_t queued = 0;     // accepted by submit, not yet taken in by the engine thread
    int max_streams = 0;    // EngineOptions::max_streams: active + queued beyond it are refused
    // The engine's recent real-time factor: the wall time of its recent rounds over the audio each
    // stream got from them (an average over the last few rounds). Above 1 its streams fall behind
    // real time; rounds with nothing to make (streams waiting for text or for their reader) bring
    // it down; 0 while it has no stream.
    double rtf = 0.0;
};

class Engine {
public:
    explicit Engine(const EngineOptions& options);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    // Validates the request on the calling thread (text, speaker, language, voice, limits) and
    // throws qtts::Error for a bad one; otherwise queues it and returns its stream at once.
    std::shared_ptr<Stream> submit(const SpeechRequest& request);

    EngineStats stats() const;
    EngineLoad load() const;
    ModelInfo model_info() const;
    std::vector<std::string> speakers() const;   // CustomVoice speaker names
    std::vector<std::string> languages() const;  // "auto" and the model's languages
    std::string backend_name() const;            // "cpu" or "cuda:N"
    // False once the backend failed for good (a sticky CUDA error): every stream then ended with
    // an error and submit() refuses new ones (ERROR_CUDA); failure() says what happened. One
    // stream's failure that leaves the device usable ends only that stream.
    bool healthy() const;
    std::string failure() const;

private:
    friend struct EngineDebug;
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------------------------
// Several engines in one process: one per GPU (and CPU engines for tests and mixed setups),
// each with its own engine thread, model copy and graphs; each new request goes to the least
// loaded one (docs/server.md, "Several engines").
// ---------------------------------------------------------------------------------------------

// Where one engine of a pool runs.
struct EngineTarget {
    std::string backend = "cpu";  // "cpu", "cuda" (device `device`), or "auto" (CUDA when usable)
    int device = 0;               // CUDA device index (0..63), for "cuda" and "auto"
};

// The one syntax for naming engines (`qtts serve --engines`, `--devices`): a comma-separated list
// of `cpu`, `cuda:N`, or a bare device index `N` (= `cuda:N`), e.g. "cuda:0,cuda:1", "0,1",
// "cuda:0,cpu", "cpu,cpu". Checked with engine_targets_validate; throws qtts::Error
// (ERROR_INVALID_ARGUMENT) naming the bad entry and what is accepted.
std::vector<EngineTarget> engine_targets_parse(const std::string& list);
// The rules for a list of targets, wherever it comes from: at least one and at most
// ENGINE_POOL_MAX_ENGINES, known backend names, device indices 0..63, no GPU twice (one engine
// per GPU; CPU engines may repeat). Throws qtts::Error (ERROR_INVALID_ARGUMENT).
void engine_targets_validate(const std::vector<EngineTarget>& targets);
constexpr size_t ENGINE_POOL_MAX_ENGINES = 16;

struct EnginePoolOptions {
    // Every engine's options (model, stream limit, chunk sizes, backend switches such as graphs);
    // each engine's backend name and device come from its target. Every engine may hold
    // `engine.max_streams` streams, so any one of them can carry the whole load alone.
    EngineOptions engine;
    std::vector<EngineTarget> targets;  // one engine per entry; empty = one, on engine.backend
};

enum class EngineState {
    ENGINE_STATE_SERVING,     // loaded and healthy: takes new requests
    ENGINE_STATE_FAILED,      // its backend failed for good after start-up (Engine::healthy is false)
    ENGINE_STATE_NOT_LOADED,  // it failed to load and was left out
};
const char* engine_state_name(EngineState state);  // "serving", "failed", "not_loaded"

// One engine of a pool, as EnginePool::status reports it.
struct EngineStatus {
    std::string label;     // "cuda:N" for a GPU engine, "cpu#I" for a CPU one (I: its place in the list)
    std::string backend;   // Engine::backend_name ("cpu", "cuda:1"); the target asked for when not loaded
    EngineState state = EngineState::ENGINE_STATE_NOT_LOADED;
    std::string error;     // why it is out (FAILED: Engine::failure; NOT_LOADED: the load error)
    EngineLoad load;       // zero when not loaded
    EngineStats stats;     // zero when not loaded
    int64_t routed = 0;    // requests the pool gave this engine (accepted by it)
};
class EnginePool {
public:
    // Loads every engine at once, one thread each (all from the same model folder). An engine
    // that fails to load is left out with one log line saying why; when none loads, throws the
    // qtts::Error of the first failure with every engine's reason in its message.
    explicit EnginePool(const EnginePoolOptions& options);
    ~EnginePool();
    EnginePool(const EnginePool&) = delete;
    EnginePool& operator=(const EnginePool&) = delete;

    // Engine::submit on the least-loaded engine that serves (engine_route_order,
    // engine/runtime/engine_pool.h): a bad request throws at once (every engine has the same
    // model); an engine at its limit passes the request to the next; when every engine is full,
    // ERROR_BUSY; when none serves, ERROR_CUDA with the reasons. Any thread.
    std::shared_ptr<Stream> submit(const SpeechRequest& request);

    std::vector<EngineStatus> status() const;  // one per target, in the order given
    size_t size() const;                        // targets (loaded or not)
    Engine* engine(size_t index) const;         // nullptr when that one did not load
    // True while at least one engine serves. failure(): why none does (empty while one does).
    bool healthy() const;
    std::string failure() const;

    // The model, as every engine loaded it (from the first engine that loaded).
    ModelInfo model_info() const;
    std::vector<std::string> speakers() const;
    std::vector<std::string> languages() const;
    std::string backend_name() const;  // the loaded engines' backend names, comma-separated ("cuda:0,cuda:1")

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace qtts
