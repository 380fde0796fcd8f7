/* The C interface of the qtts engine (libqtts.so): plain C99, usable from C, C++ and any language
 * with a C foreign-function interface. It wraps qtts::Engine and qtts::Stream (engine/api/qtts.h)
 * behind opaque handles; no C++ type and no exception crosses it. Installed as <qtts/qtts_c.h>;
 * docs/c-api.md shows how to build, install and link it.
 *
 * Conventions (after miniaudio):
 *   - Functions that can fail return a qtts_result; QTTS_OK is 0. On failure the calling thread's
 *     qtts_last_error() says why, in one line. Nothing ever calls exit() or aborts on bad input.
 *   - Options structs are filled with defaults by their *_init function, then edited.
 *   - Strings passed in are copied before the call returns; the caller keeps ownership.
 *   - Thread safety is stated on every function. "Any thread" means any thread at the same time
 *     as any other call on the same handle, except the destroy/release of that handle.
 *   - Real-time safe (no lock, no allocation, no system call): qtts_stream_read,
 *     qtts_stream_available, qtts_stream_finished, qtts_stream_generation_done. Call only these
 *     from an audio callback.
 *   - ABI: structs grow only at their end, and every struct the caller fills has an *_init
 *     function; fill with it before setting fields, so fields added later get their defaults.
 */
#ifndef QTTS_C_H
#define QTTS_C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The audio every stream carries: 24 kHz mono float PCM in 80 ms frames (qtts::SAMPLE_RATE,
 * qtts::SAMPLES_PER_FRAME). */
#define QTTS_SAMPLE_RATE 24000
#define QTTS_SAMPLES_PER_FRAME 1920

/* The results of the C API: QTTS_OK, then qtts::ErrorCode in its order, shifted by one. */
typedef enum qtts_result {
    QTTS_OK = 0,
    QTTS_ERROR_INVALID_ARGUMENT = 1, /* bad input: text, options, request fields, NULL handle */
    QTTS_ERROR_IO = 2,               /* a file could not be opened / read / written */
    QTTS_ERROR_FORMAT = 3,           /* a file's content is malformed */
    QTTS_ERROR_SHAPE = 4,            /* a tensor has the wrong shape or dtype */
    QTTS_ERROR_NOT_FOUND = 5,        /* a file, tensor, speaker or language does not exist */
    QTTS_ERROR_UNSUPPORTED = 6,      /* valid but not supported by this build or model */
    QTTS_ERROR_CUDA = 7,             /* CUDA / cuBLAS failure */
    QTTS_ERROR_CANCELLED = 8,        /* the request was cancelled */
    QTTS_ERROR_BUSY = 9,             /* the engine is at max_streams; retry later */
    QTTS_ERROR_INTERNAL = 10,        /* a bug, or an unexpected exception inside the library */
    QTTS_ERROR_OUT_OF_MEMORY = 11    /* an allocation failed (std::bad_alloc at the boundary) */
} qtts_result;

/* Why a stream's generation stopped (qtts::StopReason, same order). */
typedef enum qtts_stop_reason {
    QTTS_STOP_NONE = 0,         /* still generating */
    QTTS_STOP_EOS = 1,          /* the model ended the speech */
    QTTS_STOP_FRAME_BUDGET = 2, /* the frame budget for the text ran out */
    QTTS_STOP_MAX_FRAMES = 3,   /* the request's max_frames was reached */
    QTTS_STOP_CANCELLED = 4,    /* qtts_stream_cancel */
    QTTS_STOP_ERROR = 5         /* the stream failed after it was accepted (qtts_stream_error) */
} qtts_stop_reason;

typedef struct qtts_engine qtts_engine; /* one loaded model, one engine thread */
typedef struct qtts_stream qtts_stream; /* one request's audio */

/* The library's version, "MAJOR.MINOR.PATCH" (static storage). Any thread. */
const char* qtts_version(void);

/* The message of the last failed qtts_ call on the calling thread ("" when none failed yet).
 * Valid until the next failing qtts_ call on this thread. Any thread (thread-local). */
const char* qtts_last_error(void);

/* A short name for a result ("QTTS_ERROR_BUSY"), static storage. Any thread. */
const char* qtts_result_name(qtts_result result);
/* A short name for a stop reason ("eos"), static storage. Any thread. */
const char* qtts_stop_reason_name(qtts_stop_reason reason);

typedef struct qtts_engine_options {
    const char* model_dir;  /* NULL or "" = the embedded demo model (written to $QTTS_CACHE_DIR) */
    const char* backend;    /* "auto" (CUDA when usable, else CPU), "cpu" or "cuda"; NULL = "auto" */
    int device;             /* CUDA device index */
    int max_streams;        /* concurrent streams; more are refused with QTTS_ERROR_BUSY; 0 (the
                               default) = as many as the GPU memory holds, at most 16 (CPU: 16) */
    int first_chunk_frames; /* frames in a stream's first chunk (time to first audio) */
    int chunk_frames;       /* frames in every later chunk */
} qtts_engine_options;

/* Fills *options with the engine's defaults (qtts::EngineOptions). Any thread. */
void qtts_engine_options_init(qtts_engine_options* options);

/* Loads the model and starts the engine thread; *out receives the engine (NULL on failure).
 * options NULL = the defaults. Slow (loads weights; CUDA: captures graphs). Any thread. */
qtts_result qtts_engine_create(const qtts_engine_options* options, qtts_engine** out);

/* Stops the engine thread and frees the model. Release the engine's streams first: a stream that
 * outlives its engine stays a valid handle but may never report finished. NULL is ignored. Call
 * once, from one thread, after every other call on this engine has returned. */
void qtts_engine_destroy(qtts_engine* engine);

/* The backend the engine runs on ("cpu" or "cuda:N"), copied into buf (NUL-terminated, cut to
 * size). Any thread. */
qtts_result qtts_engine_backend(qtts_engine* engine, char* buf, size_t size);

/* Delivers a stream's audio when the request sets on_chunk (instead of qtts_stream_read).
 *
 * Thread: a thread the library starts for that stream, one per such stream; never the engine
 * thread, so a slow callback holds back only its own stream (the engine waits once 30 s of its
 * audio is unread). Calls for one stream never overlap, and come in order.
 * pcm: `samples` samples of QTTS_SAMPLE_RATE mono float audio, valid only during the call (the
 * library reuses the buffer). The last call has last = 1, pcm = NULL and samples = 0: generation
 * ended (eos, limit, cancel, discard or error: see qtts_stream_metrics_get / qtts_stream_error)
 * and every sample was delivered. It comes exactly once per stream, also when the stream is
 * cancelled or released early.
 * Inside the callback any qtts_ call on this stream is allowed except qtts_stream_read (the library
 * is the stream's reader); qtts_stream_release there gives the handle back once the callback
 * returns, and no call comes after that. */
typedef void (*qtts_chunk_callback)(void* user_data, qtts_stream* stream, const float* pcm, size_t samples,
                                    int last);

typedef struct qtts_request {
    const char* text;        /* the text to speak (UTF-8); when incremental, the first piece (may be "") */
    const char* speaker;     /* CustomVoice speaker; NULL or "" = the model's default */
    const char* language;    /* a language name or "auto"; NULL = "auto" */
    const char* instruction; /* voice description / style instruction; NULL = none */
    uint64_t seed;           /* used when has_seed is non-zero: reproducible sampling */
    int has_seed;
    int incremental;         /* non-zero: more text by qtts_stream_text_append, ended by
                                qtts_stream_text_close */
    /* Fields below: since 0.2.0. */
    int greedy;              /* non-zero: argmax decoding (the same audio every time; debugging) */
    int max_frames;          /* stop after this many 80 ms frames; 0 = no cap beyond the frame
                                budget for the text; negative is QTTS_ERROR_INVALID_ARGUMENT */
    const char* voice_path;  /* Base (voice cloning) models: a saved voice (.qv, `qtts voice create`);
                                NULL = none */
    const float* ref_audio;  /* Base models without voice_path: the clip to clone, QTTS_SAMPLE_RATE
                                mono float samples (the caller decodes and resamples files);
                                copied before qtts_submit returns; NULL = none */
    size_t ref_audio_samples;
    const char* ref_text;    /* the transcript of ref_audio (in-context cloning); NULL = none */
    int x_vector_only;       /* Base models: clone from the speaker embedding alone (no ref_text) */
    qtts_chunk_callback on_chunk; /* non-NULL: the library reads the stream and calls this */
    void* user_data;              /* passed to on_chunk */
} qtts_request;

/* Fills *request with defaults (no text, default speaker, "auto" language, no seed, sampling,
 * no frame cap, no voice, no callback). Any thread. */
void qtts_request_init(qtts_request* request);

/* Checks the request on the calling thread (text, speaker, language, limits) and queues it;
 * *out receives its stream at once (NULL on failure). A non-incremental request with empty text
 * is QTTS_ERROR_INVALID_ARGUMENT. Any thread. */
qtts_result qtts_submit(qtts_engine* engine, const qtts_request* request, qtts_stream** out);

/* Incremental requests: adds a piece of UTF-8 text. A bad piece (invalid UTF-8, over the limit)
 * fails with QTTS_ERROR_INVALID_ARGUMENT and is dropped; the stream goes on. Any thread. */
qtts_result qtts_stream_text_append(qtts_stream* stream, const char* text);
/* Incremental requests: no more text comes; the stream speaks what it has and ends. Any thread. */
qtts_result qtts_stream_text_close(qtts_stream* stream);

/* Copies up to n samples of QTTS_SAMPLE_RATE mono float PCM into out and returns the count
 * (0 when none is ready, after qtts_stream_discard, for a stream with a callback, or on a NULL
 * argument). Never blocks, never allocates: real-time safe. Exactly one thread reads a stream
 * (the consumer: e.g. the audio callback). */
size_t qtts_stream_read(qtts_stream* stream, float* out, size_t n);

/* Samples readable now (0 after qtts_stream_discard or on NULL). Exact on the reader's thread, a
 * stale figure on others. Real-time safe. Any thread. */
size_t qtts_stream_available(qtts_stream* stream);

/* Blocks until audio is readable, the stream ended, or timeout_ms passed. Returns 1 when
 * something changed (audio available or the stream ended), 0 on timeout or a NULL stream.
 * A stream with a callback: until its last callback returned. Not for an audio callback. Any
 * thread. */
int qtts_stream_wait(qtts_stream* stream, int timeout_ms);

/* 1 once generation ended (for any reason) and every sample has been read (with a callback: the
 * last callback returned; after qtts_stream_discard: as soon as generation ended). Real-time
 * safe. Any thread. */
int qtts_stream_finished(qtts_stream* stream);
/* 1 once generation ended (audio may remain unread). Real-time safe. Any thread. */
int qtts_stream_generation_done(qtts_stream* stream);

/* Stops generation within one chunk; the engine frees the stream's slot. Audio already buffered
 * stays readable. Any thread. */
qtts_result qtts_stream_cancel(qtts_stream* stream);

/* Barge-in: qtts_stream_cancel, and the audio not yet read is dropped. The reader's next
 * qtts_stream_read returns 0, and so does every later one (a chunk the engine was making is
 * dropped too), so a player that reads the stream in its audio callback falls silent within one
 * callback period; audio the application copied into its own buffers is its own to drop. With a
 * callback: no more audio is delivered, only the last call. The stream is finished as soon as
 * generation ended. Any thread (not real-time safe: it wakes the engine). */
qtts_result qtts_stream_discard(qtts_stream* stream);

typedef struct qtts_stream_metrics {
    double first_audio_ms;   /* submit -> first PCM available; -1 before it */
    double generation_ms;    /* submit -> last chunk produced */
    int64_t frames;          /* 80 ms frames produced */
    int64_t samples;         /* samples produced (frames * QTTS_SAMPLES_PER_FRAME) */
    double rtf;              /* generation wall time / audio duration */
    int64_t stalls;          /* times the reader found no audio before the end */
    qtts_stop_reason stop_reason;
} qtts_stream_metrics;

/* A snapshot of the stream's metrics. Any thread. */
qtts_result qtts_stream_metrics_get(qtts_stream* stream, qtts_stream_metrics* out);

/* The message when the stream failed after it was accepted ("" otherwise), copied into buf
 * (NUL-terminated, cut to size). Any thread. */
qtts_result qtts_stream_error(qtts_stream* stream, char* buf, size_t size);

/* Gives the handle back. A stream still generating is cancelled first. NULL is ignored. Call
 * once, from one thread, after every other call on this stream has returned. A stream with a
 * callback is discarded, and release waits for its last callback to return (up to one chunk of
 * generation), unless it is called from inside that callback. */
void qtts_stream_release(qtts_stream* stream);

/* What the engine has done since it was created. */
typedef struct qtts_engine_stats {
    int64_t requests;       /* streams accepted by qtts_submit */
    int64_t active_streams; /* accepted and not yet ended (queued or generating) */
    int64_t completed;      /* ended normally (eos, frame budget, max_frames) */
    int64_t errors;         /* ended with an error */
    int64_t cancelled;      /* ended by qtts_stream_cancel / discard / release */
    double audio_seconds;   /* audio produced by the ended streams */
} qtts_engine_stats;

/* A snapshot of the engine's counters (takes a lock for a moment). Any thread. */
qtts_result qtts_engine_stats_get(qtts_engine* engine, qtts_engine_stats* out);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* QTTS_C_H */
