// The fast CPU backend (engine/cpu_fast) against the fp32 reference (engine/cpu) on random tiny
// models: talker and code-predictor logits and greedy codes, per weight format; a model whose
// widths are no multiple of any vector width; the backend through the runtime (selection by
// name, chunks with audio) and its configuration errors; batched steps (several generators'
// frames made together) against each generator alone, bit for bit; sliced starts (a prompt
// prefilled a few rows at a time) against the whole prefill, bit for bit.
//
// Bounds. bf16: the checkpoints are bf16, so packing in bf16 is exact and the two backends differ
// only in the order of fp32 sums: logits within 1e-4 relative (the goldens' tolerance) and the
// greedy codes identical for all N = 24 frames (every frame of the run; a near-tie flipping
// would show as a failure here, with the frame named). int8 (per-row scales): the quantisation
// moves the logits by about 1% relative on these models; the bound asserted is 5%, and code
// agreement is reported, not asserted (a changed pick changes everything after it).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <memory>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/cpu/generator.h"
#include "engine/cpu_fast/fast_generator.h"
#include "engine/model/make_model.h"
#include "engine/runtime/speech_model.h"
#include "engine/text/prompt.h"
#include "test_support.h"

using namespace qtts;

namespace {

constexpr int FRAMES = 24;

struct Run {
    std::vector<FrameCodes> codes;
    std::vector<std::vector<float>> talker_logits;                 // per talker row
    std::map<std::pair<int, int>, std::vector<float>> cp_logits;  // (frame, group)
};

template <typename Gen, typename Hooks>
Run run_greedy(Gen& gen, const Prompt& prompt, const GenerationParams& params, int vocab, int cp_vocab) {
    Run run;
    Hooks hooks;
    hooks.on_talker_row = [&](int, const float*, const float* logits) {
        run.talker_logits.emplace_back(logits, logits + vocab);
    };
    hooks.on_predictor_logits = [&](int frame, int group, const float* logits) {
        run.cp_logits[{frame, group}] = std::vector<float>(logits, logits + cp_vocab);
    };
    gen.hooks_set(hooks);
    gen.start(prompt, params, 99);
    FrameCodes f{};
    while (gen.next_frame(f) == FrameStatus::FRAME_STATUS_FRAME) run.codes.push_back(f);
    return run;
}

struct Comparison {
    int agree = 0;              // frames identical from the start
    double talker_err = 0.0;    // worst logits relative error over the rows before the first difference
    double predictor_err = 0.0; // same for the code predictor
};

Comparison compare(const Run& fast, const Run& ref, int groups) {
    Comparison c;
    const size_t n = std::min(fast.codes.size(), ref.codes.size());
    while (size_t(c.agree) < n && fast.codes[size_t(c.agree)] == ref.codes[size_t(c.agree)]) ++c.agree;
    // Talker row r sees frames 0..r-1; row 0 (the prefill) always has the same input.
    for (int r = 0; r <= c.agree && size_t(r) < std::min(fast.talker_logits.size(), ref.talker_logits.size()); ++r) {
        const auto& a = fast.talker_logits[size_t(r)];
        const auto& b = ref.talker_logits[size_t(r)];
        c.talker_err = std::max(c.talker_err, qtts_test::rel_error(a.data(), b.data(), a.size()));
    }
    // Predictor logits of frame f, group g see codes up to g-1 of frame f.
    for (const auto& [key, b] : ref.cp_logits) {
        const auto [frame, group] = key;
        if (frame > c.agree || frame >= int(n)) continue;
        if (frame == c.agree) {  // the differing frame: only the groups before the first changed code
            bool same = true;
            for (int g = 0; g < group && same; ++g)
                same = fast.codes[size_t(frame)][size_t(g)] == ref.codes[size_t(frame)][size_t(g)];
            if (!same) continue;
        }
        const auto it = fast.cp_logits.find(key);
        REQUIRE(it != fast.cp_logits.end());
        c.predictor_err = std::max(c.predictor_err, qtts_test::rel_error(it->second.data(), b.data(), b.size()));
    }
    (void)groups;
    return c;
}

std::string model_dir(const std::string& name, ModelPreset preset) {
    const std::string dir = qtts_test::temp_dir() + "/" + name;
    model_write_random(preset, dir, 31);
    return dir;
}

// Both backends, greedy, FRAMES frames, every format; checks the bounds above.
void backends_compare(const std::string& dir, const char* label) {
    const auto ckpt = checkpoint_load(dir);
    const auto ref_weights = cpu::LmWeights::load(ckpt);
    const Tokenizer tok = Tokenizer::load(dir);
    PromptRequest request;
    request.input_ids = assistant_template_ids(tok, "The fast backend reads packed weights.", AddedTokens::ADDED_TOKENS_AS_TEXT);
    request.speaker = "vivian";
    request.language = "english";
    const Prompt prompt = prompt_build(ckpt->config, request);
    GenerationParams params = generation_params_greedy(ckpt->generation);
    params.max_frames = FRAMES;
    params.min_new_tokens = FRAMES + 1;  // EOS masked: every run makes FRAMES frames

    cpu::Generator ref_gen(ref_weights);
    const Run ref = run_greedy<cpu::Generator, cpu::GeneratorHooks>(ref_gen, prompt, params, ref_weights->codec_vocab(),
                                                                     ref_weights->predictor_vocab());
    REQUIRE(int(ref.codes.size()) == FRAMES);
    for (const auto format : {cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16, cpu_fast::WeightFormat::WEIGHT_FORMAT_INT8}) {
        for (const int threads : {1, 2}) {
            INFO(label << " " << cpu_fast::weight_format_name(format) << " threads " << threads);
            // parallel_min 0: the tiny matrices are split across the threads too (the product default
            // keeps them on one thread).
            cpu_fast::FastLm lm{cpu_fast::FastLmWeights::load(ckpt, format), std::make_shared<cpu_fast::ThreadPool>(threads),
                                /*parallel_min=*/0};
            cpu_fast::FastGenerator gen(lm);
            const Run fast = run_greedy<cpu_fast::FastGenerator, cpu_fast::FastGeneratorHooks>(
                gen, prompt, params, lm.weights->codec_vocab(), lm.weights->predictor_vocab());
            REQUIRE(int(fast.codes.size()) == FRAMES);
            const Comparison c = compare(fast, ref, ref_weights->num_code_groups());
            std::printf("  %-22s %-5s threads %d: greedy frames agreeing %2d/%d, talker logits rel err %.2e, "
                        "predictor %.2e\n",
                        label, cpu_fast::weight_format_name(format), threads, c.agree, FRAMES, c.talker_err,
                        c.predictor_err);
            if (format == cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16) {
                CHECK(c.agree == FRAMES);
                CHECK(c.talker_err <= 1e-4);
                CHECK(c.predictor_err <= 1e-4);
            } else {
                CHECK(c.talker_err <= 5e-2);
                CHECK(c.predictor_err <= 5e-2);
                CHECK(c.talker_err > 0.0);  // int8 really is a different number format
            }
        }
    }
}

}  // namespace

TEST_CASE("fast CPU backend vs the fp32 reference on a random tiny model", "[cpu_fast][lm]") {
    backends_compare(model_dir("tiny", model_preset("tiny-customvoice")), "tiny-customvoice");
}

TEST_CASE("fast CPU backend on widths that fit no vector (tails everywhere)", "[cpu_fast][lm]") {
    ModelPreset p = model_preset("tiny-customvoice");
    TalkerConfig& t = p.config.talker;
    t.hidden_size = 60;  // not a multiple of 8 or 16
    t.intermediate_size = 100;
    t.head_dim = 12;
    t.mrope_section = {2, 2, 2};
    t.code_predictor.hidden_size = 60;
    t.code_predictor.intermediate_size = 84;
    t.code_predictor.head_dim = 12;
    backends_compare(model_dir("odd", p), "odd widths (H=60)");
}

namespace {

// One generator of the batched-step test: its prompt, parameters and seed, and when it starts.
struct BatchSpec {
    std::string text;
    bool greedy = true;
    int max_frames = 0;
    int min_new_tokens = 0;
    uint64_t seed = 0;
    int start_step = 0;  // the batched step before which it starts (later ones join a running batch)
};

// Everything a generator shows: its frames, each talker row's and predictor pass's logits (the
// hooks), and why it stopped.
struct Heard {
    Run run;
    StopReason stop = StopReason::STOP_NONE;
};

void hooks_record(cpu_fast::FastGenerator& gen, Run& run, int vocab, int cp_vocab) {
    cpu_fast::FastGeneratorHooks hooks;
    hooks.on_talker_row = [&run, vocab](int, const float*, const float* logits) {
        run.talker_logits.emplace_back(logits, logits + vocab);
    };
    hooks.on_predictor_logits = [&run, cp_vocab](int frame, int group, const float* logits) {
        run.cp_logits[{frame, group}] = std::vector<float>(logits, logits + cp_vocab);
    };
    gen.hooks_set(hooks);
}

// Each spec's generator alone (next_frame), then all of them through batched steps of 1 frame and
// then 4 (the engine's chunks), starting at their steps; each must emit bitwise what it emitted
// alone: codes, every logit the hooks saw, and the stop reason.
void batch_compare(const std::string& dir, cpu_fast::WeightFormat format, const std::vector<BatchSpec>& specs) {
    const auto ckpt = checkpoint_load(dir);
    const Tokenizer tok = Tokenizer::load(dir);
    cpu_fast::FastLm lm{cpu_fast::FastLmWeights::load(ckpt, format), std::make_shared<cpu_fast::ThreadPool>(2),
                        /*parallel_min=*/0};
    const int vocab = lm.weights->codec_vocab(), cp_vocab = lm.weights->predictor_vocab();
    std::vector<Prompt> prompts;
    std::vector<GenerationParams> params;
    for (const BatchSpec& spec : specs) {
        PromptRequest request;
        request.input_ids = assistant_template_ids(tok, spec.text, AddedTokens::ADDED_TOKENS_AS_TEXT);
        request.speaker = "vivian";
        request.language = "english";
        prompts.push_back(prompt_build(ckpt->config, request));
        GenerationParams p = spec.greedy ? generation_params_greedy(ckpt->generation) : GenerationParams{};
        p.max_frames = spec.max_frames;
        p.min_new_tokens = spec.min_new_tokens;
        params.push_back(p);
    }
    std::vector<Heard> alone(specs.size()), batched(specs.size());
    for (size_t i = 0; i < specs.size(); ++i) {
        cpu_fast::FastGenerator gen(lm);
        hooks_record(gen, alone[i].run, vocab, cp_vocab);
        gen.start(prompts[i], params[i], specs[i].seed);
        FrameCodes f{};
        while (gen.next_frame(f) == FrameStatus::FRAME_STATUS_FRAME) alone[i].run.codes.push_back(f);
        alone[i].stop = gen.stop_reason();
    }
    std::vector<std::unique_ptr<cpu_fast::FastGenerator>> gens;
    for (size_t i = 0; i < specs.size(); ++i) {
        gens.push_back(std::make_unique<cpu_fast::FastGenerator>(lm));
        hooks_record(*gens[i], batched[i].run, vocab, cp_vocab);
    }
    cpu_fast::FastBatchStep step;
    std::vector<std::vector<FrameCodes>> made;
    std::vector<bool> started(specs.size(), false);
    std::map<size_t, int> batch_sizes;  // how many generators each step took
    for (int s = 0; s < 200; ++s) {
        std::vector<cpu_fast::FastGenerator*> members;
        std::vector<size_t> index;
        int frames = 4;
        for (size_t i = 0; i < specs.size(); ++i) {
            if (!started[i] && specs[i].start_step == s) {
                gens[i]->start(prompts[i], params[i], specs[i].seed);
                started[i] = true;
                frames = 1;  // a newcomer's first chunk is one frame: its step is one frame for all
            }
        }
        for (size_t i = 0; i < specs.size(); ++i)
            if (started[i] && gens[i]->batch_ready(frames)) {
                members.push_back(gens[i].get());
                index.push_back(i);
            }
        const bool more = std::any_of(specs.begin(), specs.end(), [s](const BatchSpec& b) { return b.start_step > s; });
        if (members.empty() && !more) break;
        if (members.empty()) continue;
        ++batch_sizes[members.size()];
        step.run(members, frames, made);
        REQUIRE(made.size() == members.size());
        for (size_t j = 0; j < members.size(); ++j) {
            const size_t i = index[j];
            CHECK(int(made[j].size()) <= frames);
            // Fewer frames than the step: the generator stopped inside it.
            if (int(made[j].size()) < frames) CHECK(members[j]->stop_reason() != StopReason::STOP_NONE);
            batched[i].run.codes.insert(batched[i].run.codes.end(), made[j].begin(), made[j].end());
        }
    }
    // A generator that made its last frame at a step's end has not seen its stop yet (its next
    // call runs the talker step and finds it): that call, alone, as the engine's next chunk().
    for (size_t i = 0; i < specs.size(); ++i) {
        FrameCodes f{};
        CHECK(gens[i]->next_frame(f) == FrameStatus::FRAME_STATUS_DONE);
        batched[i].stop = gens[i]->stop_reason();
    }
    for (const auto& [size, count] : batch_sizes) std::printf("  batched steps of %zu generators: %d\n", size, count);
    CHECK(batch_sizes.rbegin()->first == specs.size());  // at some step every generator was in it
    for (size_t i = 0; i < specs.size(); ++i) {
        INFO("generator " << i << " (" << specs[i].text << "): " << alone[i].run.codes.size() << " frames alone");
        CHECK(alone[i].stop != StopReason::STOP_NONE);
        CHECK(batched[i].stop == alone[i].stop);
        CHECK(batched[i].run.codes == alone[i].run.codes);
        CHECK(batched[i].run.talker_logits == alone[i].run.talker_logits);
        CHECK(batched[i].run.cp_logits == alone[i].run.cp_logits);
    }
}

const std::vector<BatchSpec> kBatchSpecs = {
    {"The first generator speaks greedily.", true, 11, 12, 1, 0},          // its limit falls inside a chunk
    {"The second one samples, with a seed of its own.", false, 18, 19, 7, 0},
    {"Third: sampled, and free to stop at an end of speech.", false, 40, 0, 8, 0},
    {"A latecomer joins the running batch.", true, 9, 10, 2, 3},           // its first frame beside steady ones
};

}  // namespace

TEST_CASE("batched fast steps: every generator emits bitwise what it emits alone", "[cpu_fast][lm][batch]") {
    const std::string tiny = model_dir("tiny-batch", model_preset("tiny-customvoice"));
    for (const auto format : {cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16, cpu_fast::WeightFormat::WEIGHT_FORMAT_INT8}) {
        INFO(cpu_fast::weight_format_name(format));
        batch_compare(tiny, format, kBatchSpecs);
    }
    ModelPreset p = model_preset("tiny-customvoice");
    p.config.talker.hidden_size = 60;  // widths that fit no vector (as the test above)
    p.config.talker.intermediate_size = 100;
    p.config.talker.head_dim = 12;
    p.config.talker.mrope_section = {2, 2, 2};
    p.config.talker.code_predictor.hidden_size = 60;
    p.config.talker.code_predictor.intermediate_size = 84;
    p.config.talker.code_predictor.head_dim = 12;
    batch_compare(model_dir("odd-batch", p), cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16, kBatchSpecs);
}

TEST_CASE("batch_ready: true exactly when the next frames need no text that has not arrived", "[cpu_fast][lm][batch]") {
    const std::string dir = model_dir("tiny-ready", model_preset("tiny-customvoice"));
    const auto ckpt = checkpoint_load(dir);
    const Tokenizer tok = Tokenizer::load(dir);
    cpu_fast::FastLm lm{cpu_fast::FastLmWeights::load(ckpt, cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16),
                        std::make_shared<cpu_fast::ThreadPool>(1)};
    // The streaming layout with the text open: the talker steps read one text-track row each.
    PromptRequest request;
    request.input_ids = assistant_template_ids(tok, "Hi there.", AddedTokens::ADDED_TOKENS_AS_TEXT);
    request.speaker = "vivian";
    request.language = "english";
    request.layout = TextLayout::TEXT_LAYOUT_STREAMING;
    request.text_complete = false;
    const Prompt prompt = prompt_build(ckpt->config, request);
    GenerationParams params = generation_params_greedy(ckpt->generation);
    params.max_frames = 30;
    params.min_new_tokens = 31;
    cpu_fast::FastGenerator gen(lm);
    CHECK_FALSE(gen.batch_ready(1));  // not started
    gen.start(prompt, params, 3);
    // How many frames come before the generator waits for text, found by a copy that runs ahead.
    cpu_fast::FastGenerator probe(lm);
    probe.start(prompt, params, 3);
    int before_wait = 0;
    FrameCodes f{};
    while (probe.next_frame(f) == FrameStatus::FRAME_STATUS_FRAME) ++before_wait;
    REQUIRE(before_wait >= 1);
    REQUIRE(before_wait < params.max_frames);  // it did wait for text
    INFO(before_wait << " frames before the text runs dry");
    for (int k = 1; k <= before_wait + 2; ++k) CHECK(gen.batch_ready(k) == (k <= before_wait));
    // Closed text: every frame up to the limit can be made.
    gen.text_close();
    CHECK(gen.batch_ready(params.max_frames));
}

TEST_CASE("sliced starts: a prefill run a few rows at a time is bitwise the whole one", "[cpu_fast][lm][slice]") {
    const std::string dir = model_dir("tiny-slice", model_preset("tiny-customvoice"));
    const auto ckpt = checkpoint_load(dir);
    const Tokenizer tok = Tokenizer::load(dir);
    PromptRequest request;
    request.input_ids = assistant_template_ids(tok, "A longer prompt, so that its prefill is cut into several slices.",
                                               AddedTokens::ADDED_TOKENS_AS_TEXT);
    request.speaker = "vivian";
    request.language = "english";
    const Prompt prompt = prompt_build(ckpt->config, request);
    const int L = int(prompt.positions.size());
    REQUIRE(L >= 8);
    GenerationParams params;  // sampled: the draws would show any difference in the logits
    params.max_frames = 12;
    params.min_new_tokens = 12;
    for (const auto format : {cpu_fast::WeightFormat::WEIGHT_FORMAT_BF16, cpu_fast::WeightFormat::WEIGHT_FORMAT_INT8}) {
        INFO(cpu_fast::weight_format_name(format) << ", prompt of " << L << " rows");
        cpu_fast::FastLm lm{cpu_fast::FastLmWeights::load(ckpt, format), std::make_shared<cpu_fast::ThreadPool>(2),
                            /*parallel_min=*/0};
        const int vocab = lm.weights->codec_vocab(), cp_vocab = lm.weights->predictor_vocab();
        Run whole;
        {
            cpu_fast::FastGenerator gen(lm);
            hooks_record(gen, whole, vocab, cp_vocab);
            gen.start(prompt, params, 41);
            FrameCodes f{};
            while (gen.next_frame(f) == FrameStatus::FRAME_STATUS_FRAME) whole.codes.push_back(f);
        }
        REQUIRE(whole.codes.size() == 12);
        for (const int slice : {1, 2, 3, 5, L - 1, L, L + 7}) {
            INFO("slices of " << slice << " rows");
            cpu_fast::FastGenerator gen(lm);
            Run sliced;
            hooks_record(gen, sliced, vocab, cp_vocab);
            CHECK(gen.lm().prefill_slices());
            CHECK(gen.start_open(prompt, params, 41) == L);
            CHECK(gen.start_rows_left() == L);
            CHECK_FALSE(gen.batch_ready(1));  // not started until the last slice
            int calls = 0, left = L;
            while (left > 0) {
                const int next = gen.start_advance(slice);
                CHECK(next == std::max(0, left - slice));
                left = next;
                ++calls;
                if (left > 0) CHECK(sliced.talker_logits.empty());  // the start's logits come with its last slice
            }
            CHECK(calls == (L + slice - 1) / slice);
            CHECK(gen.start_rows_left() == 0);
            CHECK(gen.context_length() == L);
            FrameCodes f{};
            while (gen.next_frame(f) == FrameStatus::FRAME_STATUS_FRAME) sliced.codes.push_back(f);
            CHECK(sliced.codes == whole.codes);
            CHECK(sliced.talker_logits == whole.talker_logits);
            CHECK(sliced.cp_logits == whole.cp_logits);
        }
    }
}

TEST_CASE("cpu-fast through the runtime: chosen by name, chunks with audio, same codes as cpu in bf16",
          "[cpu_fast][runtime]") {
    const std::string dir = default_model_dir();
    BackendOptions fast;
    fast.name = "cpu-fast";
    fast.cpu_format = "bf16";
    fast.threads = 2;
    BackendOptions ref;
    ref.name = "cpu";
    const auto fast_model = SpeechModel::load(dir, fast);
    const auto ref_model = SpeechModel::load(dir, ref);
    CHECK(fast_model->backend() == LmBackend::LM_BACKEND_CPU_FAST);
    CHECK(fast_model->backend_name() == "cpu-fast");
    CHECK(ref_model->backend_name() == "cpu");

    PromptRequest pr;
    pr.input_ids = fast_model->assistant_ids("Hello from the fast backend.");
    pr.speaker = fast_model->default_speaker();
    pr.language = "auto";
    const Prompt prompt = prompt_build(fast_model->checkpoint().config, pr);
    GenerationParams params = generation_params_greedy(fast_model->checkpoint().generation);
    params.max_frames = 6;
    params.min_new_tokens = 7;
    std::vector<FrameCodes> codes[2];
    std::vector<float> pcm[2];
    const std::shared_ptr<const SpeechModel> models[2] = {fast_model, ref_model};
    for (int m = 0; m < 2; ++m) {
        auto gen = models[m]->generator_new();
        gen->start(prompt, params, 5);
        CHECK(gen->chunk(4, &codes[m], &pcm[m]) == ChunkStatus::CHUNK_STATUS_FULL);
        CHECK(codes[m].size() == 4);
        CHECK(pcm[m].size() == 4 * size_t(SAMPLES_PER_FRAME));
        gen->chunk(4, &codes[m], &pcm[m]);
        CHECK(codes[m].size() == 6);
        CHECK(gen->stop_reason() == StopReason::STOP_MAX_FRAMES);
    }
    CHECK(codes[0] == codes[1]);
    REQUIRE(pcm[0].size() == pcm[1].size());
    // Same codes; the fast decoder (fp32 weights by default) differs from the reference decoder
    // only in the order of its fp32 sums and in its sine: far above the 50 dB floor.
    const double err = qtts_test::rel_error(pcm[0].data(), pcm[1].data(), pcm[0].size());
    const double snr = err > 0 ? -20.0 * std::log10(err) : 999.0;
    std::printf("cpu-fast through the runtime: audio SNR vs the cpu backend %.1f dB\n", snr);
    CHECK(snr >= 100.0);
}

TEST_CASE("cpu-fast configuration errors are clear", "[cpu_fast][runtime]") {
    const std::string dir = default_model_dir();
    const auto expect_error = [&](const BackendOptions& o, const std::string& needle) {
        try {
            SpeechModel::load(dir, o);
            FAIL("load must refuse: " << needle);
        } catch (const Error& e) {
            INFO(e.what());
            CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
            CHECK(std::string(e.what()).find(needle) != std::string::npos);
        }
    };
    BackendOptions o;
    o.name = "cpu-turbo";
    expect_error(o, "use auto, cpu, cpu-fast or cuda");
    o.name = "cpu-fast";
    o.cpu_format = "int4";
    expect_error(o, "use bf16 or int8");
    o.cpu_format = "int8";
    o.threads = -1;
    expect_error(o, "threads must be");
}
