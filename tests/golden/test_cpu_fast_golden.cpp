// The fast CPU backend (engine/cpu_fast) against the official reference's greedy runs on the
// tiny reference models (../shared/reference/golden, see its README), per weight format.
//
// bf16: the reference checkpoints are bf16-representable, so bf16 packing is exact and the
// README's fp32 tolerances apply unchanged: talker logits within 1e-4 relative per row, greedy
// codes identical for every frame of every scenario (N = the scenario's max_frames - 1).
// int8: per-row quantisation; talker logits within 5e-2 relative on the rows before the first
// changed code, and code agreement printed, not asserted.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu_fast/fast_generator.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/text/prompt.h"
#include "test_support.h"

using namespace qtts;

namespace {

std::vector<int32_t> ids_of(const nlohmann::json& list) {
    std::vector<int32_t> ids;
    for (const auto& v : list) ids.push_back(v.get<int32_t>());
    return ids;
}

// The request the reference's generate() received for one scenario (as test_lm_golden builds it).
PromptRequest request_of(const nlohmann::json& spec, const SafetensorsFile& golden) {
    PromptRequest r;
    r.input_ids = ids_of(spec.at("input_ids"));
    if (spec.contains("instruct_ids")) r.instruct_ids = ids_of(spec.at("instruct_ids"));
    r.language = spec.at("language").get<std::string>();
    if (spec.contains("speaker")) r.speaker = spec.at("speaker").get<std::string>();
    r.layout = spec.at("non_streaming").get<bool>() ? TextLayout::TEXT_LAYOUT_NON_STREAMING
                                                    : TextLayout::TEXT_LAYOUT_STREAMING;
    r.keep_instruct_on_0b6_custom_voice = true;
    if (golden.find("ref_speaker_embedding")) r.x_vector = tensor_to_f32(golden.get("ref_speaker_embedding"));
    if (spec.value("icl", false)) {
        r.ref_ids = ids_of(spec.at("ref_ids"));
        const auto& codes = golden.get("ref_codes");
        const std::vector<int64_t> c = tensor_to_i64(codes);
        r.ref_codes.assign(c.begin(), c.end());
        r.ref_frames = int(codes.shape[0]);
    }
    return r;
}

void model_run(const std::string& model) {
    std::ifstream in(qtts_test::reference_dir() + "/golden/scenarios.json");
    REQUIRE(in.good());
    const nlohmann::json all = nlohmann::json::parse(in);
    const auto ckpt = checkpoint_load(qtts_test::reference_model_dir(model));
    auto pool = std::make_shared<cpu_fast::ThreadPool>(1);  // threads are tested in test_cpu_fast_lm
    for (const auto format : {cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16, cpu_fast::WeightFormat::WEIGHT_FORMAT_INT8}) {
        const cpu_fast::FastLm lm{cpu_fast::FastLmWeights::load(ckpt, format), pool};
        const int G = lm.weights->num_code_groups(), V = lm.weights->codec_vocab();
        for (const auto& spec : all.at(model)) {
            const std::string label = model + "--" + spec.at("name").get<std::string>();
            INFO(label << " " << cpu_fast::weight_format_name(format));
            const auto golden = SafetensorsFile::open(qtts_test::golden_path(model, spec.at("name")));
            const Prompt prompt = prompt_build(ckpt->config, request_of(spec, *golden));
            const std::vector<float> golden_logits = tensor_to_f32(golden->get("talker_logits"));
            const std::vector<int64_t> golden_codes = tensor_to_i64(golden->get("codes"));
            const int frames = int(golden_codes.size() / size_t(G));

            GenerationParams params = generation_params_greedy(ckpt->generation);
            params.max_frames = frames;
            std::vector<std::vector<float>> logits;
            cpu_fast::FastGenerator gen(lm);
            cpu_fast::FastGeneratorHooks hooks;
            hooks.on_talker_row = [&](int, const float*, const float* l) { logits.emplace_back(l, l + V); };
            gen.hooks_set(hooks);
            gen.start(prompt, params, 1234);
            std::vector<FrameCodes> codes;
            FrameCodes f{};
            while (gen.next_frame(f) == FrameStatus::FRAME_STATUS_FRAME) codes.push_back(f);

            int agree = 0;
            while (agree < int(codes.size()) && agree < frames) {
                bool same = true;
                for (int g = 0; g < G; ++g) same = same && codes[size_t(agree)][size_t(g)] == golden_codes[size_t(agree * G + g)];
                if (!same) break;
                ++agree;
            }
            double worst = 0.0;
            for (int r = 0; r <= agree && r < int(logits.size()); ++r)
                worst = std::max(worst, qtts_test::rel_error(logits[size_t(r)].data(), golden_logits.data() + size_t(r) * V,
                                                             size_t(V)));
            std::printf("  %-34s %-5s greedy frames agreeing %2d/%2d, talker logits rel err %.2e\n", label.c_str(),
                        cpu_fast::weight_format_name(format), agree, frames, worst);
            if (format == cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16) {
                CHECK(int(codes.size()) == frames);
                CHECK(agree == frames);
                CHECK(worst <= 1e-4);
            } else {
                CHECK(worst <= 5e-2);
            }
        }
    }
}

}  // namespace

TEST_CASE("fast CPU backend vs the reference goldens: tiny-customvoice", "[cpu_fast][golden]") {
    model_run("tiny-customvoice");
}
TEST_CASE("fast CPU backend vs the reference goldens: tiny-voicedesign (projection)", "[cpu_fast][golden]") {
    model_run("tiny-voicedesign");
}
TEST_CASE("fast CPU backend vs the reference goldens: tiny-base (x-vector, ICL)", "[cpu_fast][golden]") {
    model_run("tiny-base");
}
