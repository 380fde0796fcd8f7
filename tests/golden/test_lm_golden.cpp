// The CPU talker + code predictor + frame loop against the reference's greedy runs
// (../shared/reference/golden/<model>--<scenario>.safetensors, scenarios.json).
//
// Tolerances (reference README): fp32 CPU vs fp32 goldens, logits and hidden states within 1e-4
// relative (‖a−b‖/‖b‖) per row; greedy codes identical.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/cpu/generator.h"
#include "engine/cpu/lm.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "test_support.h"
#include "engine/text/prompt.h"

namespace {

using qtts::FrameCodes;
using qtts::FrameStatus;
using qtts::cpu::Generator;
using qtts::cpu::LmWeights;
using qtts::StopReason;

constexpr double TOLERANCE = 1e-4;

struct Scenario {
    std::string model;
    std::string name;
    nlohmann::json spec;
};

std::vector<Scenario> scenarios_load(const std::string& model) {
    std::ifstream in(qtts_test::reference_dir() + "/golden/scenarios.json");
    REQUIRE(in.good());
    const nlohmann::json all = nlohmann::json::parse(in);
    std::vector<Scenario> out;
    for (const auto& s : all.at(model)) out.push_back({model, s.at("name").get<std::string>(), s});
    REQUIRE(!out.empty());
    return out;
}

// The checkpoint's weights, with the RoPE tables computed from the config as the library does.
std::shared_ptr<const LmWeights> weights_of(const std::string& model) {
    static std::map<std::string, std::shared_ptr<const LmWeights>> cache;
    auto& w = cache[model];
    if (!w) w = LmWeights::load(qtts::checkpoint_load(qtts_test::reference_model_dir(model)));
    return w;
}

std::vector<int32_t> ids_of(const nlohmann::json& list) {
    std::vector<int32_t> ids;
    for (const auto& v : list) ids.push_back(v.get<int32_t>());
    return ids;
}

std::vector<int32_t> i64_to_i32(const std::vector<int64_t>& v) { return std::vector<int32_t>(v.begin(), v.end()); }

// The request the reference's generate() received for this scenario.
qtts::PromptRequest request_of(const Scenario& sc, const qtts::SafetensorsFile& golden) {
    qtts::PromptRequest r;
    r.input_ids = ids_of(sc.spec.at("input_ids"));
    if (sc.spec.contains("instruct_ids")) r.instruct_ids = ids_of(sc.spec.at("instruct_ids"));
    r.language = sc.spec.at("language").get<std::string>();
    if (sc.spec.contains("speaker")) r.speaker = sc.spec.at("speaker").get<std::string>();
    r.layout = sc.spec.at("non_streaming").get<bool>() ? qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING
                                                       : qtts::TextLayout::TEXT_LAYOUT_STREAMING;
    r.keep_instruct_on_0b6_custom_voice = true;  // the goldens come from the low-level generate()
    if (golden.find("ref_speaker_embedding")) r.x_vector = qtts::tensor_to_f32(golden.get("ref_speaker_embedding"));
    if (sc.spec.value("icl", false)) {
        r.ref_ids = ids_of(sc.spec.at("ref_ids"));
        const auto& codes = golden.get("ref_codes");
        r.ref_codes = i64_to_i32(qtts::tensor_to_i64(codes));
        r.ref_frames = int(codes.shape[0]);
    }
    return r;
}

struct Capture {
    std::vector<std::vector<float>> hidden, logits, step_inputs;
    std::map<std::pair<int, int>, std::vector<float>> cp_logits;  // (frame, group)
};

qtts::cpu::GeneratorHooks hooks_of(Capture& cap, int H, int codec_vocab, int cp_vocab) {
    qtts::cpu::GeneratorHooks h;
    h.on_talker_row = [&cap, H, codec_vocab](int row, const float* hidden, const float* logits) {
        REQUIRE(row == int(cap.hidden.size()));
        cap.hidden.emplace_back(hidden, hidden + H);
        cap.logits.emplace_back(logits, logits + codec_vocab);
    };
    h.on_step_input = [&cap, H](int step, const float* input) {
        REQUIRE(step == int(cap.step_inputs.size()));
        cap.step_inputs.emplace_back(input, input + H);
    };
    h.on_predictor_logits = [&cap, cp_vocab](int frame, int group, const float* logits) {
        if (frame < 4) cap.cp_logits[{frame, group}] = std::vector<float>(logits, logits + cp_vocab);
    };
    return h;
}

// Compares rows of a [rows, width] golden tensor; prints the first failing row.
void rows_check(const char* what, const std::vector<std::vector<float>>& ours, const std::vector<float>& golden,
                size_t rows, size_t width, const std::string& label) {
    INFO(label << " " << what);
    REQUIRE(ours.size() == rows);
    double worst = 0.0;
    for (size_t r = 0; r < rows; ++r) {
        REQUIRE(ours[r].size() == width);
        const double err = qtts_test::rel_error(ours[r].data(), golden.data() + r * width, width);
        worst = std::max(worst, err);
        if (!(err <= TOLERANCE)) {
            size_t col = 0;
            double col_err = 0.0;
            for (size_t c = 0; c < width; ++c) {
                const double d = std::fabs(double(ours[r][c]) - golden[r * width + c]);
                if (d > col_err) col_err = d, col = c;
            }
            FAIL_CHECK(what << " row " << r << ": relative error " << err << " > " << TOLERANCE << " (largest at ["
                            << col << "]: ours " << ours[r][col] << " vs golden " << golden[r * width + col] << ")");
            return;
        }
    }
    std::printf("  %-40s %-16s %3zu rows, worst relative error %.3g\n", label.c_str(), what, rows, worst);
}

void scenario_run(const Scenario& sc) {
    const std::string label = sc.model + "--" + sc.name;
    INFO(label);
    const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path(sc.model, sc.name));
    const auto w = weights_of(sc.model);
    const int H = w->hidden_size();
    const int G = w->num_code_groups();

    const qtts::Prompt prompt = qtts::prompt_build(w->config(), request_of(sc, *golden));
    const auto& golden_logits = golden->get("talker_logits");
    const size_t N = size_t(golden_logits.shape[0]);
    REQUIRE(int(N) == sc.spec.at("max_frames").get<int>());

    qtts::GenerationParams params = qtts::generation_params_greedy(w->generation_config());
    params.max_frames = int(N) - 1;  // the reference sampled N codebook-0 tokens and expanded N-1

    Capture cap;
    Generator gen(w);
    gen.hooks_set(hooks_of(cap, H, w->codec_vocab(), w->predictor_vocab()));
    gen.start(prompt, params, /*seed=*/1234);
    std::vector<FrameCodes> frames;
    FrameCodes codes{};
    FrameStatus status;
    while ((status = gen.next_frame(codes)) == FrameStatus::FRAME_STATUS_FRAME) frames.push_back(codes);
    CHECK(status == FrameStatus::FRAME_STATUS_DONE);
    CHECK(gen.stop_reason() == StopReason::STOP_MAX_FRAMES);

    rows_check("talker_logits", cap.logits, qtts::tensor_to_f32(golden_logits), N, size_t(w->codec_vocab()), label);
    rows_check("talker_hidden", cap.hidden, qtts::tensor_to_f32(golden->get("talker_hidden")), N, size_t(H), label);
    rows_check("step_inputs", cap.step_inputs, qtts::tensor_to_f32(golden->get("step_inputs")), N - 1, size_t(H), label);

    // Code predictor logits of the first 4 frames, groups 1..15.
    const std::vector<float> cp_golden = qtts::tensor_to_f32(golden->get("cp_logits_first4"));
    std::vector<std::vector<float>> cp_rows;
    for (int f = 0; f < 4; ++f)
        for (int g = 1; g < G; ++g) {
            const auto it = cap.cp_logits.find({f, g});
            REQUIRE(it != cap.cp_logits.end());
            cp_rows.push_back(it->second);
        }
    rows_check("cp_logits_first4", cp_rows, cp_golden, size_t(4 * (G - 1)), size_t(w->predictor_vocab()), label);

    // Codes: identical.
    const auto& golden_codes_t = golden->get("codes");
    const std::vector<int64_t> golden_codes = qtts::tensor_to_i64(golden_codes_t);
    REQUIRE(size_t(golden_codes_t.shape[0]) == N - 1);
    REQUIRE(frames.size() == N - 1);
    for (size_t f = 0; f < frames.size(); ++f)
        for (int g = 0; g < G; ++g) {
            const int64_t expected = golden_codes[f * size_t(G) + size_t(g)];
            if (frames[f][size_t(g)] != expected) {
                FAIL("codes differ first at frame " << f << " codebook " << g << ": ours " << frames[f][size_t(g)]
                                                    << " vs golden " << expected);
            }
        }
    std::printf("  %-40s codes            %3zu frames identical\n", label.c_str(), frames.size());
}

}  // namespace

TEST_CASE("CPU LM matches the reference: tiny-customvoice", "[lm][golden]") {
    for (const auto& sc : scenarios_load("tiny-customvoice")) scenario_run(sc);
}

TEST_CASE("CPU LM matches the reference: tiny-voicedesign (small_to_mtp_projection)", "[lm][golden]") {
    for (const auto& sc : scenarios_load("tiny-voicedesign")) scenario_run(sc);
}

TEST_CASE("CPU LM matches the reference: tiny-base (x-vector and ICL)", "[lm][golden]") {
    for (const auto& sc : scenarios_load("tiny-base")) scenario_run(sc);
}

TEST_CASE("streaming text fed piecewise gives exactly the golden frames", "[lm][golden][streaming]") {
    const Scenario sc = [] {
        for (const auto& s : scenarios_load("tiny-customvoice"))
            if (s.name == "cv-en-stream") return s;
        FAIL("cv-en-stream missing");
        return Scenario{};
    }();
    const auto golden = qtts::SafetensorsFile::open(qtts_test::golden_path(sc.model, sc.name));
    const auto w = weights_of(sc.model);
    qtts::PromptRequest request = request_of(sc, *golden);
    const std::vector<int32_t> full = request.input_ids;
    const std::vector<int32_t> text(full.begin() + 3, full.end() - 5);
    REQUIRE(text.size() > 6);
    // Only the first 3 text tokens are known when generation starts.
    std::vector<int32_t> head(full.begin(), full.begin() + 6);
    head.insert(head.end(), full.end() - 5, full.end());
    request.input_ids = head;
    request.text_complete = false;
    const qtts::Prompt prompt = qtts::prompt_build(w->config(), request);
    CHECK(prompt.trailing_ids.size() == 2);  // text[1], text[2]; no <tts_text_eod> yet

    const size_t N = size_t(sc.spec.at("max_frames").get<int>());
    qtts::GenerationParams params = qtts::generation_params_greedy(w->generation_config());
    params.max_frames = int(N) - 1;
    Generator gen(w);
    gen.start(prompt, params, 5);
    CHECK_FALSE(gen.text_closed());

    std::vector<FrameCodes> frames;
    size_t next_text = 3;
    int waits = 0;
    FrameCodes codes{};
    for (;;) {
        const FrameStatus status = gen.next_frame(codes);
        if (status == FrameStatus::FRAME_STATUS_FRAME) {
            frames.push_back(codes);
            continue;
        }
        if (status == FrameStatus::FRAME_STATUS_DONE) break;
        ++waits;
        // Waiting twice in a row changes nothing.
        CHECK(gen.next_frame(codes) == FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT);
        if (next_text < text.size()) {
            const size_t n = std::min<size_t>(2, text.size() - next_text);  // two ids at a time
            gen.text_append(text.data() + next_text, n);
            next_text += n;
        } else {
            gen.text_close();
        }
    }
    CHECK(waits >= 6);
    CHECK(gen.stop_reason() == StopReason::STOP_MAX_FRAMES);
    CHECK_THROWS_AS(gen.text_append(text.data(), 1), qtts::Error);

    const std::vector<int64_t> golden_codes = qtts::tensor_to_i64(golden->get("codes"));
    REQUIRE(frames.size() == N - 1);
    for (size_t f = 0; f < frames.size(); ++f)
        for (size_t g = 0; g < 16; ++g)
            if (frames[f][g] != golden_codes[f * 16 + g])
                FAIL("frame " << f << " codebook " << g << ": ours " << frames[f][g] << " vs golden "
                              << golden_codes[f * 16 + g]);
    std::printf("  streaming append: %zu frames identical to the golden, %d waits for text\n", frames.size(), waits);
}

TEST_CASE("frame budget and explicit max_frames end a stream with their stop reason", "[lm][golden]") {
    const auto w = weights_of("tiny-customvoice");
    qtts::PromptRequest r;
    r.input_ids = {151644, 77091, 198, 9707, 1879, 11, 151645, 198, 151644, 77091, 198};
    r.speaker = "ryan";
    r.language = "english";
    const qtts::Prompt prompt = qtts::prompt_build(w->config(), r);
    FrameCodes codes{};

    qtts::GenerationParams params = qtts::generation_params_greedy(w->generation_config());
    params.budget.base_frames = 3;
    params.budget.frames_per_text_token = 1;  // 3 text tokens → 6 frames
    Generator gen(w);
    gen.start(prompt, params, 1);
    CHECK(gen.frame_limit() == 6);
    int frames = 0;
    while (gen.next_frame(codes) == FrameStatus::FRAME_STATUS_FRAME) ++frames;
    // Random tiny weights never choose EOS within 6 frames (EOS is masked for 2, then rare).
    if (gen.stop_reason() != StopReason::STOP_EOS) {
        CHECK(frames == 6);
        CHECK(gen.stop_reason() == StopReason::STOP_FRAME_BUDGET);
    }
    CHECK(gen.next_frame(codes) == FrameStatus::FRAME_STATUS_DONE);  // stays done

    params.max_frames = 2;
    gen.start(prompt, params, 1);
    frames = 0;
    while (gen.next_frame(codes) == FrameStatus::FRAME_STATUS_FRAME) ++frames;
    CHECK(frames == 2);
    CHECK(gen.stop_reason() == StopReason::STOP_MAX_FRAMES);
}

TEST_CASE("seeded sampling through the generator is reproducible", "[lm][golden]") {
    const auto w = weights_of("tiny-voicedesign");
    qtts::PromptRequest r;
    r.input_ids = {151644, 77091, 198, 9707, 1879, 11, 419, 374, 264, 1273, 13, 151645, 198, 151644, 77091, 198};
    r.language = "english";
    const qtts::Prompt prompt = qtts::prompt_build(w->config(), r);
    qtts::GenerationParams params = qtts::generation_params_from_config(w->generation_config());
    REQUIRE_FALSE(params.talker.greedy);
    params.max_frames = 12;
    auto run = [&](uint64_t seed) {
        Generator gen(w);
        gen.start(prompt, params, seed);
        std::vector<FrameCodes> out;
        FrameCodes codes{};
        while (gen.next_frame(codes) == FrameStatus::FRAME_STATUS_FRAME) out.push_back(codes);
        return out;
    };
    const auto a = run(42), b = run(42), c = run(43);
    CHECK(a == b);
    CHECK(a != c);
    CHECK(!a.empty());
}

TEST_CASE("talker: one prefill equals a shorter prefill plus decode steps (KV cache, positions)", "[lm][golden]") {
    for (const std::string model : {"tiny-customvoice", "tiny-voicedesign"}) {
        const auto w = weights_of(model);  // the config's RoPE table
        const int H = w->hidden_size();
        const int L = 12;
        const std::vector<float> x = qtts_test::random_floats(size_t(L * H), 99);
        qtts::cpu::TalkerState whole, split;
        qtts::cpu::talker_state_init(*w, whole, 4);  // also exercises cache growth
        qtts::cpu::talker_prefill(*w, whole, x.data(), L);
        qtts::cpu::talker_state_init(*w, split, 4);
        qtts::cpu::talker_prefill(*w, split, x.data(), L - 4);
        for (int t = L - 4; t < L; ++t) qtts::cpu::talker_step(*w, split, x.data() + size_t(t) * size_t(H));
        INFO(model);
        CHECK(qtts_test::rel_error(split.hidden.data(), whole.hidden.data(), size_t(H)) < 1e-5);
        CHECK(qtts_test::rel_error(split.logits.data(), whole.logits.data(), split.logits.size()) < 1e-5);
        // The config table is the textbook one.
        const auto& inv = w->talker.rope_inv_freq;
        for (size_t i = 0; i < inv.size(); ++i)
            CHECK(inv[i] == Approx(std::pow(w->talker.rope_theta, -2.0 * double(i) / w->talker.head_dim)).epsilon(1e-6));
    }
}
