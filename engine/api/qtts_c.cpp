// The C interface (qtts_c.h) over the public C++ API (qtts.h) and nothing else: libqtts.so is this
// file plus the static engine. Every entry point catches every exception here, at the boundary,
// and turns it into a qtts_result plus the calling thread's last-error text; no exception and no
// C++ type crosses into the caller.
#include "engine/api/qtts_c.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "engine/api/qtts.h"

// The opaque handles: a C++ object behind a C name.
struct qtts_engine {
    std::unique_ptr<qtts::Engine> engine;
};
struct qtts_stream {
    std::shared_ptr<qtts::Stream> stream;

    // Streams with a chunk callback (qtts_request.on_chunk): `worker` is the stream's one reader
    // and calls the callback; see callback_run.
    qtts_chunk_callback callback = nullptr;
    void* user_data = nullptr;
    std::thread worker;
    std::atomic<bool> callback_done{false};      // the last call returned (qtts_stream_finished)
    std::atomic<bool> released_inside{false};    // qtts_stream_release was called by the callback
    std::mutex done_mutex;                       // with done_cv: qtts_stream_wait on such a stream
    std::condition_variable done_cv;
};

namespace {

// The result codes mirror qtts::ErrorCode shifted by one (QTTS_OK takes 0); these keep the two
// lists from drifting apart silently.
static_assert(QTTS_ERROR_INVALID_ARGUMENT == 1 + int(qtts::ErrorCode::ERROR_INVALID_ARGUMENT), "qtts_result order");
static_assert(QTTS_ERROR_INTERNAL == 1 + int(qtts::ErrorCode::ERROR_INTERNAL), "qtts_result order");
static_assert(QTTS_STOP_ERROR == int(qtts::StopReason::STOP_ERROR), "qtts_stop_reason order");
static_assert(QTTS_SAMPLE_RATE == qtts::SAMPLE_RATE, "sample rate");
static_assert(QTTS_SAMPLES_PER_FRAME == qtts::SAMPLES_PER_FRAME, "samples per frame");

// Per thread, so two threads failing at once each read their own message. Assigning may allocate;
// only the failure paths write it, never qtts_stream_read.
thread_local std::string last_error;

qtts_result fail_with(qtts_result result, const char* message) {
    try {
        last_error = message;
    } catch (...) {
        // No memory even for the message: the code still says what happened.
    }
    return result;
}

// The one translation of an exception in flight into a result: call from a catch (...) block.
qtts_result result_from_exception() {
    try {
        throw;
    } catch (const qtts::Error& e) {
        return fail_with(qtts_result(1 + int(e.code())), e.what());
    } catch (const std::bad_alloc&) {
        return fail_with(QTTS_ERROR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& e) {
        return fail_with(QTTS_ERROR_INTERNAL, e.what());
    } catch (...) {
        return fail_with(QTTS_ERROR_INTERNAL, "unknown exception");
    }
}

// NULL strings read as "": C callers may leave optional fields unset.
std::string str_or_empty(const char* s) { return s ? std::string(s) : std::string(); }

qtts_result copy_out(const std::string& s, char* buf, size_t size) {
    if (!buf || size == 0) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "output buffer is NULL or empty");
    const size_t n = s.size() < size - 1 ? s.size() : size - 1;
    std::memcpy(buf, s.data(), n);
    buf[n] = '\0';
    return QTTS_OK;
}

// Audio handed to a callback per call, at most: four 80 ms frames (one steady chunk by default).
constexpr size_t k_callback_block = 4 * QTTS_SAMPLES_PER_FRAME;

// The reader thread of a stream with a callback: delivers audio as it arrives, then the last call.
// A release from inside the callback ends the deliveries; the handle is deleted here, after the
// callback returned, since the releasing thread is this one.
void callback_run(qtts_stream* handle) {
    // qtts_submit holds the lock until handle->worker is assigned: release's "am I the worker?"
    // and the detach below read it.
    { std::lock_guard<std::mutex> started(handle->done_mutex); }
    qtts::Stream& stream = *handle->stream;
    bool released = false;
    try {
        std::vector<float> block(k_callback_block);
        while (!handle->released_inside.load()) {
            const size_t n = stream.read(block.data(), block.size());
            if (n > 0) {
                handle->callback(handle->user_data, handle, block.data(), n, 0);
                continue;
            }
            if (stream.finished()) break;
            stream.wait(std::chrono::milliseconds(50));
        }
        released = handle->released_inside.load();
        if (!released) handle->callback(handle->user_data, handle, nullptr, 0, 1);
    } catch (...) {
        // No memory for the block, or a C++ callback that threw: the stream stops speaking.
        stream.discard();
    }
    released = released || handle->released_inside.load();
    if (released) {
        // qtts_stream_release ran on this thread, inside the callback, and left the rest to us.
        handle->worker.detach();
        delete handle;
        return;
    }
    {
        std::lock_guard<std::mutex> lock(handle->done_mutex);
        handle->callback_done.store(true);
    }
    handle->done_cv.notify_all();
}

}  // namespace

extern "C" {

const char* qtts_version(void) {
#ifdef QTTS_VERSION
    return QTTS_VERSION;
#else
    return "unknown";
#endif
}

const char* qtts_last_error(void) { return last_error.c_str(); }

const char* qtts_result_name(qtts_result result) {
    switch (result) {
        case QTTS_OK: return "QTTS_OK";
        case QTTS_ERROR_INVALID_ARGUMENT: return "QTTS_ERROR_INVALID_ARGUMENT";
        case QTTS_ERROR_IO: return "QTTS_ERROR_IO";
        case QTTS_ERROR_FORMAT: return "QTTS_ERROR_FORMAT";
        case QTTS_ERROR_SHAPE: return "QTTS_ERROR_SHAPE";
        case QTTS_ERROR_NOT_FOUND: return "QTTS_ERROR_NOT_FOUND";
        case QTTS_ERROR_UNSUPPORTED: return "QTTS_ERROR_UNSUPPORTED";
        case QTTS_ERROR_CUDA: return "QTTS_ERROR_CUDA";
        case QTTS_ERROR_CANCELLED: return "QTTS_ERROR_CANCELLED";
        case QTTS_ERROR_BUSY: return "QTTS_ERROR_BUSY";
        case QTTS_ERROR_INTERNAL: return "QTTS_ERROR_INTERNAL";
        case QTTS_ERROR_OUT_OF_MEMORY: return "QTTS_ERROR_OUT_OF_MEMORY";
    }
    return "?";
}

const char* qtts_stop_reason_name(qtts_stop_reason reason) {
    if (reason < QTTS_STOP_NONE || reason > QTTS_STOP_ERROR) return "?";
    return qtts::stop_reason_name(qtts::StopReason(int(reason)));
}

void qtts_engine_options_init(qtts_engine_options* options) {
    if (!options) return;
    const qtts::EngineOptions defaults;
    options->model_dir = nullptr;
    options->backend = "auto";
    options->device = defaults.backend.device;
    options->max_streams = defaults.max_streams;
    options->first_chunk_frames = defaults.first_chunk_frames;
    options->chunk_frames = defaults.chunk_frames;
}

qtts_result qtts_engine_create(const qtts_engine_options* options, qtts_engine** out) {
    if (!out) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_engine_create: out is NULL");
    *out = nullptr;
    try {
        qtts_engine_options defaults;
        qtts_engine_options_init(&defaults);
        const qtts_engine_options& o = options ? *options : defaults;
        qtts::EngineOptions cpp;
        cpp.model_dir = str_or_empty(o.model_dir);
        cpp.backend.name = o.backend && *o.backend ? o.backend : "auto";
        cpp.backend.device = o.device;
        cpp.max_streams = o.max_streams;
        cpp.first_chunk_frames = o.first_chunk_frames;
        cpp.chunk_frames = o.chunk_frames;
        auto handle = std::make_unique<qtts_engine>();
        handle->engine = std::make_unique<qtts::Engine>(cpp);  // validates the options; throws qtts::Error
        *out = handle.release();
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

void qtts_engine_destroy(qtts_engine* engine) {
    // Engine's destructor joins its thread and does not throw; delete cannot fail.
    delete engine;
}

qtts_result qtts_engine_backend(qtts_engine* engine, char* buf, size_t size) {
    if (!engine) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_engine_backend: engine is NULL");
    try {
        return copy_out(engine->engine->backend_name(), buf, size);
    } catch (...) {
        return result_from_exception();
    }
}

void qtts_request_init(qtts_request* request) {
    if (!request) return;
    request->text = nullptr;
    request->speaker = nullptr;
    request->language = "auto";
    request->instruction = nullptr;
    request->seed = 0;
    request->has_seed = 0;
    request->incremental = 0;
    request->greedy = 0;
    request->max_frames = 0;
    request->voice_path = nullptr;
    request->ref_audio = nullptr;
    request->ref_audio_samples = 0;
    request->ref_text = nullptr;
    request->x_vector_only = 0;
    request->on_chunk = nullptr;
    request->user_data = nullptr;
}

qtts_result qtts_submit(qtts_engine* engine, const qtts_request* request, qtts_stream** out) {
    if (!out) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_submit: out is NULL");
    *out = nullptr;
    if (!engine) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_submit: engine is NULL");
    if (!request) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_submit: request is NULL");
    if (!request->ref_audio && request->ref_audio_samples > 0)
        return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_submit: ref_audio is NULL but ref_audio_samples is not 0");
    try {
        qtts::SpeechRequest cpp;
        cpp.text = str_or_empty(request->text);
        cpp.speaker = str_or_empty(request->speaker);
        cpp.language = request->language && *request->language ? request->language : "auto";
        cpp.instruct = str_or_empty(request->instruction);
        if (request->has_seed) cpp.seed = request->seed;
        cpp.incremental = request->incremental != 0;
        cpp.greedy = request->greedy != 0;
        cpp.max_frames = request->max_frames;  // the engine refuses a negative one
        cpp.voice_path = str_or_empty(request->voice_path);
        if (request->ref_audio)
            cpp.ref_audio.assign(request->ref_audio, request->ref_audio + request->ref_audio_samples);
        cpp.ref_text = str_or_empty(request->ref_text);
        cpp.x_vector_only = request->x_vector_only != 0;
        auto handle = std::make_unique<qtts_stream>();
        handle->stream = engine->engine->submit(cpp);  // checks the request; throws qtts::Error
        if (request->on_chunk) {
            handle->callback = request->on_chunk;
            handle->user_data = request->user_data;
            try {
                std::lock_guard<std::mutex> lock(handle->done_mutex);
                handle->worker = std::thread(callback_run, handle.get());
            } catch (...) {
                handle->stream->discard();  // no thread to read it: the accepted stream ends here
                throw;
            }
        }
        *out = handle.release();
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

qtts_result qtts_stream_text_append(qtts_stream* stream, const char* text) {
    if (!stream || !text) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_stream_text_append: stream or text is NULL");
    try {
        stream->stream->text_append(text);
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

qtts_result qtts_stream_text_close(qtts_stream* stream) {
    if (!stream) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_stream_text_close: stream is NULL");
    try {
        stream->stream->text_close();
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

// The audio callback's call: Stream::read is wait-free and does not throw (an SPSC ring copy).
// A stream with a callback has its reader already (the worker): a second one would break the ring.
size_t qtts_stream_read(qtts_stream* stream, float* out, size_t n) {
    if (!stream || !out || stream->callback) return 0;
    return stream->stream->read(out, n);
}

size_t qtts_stream_available(qtts_stream* stream) { return stream ? stream->stream->available() : 0; }

int qtts_stream_wait(qtts_stream* stream, int timeout_ms) {
    if (!stream) return 0;
    try {
        const std::chrono::milliseconds timeout(timeout_ms < 0 ? 0 : timeout_ms);
        if (stream->callback) {
            std::unique_lock<std::mutex> lock(stream->done_mutex);
            return stream->done_cv.wait_for(lock, timeout, [&] { return stream->callback_done.load(); }) ? 1 : 0;
        }
        return stream->stream->wait(timeout) ? 1 : 0;
    } catch (...) {
        result_from_exception();
        return 0;
    }
}

int qtts_stream_finished(qtts_stream* stream) {
    if (!stream) return 0;
    if (stream->callback) return stream->callback_done.load() ? 1 : 0;
    return stream->stream->finished() ? 1 : 0;
}

int qtts_stream_generation_done(qtts_stream* stream) { return stream && stream->stream->generation_done() ? 1 : 0; }

qtts_result qtts_stream_cancel(qtts_stream* stream) {
    if (!stream) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_stream_cancel: stream is NULL");
    try {
        stream->stream->cancel();
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

qtts_result qtts_stream_discard(qtts_stream* stream) {
    if (!stream) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_stream_discard: stream is NULL");
    try {
        stream->stream->discard();
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

qtts_result qtts_stream_metrics_get(qtts_stream* stream, qtts_stream_metrics* out) {
    if (!stream || !out) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_stream_metrics_get: stream or out is NULL");
    try {
        const qtts::StreamMetrics m = stream->stream->metrics();
        out->first_audio_ms = m.ttfa_gen_ms;
        out->generation_ms = m.generation_ms;
        out->frames = m.frames;
        out->samples = m.samples;
        out->rtf = m.rtf;
        out->stalls = m.stalls;
        out->stop_reason = qtts_stop_reason(int(m.stop_reason));
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

qtts_result qtts_stream_error(qtts_stream* stream, char* buf, size_t size) {
    if (!stream) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_stream_error: stream is NULL");
    try {
        return copy_out(stream->stream->error(), buf, size);
    } catch (...) {
        return result_from_exception();
    }
}

void qtts_stream_release(qtts_stream* stream) {
    if (!stream) return;
    if (stream->callback && stream->worker.get_id() == std::this_thread::get_id()) {
        // From inside the callback: the worker deletes the handle once the callback returned.
        stream->stream->discard();
        stream->released_inside.store(true);
        return;
    }
    try {
        // A handle given back mid-speech frees its engine slot now rather than at the end; a
        // callback gets no more audio, only its last call.
        if (stream->callback) stream->stream->discard();
        else if (!stream->stream->generation_done()) stream->stream->cancel();
    } catch (...) {
        result_from_exception();
    }
    if (stream->worker.joinable()) stream->worker.join();
    delete stream;
}

qtts_result qtts_engine_stats_get(qtts_engine* engine, qtts_engine_stats* out) {
    if (!engine || !out) return fail_with(QTTS_ERROR_INVALID_ARGUMENT, "qtts_engine_stats_get: engine or out is NULL");
    try {
        const qtts::EngineStats s = engine->engine->stats();
        out->requests = s.requests;
        out->active_streams = s.active_streams;
        out->completed = s.completed;
        out->errors = s.errors;
        out->cancelled = s.cancelled;
        out->audio_seconds = s.audio_seconds;
        return QTTS_OK;
    } catch (...) {
        return result_from_exception();
    }
}

}  // extern "C"
