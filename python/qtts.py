"""Python bindings of the qtts C API (libqtts.so), in pure Python with ctypes: nothing to build,
nothing to download, no dependency beyond the standard library.

    import qtts
    with qtts.Engine(backend="cpu") as engine:          # no model_dir: the embedded demo model
        with engine.speak("Hello from Python.") as stream:
            for chunk in stream:                        # array('f') of 24 kHz mono samples
                play(chunk)

Audio comes as array.array('f') (numpy: numpy.frombuffer(chunk, dtype=numpy.float32)).
Every failure of the library raises qtts.QttsError carrying the result code and the message of
qtts_last_error().

The library is found, in order: the `library` argument, $QTTS_LIBRARY, a build tree next to this
file (../build/libqtts.so), then the system's search path (libqtts.so.0, ctypes.util).

Threads: as in the C API (docs/c-api.md). An Engine may be shared between threads; one thread
iterates / reads a given Stream; cancel(), discard(), append() and metrics() may come from any
thread. The iterator waits for audio inside the library with the GIL released.
"""

import array
import ctypes
import ctypes.util
import os

__all__ = ["QttsError", "Engine", "Stream", "load_library", "SAMPLE_RATE", "SAMPLES_PER_FRAME", "version"]

SAMPLE_RATE = 24000
SAMPLES_PER_FRAME = 1920

_RESULT_NAMES = [
    "QTTS_OK", "QTTS_ERROR_INVALID_ARGUMENT", "QTTS_ERROR_IO", "QTTS_ERROR_FORMAT", "QTTS_ERROR_SHAPE",
    "QTTS_ERROR_NOT_FOUND", "QTTS_ERROR_UNSUPPORTED", "QTTS_ERROR_CUDA", "QTTS_ERROR_CANCELLED",
    "QTTS_ERROR_BUSY", "QTTS_ERROR_INTERNAL", "QTTS_ERROR_OUT_OF_MEMORY",
]
INVALID_ARGUMENT = 1
NOT_FOUND = 5
BUSY = 9


class QttsError(Exception):
    """A failed qtts call: `code` is the qtts_result value, `name` its name, `message` the text of
    qtts_last_error()."""

    def __init__(self, code, message):
        self.code = code
        self.name = _RESULT_NAMES[code] if 0 <= code < len(_RESULT_NAMES) else "QTTS_ERROR_%d" % code
        self.message = message
        super().__init__("%s: %s" % (self.name, message))


# ---- the C declarations (engine/api/qtts_c.h), field for field ----

_engine_p = ctypes.c_void_p
_stream_p = ctypes.c_void_p

CHUNK_CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _stream_p, ctypes.POINTER(ctypes.c_float),
                                  ctypes.c_size_t, ctypes.c_int)


class _EngineOptions(ctypes.Structure):
    _fields_ = [("model_dir", ctypes.c_char_p), ("backend", ctypes.c_char_p), ("device", ctypes.c_int),
                ("max_streams", ctypes.c_int), ("first_chunk_frames", ctypes.c_int), ("chunk_frames", ctypes.c_int)]


class _Request(ctypes.Structure):
    _fields_ = [("text", ctypes.c_char_p), ("speaker", ctypes.c_char_p), ("language", ctypes.c_char_p),
                ("instruction", ctypes.c_char_p), ("seed", ctypes.c_uint64), ("has_seed", ctypes.c_int),
                ("incremental", ctypes.c_int), ("greedy", ctypes.c_int), ("max_frames", ctypes.c_int),
                ("voice_path", ctypes.c_char_p), ("ref_audio", ctypes.POINTER(ctypes.c_float)),
                ("ref_audio_samples", ctypes.c_size_t), ("ref_text", ctypes.c_char_p),
                ("x_vector_only", ctypes.c_int), ("on_chunk", CHUNK_CALLBACK), ("user_data", ctypes.c_void_p)]


class _Metrics(ctypes.Structure):
    _fields_ = [("first_audio_ms", ctypes.c_double), ("generation_ms", ctypes.c_double),
                ("frames", ctypes.c_int64), ("samples", ctypes.c_int64), ("rtf", ctypes.c_double),
                ("stalls", ctypes.c_int64), ("stop_reason", ctypes.c_int)]


class _EngineStats(ctypes.Structure):
    _fields_ = [("requests", ctypes.c_int64), ("active_streams", ctypes.c_int64), ("completed", ctypes.c_int64),
                ("errors", ctypes.c_int64), ("cancelled", ctypes.c_int64), ("audio_seconds", ctypes.c_double)]


def _declare(lib):
    sigs = {
        "qtts_version": (ctypes.c_char_p, []),
        "qtts_last_error": (ctypes.c_char_p, []),
        "qtts_stop_reason_name": (ctypes.c_char_p, [ctypes.c_int]),
        "qtts_engine_options_init": (None, [ctypes.POINTER(_EngineOptions)]),
        "qtts_engine_create": (ctypes.c_int, [ctypes.POINTER(_EngineOptions), ctypes.POINTER(_engine_p)]),
        "qtts_engine_destroy": (None, [_engine_p]),
        "qtts_engine_backend": (ctypes.c_int, [_engine_p, ctypes.c_char_p, ctypes.c_size_t]),
        "qtts_engine_stats_get": (ctypes.c_int, [_engine_p, ctypes.POINTER(_EngineStats)]),
        "qtts_request_init": (None, [ctypes.POINTER(_Request)]),
        "qtts_submit": (ctypes.c_int, [_engine_p, ctypes.POINTER(_Request), ctypes.POINTER(_stream_p)]),
        "qtts_stream_text_append": (ctypes.c_int, [_stream_p, ctypes.c_char_p]),
        "qtts_stream_text_close": (ctypes.c_int, [_stream_p]),
        "qtts_stream_read": (ctypes.c_size_t, [_stream_p, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t]),
        "qtts_stream_available": (ctypes.c_size_t, [_stream_p]),
        "qtts_stream_wait": (ctypes.c_int, [_stream_p, ctypes.c_int]),
        "qtts_stream_finished": (ctypes.c_int, [_stream_p]),
        "qtts_stream_generation_done": (ctypes.c_int, [_stream_p]),
        "qtts_stream_cancel": (ctypes.c_int, [_stream_p]),
        "qtts_stream_discard": (ctypes.c_int, [_stream_p]),
        "qtts_stream_metrics_get": (ctypes.c_int, [_stream_p, ctypes.POINTER(_Metrics)]),
        "qtts_stream_error": (ctypes.c_int, [_stream_p, ctypes.c_char_p, ctypes.c_size_t]),
        "qtts_stream_release": (None, [_stream_p]),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


_lib = None


def _candidates():
    env = os.environ.get("QTTS_LIBRARY")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, os.pardir, "build", "libqtts.so")
    yield "libqtts.so.0"
    found = ctypes.util.find_library("qtts")
    if found:
        yield found


def load_library(path=None):
    """Loads libqtts.so (once per process) and returns the ctypes handle. `path` wins over the
    search described in the module's documentation."""
    global _lib
    if _lib is not None and path is None:
        return _lib
    tried = []
    for candidate in ([path] if path else _candidates()):
        if os.sep in candidate and not os.path.exists(candidate):
            tried.append(candidate + " (no such file)")
            continue
        try:
            _lib = _declare(ctypes.CDLL(candidate))
            return _lib
        except OSError as e:
            tried.append("%s (%s)" % (candidate, e))
    raise OSError("libqtts.so not found; set QTTS_LIBRARY to its path. Tried: " + "; ".join(tried))


def _check(result):
    if result != 0:
        raise QttsError(result, _lib.qtts_last_error().decode("utf-8", "replace"))


def _bytes(s):
    return None if s is None else s.encode("utf-8")


def version():
    return load_library().qtts_version().decode()


class Stream:
    """One request's audio. Iterate for array('f') chunks until the stream ends; or read() when
    you pace the reads yourself (an audio callback)."""

    def __init__(self, lib, handle, keep):
        self._h = handle
        self._lib = lib
        self._keep = keep  # what the library still points into (reference audio, the callback)
        self._buf = (ctypes.c_float * (4 * SAMPLES_PER_FRAME))()

    def _handle(self):
        if self._h is None:
            raise QttsError(INVALID_ARGUMENT, "the stream was released")
        return self._h

    def read(self, n=4 * SAMPLES_PER_FRAME):
        """Up to n samples that are ready now (may be empty); never blocks."""
        buf = self._buf if n <= len(self._buf) else (ctypes.c_float * n)()
        got = self._lib.qtts_stream_read(self._handle(), buf, min(n, len(buf)))
        out = array.array("f")
        out.frombytes(ctypes.string_at(buf, got * 4))
        return out

    def wait(self, timeout_ms=100):
        """Blocks (GIL released) until audio is ready, the stream ended, or the timeout."""
        return self._lib.qtts_stream_wait(self._handle(), int(timeout_ms)) == 1

    def __iter__(self):
        h = self._handle()
        while not self._lib.qtts_stream_finished(h):
            chunk = self.read()
            if chunk:
                yield chunk
            else:
                self._lib.qtts_stream_wait(h, 100)
        message = self.error()
        if message:
            raise QttsError(10, "the stream failed: " + message)

    def read_all(self):
        """Every sample to the end of the stream, as one array('f')."""
        out = array.array("f")
        for chunk in self:
            out.extend(chunk)
        return out

    @property
    def available(self):
        return self._lib.qtts_stream_available(self._handle())

    @property
    def finished(self):
        return self._lib.qtts_stream_finished(self._handle()) == 1

    @property
    def generation_done(self):
        return self._lib.qtts_stream_generation_done(self._handle()) == 1

    def append(self, text):
        """Incremental streams: more text."""
        _check(self._lib.qtts_stream_text_append(self._handle(), _bytes(text)))

    def close_text(self):
        """Incremental streams: no more text; the stream speaks what it has and ends."""
        _check(self._lib.qtts_stream_text_close(self._handle()))

    def cancel(self):
        _check(self._lib.qtts_stream_cancel(self._handle()))

    def discard(self):
        """Barge-in: cancel, and drop the audio not yet read (the next read is empty)."""
        _check(self._lib.qtts_stream_discard(self._handle()))

    def metrics(self):
        m = _Metrics()
        _check(self._lib.qtts_stream_metrics_get(self._handle(), ctypes.byref(m)))
        return {
            "first_audio_ms": m.first_audio_ms, "generation_ms": m.generation_ms, "frames": m.frames,
            "samples": m.samples, "rtf": m.rtf, "stalls": m.stalls,
            "stop_reason": self._lib.qtts_stop_reason_name(m.stop_reason).decode(),
        }

    def error(self):
        buf = ctypes.create_string_buffer(1024)
        _check(self._lib.qtts_stream_error(self._handle(), buf, len(buf)))
        return buf.value.decode("utf-8", "replace")

    def release(self):
        """Gives the stream back (cancels it if still speaking). Idempotent."""
        if self._h is not None:
            self._lib.qtts_stream_release(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        self.release()


class Engine:
    """A loaded model and its engine thread. model_dir None: the embedded demo model (random
    weights, noise-like speech; written to $QTTS_CACHE_DIR or ~/.cache/qtts on first use)."""

    def __init__(self, model_dir=None, backend="auto", device=0, max_streams=None, library=None):
        self._h = None  # until the engine exists (close() and __del__ look at it)
        self._lib = load_library(library)
        o = _EngineOptions()
        self._lib.qtts_engine_options_init(ctypes.byref(o))
        o.model_dir = _bytes(model_dir)
        o.backend = _bytes(backend)
        o.device = int(device)
        if max_streams is not None:
            o.max_streams = int(max_streams)
        h = _engine_p()
        _check(self._lib.qtts_engine_create(ctypes.byref(o), ctypes.byref(h)))
        self._h = h

    def _handle(self):
        if self._h is None:
            raise QttsError(INVALID_ARGUMENT, "the engine was closed")
        return self._h

    @property
    def backend(self):
        buf = ctypes.create_string_buffer(64)
        _check(self._lib.qtts_engine_backend(self._handle(), buf, len(buf)))
        return buf.value.decode()

    def stats(self):
        s = _EngineStats()
        _check(self._lib.qtts_engine_stats_get(self._handle(), ctypes.byref(s)))
        return {name: getattr(s, name) for name, _ in _EngineStats._fields_}

    def speak(self, text="", speaker=None, language=None, instruction=None, seed=None, greedy=False,
              max_frames=0, incremental=False, voice_path=None, ref_audio=None, ref_text=None,
              x_vector_only=False, on_chunk=None):
        """Submits a request and returns its Stream at once. ref_audio: 24 kHz mono float samples
        (any sequence of numbers). on_chunk(samples: array('f'), last: bool) makes the library
        deliver the audio on its own thread instead of the iterator."""
        lib = self._lib
        r = _Request()
        lib.qtts_request_init(ctypes.byref(r))
        keep = [self]  # the engine outlives its streams
        r.text = _bytes(text)
        r.speaker = _bytes(speaker)
        if language is not None:
            r.language = _bytes(language)
        r.instruction = _bytes(instruction)
        if seed is not None:
            r.seed = int(seed)
            r.has_seed = 1
        r.greedy = 1 if greedy else 0
        r.max_frames = int(max_frames)
        r.incremental = 1 if incremental else 0
        r.voice_path = _bytes(voice_path)
        if ref_audio is not None:
            clip = (ctypes.c_float * len(ref_audio))(*ref_audio)
            keep.append(clip)
            r.ref_audio = clip
            r.ref_audio_samples = len(ref_audio)
        r.ref_text = _bytes(ref_text)
        r.x_vector_only = 1 if x_vector_only else 0
        if on_chunk is not None:
            def trampoline(_user, _stream, pcm, samples, last):
                chunk = array.array("f")
                if samples:
                    chunk.frombytes(ctypes.string_at(pcm, samples * 4))
                try:
                    on_chunk(chunk, bool(last))
                except Exception:  # an exception cannot cross into C: report it and go on
                    import traceback
                    traceback.print_exc()
            cb = CHUNK_CALLBACK(trampoline)
            keep.append(cb)  # alive as long as the stream: the library calls it until the last call
            r.on_chunk = cb
        h = _stream_p()
        _check(lib.qtts_submit(self._handle(), ctypes.byref(r), ctypes.byref(h)))
        return Stream(lib, h, keep)

    def synthesize(self, text, **kwargs):
        """Speaks `text` whole and returns all of its samples as one array('f')."""
        with self.speak(text, **kwargs) as stream:
            return stream.read_all()

    def close(self):
        """Stops the engine. Release (or finish with) its streams first. Idempotent."""
        if self._h is not None:
            self._lib.qtts_engine_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
