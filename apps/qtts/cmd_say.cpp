// qtts say "text" -o out.wav: speak text into a WAV file, streaming chunks as they are decoded.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "audio_io/wav_writer.h"
#include "cli.h"
#include "common/error.h"
#include "common/log.h"
#include "model/make_model.h"
#include "runtime/synthesizer.h"

namespace {

using qtts::ErrorCode;
using qtts::fail;
using Clock = std::chrono::steady_clock;

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

void print_usage() {
    std::printf(
        "usage: qtts say \"text\" -o out.wav [options]\n"
        "  text            the text to speak (\"-\" reads standard input)\n"
        "  -o, --out FILE  24 kHz mono WAV written as audio is generated\n"
        "  --model DIR     checkpoint directory (default: the embedded demo model)\n"
        "  --speaker S     CustomVoice speaker (default vivian)\n"
        "  --language L    language name or auto (default auto)\n"
        "  --instruct T    style instruction / voice description\n"
        "  --seed N        fixed seed (reproducible sampling)\n"
        "  --greedy        argmax decoding\n"
        "  --max-frames N  stop after N frames (80 ms each)\n"
        "  --text-layout streaming|non-streaming\n"
        "  --input-ids a,b,c     assistant-template ids (skips the tokenizer)\n"
        "  --instruct-ids a,b,c  instruct-template ids\n"
        "  --codes-out FILE      write {\"codes\": [[c0..c15], ...]}\n"
        "  --sample-format s16|f32\n"
        "  --chunk-frames N      frames per decoded chunk (default 4; first chunk is 1)\n"
        "  --backend cpu|cuda|auto\n");
}

int cmd_say(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv,
                        {"out", "model", "speaker", "language", "instruct", "seed", "max-frames", "text-layout",
                         "input-ids", "instruct-ids", "codes-out", "sample-format", "chunk-frames", "backend", "device"},
                        {"help", "greedy", "no-cuda-graphs"});
    if (args.has("help")) {
        print_usage();
        return 0;
    }
    if (!args.get("out")) {
        print_usage();
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "missing -o FILE.wav");
    }
    qtts::SpeechRequest request;
    if (args.positional().size() > 1) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "give the text as one argument (quote it)");
    if (!args.positional().empty()) request.text = args.positional()[0];
    if (request.text == "-") {
        std::ostringstream ss;
        ss << std::cin.rdbuf();
        request.text = ss.str();
    }
    if (args.get("input-ids")) request.input_ids = parse_ids(*args.get("input-ids"), "input-ids");
    if (args.get("instruct-ids")) request.instruct_ids = parse_ids(*args.get("instruct-ids"), "instruct-ids");
    if (request.text.empty() && request.input_ids.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "no text given: qtts say \"text\" -o out.wav");
    request.speaker = args.get_or("speaker", "");
    request.language = args.get_or("language", "auto");
    request.instruct = args.get_or("instruct", "");
    if (args.get("seed")) request.seed = uint64_t(args.get_int("seed", 0));
    request.greedy = args.has("greedy");
    request.max_frames = int(args.get_int("max-frames", 0));
    if (auto layout = args.get("text-layout")) {
        if (*layout == "streaming") request.text_layout = qtts::TextLayout::TEXT_LAYOUT_STREAMING;
        else if (*layout == "non-streaming") request.text_layout = qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING;
        else fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--text-layout expects streaming or non-streaming, got '{}'", *layout);
    }
    const std::string format_name = args.get_or("sample-format", "s16");
    if (format_name != "s16" && format_name != "f32")
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--sample-format expects s16 or f32, got '{}'", format_name);
    const int chunk_frames = int(args.get_int("chunk-frames", 4));
    if (chunk_frames < 1 || chunk_frames > 1000) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "--chunk-frames must be 1..1000");

    std::string model_dir;
    if (auto m = args.get("model")) {
        model_dir = *m;
    } else {
        model_dir = qtts::default_model_dir();
        QTTS_LOG_INFO("no --model given: using the embedded demo model (random weights) at {}", model_dir);
    }
    qtts::SpeechModelOptions options;
    options.backend = args.get_or("backend", "auto");
    options.device = int(args.get_int("device", 0));
    options.cuda_graphs = !args.has("no-cuda-graphs");
    auto model = qtts::SpeechModel::load(model_dir, options);

    const auto t_request = Clock::now();
    qtts::PreparedSpeech prepared = model->prepare(request);
    qtts::Utterance utterance(model, std::move(prepared));

    qtts::WavWriter wav(*args.get("out"), 24000, 1,
                        format_name == "f32" ? qtts::WavFormat::WAV_FORMAT_F32 : qtts::WavFormat::WAV_FORMAT_S16);
    std::vector<float> pcm;
    std::vector<qtts::FrameCodes> codes;
    double ttfa_ms = -1.0;
    int64_t samples = 0;
    int chunk = 1;  // first chunk: one frame, for the earliest first audio
    for (;;) {
        pcm.clear();
        const auto status = utterance.chunk(chunk, &pcm, &codes);
        if (!pcm.empty()) {
            if (ttfa_ms < 0) ttfa_ms = std::chrono::duration<double, std::milli>(Clock::now() - t_request).count();
            wav.write(pcm.data(), pcm.size());
            samples += int64_t(pcm.size());
        }
        if (status == qtts::UtteranceStatus::UTTERANCE_DONE) break;
        chunk = chunk_frames;
    }
    wav.close();
    const double wall = std::chrono::duration<double>(Clock::now() - t_request).count();
    const double audio_s = double(samples) / 24000.0;

    if (auto path = args.get("codes-out")) {
        nlohmann::json j;
        j["codes"] = nlohmann::json::array();
        for (const auto& f : codes) j["codes"].push_back(std::vector<int32_t>(f.begin(), f.end()));
        std::ofstream out(*path);
        if (!out) fail(ErrorCode::ERROR_IO, "{}: cannot create", *path);
        out << j.dump() << "\n";
    }
    std::printf("wrote %s: %lld frames, %.2f s of audio; time to first audio %.1f ms; real-time factor %.3f (%.1fx real time); stop: %s\n",
                args.get("out")->c_str(), (long long)utterance.frames(), audio_s, ttfa_ms, audio_s > 0 ? wall / audio_s : 0.0,
                wall > 0 ? audio_s / wall : 0.0, qtts::stop_reason_name(utterance.stop_reason()));
    return 0;
}

}  // namespace

QTTS_COMMAND("say", "speak text into a WAV file (streaming as it is generated)", cmd_say);
