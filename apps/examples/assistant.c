/* A voice assistant's speaking half, in plain C against the installed C API (<qtts/qtts_c.h>).
 *
 * It reads an LLM-like token stream, one token per line (standard input, or a file played back
 * with a delay per token), and speaks each answer while its tokens arrive: the first token opens
 * an incremental stream, later ones are appended, "<end>" (or the end of the input) closes the
 * text. A player thread stands in for an audio device: once per period (20 ms) it pulls one
 * period of samples from the stream, as an audio callback would, and throws them away at real-time
 * pace. A line "<interrupt>" is the user speaking over the answer: the assistant barges in
 * (qtts_stream_discard: generation stops, the queued audio is dropped, the player's next read is
 * empty) and the next tokens start the next answer.
 *
 * Printed per answer: the time from its first token to its first audible sample; for a barge-in,
 * the time from the cancel to the first silent period, how much queued audio was dropped, and
 * how many samples of it were played after the cancel (0 when the barge-in works).
 *
 * Build (docs/c-api.md):
 *   cc -std=c11 apps/examples/assistant.c $(pkg-config --cflags --libs qtts) -pthread -o qtts-assistant
 * Run:
 *   ./qtts-assistant --backend cpu apps/examples/assistant-tokens.txt
 *
 * Threads: main (input, control), the player (the "audio callback": only real-time safe calls,
 * qtts_stream_read, and atomics; no lock, no allocation, no I/O). */
#define _POSIX_C_SOURCE 200809L
#include <qtts/qtts_c.h>

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void sleep_ns(int64_t ns) {
    struct timespec t;
    if (ns <= 0) return;
    t.tv_sec = (time_t)(ns / 1000000000);
    t.tv_nsec = (long)(ns % 1000000000);
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

static double ms_between(int64_t a, int64_t b) { return (double)(b - a) / 1e6; }

/* ---- the player: a stand-in for an audio device's callback ---- */

typedef struct {
    size_t period;                      /* samples per callback */
    float* buffer;                      /* [period], allocated before the thread starts */
    _Atomic(qtts_stream*) current;      /* the answer being played; NULL = silence */
    atomic_int quit;
    atomic_llong periods;               /* callbacks run so far */
    atomic_llong played;                /* samples of the current answer played */
    atomic_llong first_audio_ns;        /* when its first samples were played (0 = not yet) */
    atomic_int barge_pending;           /* set by main after qtts_stream_discard */
    atomic_llong silence_ns;            /* the first period that found the stream silent after it */
    atomic_llong played_after_cancel;   /* samples read after the barge-in was seen: must stay 0 */
    atomic_llong short_periods;         /* periods the answer had not enough audio for (underruns) */
} player_t;

static void* player_run(void* arg) {
    player_t* p = (player_t*)arg;
    const int64_t period_ns = (int64_t)p->period * 1000000000 / QTTS_SAMPLE_RATE;
    int64_t next = now_ns();
    while (!atomic_load(&p->quit)) {
        qtts_stream* s = atomic_load(&p->current);
        /* Loaded before the read: a barge-in seen here was discarded before this read. */
        const int barge = atomic_load(&p->barge_pending);
        size_t n = s ? qtts_stream_read(s, p->buffer, p->period) : 0;
        const int64_t t = now_ns();
        if (n < p->period) memset(p->buffer + n, 0, (p->period - n) * sizeof(float));
        if (n > 0) {
            atomic_fetch_add(&p->played, (long long)n);
            if (atomic_load(&p->first_audio_ns) == 0) atomic_store(&p->first_audio_ns, t);
            if (barge) atomic_fetch_add(&p->played_after_cancel, (long long)n);
        } else if (barge) {
            atomic_store(&p->silence_ns, t);
            atomic_store(&p->barge_pending, 0);
        }
        if (s && n < p->period && atomic_load(&p->first_audio_ns) != 0 && !qtts_stream_generation_done(s))
            atomic_fetch_add(&p->short_periods, 1);
        /* (a real callback would hand p->buffer to the device here) */
        atomic_fetch_add(&p->periods, 1);
        next += period_ns;
        sleep_ns(next - now_ns());
    }
    return NULL;
}

/* Stops the player using `s`: after two more periods no callback can still hold it. */
static void player_detach(player_t* p) {
    const long long start = atomic_load(&p->periods);
    atomic_store(&p->current, (qtts_stream*)NULL);
    while (atomic_load(&p->periods) < start + 2) sleep_ns(1000000);
}

/* ---- the assistant ---- */

typedef struct {
    const char* backend;
    const char* model;
    const char* speaker;
    const char* input;
    int token_ms;
    int period_ms;
    int max_frames;
    int min_speech_ms;
    int min_queued_ms;
} options_t;

typedef struct {
    qtts_engine* engine;
    player_t* player;
    const options_t* opt;
    qtts_stream* stream; /* the answer being spoken, NULL between answers */
    int number;          /* answers started */
    int64_t first_token_ns;
    int failures;
} assistant_t;

static void usage(void) {
    fprintf(stderr,
            "usage: qtts-assistant [--backend auto|cpu|cuda] [--model DIR] [--speaker NAME] [--token-ms N]\n"
            "                      [--period-ms N] [--max-frames N] [--min-speech-ms N] [--min-queued-ms N] [INPUT]\n"
            "INPUT: one token per line (default: standard input). \"<end>\" ends an answer, \"<interrupt>\"\n"
            "barges in on the answer being spoken; the next token starts the next answer.\n"
            "  --token-ms N       delay before each token, like an LLM's pace (default 30)\n"
            "  --period-ms N      the player's callback period (default 20)\n"
            "  --max-frames N     cap each answer at N 80 ms frames (default 0: no cap)\n"
            "  --min-speech-ms N  an interrupt waits until the answer was audible this long (default 300)\n"
            "  --min-queued-ms N  ... and until this much of it is queued, unless its generation ended\n"
            "                     (default 0; tests use it so there is queued audio to drop)\n");
}

static int parse_int(const char* s, int lo, int hi, int* out) {
    char* end = NULL;
    long v;
    if (!s) return 0;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

static int parse_options(int argc, char** argv, options_t* o) {
    int i;
    o->backend = "auto";
    o->model = NULL;
    o->speaker = NULL;
    o->input = NULL;
    o->token_ms = 30;
    o->period_ms = 20;
    o->max_frames = 0;
    o->min_speech_ms = 300;
    o->min_queued_ms = 0;
    for (i = 1; i < argc; ++i) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        int ok = 1;
        if (strcmp(a, "--backend") == 0 && v) o->backend = v;
        else if (strcmp(a, "--model") == 0 && v) o->model = v;
        else if (strcmp(a, "--speaker") == 0 && v) o->speaker = v;
        else if (strcmp(a, "--token-ms") == 0) ok = parse_int(v, 0, 10000, &o->token_ms);
        else if (strcmp(a, "--period-ms") == 0) ok = parse_int(v, 1, 1000, &o->period_ms);
        else if (strcmp(a, "--max-frames") == 0) ok = parse_int(v, 0, 100000, &o->max_frames);
        else if (strcmp(a, "--min-speech-ms") == 0) ok = parse_int(v, 0, 60000, &o->min_speech_ms);
        else if (strcmp(a, "--min-queued-ms") == 0) ok = parse_int(v, 0, 60000, &o->min_queued_ms);
        else if (a[0] == '-' && a[1] != '\0') ok = 0;
        else if (!o->input) {
            o->input = a;
            continue;
        } else ok = 0;
        if (!ok) {
            fprintf(stderr, "qtts-assistant: bad argument '%s'%s%s\n", a, v ? " " : "", v ? v : "");
            usage();
            return 0;
        }
        ++i; /* the option's value */
    }
    return 1;
}

/* The first token of an answer: open an incremental stream and hand it to the player. */
static int answer_start(assistant_t* a, const char* token) {
    qtts_request r;
    qtts_stream* s = NULL;
    qtts_request_init(&r);
    r.text = token;
    r.incremental = 1;
    r.speaker = a->opt->speaker;
    r.max_frames = a->opt->max_frames;
    a->first_token_ns = now_ns();
    if (qtts_submit(a->engine, &r, &s) != QTTS_OK) {
        fprintf(stderr, "qtts-assistant: cannot start an answer: %s\n", qtts_last_error());
        return 0;
    }
    a->stream = s;
    a->number++;
    atomic_store(&a->player->played, 0);
    atomic_store(&a->player->first_audio_ns, 0);
    atomic_store(&a->player->short_periods, 0);
    atomic_store(&a->player->current, s);
    return 1;
}

static void answer_release(assistant_t* a) {
    player_detach(a->player);
    qtts_stream_release(a->stream);
    a->stream = NULL;
}

static void print_first_audio(assistant_t* a) {
    const long long first = atomic_load(&a->player->first_audio_ns);
    qtts_stream_metrics m;
    qtts_stream_metrics_get(a->stream, &m);
    if (first == 0) {
        printf("answer %d: no audio was played\n", a->number);
        a->failures++;
        return;
    }
    printf("answer %d: first audio %.1f ms after the first token (engine: first PCM %.1f ms after submit)\n", a->number,
           ms_between(a->first_token_ns, first), m.first_audio_ms);
}

/* "<end>" or the end of the input: no more text; the answer plays out to its end. */
static void answer_finish(assistant_t* a) {
    qtts_stream_metrics m;
    int waited = 0;
    qtts_stream_text_close(a->stream);
    while (!qtts_stream_finished(a->stream) && waited++ < 1200) sleep_ns(50 * 1000000LL); /* <= 60 s */
    if (!qtts_stream_finished(a->stream)) {
        fprintf(stderr, "qtts-assistant: answer %d did not finish playing within 60 s\n", a->number);
        a->failures++;
    }
    print_first_audio(a);
    qtts_stream_metrics_get(a->stream, &m);
    printf("answer %d: played %.2f s to its end (stop: %s, %lld short periods)\n", a->number,
           (double)atomic_load(&a->player->played) / QTTS_SAMPLE_RATE, qtts_stop_reason_name(m.stop_reason),
           (long long)atomic_load(&a->player->short_periods));
    answer_release(a);
}

/* "<interrupt>": the user speaks over the answer. */
static void answer_barge_in(assistant_t* a) {
    player_t* p = a->player;
    const int64_t speech_ns = (int64_t)a->opt->min_speech_ms * 1000000;
    int64_t deadline = now_ns() + 60LL * 1000000000;
    int64_t cancel_ns, done_ns = 0;
    size_t queued;
    long long first;

    const size_t min_queued = (size_t)a->opt->min_queued_ms * QTTS_SAMPLE_RATE / 1000;
    /* Interrupt someone who is talking: wait until the answer has been audible a moment (and, if
     * asked, has that much more to say). */
    while (((first = atomic_load(&p->first_audio_ns)) == 0 || now_ns() - first < speech_ns) && now_ns() < deadline)
        sleep_ns(1000000);
    while (qtts_stream_available(a->stream) < min_queued && !qtts_stream_generation_done(a->stream) &&
           now_ns() < deadline)
        sleep_ns(1000000);
    print_first_audio(a);
    queued = qtts_stream_available(a->stream);
    const int generated_all = qtts_stream_generation_done(a->stream); /* nothing left to stop */
    cancel_ns = now_ns();
    qtts_stream_discard(a->stream);
    atomic_store(&p->played_after_cancel, 0);
    atomic_store(&p->silence_ns, 0);
    atomic_store(&p->barge_pending, 1);
    deadline = now_ns() + 10LL * 1000000000;
    while ((atomic_load(&p->barge_pending) || !qtts_stream_generation_done(a->stream)) && now_ns() < deadline) {
        if (!done_ns && qtts_stream_generation_done(a->stream)) done_ns = now_ns();
        sleep_ns(200000);
    }
    if (!done_ns && qtts_stream_generation_done(a->stream)) done_ns = now_ns();
    if (atomic_load(&p->barge_pending) || !done_ns) {
        fprintf(stderr, "qtts-assistant: answer %d: the barge-in did not silence the player or stop generation\n",
                a->number);
        a->failures++;
    } else {
        char stopped[64];
        if (generated_all)
            snprintf(stopped, sizeof stopped, "had already ended");
        else
            snprintf(stopped, sizeof stopped, "stopped %.1f ms after the cancel", ms_between(cancel_ns, done_ns));
        printf("answer %d: barge-in after %.2f s of speech: silent %.1f ms after the cancel (period %d ms); "
               "dropped %.2f s of queued audio; generation %s; samples played after the cancel: %lld\n",
               a->number, (double)atomic_load(&p->played) / QTTS_SAMPLE_RATE,
               ms_between(cancel_ns, atomic_load(&p->silence_ns)), a->opt->period_ms, (double)queued / QTTS_SAMPLE_RATE,
               stopped, (long long)atomic_load(&p->played_after_cancel));
    }
    answer_release(a);
}

/* One input line: a token, or a control line. Returns 0 on a fatal error. */
static int handle_line(assistant_t* a, const char* line) {
    if (strcmp(line, "<end>") == 0) {
        if (a->stream) answer_finish(a);
        return 1;
    }
    if (strcmp(line, "<interrupt>") == 0) {
        if (a->stream) answer_barge_in(a);
        return 1;
    }
    if (line[0] == '\0') return 1;
    if (!a->stream) return answer_start(a, line);
    if (qtts_stream_text_append(a->stream, line) != QTTS_OK)
        fprintf(stderr, "qtts-assistant: a token was refused (%s); skipped\n", qtts_last_error());
    return 1;
}

int main(int argc, char** argv) {
    options_t opt;
    qtts_engine_options eo;
    player_t player;
    assistant_t a;
    pthread_t thread;
    FILE* in = stdin;
    char line[4096];
    int ok = 1;
    char backend[64];

    if (!parse_options(argc, argv, &opt)) return 2;
    if (opt.input && strcmp(opt.input, "-") != 0) {
        in = fopen(opt.input, "r");
        if (!in) {
            fprintf(stderr, "qtts-assistant: cannot open %s: %s\n", opt.input, strerror(errno));
            return 1;
        }
    }
    qtts_engine_options_init(&eo);
    eo.backend = opt.backend;
    eo.model_dir = opt.model;
    memset(&a, 0, sizeof a);
    if (qtts_engine_create(&eo, &a.engine) != QTTS_OK) {
        fprintf(stderr, "qtts-assistant: %s\n", qtts_last_error());
        if (in != stdin) fclose(in);
        return 1;
    }
    qtts_engine_backend(a.engine, backend, sizeof backend);
    printf("qtts %s on %s; player period %d ms; %d ms per token\n", qtts_version(), backend, opt.period_ms,
           opt.token_ms);

    memset(&player, 0, sizeof player);
    player.period = (size_t)opt.period_ms * QTTS_SAMPLE_RATE / 1000;
    player.buffer = (float*)calloc(player.period, sizeof(float));
    atomic_init(&player.current, (qtts_stream*)NULL);
    if (!player.buffer || pthread_create(&thread, NULL, player_run, &player) != 0) {
        fprintf(stderr, "qtts-assistant: cannot start the player\n");
        qtts_engine_destroy(a.engine);
        free(player.buffer);
        if (in != stdin) fclose(in);
        return 1;
    }
    a.player = &player;
    a.opt = &opt;

    while (ok && fgets(line, sizeof line, in)) {
        size_t n = strlen(line);
        if (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
        if (n > 0 && line[n - 1] == '\r') line[--n] = '\0';
        sleep_ns((int64_t)opt.token_ms * 1000000); /* the LLM's pace */
        ok = handle_line(&a, line);
    }
    if (ok && a.stream) answer_finish(&a); /* the input ended mid-answer: speak what came */

    atomic_store(&player.quit, 1);
    pthread_join(thread, NULL);
    free(player.buffer);
    if (a.stream) qtts_stream_release(a.stream);
    qtts_engine_destroy(a.engine);
    if (in != stdin) fclose(in);
    if (!ok || a.failures) return 1;
    printf("%d answers\n", a.number);
    return 0;
}
