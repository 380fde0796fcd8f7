// The runtime's backend choice without a GPU (CI): `cuda` is refused with a clear error before
// anything is loaded, `auto` falls back to the fast CPU backend (cpu-fast), unknown names are rejected, the CPU path
// through the ChunkGenerator interface gives exactly cpu::Generator's codes, and a chunk is
// exactly the frames asked for (with their audio) except at a stop. On a GPU machine the
// selection checks flip to the CUDA side (the GPU side is covered by tests/gpu/test_gpu_runtime).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/cpu/cpu_chunk_generator.h"
#include "engine/cpu/generator.h"
#include "engine/model/make_model.h"
#include "engine/api/qtts.h"
#include "engine/runtime/speech_model.h"
#include "engine/runtime/utterance.h"
#include "test_support.h"

using namespace qtts;

namespace {

bool have_gpu() { return cuda_compiled() && cuda_device_count() > 0; }

SpeechRequest request(const std::string& text, bool greedy) {
    SpeechRequest r;
    r.text = text;
    r.greedy = greedy;
    r.seed = 77;
    r.max_frames = 9;
    return r;
}

}  // namespace

TEST_CASE("backend cuda without a GPU fails with a clear error; auto falls back to the CPU", "[runtime][backend]") {
    const std::string dir = default_model_dir();
    BackendOptions cuda;
    cuda.name = "cuda";
    BackendOptions automatic;  // backend "auto"
    if (!have_gpu()) {
        try {
            SpeechModel::load(dir, cuda);
            FAIL("backend cuda without a GPU must throw");
        } catch (const Error& e) {
            CHECK(e.code() == ErrorCode::ERROR_UNSUPPORTED);
            const std::string message = e.what();
            INFO(message);
            CHECK(message.find("CUDA backend was requested") != std::string::npos);
            CHECK(message.find("device 0") != std::string::npos);
        }
        // The engine surfaces the same error from its constructor (what `qtts say` reports).
        EngineOptions engine_cuda;
        engine_cuda.backend.name = "cuda";
        CHECK_THROWS_AS(Engine(engine_cuda), Error);

        auto model = SpeechModel::load(dir, automatic);
        CHECK(model->backend() == LmBackend::LM_BACKEND_CPU_FAST);
        CHECK(model->backend_name() == "cpu-fast");
        CHECK(model->gpu_states_created() == 0);
        Engine engine(EngineOptions{});
        CHECK(engine.backend_name() == "cpu-fast");
    } else {
        auto model = SpeechModel::load(dir, automatic);
        CHECK(model->backend() == LmBackend::LM_BACKEND_CUDA);
        CHECK(model->backend_name() == "cuda:0");
        CHECK(model->gpu_states_created() == 1);
    }
    BackendOptions cpu;
    cpu.name = "cpu";
    CHECK(SpeechModel::load(dir, cpu)->backend_name() == "cpu");

    BackendOptions bad;
    bad.name = "tpu";
    try {
        SpeechModel::load(dir, bad);
        FAIL("an unknown backend must throw");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find("auto, cpu, cpu-fast or cuda") != std::string::npos);
    }
    // A device that cannot exist: auto still works (cpu-fast), cuda is refused.
    BackendOptions far = automatic;
    far.device = 4096;
    CHECK(SpeechModel::load(dir, far)->backend_name() == "cpu-fast");
    far.name = "cuda";
    CHECK_THROWS_AS(SpeechModel::load(dir, far), Error);
}

TEST_CASE("the CPU backend's utterance gives exactly cpu::Generator's codes", "[runtime][backend]") {
    BackendOptions cpu;
    cpu.name = "cpu";
    auto model = SpeechModel::load(default_model_dir(), cpu);
    for (const bool greedy : {true, false}) {
        INFO("greedy " << greedy);
        const PreparedSpeech prep = model->prepare(request("Backends must agree.", greedy));
        REQUIRE(prep.segments.size() == 1);
        Utterance utt(model, prep);
        std::vector<float> pcm;
        std::vector<FrameCodes> codes;
        while (utt.chunk(4, &pcm, &codes) != UtteranceStatus::UTTERANCE_DONE) {
        }
        REQUIRE(!codes.empty());
        CHECK(pcm.size() == codes.size() * 1920);

        // The same prompt, parameters and seed straight through the CPU generator.
        PromptRequest pr = prep.base;
        pr.input_ids = prep.segments.front();
        const Prompt prompt = prompt_build(model->checkpoint().config, pr);
        GenerationParams params = prep.params;
        params.max_frames = prep.max_frames;
        cpu::Generator gen(model->lm_shared());
        gen.start(prompt, params, prep.seed);
        std::vector<FrameCodes> direct;
        FrameCodes c{};
        while (gen.next_frame(c) == FrameStatus::FRAME_STATUS_FRAME) direct.push_back(c);
        CHECK(direct == codes);
    }
}

TEST_CASE("a chunk is exactly the frames asked for, with their audio, except at a stop", "[runtime][backend]") {
    BackendOptions cpu;
    cpu.name = "cpu";
    auto model = SpeechModel::load(default_model_dir(), cpu);
    const PreparedSpeech prep = model->prepare(request("Chunks are exact.", true));
    PromptRequest pr = prep.base;
    pr.input_ids = prep.segments.front();
    const Prompt prompt = prompt_build(model->checkpoint().config, pr);
    GenerationParams params = prep.params;
    params.max_frames = 11;  // a frame-limit stop inside the fourth chunk

    std::unique_ptr<ChunkGenerator> gen = model->generator_new();
    gen->start(prompt, params, prep.seed);
    std::vector<FrameCodes> codes;
    std::vector<float> pcm;
    std::vector<int> sizes;
    for (const int k : {1, 4, 3, 4, 4}) {
        const size_t codes_before = codes.size(), pcm_before = pcm.size();
        const ChunkStatus status = gen->chunk(k, &codes, &pcm);
        const int made = int(codes.size() - codes_before);
        INFO("chunk of " << k << ": " << made << " frames, " << chunk_status_name(status));
        CHECK(pcm.size() - pcm_before == size_t(made) * SAMPLES_PER_FRAME);
        if (status == ChunkStatus::CHUNK_STATUS_FULL) CHECK(made == k);
        else CHECK(made < k);
        sizes.push_back(made);
        CHECK(gen->frames_emitted() == int(codes.size()));
    }
    // 1 + 4 + 3 frames, then 3 up to the limit (DONE), then nothing (still DONE).
    CHECK(sizes == std::vector<int>{1, 4, 3, 3, 0});
    CHECK(gen->stop_reason() == StopReason::STOP_MAX_FRAMES);

    // The same codes as cpu::Generator frame by frame, and the same audio (to float rounding of
    // differently sized products) as one decoder call over every frame.
    cpu::Generator direct(model->lm_shared());
    direct.start(prompt, params, prep.seed);
    std::vector<FrameCodes> expected;
    FrameCodes c{};
    while (direct.next_frame(c) == FrameStatus::FRAME_STATUS_FRAME) expected.push_back(c);
    CHECK(expected == codes);
    CpuDecoderStream decoder(model->decoder());
    std::vector<float> whole;
    decoder.frames_decode(codes.data(), int(codes.size()), &whole);
    REQUIRE(whole.size() == pcm.size());
    double max_diff = 0.0;
    for (size_t i = 0; i < pcm.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(pcm[i] - whole[i])));
    CHECK(max_diff < 1e-5);
}

TEST_CASE("a sentence that ends inside a chunk ends the chunk; the next sentence starts a new one",
          "[runtime][backend]") {
    BackendOptions cpu;
    cpu.name = "cpu";
    auto model = SpeechModel::load(default_model_dir(), cpu);
    // Two segments: each sentence over half the 600-byte split limit (text/text_split.h).
    std::string first = "The first long sentence goes on", second = "The second long sentence also goes on";
    while (first.size() < 380) first += " and on";
    while (second.size() < 380) second += " and on";
    PreparedSpeech prep = model->prepare(request(first + ". " + second + ".", true));
    REQUIRE(prep.segments.size() == 2);
    prep.max_frames = 0;
    prep.params.max_frames = 6;  // each sentence stops after 6 frames
    Utterance utt(model, prep);
    std::vector<float> pcm;
    std::vector<FrameCodes> codes;
    std::vector<int> sizes;
    for (;;) {
        const size_t before = codes.size();
        const UtteranceStatus status = utt.chunk(4, &pcm, &codes);
        if (status == UtteranceStatus::UTTERANCE_DONE) break;
        REQUIRE(status == UtteranceStatus::UTTERANCE_CHUNK);
        sizes.push_back(int(codes.size() - before));
    }
    // 4 + 2 for each sentence: the remainder is never borrowed from the next sentence.
    CHECK(sizes == std::vector<int>{4, 2, 4, 2});
    CHECK(pcm.size() == codes.size() * SAMPLES_PER_FRAME);
    CHECK(utt.frames() == 12);
}

TEST_CASE("backend options are checked where they enter", "[runtime][backend]") {
    BackendOptions options;
    options.name = "cpu";
    CHECK_NOTHROW(backend_options_validate(options));
    BackendOptions bad = options;
    bad.chunk_sizes = {1, 0};
    CHECK_THROWS_AS(SpeechModel::load(default_model_dir(), bad), Error);
    bad = options;
    bad.chunk_sizes.clear();
    CHECK_THROWS_AS(backend_options_validate(bad), Error);
    bad = options;
    bad.states = 0;
    CHECK_THROWS_AS(backend_options_validate(bad), Error);
    EngineOptions engine;
    engine.backend.name = "cpu";
    engine.chunk_frames = 0;
    CHECK_THROWS_AS(Engine(engine), Error);
}

TEST_CASE("qtts say --backend cuda exits non-zero with the reason when there is no GPU", "[runtime][backend][cli]") {
    const std::string exe = std::string(QTTS_BINARY_DIR) + "/qtts";
    if (have_gpu() || !std::filesystem::exists(exe)) {
        WARN("skipped: " << (have_gpu() ? "a GPU is present" : exe + " is not built"));
        return;
    }
    const std::string tmp = qtts_test::temp_dir();
    const std::string err = tmp + "/say.err";
    const std::string cmd = exe + " say \"Hello.\" -o " + tmp + "/out.wav --backend cuda 2>" + err + " >/dev/null";
    const int status = std::system(cmd.c_str());
    CHECK(status != 0);
    std::ifstream in(err);
    std::stringstream text;
    text << in.rdbuf();
    INFO(text.str());
    CHECK(text.str().find("CUDA backend was requested") != std::string::npos);
    CHECK(!std::filesystem::exists(tmp + "/out.wav"));
}
