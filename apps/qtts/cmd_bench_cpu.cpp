// qtts bench-cpu: frame time of a CPU backend (talker + code predictor, and the streaming speech
// decoder), fixed prompt, fixed frame count, EOS masked: the fp32 reference (--backend cpu) or the
// fast backend (--backend cpu-fast --format bf16|int8 --threads N), with the weight bytes each
// frame reads, the bandwidth that achieves and the machine's measured read bandwidth. JSON + a
// table.
#include <algorithm>
#include <cmath>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "apps/qtts/bench_common.h"
#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/cpu/cpu_chunk_generator.h"
#include "engine/cpu_fast/fast_generator.h"
#include "engine/cpu_fast/fast_speech_decoder.h"
#include "engine/cpu_fast/thread_pool.h"
#include "engine/model/make_model.h"
#include "engine/runtime/speech_model.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); }

size_t floats_bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }

// Weight bytes one frame of the fp32 reference reads (the fast backend's FastLmWeights::frame_bytes
// counted the same way): a talker step, the code predictor's prefill and G-2 steps, the heads.
size_t reference_frame_bytes(const qtts::cpu::LmWeights& w) {
    const auto stack = [](const qtts::cpu::StackF32& s) {
        size_t n = 0;
        for (const auto& l : s.layers)
            n += floats_bytes(l.q_proj) + floats_bytes(l.k_proj) + floats_bytes(l.v_proj) + floats_bytes(l.o_proj) +
                 floats_bytes(l.gate_proj) + floats_bytes(l.up_proj) + floats_bytes(l.down_proj);
        return n;
    };
    const size_t passes = size_t(w.num_code_groups() - 1);
    size_t n = stack(w.talker) + floats_bytes(w.codec_head) + passes * (stack(w.predictor) + floats_bytes(w.predictor_proj_w));
    for (const auto& h : w.predictor_head) n += floats_bytes(h);
    return n;
}

// Greedy codes and talker logits of `frames` frames (EOS masked) from either generator.
template <typename Gen, typename Hooks>
void greedy_run(Gen& gen, const qtts::Prompt& prompt, qtts::GenerationParams params, int frames, int vocab,
                std::vector<std::vector<float>>* logits, std::vector<int32_t>* codes) {
    Hooks hooks;
    hooks.on_talker_row = [&](int, const float*, const float* l) { logits->emplace_back(l, l + vocab); };
    gen.hooks_set(hooks);
    params.max_frames = frames;
    params.min_new_tokens = frames + 2;
    gen.start(prompt, params, 1);
    qtts::FrameCodes f{};
    while (gen.next_frame(f) == qtts::FrameStatus::FRAME_STATUS_FRAME) codes->insert(codes->end(), f.begin(), f.end());
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return den > 0 ? std::sqrt(num / den) : 0.0;
}

// The fast backend against the fp32 reference on this model: greedy, `frames` frames. Talker
// logits relative error (prefill row; worst row before the first differing frame), frames
// agreeing from the start, and the SNR of the fast codes' audio against the reference codes' audio
// (both through the fp32 decoder).
nlohmann::json quality_compare(const qtts::SpeechModel& model, const qtts::Prompt& prompt,
                               const qtts::GenerationParams& params, int frames) {
    const auto ref_w = model.lm_shared();
    const int V = ref_w->codec_vocab();
    std::vector<std::vector<float>> ref_logits, fast_logits;
    std::vector<int32_t> ref_codes, fast_codes;
    qtts::cpu::Generator ref(ref_w);
    greedy_run<qtts::cpu::Generator, qtts::cpu::GeneratorHooks>(ref, prompt, params, frames, V, &ref_logits, &ref_codes);
    qtts::cpu_fast::FastGenerator fast(model.fast_lm());
    greedy_run<qtts::cpu_fast::FastGenerator, qtts::cpu_fast::FastGeneratorHooks>(fast, prompt, params, frames, V,
                                                                                 &fast_logits, &fast_codes);
    const int G = ref_w->num_code_groups();
    const int n = int(std::min(ref_codes.size(), fast_codes.size()) / size_t(G));
    int agree = 0;
    while (agree < n && std::equal(ref_codes.begin() + agree * G, ref_codes.begin() + (agree + 1) * G,
                                   fast_codes.begin() + agree * G))
        ++agree;
    double worst = 0.0;
    for (int r = 0; r <= agree && r < int(std::min(ref_logits.size(), fast_logits.size())); ++r)
        worst = std::max(worst, rel_err(fast_logits[size_t(r)], ref_logits[size_t(r)]));
    std::vector<float> ref_pcm, fast_pcm;
    {
        qtts::cpu::DecoderState s = model.decoder().state_new();
        model.decoder().decode(s, ref_codes.data(), n, &ref_pcm);
    }
    {
        qtts::cpu::DecoderState s = model.decoder().state_new();
        model.decoder().decode(s, fast_codes.data(), n, &fast_pcm);
    }
    const double e = rel_err(fast_pcm, ref_pcm);
    const double snr = e > 0 ? -20.0 * std::log10(e) : 999.0;
    return {{"frames", n},
            {"greedy_frames_agreeing", agree},
            {"talker_logits_rel_err_prefill", ref_logits.empty() ? 0.0 : rel_err(fast_logits[0], ref_logits[0])},
            {"talker_logits_rel_err_worst", worst},
            {"audio_snr_db", snr}};
}

// Frame times of a generator (cpu::Generator or cpu_fast::FastGenerator) over `frames` frames.
template <typename Gen>
void frames_run(Gen& gen, const qtts::Prompt& prompt, const qtts::PreparedSpeech& prep, int frames, double* prefill_ms,
                std::vector<double>* frame_ms, std::vector<int32_t>* codes) {
    const auto t_prefill = Clock::now();
    gen.start(prompt, prep.params, prep.seed);
    *prefill_ms = ms(t_prefill, Clock::now());
    qtts::FrameCodes f{};
    for (int i = 0; i < frames; ++i) {
        const auto t0 = Clock::now();
        if (gen.next_frame(f) != qtts::FrameStatus::FRAME_STATUS_FRAME) break;
        frame_ms->push_back(ms(t0, Clock::now()));
        codes->insert(codes->end(), f.begin(), f.end());
    }
}

int cmd_bench_cpu(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model", "preset", "frames", "json", "cache", "chunk", "backend", "format", "threads", "compare",
                               "decoder"},
                        {"help", "no-bandwidth"});
    if (args.has("help") || (!args.get("model") && !args.get("preset"))) {
        std::printf("usage: qtts bench-cpu --model DIR | --preset P [--backend cpu|cpu-fast] [--format bf16|int8]\n"
                    "                      [--threads N] [--decoder fp32|bf16|reference] [--frames N] [--chunk K]\n"
                    "                      [--json FILE] [--no-bandwidth]\n"
                    "  CPU frame time: talker + code predictor per frame, decoder per frame, prefill, x real time;\n"
                    "  weight bytes per frame, achieved GB/s and the machine's measured read bandwidth\n"
                    "  (--backend cpu, the fp32 reference, is the default; --format and --threads are cpu-fast's)\n"
                    "  --decoder F   cpu-fast: the speech decoder timed: the fast one with fp32 or bf16 weights\n"
                    "                (default: what the model loads) or the fp32 reference\n"
                    "  --compare N   cpu-fast: also run the fp32 reference greedy for N frames and report logits\n"
                    "                error, greedy frames agreeing and the audio SNR against it, and the fast\n"
                    "                decoder's SNR against the reference decode of the same codes\n");
        return args.has("help") ? 0 : 2;
    }
    const std::string dir = qtts_cli::bench_model_dir(args);
    const int frames = int(args.get_int("frames", 32));
    const int chunk = int(args.get_int("chunk", 4));
    if (frames < 1 || chunk < 1) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--frames and --chunk must be >= 1");
    const std::string backend = args.get_or("backend", "cpu");
    if (backend != "cpu" && backend != "cpu-fast")
        qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "bench-cpu: unknown --backend '{}': use cpu or cpu-fast", backend);
    const bool fast = backend == "cpu-fast";
    const int compare = int(args.get_int("compare", 0));
    if (compare < 0 || (compare > 0 && !fast))
        qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "bench-cpu: --compare N (N >= 1) is for --backend cpu-fast");
    if (!fast && (args.get("format") || args.get("threads") || args.get("decoder")))
        qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT,
                   "bench-cpu: --format, --threads and --decoder are for --backend cpu-fast");
    const std::string decoder_choice =
        args.get_or("decoder", qtts::cpu_fast::conv_format_name(qtts::cpu_fast::FAST_DECODER_FORMAT_DEFAULT));
    if (decoder_choice != "reference") qtts::cpu_fast::conv_format_parse(decoder_choice);  // throws on a bad name

    const auto t_load0 = Clock::now();
    qtts::BackendOptions model_options;
    model_options.name = backend;
    model_options.cpu_format = args.get_or("format", model_options.cpu_format);
    model_options.threads = int(args.get_int("threads", 0));
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
    double prefill_ms = 0.0;
    std::vector<double> frame_ms;
    std::vector<int32_t> codes;
    size_t frame_bytes = 0;
    int threads = 1;
    std::string format = "fp32";
    std::string kernels = "openblas";
    if (fast) {
        const qtts::cpu_fast::FastLm& lm = model->fast_lm();
        qtts::cpu_fast::FastGenerator gen(lm);
        frames_run(gen, prompt, prep, frames, &prefill_ms, &frame_ms, &codes);
        frame_bytes = lm.weights->frame_bytes();
        threads = lm.pool->size();
        format = qtts::cpu_fast::weight_format_name(lm.weights->format());
        kernels = qtts::cpu_fast::matvec_isa_name(qtts::cpu_fast::matvec_isa_best());
    } else {
        qtts::cpu::Generator gen(model->lm_shared());
        frames_run(gen, prompt, prep, frames, &prefill_ms, &frame_ms, &codes);
        frame_bytes = reference_frame_bytes(*model->lm_shared());
        threads = 0;  // OpenBLAS's own threads
    }
    const int made = int(frame_ms.size());

    // Decoder alone, streaming in chunks of `chunk` frames: the fp32 reference (--backend cpu,
    // --decoder reference) or the fast decoder in the format asked for, on the LM's pool.
    std::shared_ptr<const qtts::cpu_fast::FastSpeechDecoder> fast_decoder;
    if (fast && decoder_choice != "reference") {
        const qtts::cpu_fast::FastLm& lm = model->fast_lm();
        const auto want = qtts::cpu_fast::conv_format_parse(decoder_choice);
        fast_decoder = lm.decoder && lm.decoder->format() == want
                           ? lm.decoder
                           : std::make_shared<const qtts::cpu_fast::FastSpeechDecoder>(
                                 model->checkpoint().speech_config.decoder, model->checkpoint().decoder, want, lm.pool);
    }
    std::unique_ptr<qtts::DecoderStream> stream;
    if (fast_decoder) stream = std::make_unique<qtts::cpu_fast::FastDecoderStream>(*fast_decoder);
    else stream = std::make_unique<qtts::CpuDecoderStream>(model->decoder());
    std::vector<float> pcm;
    std::vector<double> chunk_ms;
    // Process CPU time (every thread, spinning included) next to the wall time: on a shared machine
    // the wall time moves with the other load, the CPU time much less.
    const std::clock_t decoder_cpu0 = std::clock();
    for (int s = 0; s < made; s += chunk) {
        const int n = std::min(chunk, made - s);
        const auto t0 = Clock::now();
        stream->decode(codes.data() + size_t(s) * 16, n, &pcm);
        chunk_ms.push_back(ms(t0, Clock::now()) / n);
    }
    const double decoder_cpu_ms = made > 0 ? 1e3 * double(std::clock() - decoder_cpu0) / CLOCKS_PER_SEC / made : 0.0;
    const std::string decoder_name = fast_decoder ? qtts::cpu_fast::conv_format_name(fast_decoder->format()) : "reference";
    // Multiply-adds per frame of the decoder's convs and linears (the same network in both).
    const double decoder_macs =
        fast_decoder ? fast_decoder->macs_per_frame()
                     : qtts::cpu_fast::FastSpeechDecoder(model->checkpoint().speech_config.decoder, model->checkpoint().decoder,
                                                         qtts::cpu_fast::ConvFormat::CONV_FORMAT_BF16,
                                                         std::make_shared<qtts::cpu_fast::ThreadPool>(1))
                           .macs_per_frame();
    const double lm_med = qtts_cli::bench_median(frame_ms);
    const double dec_med = qtts_cli::bench_median(chunk_ms);
    const double total = lm_med + dec_med;
    const double achieved_gbs = lm_med > 0 ? double(frame_bytes) / (lm_med * 1e-3) / 1e9 : 0.0;
    double machine_gbs = 0.0;
    if (!args.has("no-bandwidth")) {
        qtts::cpu_fast::ThreadPool probe_pool(fast ? threads : 0);
        machine_gbs = qtts::cpu_fast::memory_read_bandwidth_gbs(probe_pool);
    }

    nlohmann::json j = {{"bench", "cpu"},
                        {"model", dir},
                        {"backend", backend},
                        {"format", format},
                        {"kernels", kernels},
                        {"threads", threads},
                        {"cores", std::thread::hardware_concurrency()},
                        {"frames", made},
                        {"chunk_frames", chunk},
                        {"load_ms", load_ms},
                        {"prefill_ms", prefill_ms},
                        {"prefill_positions", prompt.positions.size()},
                        {"lm_frame_ms_p50", lm_med},
                        {"lm_frame_ms_p95", qtts_cli::bench_percentile(frame_ms, 95)},
                        {"decoder", decoder_name},
                        {"decoder_frame_ms_p50", dec_med},
                        {"decoder_cpu_ms_per_frame", decoder_cpu_ms},
                        {"decoder_packed_mb", fast_decoder ? double(fast_decoder->packed_bytes()) / 1e6 : 0.0},
                        {"decoder_gmac_per_frame", decoder_macs / 1e9},
                        {"decoder_gmacs", dec_med > 0 ? decoder_macs / (dec_med * 1e-3) / 1e9 : 0.0},
                        {"frame_ms_p50", total},
                        {"lm_bytes_per_frame", frame_bytes},
                        {"lm_achieved_gbs", achieved_gbs},
                        {"machine_read_gbs", machine_gbs},
                        {"bandwidth_fraction", machine_gbs > 0 ? achieved_gbs / machine_gbs : 0.0},
                        {"lm_x_real_time", lm_med > 0 ? 80.0 / lm_med : 0.0},
                        {"x_real_time", total > 0 ? 80.0 / total : 0.0}};
    std::printf("%-26s %10s\n", ("bench " + backend + " " + format).c_str(), "value");
    std::printf("%-26s %10.1f\n", "load ms", load_ms);
    std::printf("%-26s %10.2f\n", "prefill ms", prefill_ms);
    std::printf("%-26s %10.2f\n", "talker+predictor ms/frame", lm_med);
    std::printf("%-26s %10.2f\n", ("decoder ms/frame (" + decoder_name + ")").c_str(), dec_med);
    std::printf("%-26s %10.2f\n", "decoder CPU ms/frame", decoder_cpu_ms);
    std::printf("%-26s %10.2f\n", "decoder GMAC/s", dec_med > 0 ? decoder_macs / (dec_med * 1e-3) / 1e9 : 0.0);
    std::printf("%-26s %10.2f\n", "total ms/frame (p50)", total);
    std::printf("%-26s %10.2f\n", "x real time", total > 0 ? 80.0 / total : 0.0);
    std::printf("%-26s %10.1f\n", "LM MB read per frame", double(frame_bytes) / 1e6);
    std::printf("%-26s %10.2f\n", "LM achieved GB/s", achieved_gbs);
    if (machine_gbs > 0) {
        std::printf("%-26s %10.2f\n", "machine read GB/s", machine_gbs);
        std::printf("%-26s %9.0f%%\n", "of machine bandwidth", 100.0 * achieved_gbs / machine_gbs);
    }
    std::printf("%s\n", j.dump().c_str());
    if (compare > 0) {
        j["quality"] = quality_compare(*model, prompt, prep.params, compare);
        if (fast_decoder) {
            // The fast decoder against the reference decode of the same codes (the LM run's).
            std::vector<float> ref_pcm;
            qtts::CpuDecoderStream(model->decoder()).decode(codes.data(), made, &ref_pcm);
            const double e = rel_err(pcm, ref_pcm);
            j["quality"]["decoder_snr_db"] = e > 0 ? -20.0 * std::log10(e) : 999.0;
        }
        std::printf("quality vs fp32: %s\n", j["quality"].dump().c_str());
    }
    if (auto path = args.get("json")) qtts_cli::bench_json_write(*path, j);
    return 0;
}

}  // namespace

QTTS_COMMAND("bench-cpu", "benchmark a CPU backend (frame time, bytes and GB/s per frame, decoder, prefill) with JSON output", cmd_bench_cpu);
