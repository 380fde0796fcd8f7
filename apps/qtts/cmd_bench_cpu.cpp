// qtts bench-cpu: frame time of the fp32 CPU reference engine (talker + code predictor, and the
// streaming speech decoder), fixed prompt, fixed frame count, EOS masked. JSON + a table.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "apps/qtts/bench_common.h"
#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/model/make_model.h"
#include "engine/runtime/speech_model.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

int cmd_bench_cpu(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "preset", "frames", "json", "cache", "chunk"}, {"help"});
    if (args.has("help") || (!args.get("model") && !args.get("preset"))) {
        std::printf("usage: qtts bench-cpu --model DIR | --preset P [--frames N] [--chunk K] [--json FILE]\n"
                    "  CPU frame time: talker + code predictor per frame, decoder per frame, prefill, x real time\n");
        return args.has("help") ? 0 : 2;
    }
    std::string dir;
    if (auto m = args.get("model")) {
        dir = *m;
    } else {
        const std::string cache = args.get_or("cache", (std::filesystem::temp_directory_path() / "qtts-bench").string());
        dir = cache + "/" + *args.get("preset");
        if (!std::filesystem::exists(dir + "/speech_tokenizer/model.safetensors"))
            qtts::model_write_random(qtts::model_preset(*args.get("preset")), dir, 1234);
    }
    const int frames = int(args.get_int("frames", 32));
    const int chunk = int(args.get_int("chunk", 4));
    if (frames < 1 || chunk < 1) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--frames and --chunk must be >= 1");

    const auto t_load0 = Clock::now();
    qtts::BackendOptions model_options;
    model_options.name = "cpu";  // this benchmark measures the CPU reference
    auto model = qtts::SpeechModel::load(dir, model_options);
    const double load_ms = ms(t_load0, Clock::now());

    qtts::SpeechRequest request;
    request.text = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods.";
    request.seed = 42;
    request.text_layout = qtts::TextLayout::TEXT_LAYOUT_STREAMING;  // keeps the prefill short and the text track busy
    qtts::PreparedSpeech prep = model->prepare(request);
    prep.params.min_new_tokens = frames + 2;  // EOS masked: every run makes exactly `frames` frames
    prep.params.max_frames = frames;
    prep.max_frames = frames;

    // Generation alone, frame by frame.
    qtts::PromptRequest pr = prep.base;
    pr.input_ids = prep.segments.front();
    const qtts::Prompt prompt = qtts::prompt_build(model->checkpoint().config, pr);
    qtts::cpu::Generator gen(model->lm_shared());
    const auto t_prefill = Clock::now();
    gen.start(prompt, prep.params, prep.seed);
    const double prefill_ms = ms(t_prefill, Clock::now());
    std::vector<double> frame_ms;
    std::vector<int32_t> codes;
    qtts::FrameCodes f{};
    for (int i = 0; i < frames; ++i) {
        const auto t0 = Clock::now();
        if (gen.next_frame(f) != qtts::FrameStatus::FRAME_STATUS_FRAME) break;
        frame_ms.push_back(ms(t0, Clock::now()));
        codes.insert(codes.end(), f.begin(), f.end());
    }
    const int made = int(frame_ms.size());

    // Decoder alone, streaming in chunks of `chunk` frames.
    qtts::cpu::DecoderState state = model->decoder().state_new();
    std::vector<float> pcm;
    std::vector<double> chunk_ms;
    for (int s = 0; s < made; s += chunk) {
        const int n = std::min(chunk, made - s);
        const auto t0 = Clock::now();
        model->decoder().decode(state, codes.data() + size_t(s) * 16, n, &pcm);
        chunk_ms.push_back(ms(t0, Clock::now()) / n);
    }
    const double lm_med = qtts_cli::bench_median(frame_ms);
    const double dec_med = qtts_cli::bench_median(chunk_ms);
    const double total = lm_med + dec_med;

    nlohmann::json j = {{"bench", "cpu"},
                        {"model", dir},
                        {"threads", std::thread::hardware_concurrency()},
                        {"frames", made},
                        {"chunk_frames", chunk},
                        {"load_ms", load_ms},
                        {"prefill_ms", prefill_ms},
                        {"prefill_positions", prompt.positions.size()},
                        {"lm_frame_ms_p50", lm_med},
                        {"lm_frame_ms_p95", qtts_cli::bench_percentile(frame_ms, 95)},
                        {"decoder_frame_ms_p50", dec_med},
                        {"frame_ms_p50", total},
                        {"x_real_time", total > 0 ? 80.0 / total : 0.0}};
    std::printf("%-26s %10s\n", "cpu benchmark", "value");
    std::printf("%-26s %10.1f\n", "load ms", load_ms);
    std::printf("%-26s %10.2f\n", "prefill ms", prefill_ms);
    std::printf("%-26s %10.2f\n", "talker+predictor ms/frame", lm_med);
    std::printf("%-26s %10.2f\n", "decoder ms/frame", dec_med);
    std::printf("%-26s %10.2f\n", "total ms/frame (p50)", total);
    std::printf("%-26s %10.2f\n", "x real time", total > 0 ? 80.0 / total : 0.0);
    std::printf("%s\n", j.dump().c_str());
    if (auto path = args.get("json")) qtts_cli::bench_json_write(*path, j);
    return 0;
}

}  // namespace

QTTS_COMMAND("bench-cpu", "benchmark the CPU reference engine (frame time, decoder, prefill) with JSON output", cmd_bench_cpu);
