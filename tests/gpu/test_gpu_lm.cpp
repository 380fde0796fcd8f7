// The GPU talker + code predictor against the CPU reference LM on the tiny reference models
// (../shared/reference/models; random tiny checkpoints of the same shapes when it is absent):
//   * teacher-forced: every talker and predictor logits row (rel err < 1e-2, per row);
//   * free-running greedy: identical codes, graphs on and off, host or device embeddings;
//   * free-running seeded sampling: the same Philox stream gives the same codes;
//   * the predictor's projected inputs (GpuLmWeights::predictor_input_rows): the projection's
//     gemv bit for bit, the CPU's product within 1e-5.
#include <catch2/catch.hpp>

// CPU-only builds compile this file to nothing (test_main skips the gpu label without a device).
#ifdef QTTS_HAVE_CUDA

#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "engine/cpu/generator.h"
#include "engine/cpu/lm.h"
#include "engine/cuda/device_buffer.h"
#include "engine/cuda/gpu_generator.h"
#include "engine/model/safetensors.h"
#include "kernels/gemv.cuh"
#include "engine/model/make_model.h"
#include "engine/model/weights.h"
#include "engine/generation/sampling.h"
#include "test_support.h"
#include "engine/text/prompt.h"

namespace qc = qtts::cuda;
using qtts::FrameCodes;
using qtts::FrameStatus;

namespace {

qc::GpuContext& context() {
    static qc::GpuContext ctx(0);
    return ctx;
}

// The 0.6B-like (no projection) and 1.7B-like (small_to_mtp_projection) tiny models.
std::vector<std::string> tiny_models() {
    std::vector<std::string> dirs;
    if (qtts_test::reference_available()) {
        for (const char* name : {"tiny-customvoice", "tiny-voicedesign"}) {
            const std::string dir = qtts_test::reference_model_dir(name);
            if (std::filesystem::exists(dir + "/model.safetensors")) dirs.push_back(dir);
        }
    }
    if (dirs.size() == 2) return dirs;
    dirs.clear();
    const std::string base = qtts_test::temp_dir();
    qtts::ModelPreset plain = qtts::model_preset("tiny-customvoice");
    qtts::model_write_random(plain, base + "/tiny-plain", 11);
    qtts::ModelPreset projected = plain;
    projected.config.talker.hidden_size = 96;  // != predictor width 64: small_to_mtp_projection
    qtts::model_write_random(projected, base + "/tiny-projected", 12);
    return {base + "/tiny-plain", base + "/tiny-projected"};
}

qtts::Prompt test_prompt(const qtts::ModelConfig& config, qtts::TextLayout layout) {
    qtts::PromptRequest r;
    r.input_ids = {151644, 77091, 198, 9707, 1879, 11, 419, 374, 264, 1273, 13, 151645, 198, 151644, 77091, 198};
    r.language = "english";
    r.layout = layout;
    if (config.type == qtts::ModelType::MODEL_TYPE_CUSTOM_VOICE) r.speaker = config.talker.speaker_ids.begin()->first;
    if (config.type == qtts::ModelType::MODEL_TYPE_VOICE_DESIGN)
        r.instruct_ids = {151644, 872, 198, 100345, 99354, 101091, 3837, 151645, 198};
    return qtts::prompt_build(config, r);
}

struct CpuRun {
    std::vector<std::vector<float>> talker_logits;                  // row r
    std::vector<std::vector<std::vector<float>>> predictor_logits;  // [frame][group-1]
    std::vector<std::vector<float>> step_inputs;                    // step k
    std::vector<FrameCodes> codes;
};

CpuRun cpu_generate(std::shared_ptr<const qtts::cpu::LmWeights> w, const qtts::Prompt& prompt,
                    const qtts::GenerationParams& params, uint64_t seed, int frames) {
    CpuRun run;
    run.predictor_logits.resize(size_t(frames) + 1);
    qtts::cpu::Generator gen(w);
    qtts::cpu::GeneratorHooks hooks;
    hooks.on_talker_row = [&](int, const float*, const float* logits) {
        run.talker_logits.emplace_back(logits, logits + w->codec_vocab());
    };
    hooks.on_predictor_logits = [&](int frame, int, const float* logits) {
        if (frame < frames + 1) run.predictor_logits[size_t(frame)].emplace_back(logits, logits + w->predictor_vocab());
    };
    hooks.on_step_input = [&](int, const float* input) {
        run.step_inputs.emplace_back(input, input + w->hidden_size());
    };
    gen.hooks_set(hooks);
    gen.start(prompt, params, seed);
    FrameCodes codes{};
    while (int(run.codes.size()) < frames && gen.next_frame(codes) == FrameStatus::FRAME_STATUS_FRAME)
        run.codes.push_back(codes);
    return run;
}

// Up to `frames` frames in the engine's chunk shape (1, then 4 at a time).
std::vector<FrameCodes> gpu_generate(qc::GpuGenerator& gen, const qtts::Prompt& prompt,
                                     const qtts::GenerationParams& params, uint64_t seed, int frames) {
    gen.start(prompt, params, seed);
    std::vector<FrameCodes> out;
    while (int(out.size()) < frames) {
        const int k = std::min(out.empty() ? 1 : 4, frames - int(out.size()));
        if (gen.chunk(k, &out, nullptr) != qtts::ChunkStatus::CHUNK_STATUS_FULL) break;
    }
    return out;
}

qtts::BackendOptions lm_options(int max_context, bool graphs = true) {
    qtts::BackendOptions o;
    o.max_context = max_context;
    o.prefill_chunk = 16;
    o.cuda_graphs = graphs;
    return o;
}

int matching_prefix(const std::vector<FrameCodes>& a, const std::vector<FrameCodes>& b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return int(n);
}

}  // namespace

TEST_CASE("the predictor's projected inputs are its projection's gemv, bit for bit", "[gpu][lm]") {
    int projected = 0;
    for (const std::string& dir : tiny_models()) {
        INFO("model " << dir);
        const auto checkpoint = qtts::checkpoint_load(dir);
        const auto w = qc::GpuLmWeights::upload(checkpoint, context().device());
        if (!w->predictor_proj_w) {  // the draw copies the embedding itself
            CHECK(w->predictor_input_rows.empty());
            continue;
        }
        ++projected;
        const int G = w->num_code_groups, V = w->predictor_vocab, H = w->talker.hidden, Hc = w->predictor.hidden;
        REQUIRE(int(w->predictor_input_rows.size()) == G - 2);
        const uint64_t seed = std::random_device{}();
        INFO("seed " << seed);
        std::mt19937_64 rng(seed);
        std::vector<int32_t> codes = {0, 1, V - 1};
        while (codes.size() < 12) codes.push_back(int32_t(rng() % uint64_t(V)));
        const int R = int(codes.size());
        qc::DeviceArray<int32_t> d_codes(codes.size());
        REQUIRE(cudaMemcpy(d_codes.get(), codes.data(), codes.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess);
        qc::DeviceArray<float> d_y(size_t(R) * Hc);
        const std::vector<float> proj_w = qtts::tensor_to_f32(*checkpoint->code_predictor.proj_w);
        const std::vector<float> proj_b = qtts::tensor_to_f32(*checkpoint->code_predictor.proj_b);
        double worst = 0.0;
        for (int t = 0; t + 2 < G; ++t) {
            INFO("pass " << t + 2);
            // What the pass's gathering gemv would write for these codes.
            REQUIRE(cudaMemset(d_y.get(), 0xff, d_y.bytes()) == cudaSuccess);  // NaN
            qtts::kernels::GemvArgs a;
            a.w = w->predictor_proj_w;
            a.bias = w->predictor_proj_b;
            a.out = Hc;
            a.in = H;
            a.rows = R;
            a.input = qtts::kernels::GemvInput::GEMV_INPUT_GATHER;
            a.table = w->predictor_codec_embedding[size_t(t)];
            a.index = d_codes.get();
            a.y = d_y.get();
            a.ldy = Hc;
            qtts::kernels::gemv(a, qtts::kernels::Launch{});
            std::vector<float> gemv_rows(size_t(R) * Hc), table_rows(size_t(R) * Hc);
            REQUIRE(cudaMemcpy(gemv_rows.data(), d_y.get(), gemv_rows.size() * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
            for (int r = 0; r < R; ++r)
                REQUIRE(cudaMemcpy(table_rows.data() + size_t(r) * Hc,
                                   w->predictor_input_rows[size_t(t)] + size_t(codes[size_t(r)]) * Hc, size_t(Hc) * 4,
                                   cudaMemcpyDeviceToHost) == cudaSuccess);
            REQUIRE(std::memcmp(gemv_rows.data(), table_rows.data(), table_rows.size() * 4) == 0);

            // The CPU's product over the same bf16 values, in double.
            const std::vector<float> table = qtts::tensor_to_f32(*checkpoint->code_predictor.codec_embedding[size_t(t)]);
            auto bf = [](float v) { return double(qtts::bf16_to_f32(qtts::f32_to_bf16(v))); };
            std::vector<float> ref(size_t(R) * Hc);
            for (int r = 0; r < R; ++r)
                for (int o = 0; o < Hc; ++o) {
                    double acc = proj_b[size_t(o)];
                    for (int i = 0; i < H; ++i)
                        acc += bf(proj_w[size_t(o) * H + i]) * bf(table[size_t(codes[size_t(r)]) * H + i]);
                    ref[size_t(r) * Hc + o] = float(acc);
                }
            const double e = qtts_test::rel_error(table_rows.data(), ref.data(), ref.size());
            CHECK(e < 1e-5);
            worst = std::max(worst, e);
        }
        WARN("projected predictor inputs vs the CPU: max rel err " << worst << " (" << dir << ")");
    }
    REQUIRE(projected >= 1);
}

TEST_CASE("GPU logits match the CPU reference row by row (teacher forcing)", "[gpu][lm]") {
    for (const std::string& dir : tiny_models()) {
        INFO("model " << dir);
        const auto checkpoint = qtts::checkpoint_load(dir);
        const auto cpu_weights = qtts::cpu::LmWeights::load(checkpoint);
        const auto gpu_weights = qc::GpuLmWeights::upload(checkpoint, context().device());
        const qtts::Prompt prompt = test_prompt(checkpoint->config, qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING);
        qtts::GenerationParams params = qtts::generation_params_greedy(checkpoint->generation);
        params.min_new_tokens = 1000;  // no EOS: a fixed number of frames
        params.max_frames = 10;
        const int frames = 10;
        const CpuRun ref = cpu_generate(cpu_weights, prompt, params, 1, frames);
        REQUIRE(int(ref.codes.size()) == frames);

        qc::GpuLm lm(gpu_weights, context(), qc::GpuLmOptions{256, 16});
        const std::vector<float> prefill = qtts::prompt_embed(prompt, *cpu_weights, cpu_weights->num_code_groups());
        const int H = cpu_weights->hidden_size();
        lm.talker_prefill(prefill.data(), int(prefill.size() / size_t(H)));
        std::vector<float> logits(size_t(cpu_weights->codec_vocab()));
        std::vector<float> plogits(size_t(cpu_weights->predictor_vocab()));
        double worst_talker = 0.0, worst_predictor = 0.0;
        for (int f = 0; f < frames; ++f) {
            lm.talker_logits_read(logits.data());
            const double e = qtts_test::rel_error(logits.data(), ref.talker_logits[size_t(f)].data(), logits.size());
            INFO("talker row " << f << " rel err " << e);
            CHECK(e < 1e-2);
            worst_talker = std::max(worst_talker, e);
            const FrameCodes& c = ref.codes[size_t(f)];
            for (int g = 1; g < cpu_weights->num_code_groups(); ++g) {
                if (g == 1)
                    lm.predictor_prefill(c[0]);
                else
                    lm.predictor_step(g, c[size_t(g - 1)]);
                lm.predictor_logits_read(plogits.data());
                const double pe = qtts_test::rel_error(plogits.data(), ref.predictor_logits[size_t(f)][size_t(g - 1)].data(),
                                                       plogits.size());
                INFO("predictor frame " << f << " group " << g << " rel err " << pe);
                CHECK(pe < 1e-2);
                worst_predictor = std::max(worst_predictor, pe);
            }
            if (f + 1 < frames) lm.talker_step(ref.step_inputs[size_t(f)].data());
        }
        WARN("max rel err vs CPU: talker " << worst_talker << ", predictor " << worst_predictor << " (" << dir << ")");
    }
}

TEST_CASE("GPU greedy generation gives the CPU's codes, graphs on and off", "[gpu][lm][graphs]") {
    for (const std::string& dir : tiny_models()) {
        INFO("model " << dir);
        const auto checkpoint = qtts::checkpoint_load(dir);
        const auto cpu_weights = qtts::cpu::LmWeights::load(checkpoint);
        const auto gpu_weights = qc::GpuLmWeights::upload(checkpoint, context().device());
        qtts::GenerationParams params = qtts::generation_params_greedy(checkpoint->generation);
        params.min_new_tokens = 1000;
        params.max_frames = 24;
        for (const auto layout : {qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING, qtts::TextLayout::TEXT_LAYOUT_STREAMING}) {
            const qtts::Prompt prompt = test_prompt(checkpoint->config, layout);
            const CpuRun ref = cpu_generate(cpu_weights, prompt, params, 1, 24);
            REQUIRE(ref.codes.size() == 24);
            for (const bool graphs : {true, false}) {
                qc::GpuGenerator gen(gpu_weights, context(), lm_options(256, graphs));
                CHECK(gen.graphs_enabled() == graphs);
                const auto codes = gpu_generate(gen, prompt, params, 1, 24);
                INFO("graphs " << graphs << " layout " << qtts::text_layout_name(layout));
                CHECK(matching_prefix(codes, ref.codes) == 24);
                CHECK(gen.frames_emitted() == 24);
                // The limit is seen with the chunk that reaches it; later calls make nothing.
                CHECK(gen.stop_reason() == qtts::StopReason::STOP_MAX_FRAMES);
                std::vector<FrameCodes> extra;
                CHECK(gen.chunk(4, &extra, nullptr) == qtts::ChunkStatus::CHUNK_STATUS_DONE);
                CHECK(extra.empty());

                // The same from host-side embeddings (the CPU front end's vectors).
                const int H = cpu_weights->hidden_size();
                const auto prefill = qtts::prompt_embed(prompt, *cpu_weights, cpu_weights->num_code_groups());
                const auto trailing = qtts::prompt_embed_trailing(prompt, *cpu_weights);
                gen.start(prefill.data(), int(prefill.size() / size_t(H)), trailing.data(),
                          int(trailing.size() / size_t(H)), params, 1, prompt.text_tokens, prompt.text_complete);
                std::vector<FrameCodes> host_codes;
                while (host_codes.size() < 24 &&
                       gen.chunk(4, &host_codes, nullptr) == qtts::ChunkStatus::CHUNK_STATUS_FULL) {
                }
                CHECK(matching_prefix(host_codes, ref.codes) == 24);
            }
        }
    }
}

TEST_CASE("GPU seeded sampling follows the CPU's random stream", "[gpu][lm][sampling]") {
    for (const std::string& dir : tiny_models()) {
        INFO("model " << dir);
        const auto checkpoint = qtts::checkpoint_load(dir);
        const auto cpu_weights = qtts::cpu::LmWeights::load(checkpoint);
        const auto gpu_weights = qc::GpuLmWeights::upload(checkpoint, context().device());
        qtts::GenerationParams params = qtts::generation_params_from_config(checkpoint->generation);
        params.talker.greedy = false;
        params.predictor.greedy = false;
        params.min_new_tokens = 1000;
        params.max_frames = 16;
        const qtts::Prompt prompt = test_prompt(checkpoint->config, qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING);
        const CpuRun ref = cpu_generate(cpu_weights, prompt, params, 20261129, 16);
        qc::GpuGenerator gen(gpu_weights, context(), lm_options(256));
        const auto codes = gpu_generate(gen, prompt, params, 20261129, 16);
        const int same = matching_prefix(codes, ref.codes);
        WARN("sampled frames identical to the CPU: " << same << " of 16 (" << dir << ")");
        CHECK(same >= 8);
    }
}

TEST_CASE("GPU generation stops like the CPU: EOS, budget and streaming text", "[gpu][lm]") {
    const std::string dir = tiny_models().front();
    const auto checkpoint = qtts::checkpoint_load(dir);
    const auto cpu_weights = qtts::cpu::LmWeights::load(checkpoint);
    const auto gpu_weights = qc::GpuLmWeights::upload(checkpoint, context().device());
    qc::GpuGenerator gen(gpu_weights, context(), lm_options(512));

    SECTION("the reference rules (EOS allowed after 2 frames) stop at the same frame") {
        qtts::GenerationParams params = qtts::generation_params_greedy(checkpoint->generation);
        params.max_frames = 200;
        const qtts::Prompt prompt = test_prompt(checkpoint->config, qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING);
        qtts::cpu::Generator cpu(cpu_weights);
        cpu.start(prompt, params, 3);
        std::vector<FrameCodes> ref;
        FrameCodes c{};
        while (cpu.next_frame(c) == FrameStatus::FRAME_STATUS_FRAME) ref.push_back(c);
        const auto got = gpu_generate(gen, prompt, params, 3, 1000);
        CHECK(got == ref);
        CHECK(gen.stop_reason() == cpu.stop_reason());
    }
    SECTION("streaming text: waits for text, then continues with the CPU's codes") {
        qtts::GenerationParams params = qtts::generation_params_greedy(checkpoint->generation);
        params.min_new_tokens = 1000;
        params.max_frames = 12;
        qtts::PromptRequest r;
        r.input_ids = {151644, 77091, 198, 9707, 1879, 151645, 198, 151644, 77091, 198};
        r.language = "english";
        r.speaker = checkpoint->config.talker.speaker_ids.begin()->first;
        r.layout = qtts::TextLayout::TEXT_LAYOUT_STREAMING;
        r.text_complete = false;
        const qtts::Prompt prompt = qtts::prompt_build(checkpoint->config, r);
        const std::vector<int32_t> more{11, 419, 374, 264};

        qtts::cpu::Generator cpu(cpu_weights);
        cpu.start(prompt, params, 5);
        std::vector<FrameCodes> ref;
        FrameCodes c{};
        int cpu_waits = 0;  // first wait: more text; second wait: end of text (same text on both sides)
        for (int i = 0; i < 40 && ref.size() < 12; ++i) {
            const FrameStatus s = cpu.next_frame(c);
            if (s == FrameStatus::FRAME_STATUS_FRAME) {
                ref.push_back(c);
            } else if (s == FrameStatus::FRAME_STATUS_WAITING_FOR_TEXT) {
                if (cpu_waits++ == 0) cpu.text_append(more.data(), more.size());
                else cpu.text_close();
            } else {
                break;
            }
        }
        gen.start(prompt, params, 5);
        std::vector<FrameCodes> got;
        int waits = 0;
        for (int i = 0; i < 40 && got.size() < 12; ++i) {
            const qtts::ChunkStatus s = gen.chunk(1, &got, nullptr);
            if (s == qtts::ChunkStatus::CHUNK_STATUS_FULL) {
                continue;
            } else if (s == qtts::ChunkStatus::CHUNK_STATUS_WAITING_FOR_TEXT) {
                if (waits++ == 0) gen.text_append(more.data(), more.size());
                else gen.text_close();
            } else {
                break;
            }
        }
        CHECK(waits == 2);
        CHECK(cpu_waits == 2);
        CHECK(got.size() == ref.size());
        CHECK(matching_prefix(got, ref) == int(ref.size()));
    }
}

#endif  // QTTS_HAVE_CUDA
