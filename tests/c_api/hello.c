/* A program from outside the tree that uses only the installed C API (libqtts.so, <qtts/qtts_c.h>):
 * it speaks one sentence with the embedded demo model, pulls every sample, checks the counts and
 * one error path, and prints the time to first audio. Built twice by
 * tests/tools/test_c_api_install.sh: with pkg-config and cc, and with find_package(qtts).
 * Exit 0: everything held; 1: a check failed (the reason on stderr). Plain C99. */
#include <qtts/qtts_c.h>

#include <stdio.h>
#include <string.h>

#define CHECK(cond, what)                                                         \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "qtts-c-hello: FAILED: %s (last error: %s)\n", what, \
                    qtts_last_error());                                           \
            return 1;                                                             \
        }                                                                         \
    } while (0)

static int run(qtts_engine* engine) {
    qtts_request request;
    qtts_stream* stream = NULL;
    qtts_stream_metrics m;
    float pcm[QTTS_SAMPLES_PER_FRAME]; /* one frame's worth per read */
    long long samples = 0;
    char err[256];
    qtts_result r;

    /* The error path: an empty text is refused with a code and a message. */
    qtts_request_init(&request);
    request.text = "";
    r = qtts_submit(engine, &request, &stream);
    CHECK(r == QTTS_ERROR_INVALID_ARGUMENT, "empty text gives QTTS_ERROR_INVALID_ARGUMENT");
    CHECK(stream == NULL, "no stream on failure");
    CHECK(qtts_last_error()[0] != '\0', "a failure leaves a last-error message");
    printf("empty text: %s: %s\n", qtts_result_name(r), qtts_last_error());

    qtts_request_init(&request);
    request.text = "Hello from a C program.";
    request.seed = 7;
    request.has_seed = 1;
    r = qtts_submit(engine, &request, &stream);
    CHECK(r == QTTS_OK && stream != NULL, "qtts_submit");

    /* The consumer: wait for audio, read what is there, until the stream is finished. */
    while (!qtts_stream_finished(stream)) {
        size_t n;
        qtts_stream_wait(stream, 100);
        while ((n = qtts_stream_read(stream, pcm, QTTS_SAMPLES_PER_FRAME)) > 0) samples += (long long)n;
    }
    CHECK(qtts_stream_generation_done(stream), "finished implies generation done");
    CHECK(qtts_stream_error(stream, err, sizeof err) == QTTS_OK && err[0] == '\0', "the stream ended without an error");
    CHECK(qtts_stream_metrics_get(stream, &m) == QTTS_OK, "qtts_stream_metrics_get");
    qtts_stream_release(stream);

    CHECK(samples > 0, "some audio came out");
    CHECK(samples % QTTS_SAMPLES_PER_FRAME == 0, "whole frames of audio");
    CHECK(samples == m.samples, "every sample produced was read");
    CHECK(m.frames * QTTS_SAMPLES_PER_FRAME == m.samples, "metrics: frames and samples agree");
    CHECK(m.first_audio_ms >= 0.0, "metrics: a first-audio time");
    CHECK(m.stop_reason != QTTS_STOP_NONE && m.stop_reason != QTTS_STOP_ERROR, "metrics: a normal stop");
    printf("qtts %s: %lld samples (%.2f s), first audio after %.1f ms, rtf %.2f, stop: %s\n", qtts_version(), samples,
           (double)samples / QTTS_SAMPLE_RATE, m.first_audio_ms, m.rtf, qtts_stop_reason_name(m.stop_reason));
    return 0;
}

/* Pulls a stream to its end; returns the samples read. */
static long long drain(qtts_stream* stream) {
    float pcm[QTTS_SAMPLES_PER_FRAME];
    long long samples = 0;
    size_t n;
    while (!qtts_stream_finished(stream)) {
        qtts_stream_wait(stream, 100);
        while ((n = qtts_stream_read(stream, pcm, QTTS_SAMPLES_PER_FRAME)) > 0) samples += (long long)n;
    }
    return samples;
}

/* Incremental text and cancel: text arrives in pieces; a cancelled stream ends. */
static int run_incremental(qtts_engine* engine) {
    qtts_request request;
    qtts_stream* stream = NULL;
    qtts_stream_metrics m;
    long long samples;

    qtts_request_init(&request);
    request.text = "Hello";
    request.incremental = 1;
    CHECK(qtts_submit(engine, &request, &stream) == QTTS_OK, "incremental qtts_submit");
    CHECK(qtts_stream_text_append(stream, " from the pieces of a sentence.") == QTTS_OK, "qtts_stream_text_append");
    CHECK(qtts_stream_text_append(stream, "\xff") == QTTS_ERROR_INVALID_ARGUMENT, "invalid UTF-8 is refused");
    CHECK(qtts_stream_text_close(stream) == QTTS_OK, "qtts_stream_text_close");
    samples = drain(stream);
    CHECK(samples > 0 && samples % QTTS_SAMPLES_PER_FRAME == 0, "incremental: whole frames of audio");
    qtts_stream_release(stream);

    qtts_request_init(&request);
    request.text = "This sentence is cancelled before it is spoken to its end.";
    CHECK(qtts_submit(engine, &request, &stream) == QTTS_OK, "qtts_submit (to cancel)");
    CHECK(qtts_stream_text_append(stream, "more") == QTTS_ERROR_INVALID_ARGUMENT, "append to a non-incremental stream is refused");
    CHECK(qtts_stream_cancel(stream) == QTTS_OK, "qtts_stream_cancel");
    drain(stream);
    CHECK(qtts_stream_metrics_get(stream, &m) == QTTS_OK, "qtts_stream_metrics_get (cancelled)");
    CHECK(m.stop_reason == QTTS_STOP_CANCELLED || m.stop_reason == QTTS_STOP_EOS, "cancelled (or done before the cancel)");
    printf("cancelled stream: stop %s after %lld frames\n", qtts_stop_reason_name(m.stop_reason), (long long)m.frames);
    qtts_stream_release(stream);
    return 0;
}

/* usage: qtts-c-hello [cpu|cuda]   (default cpu: the test machine may have no GPU; the C API is
 * the same on both, and the GPU machine runs it with cuda) */
int main(int argc, char** argv) {
    qtts_engine_options options;
    qtts_engine* engine = NULL;
    char backend[32];
    const char* wanted = argc > 1 ? argv[1] : "cpu";
    int rc;

    qtts_engine_options_init(&options);
    options.backend = wanted;
    options.max_streams = 2;
    CHECK(qtts_engine_create(&options, &engine) == QTTS_OK && engine != NULL, "qtts_engine_create (demo model)");
    CHECK(qtts_engine_backend(engine, backend, sizeof backend) == QTTS_OK &&
              strncmp(backend, wanted, strlen(wanted)) == 0,
          "the engine runs on the requested backend");
    printf("backend: %s\n", backend);
    rc = run(engine);
    if (rc == 0) rc = run_incremental(engine);
    qtts_engine_destroy(engine);
    return rc;
}
