/* The C API beyond the first slice, from outside the tree against the installed libqtts.so:
 * request fields (greedy, max_frames, reference audio), the chunk callback and its thread,
 * barge-in (qtts_stream_discard), and the engine's counters. Built with pkg-config by
 * tests/tools/test_c_api_install.sh and run on the embedded demo model (CPU backend).
 * Exit 0: every check held; 1: one failed (the reason on stderr). C99 + POSIX threads. */
#define _POSIX_C_SOURCE 200809L
#include <qtts/qtts_c.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(cond, what)                                                            \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "qtts-c-features: FAILED: %s (last error: %s)\n", what, \
                    qtts_last_error());                                              \
            return 1;                                                                \
        }                                                                            \
    } while (0)

#define MAX_SAMPLES (64 * QTTS_SAMPLES_PER_FRAME)

static void sleep_ms(int ms) {
    struct timespec t;
    t.tv_sec = ms / 1000;
    t.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&t, NULL);
}

/* Reads a stream to its end into out (at most cap samples kept); returns the count read. */
static size_t read_all(qtts_stream* s, float* out, size_t cap) {
    float buf[QTTS_SAMPLES_PER_FRAME];
    size_t total = 0;
    while (!qtts_stream_finished(s)) {
        size_t n;
        qtts_stream_wait(s, 50);
        while ((n = qtts_stream_read(s, buf, QTTS_SAMPLES_PER_FRAME)) > 0) {
            if (out && total + n <= cap) memcpy(out + total, buf, n * sizeof(float));
            total += n;
        }
    }
    return total;
}

static float audio_a[MAX_SAMPLES];
static float audio_b[MAX_SAMPLES];

static size_t speak(qtts_engine* e, int greedy, uint64_t seed, float* out) {
    qtts_request r;
    qtts_stream* s = NULL;
    size_t n;
    qtts_request_init(&r);
    r.text = "Greedy decoding is reproducible.";
    r.greedy = greedy;
    r.seed = seed;
    r.has_seed = 1;
    r.max_frames = 6;
    if (qtts_submit(e, &r, &s) != QTTS_OK) return 0;
    n = read_all(s, out, MAX_SAMPLES);
    qtts_stream_release(s);
    return n;
}

static int request_fields(qtts_engine* e) {
    qtts_request r;
    qtts_stream* s = NULL;
    qtts_stream_metrics m;
    size_t na, nb;
    float clip[2400];

    /* Greedy decoding ignores the seed; sampling does not (so the equality below says something). */
    na = speak(e, 1, 1, audio_a);
    nb = speak(e, 1, 2, audio_b);
    CHECK(na == (size_t)6 * QTTS_SAMPLES_PER_FRAME, "max_frames = 6 gives six frames");
    CHECK(na == nb && memcmp(audio_a, audio_b, na * sizeof(float)) == 0, "greedy: same audio for different seeds");
    na = speak(e, 0, 1, audio_a);
    nb = speak(e, 0, 2, audio_b);
    CHECK(na > 0 && nb > 0, "sampled streams speak");
    CHECK(na != nb || memcmp(audio_a, audio_b, na * sizeof(float)) != 0, "sampling: different seeds, different audio");

    qtts_request_init(&r);
    r.text = "Short.";
    r.max_frames = 3;
    CHECK(qtts_submit(e, &r, &s) == QTTS_OK, "submit with max_frames");
    read_all(s, NULL, 0);
    CHECK(qtts_stream_metrics_get(s, &m) == QTTS_OK, "metrics");
    CHECK(m.frames <= 3, "max_frames caps the frames");
    qtts_stream_release(s);

    /* Bad fields: a code, a message, no stream. */
    qtts_request_init(&r);
    r.text = "Hello.";
    r.max_frames = -1;
    s = NULL;
    CHECK(qtts_submit(e, &r, &s) == QTTS_ERROR_INVALID_ARGUMENT && s == NULL, "negative max_frames is refused");
    printf("max_frames -1: %s\n", qtts_last_error());

    qtts_request_init(&r);
    r.text = "Hello.";
    r.ref_audio_samples = 100;
    CHECK(qtts_submit(e, &r, &s) == QTTS_ERROR_INVALID_ARGUMENT && s == NULL, "ref_audio NULL with a count is refused");

    /* The demo model is CustomVoice: reference audio belongs to Base models. */
    memset(clip, 0, sizeof clip);
    qtts_request_init(&r);
    r.text = "Hello.";
    r.ref_audio = clip;
    r.ref_audio_samples = sizeof clip / sizeof clip[0];
    r.ref_text = "Silence.";
    CHECK(qtts_submit(e, &r, &s) == QTTS_ERROR_INVALID_ARGUMENT && s == NULL, "reference audio on a CustomVoice model");
    CHECK(strstr(qtts_last_error(), "Base") != NULL, "the message names Base models");
    printf("ref_audio on the demo model: %s\n", qtts_last_error());

    qtts_request_init(&r);
    r.text = "Hello.";
    r.voice_path = "/nonexistent/voice.qv";
    CHECK(qtts_submit(e, &r, &s) != QTTS_OK && s == NULL, "a voice file on a CustomVoice model is refused");
    return 0;
}

/* ---- the chunk callback ---- */

typedef struct {
    pthread_t submitter;
    volatile int other_thread; /* every call came on a thread other than the submitter's */
    size_t samples;
    int calls;
    int lasts;
    int data_after_last;
    int release_inside; /* release the stream from inside the last call */
    volatile int done;
    pthread_mutex_t mutex;
} sink_t;

static void on_chunk(void* user, qtts_stream* stream, const float* pcm, size_t samples, int last) {
    sink_t* k = (sink_t*)user;
    pthread_mutex_lock(&k->mutex);
    if (pthread_equal(pthread_self(), k->submitter)) k->other_thread = 0;
    if (k->lasts > 0) k->data_after_last = 1;
    k->calls++;
    if (last) {
        k->lasts++;
        if (pcm != NULL || samples != 0) k->data_after_last = 1;
    } else {
        k->samples += samples;
    }
    pthread_mutex_unlock(&k->mutex);
    if (last && k->release_inside) qtts_stream_release(stream);
    if (last) k->done = 1;
}

static void sink_init(sink_t* k) {
    memset(k, 0, sizeof *k);
    k->submitter = pthread_self();
    k->other_thread = 1;
    pthread_mutex_init(&k->mutex, NULL);
}

static int callbacks(qtts_engine* e) {
    qtts_request r;
    qtts_stream* s = NULL;
    qtts_stream_metrics m;
    sink_t k;
    float buf[QTTS_SAMPLES_PER_FRAME];
    int waited = 0;

    /* A whole stream through the callback. */
    sink_init(&k);
    qtts_request_init(&r);
    r.text = "Audio delivered by a callback.";
    r.max_frames = 8;
    r.greedy = 1;
    r.on_chunk = on_chunk;
    r.user_data = &k;
    CHECK(qtts_submit(e, &r, &s) == QTTS_OK, "submit with a callback");
    CHECK(qtts_stream_read(s, buf, QTTS_SAMPLES_PER_FRAME) == 0, "qtts_stream_read gives nothing: the callback reads");
    while (!qtts_stream_finished(s) && waited++ < 600) qtts_stream_wait(s, 100);
    CHECK(qtts_stream_finished(s), "the callback stream finishes");
    CHECK(qtts_stream_metrics_get(s, &m) == QTTS_OK, "metrics");
    qtts_stream_release(s);
    CHECK(k.other_thread, "the callback runs on the library's thread, not the submitter's");
    CHECK(k.lasts == 1 && !k.data_after_last, "exactly one last call, after all the audio");
    CHECK(k.samples > 0 && (long long)k.samples == (long long)m.samples, "every sample produced was delivered");
    printf("callback: %d calls, %lu samples\n", k.calls, (unsigned long)k.samples);

    /* Fire and forget: the last call gives the handle back itself. */
    sink_init(&k);
    k.release_inside = 1;
    r.user_data = &k;
    r.max_frames = 3;
    CHECK(qtts_submit(e, &r, &s) == QTTS_OK, "submit (release inside the callback)");
    for (waited = 0; !k.done && waited < 6000; ++waited) sleep_ms(10);
    CHECK(k.done && k.lasts == 1, "the last call came and released its stream");

    /* Barge-in on a callback stream: the audio stops, the last call still comes, once. */
    sink_init(&k);
    r.user_data = &k;
    r.max_frames = 200;
    r.greedy = 1;
    r.text = "A long answer that the user interrupts before it is over.";
    r.incremental = 1; /* text left open: it waits for more, so the discard always finds it running */
    CHECK(qtts_submit(e, &r, &s) == QTTS_OK, "submit (discard with a callback)");
    r.incremental = 0;
    for (waited = 0; k.samples == 0 && waited < 6000; ++waited) sleep_ms(5);
    CHECK(k.samples > 0, "audio arrived");
    CHECK(qtts_stream_discard(s) == QTTS_OK, "qtts_stream_discard");
    for (waited = 0; !qtts_stream_finished(s) && waited < 300; ++waited) qtts_stream_wait(s, 100);
    CHECK(qtts_stream_finished(s) && k.lasts == 1, "the discarded callback stream ends with one last call");
    CHECK(k.samples < (size_t)200 * QTTS_SAMPLES_PER_FRAME, "the stream was cut short");
    CHECK(qtts_stream_metrics_get(s, &m) == QTTS_OK && m.stop_reason == QTTS_STOP_CANCELLED, "stopped: cancelled");
    qtts_stream_release(s);

    /* Released mid-speech from another thread: release waits for the last call. */
    sink_init(&k);
    r.user_data = &k;
    CHECK(qtts_submit(e, &r, &s) == QTTS_OK, "submit (release mid-speech)");
    for (waited = 0; k.samples == 0 && waited < 6000; ++waited) sleep_ms(5);
    qtts_stream_release(s);
    CHECK(k.lasts == 1 && k.done, "release returned after the one last call");
    return 0;
}

/* ---- barge-in on a pulled stream ---- */

static int discard(qtts_engine* e) {
    qtts_request r;
    qtts_stream* s = NULL;
    qtts_stream_metrics m;
    float buf[QTTS_SAMPLES_PER_FRAME];
    size_t queued;
    int waited;

    qtts_request_init(&r);
    r.text = "A long answer that keeps going while nobody reads it.";
    r.max_frames = 200;
    r.greedy = 1;
    CHECK(qtts_submit(e, &r, &s) == QTTS_OK, "submit (discard)");
    /* Audio piles up unread, as it does in a player's buffer. */
    for (waited = 0; qtts_stream_available(s) < 3 * QTTS_SAMPLES_PER_FRAME && waited < 6000; ++waited) sleep_ms(5);
    queued = qtts_stream_available(s);
    CHECK(queued >= 3 * QTTS_SAMPLES_PER_FRAME, "audio is queued");
    CHECK(qtts_stream_discard(s) == QTTS_OK, "qtts_stream_discard");
    CHECK(qtts_stream_available(s) == 0, "nothing readable after discard");
    CHECK(qtts_stream_read(s, buf, QTTS_SAMPLES_PER_FRAME) == 0, "the next read returns nothing");
    for (waited = 0; !qtts_stream_generation_done(s) && waited < 300; ++waited) qtts_stream_wait(s, 100);
    CHECK(qtts_stream_generation_done(s), "generation stopped");
    CHECK(qtts_stream_read(s, buf, QTTS_SAMPLES_PER_FRAME) == 0, "nothing made before the stop comes out");
    CHECK(qtts_stream_finished(s), "finished without reading");
    CHECK(qtts_stream_metrics_get(s, &m) == QTTS_OK && m.stop_reason == QTTS_STOP_CANCELLED, "stopped: cancelled");
    printf("discard: dropped %lu queued samples, stopped after %lld frames\n", (unsigned long)queued, (long long)m.frames);
    qtts_stream_release(s);
    CHECK(qtts_stream_discard(NULL) == QTTS_ERROR_INVALID_ARGUMENT, "discard(NULL) is an error, not a crash");
    CHECK(qtts_stream_available(NULL) == 0, "available(NULL) is 0");
    return 0;
}

int main(int argc, char** argv) {
    qtts_engine_options o;
    qtts_engine* e = NULL;
    qtts_engine_stats st;
    qtts_stream* s = NULL;
    qtts_request r;

    qtts_engine_options_init(&o);
    o.backend = argc > 1 ? argv[1] : "cpu";
    CHECK(qtts_engine_create(&o, &e) == QTTS_OK, "qtts_engine_create");
    CHECK(qtts_engine_stats_get(e, &st) == QTTS_OK && st.requests == 0, "a new engine has no requests");
    CHECK(qtts_engine_stats_get(NULL, &st) == QTTS_ERROR_INVALID_ARGUMENT, "stats of NULL is an error");
    CHECK(qtts_engine_stats_get(e, NULL) == QTTS_ERROR_INVALID_ARGUMENT, "stats into NULL is an error");

    if (request_fields(e) || callbacks(e) || discard(e)) {
        qtts_engine_destroy(e);
        return 1;
    }
    /* request_fields: 5 streams; callbacks: 4 (2 cut short); discard: 1 (cut short). */
    qtts_request_init(&r);
    r.text = "";
    CHECK(qtts_submit(e, &r, &s) != QTTS_OK, "refused requests are not counted");
    CHECK(qtts_engine_stats_get(e, &st) == QTTS_OK, "qtts_engine_stats_get");
    printf("engine: %lld requests, %lld completed, %lld cancelled, %lld errors, %lld active, %.2f s of audio\n",
           (long long)st.requests, (long long)st.completed, (long long)st.cancelled, (long long)st.errors,
           (long long)st.active_streams, st.audio_seconds);
    CHECK(st.requests == 10, "10 streams were accepted");
    CHECK(st.cancelled == 3, "3 were cut short");
    CHECK(st.completed == 7 && st.errors == 0 && st.active_streams == 0, "7 completed, none failed, none left");
    CHECK(st.audio_seconds > 0.0, "audio was counted");
    qtts_engine_destroy(e);
    printf("qtts-c-features: PASSED\n");
    return 0;
}
