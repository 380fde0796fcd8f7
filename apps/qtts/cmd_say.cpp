// qtts say "text" -o out.wav: speak text into a WAV file, streaming chunks as they are decoded.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "audio_io/audio_output.h"
#include "audio_io/jitter_buffer.h"
#include "audio_io/stream_player.h"
#include "audio_io/wav_writer.h"
#include "apps/qtts/cli.h"
#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/model/make_model.h"
#include "engine/api/qtts.h"
#include "engine/runtime/engine_debug.h"
#include "engine/text/request_check.h"
#include "engine/text/text_split.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;

std::vector<int32_t> parse_ids(const std::string& text, const char* option) {
    std::vector<int32_t> ids;
    std::stringstream ss(text);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        const long v = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 0 || v > 1000000)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--{} expects comma-separated token ids, got '{}'", option, item);
        ids.push_back(int32_t(v));
    }
    if (ids.empty()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--{} is empty", option);
    return ids;
}

// The first line of standard input that holds more than whitespace, or "" at end of input.
std::string stdin_first_text_line() {
    std::string line;
    while (std::getline(std::cin, line)) {
        if (!qtts::text_is_blank(line)) return line;
    }
    return "";
}

// --ref-audio FILE: reference_clip_read (cli.h), its errors named after the option.
std::vector<float> ref_audio_read(const std::string& path) {
    try {
        return qtts_cli::reference_clip_read(path);
    } catch (const qtts::Error& e) {
        fail(e.code(), "--ref-audio: {}", e.what());
    }
}

void print_usage() {
    std::printf(
        "usage: qtts say \"text\" -o out.wav [options]\n"
        "  text            the text to speak (\"-\" reads standard input line by line into one stream;\n"
        "                  empty or blank input is an error and writes no file)\n"
        "  -o, --out FILE  24 kHz mono WAV written as audio is generated\n"
        "  --model DIR     checkpoint directory (default: the embedded demo model)\n"
        "  --speaker S     CustomVoice speaker (default vivian)\n"
        "  --language L    language name or auto (default auto; qtts info lists them); a dialect\n"
        "                  (sichuan_dialect, beijing_dialect) only with its speaker (eric, dylan)\n"
        "  --instruct T    style instruction / voice description\n"
        "  --seed N        fixed seed, 0..18446744073709551615 (2^64-1), for reproducible sampling\n"
        "  --greedy        argmax decoding\n"
        "  --max-frames N  stop after N frames (80 ms each); 0 (the default) = no cap beyond the\n"
        "                  text-length frame budget\n"
        "  --text-layout streaming|non-streaming\n"
        "  --raw-tokens          debugging: special-token strings in the text and --instruct\n"
        "                        (<|im_end|>, <|im_start|>, <tts_pad>, ...) become control tokens;\n"
        "                        by default they are read as plain text\n"
        "  --input-ids a,b,c     assistant-template ids (skips the tokenizer)\n"
        "  --instruct-ids a,b,c  instruct-template ids\n"
        "  --codes-out FILE      write {\"codes\": [[c0..c15], ...]}\n"
        "  --sample-format s16|f32\n"
        "  --chunk-frames N      frames per decoded chunk (default 4; first chunk is 1)\n"
        "  --backend auto|cpu|cpu-fast|cuda  talker + code predictor backend (default auto: CUDA when\n"
        "                        usable, else cpu-fast; cpu is the fp32 reference)\n"
        "  --cpu-format bf16|int8  cpu-fast weight format (default bf16, exact; int8 is ~2x faster,\n"
        "                        ~1%% logits error; docs/cpu-fast.md)\n"
        "  --threads N           cpu-fast threads (default 0: every core)\n"
        "  --device N            CUDA device index (default 0)\n"
        "  --no-cuda-graphs      run the GPU frame steps eagerly (same audio)\n"
        "  --cpu-decoder         CUDA backend: decode speech on the CPU instead of the GPU (same audio to ~1e-6)\n"
        "  --no-fused-chunks     CUDA backend: replay the LM and the decoder separately (same audio)\n"
        "  --no-warm-up          CUDA backend: skip the load-time warm-up (~0.2-0.5 s sooner to start;\n"
        "                        the first audio then comes ~10 ms later)\n"
        "%s%s"
        "  --play                speak through the default audio device while generating\n"
        "  --audio-device D      output device: index, part of a name, or null (discard at real-time pace)\n"
        "  --voice FILE.qv       Base models: a saved voice (qtts voice create)\n"
        "  --ref-audio FILE      Base models: clone from this clip (with --ref-text, or --x-vector-only);\n"
        "                        checked (exists, decodes, 1-30 s of sound) before the model loads\n"
        "  --ref-text T          transcript of --ref-audio (in-context cloning)\n"
        "  --x-vector-only       Base models: use only the speaker x-vector\n",
        qtts_cli::GPU_MEMORY_LIMIT_HELP, qtts_cli::MAX_CONTEXT_HELP);
}

int cmd_say(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv,
                        {"out", "model", "speaker", "language", "instruct", "seed", "max-frames", "text-layout",
                         "input-ids", "instruct-ids", "codes-out", "sample-format", "chunk-frames", "backend", "cpu-format", "threads", "device",
                         "audio-device", "voice", "ref-audio", "ref-text", "gpu-memory-limit", "max-context"},
                        {"help", "greedy", "no-cuda-graphs", "cpu-decoder", "no-fused-chunks", "play", "x-vector-only", "raw-tokens",
                         "no-warm-up"});
    if (args.has("help")) {
        print_usage();
        return 0;
    }
    const bool play = args.has("play") || args.get("audio-device");
    if (!args.get("out") && !play) {
        print_usage();
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing -o FILE.wav (or --play)");
    }
    qtts::SpeechRequest request;
    if (args.positional().size() > 1) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "give the text as one argument (quote it)");
    if (!args.positional().empty()) request.text = args.positional()[0];
    const bool from_stdin = request.text == "-";
    if (from_stdin) {
        request.text.clear();
        request.incremental = true;  // lines are appended to one stream as they arrive
    }
    // The debugging inputs go through the engine's debug entry (engine/runtime/engine_debug.h).
    qtts::SpeechRequestDebug debug;
    if (args.get("input-ids")) debug.input_ids = parse_ids(*args.get("input-ids"), "input-ids");
    if (args.get("instruct-ids")) debug.instruct_ids = parse_ids(*args.get("instruct-ids"), "instruct-ids");
    if (qtts::text_is_blank(request.text) && debug.input_ids.empty() && !from_stdin)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "no text given (empty or only whitespace): qtts say \"text\" -o out.wav");
    request.speaker = args.get_or("speaker", "");
    request.language = args.get_or("language", "auto");
    request.instruct = args.get_or("instruct", "");
    request.voice_path = args.get_or("voice", "");
    request.ref_text = args.get_or("ref-text", "");
    request.x_vector_only = args.has("x-vector-only");
    if (args.get("ref-audio") && !request.x_vector_only && request.ref_text.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--ref-audio needs --ref-text TRANSCRIPT (or --x-vector-only)");
    if (auto path = args.get("ref-audio")) request.ref_audio = ref_audio_read(*path);
    if (auto seed = args.get("seed")) request.seed = qtts::seed_parse(*seed);
    debug.raw_tokens = args.has("raw-tokens");
    request.greedy = args.has("greedy");
    const long long max_frames = args.get_int("max-frames", 0);
    if (max_frames < 0 || max_frames > INT32_MAX)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--max-frames must be 0 (no cap) or a frame count up to {}, got {}",
             INT32_MAX, max_frames);
    request.max_frames = int(max_frames);
    if (auto layout = args.get("text-layout")) {
        if (*layout == "streaming") request.text_layout = qtts::TextLayout::TEXT_LAYOUT_STREAMING;
        else if (*layout == "non-streaming") request.text_layout = qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING;
        else fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--text-layout expects streaming or non-streaming, got '{}'", *layout);
    }
    const std::string format_name = args.get_or("sample-format", "s16");
    if (format_name != "s16" && format_name != "f32")
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--sample-format expects s16 or f32, got '{}'", format_name);

    qtts::EngineOptions options;
    options.chunk_frames = int(args.get_int("chunk-frames", qtts::CHUNK_FRAMES_DEFAULT));
    if (options.chunk_frames < 1 || options.chunk_frames > 1000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--chunk-frames must be 1..1000");
    options.backend.name = args.get_or("backend", "auto");
    options.backend.cpu_format = args.get_or("cpu-format", "bf16");
    options.backend.threads = int(args.get_int("threads", 0));
    options.backend.device = int(args.get_int("device", 0));
    if (options.backend.device < 0 || options.backend.device > 64) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--device must be 0..64");
    options.backend.cuda_graphs = !args.has("no-cuda-graphs");
    options.backend.gpu_decoder = !args.has("cpu-decoder");
    options.backend.fused_chunks = !args.has("no-fused-chunks");
    options.backend.warm_up = !args.has("no-warm-up");
    options.backend.gpu_memory_limit = qtts_cli::gpu_memory_limit_option(args);
    options.backend.max_context = qtts_cli::max_context_option(args);
    options.max_streams = 1;
    options.model_dir = qtts_cli::model_dir_or_default(args);

    // Open the audio output first, so a machine without sound fails before any work is done.
    std::unique_ptr<qtts::JitterBuffer> jitter;
    std::unique_ptr<qtts::AudioSink> sink;
    if (play) {
        jitter = std::make_unique<qtts::JitterBuffer>();
        qtts::AudioSinkConfig sink_config;
        sink_config.device = args.get_or("audio-device", "");
        sink = qtts::audio_sink_open(sink_config, qtts::render_source(*jitter));
        QTTS_LOG_INFO("playing on {} (output latency {:.1f} ms)", sink->describe(), sink->output_latency_s() * 1000.0);
        sink->start();
    }
    // The engine before the WAV file: a backend that cannot run (--backend cuda without a GPU)
    // fails without leaving an empty file behind.
    qtts::Engine engine(options);
    QTTS_LOG_INFO("say: generating on the {} backend", engine.backend_name());
    const double play_t0 = sink ? sink->time_now() : 0.0;
    // Validates the request (speaker, language, text, voice, ids).
    auto stream = qtts::engine_submit_debug(engine, request, debug);
    // Standard input: wait for the first line with text before any file is written, so empty or
    // blank input fails like `say ""` and leaves nothing behind.
    std::string first_line;
    if (from_stdin) {
        first_line = stdin_first_text_line();
        if (first_line.empty()) {
            stream->cancel();
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "no text on standard input (it was empty or only whitespace); nothing was written");
        }
    }
    // The WAV file only once the request is accepted, so a refused one leaves no file behind.
    std::unique_ptr<qtts::WavWriter> wav;
    if (auto out = args.get("out")) {
        wav = std::make_unique<qtts::WavWriter>(*out, qtts::SAMPLE_RATE, 1,
                                                format_name == "f32" ? qtts::WavFormat::WAV_FORMAT_F32 : qtts::WavFormat::WAV_FORMAT_S16);
    }

    // Standard input: each line is appended to the stream as it arrives; EOF closes the text.
    std::thread reader;
    if (from_stdin) {
        reader = std::thread([stream, first_line]() {
            std::string line = first_line;
            do {
                try {
                    stream->text_append(line + "\n");
                } catch (const qtts::Error& e) {
                    QTTS_LOG_WARN("skipping a line of input: {}", e.what());
                }
            } while (std::getline(std::cin, line));
            stream->text_close();
        });
    }

    // Engine stream -> (WAV file) -> jitter buffer -> audio callback.
    qtts::StreamPumpOptions pump;
    if (wav) pump.tee = [&wav](const float* pcm, size_t n) { wav->write(pcm, n); };
    qtts::stream_pump(*stream, jitter.get(), pump);
    if (reader.joinable()) reader.join();
    if (wav) wav->close();
    const std::string error = stream->error();
    if (jitter) {
        // Playback ends within the stream's length plus the buffered start (an hour is "never").
        if (error.empty()) qtts::playback_wait(*jitter, 3600.0);
        sink->stop();
    }
    if (!error.empty()) fail(ErrorCode::ERROR_INTERNAL, "generation failed: {}", error);

    const qtts::StreamMetrics m = stream->metrics();
    const double audio_s = double(m.samples) / qtts::SAMPLE_RATE;
    if (auto path = args.get("codes-out")) {
        nlohmann::json j;
        j["codes"] = stream->codes();
        std::ofstream out(*path);
        if (!out) fail(ErrorCode::ERROR_IO, "{}: cannot create", *path);
        out << j.dump() << "\n";
    }
    std::printf("%s%s: %lld frames, %.2f s of audio; ttfa_gen %.1f ms", args.get("out") ? "wrote " : "played",
                args.get("out") ? args.get("out")->c_str() : "", (long long)m.frames, audio_s, m.ttfa_gen_ms);
    if (jitter && jitter->first_sample_time() >= 0)
        std::printf("; ttfa_play %.1f ms; underruns %llu (%llu samples)", (jitter->first_sample_time() - play_t0) * 1000.0,
                    (unsigned long long)jitter->underrun_events(), (unsigned long long)jitter->underrun_samples());
    std::printf("; real-time factor %.3f (%.1fx real time); stop: %s; backend %s\n", m.rtf, m.rtf > 0 ? 1.0 / m.rtf : 0.0,
                qtts::stop_reason_name(m.stop_reason), engine.backend_name().c_str());
    QTTS_LOG_INFO("say: first audio {:.1f} ms, real-time factor {:.3f} ({:.1f}x real time)", m.ttfa_gen_ms, m.rtf,
                  m.rtf > 0 ? 1.0 / m.rtf : 0.0);
    if (engine.backend_name().rfind("cuda", 0) == 0) {
        // What qtts allocated on the device at most (its own buffers), and the device's view now
        // (graphs, libraries and the CUDA context included, other processes too).
        const int device = options.backend.device;
        const qtts::GpuMemoryUse use = qtts::gpu_memory_use(device);
        const qtts::DeviceMemory now = qtts::cuda_memory(device);
        QTTS_LOG_INFO("say: peak GPU memory {:.0f} MB (qtts allocations on cuda:{}; limit {}); device in use now {:.0f} "
                      "of {:.0f} MB, CUDA context and other processes included",
                      use.peak_bytes / 1e6, device,
                      options.backend.gpu_memory_limit
                          ? fmt::format("{:.0f} MB", options.backend.gpu_memory_limit / 1e6)
                          : std::string("none"),
                      now.used_bytes / 1e6, now.total_bytes / 1e6);
    }
    return 0;
}

}  // namespace

QTTS_COMMAND("say", "speak text into a WAV file (streaming as it is generated)", cmd_say);
