// The runtime's backend choice without a GPU (CI): `cuda` is refused with a clear error before
// anything is loaded, `auto` falls back to the CPU, unknown names are rejected, and the CPU path
// through the FrameGenerator interface gives exactly cpu::Generator's codes. On a GPU machine the
// selection checks flip to the CUDA side (the GPU side is covered by tests/gpu/test_gpu_runtime).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "engine/common/device.h"
#include "engine/common/error.h"
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
    SpeechModelOptions cuda;
    cuda.backend = "cuda";
    SpeechModelOptions automatic;  // backend "auto"
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
        engine_cuda.backend = "cuda";
        CHECK_THROWS_AS(Engine(engine_cuda), Error);

        auto model = SpeechModel::load(dir, automatic);
        CHECK(model->backend() == LmBackend::LM_BACKEND_CPU);
        CHECK(model->backend_name() == "cpu");
        CHECK(model->gpu_states_created() == 0);
        Engine engine(EngineOptions{});
        CHECK(engine.backend_name() == "cpu");
    } else {
        auto model = SpeechModel::load(dir, automatic);
        CHECK(model->backend() == LmBackend::LM_BACKEND_CUDA);
        CHECK(model->backend_name() == "cuda:0");
        CHECK(model->gpu_states_created() == 1);
    }
    SpeechModelOptions cpu;
    cpu.backend = "cpu";
    CHECK(SpeechModel::load(dir, cpu)->backend_name() == "cpu");

    SpeechModelOptions bad;
    bad.backend = "tpu";
    try {
        SpeechModel::load(dir, bad);
        FAIL("an unknown backend must throw");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
        CHECK(std::string(e.what()).find("auto, cpu or cuda") != std::string::npos);
    }
    // A device that cannot exist: auto still works (CPU), cuda is refused.
    SpeechModelOptions far = automatic;
    far.device = 4096;
    CHECK(SpeechModel::load(dir, far)->backend_name() == "cpu");
    far.backend = "cuda";
    CHECK_THROWS_AS(SpeechModel::load(dir, far), Error);
}

TEST_CASE("the CPU backend's utterance gives exactly cpu::Generator's codes", "[runtime][backend]") {
    SpeechModelOptions cpu;
    cpu.backend = "cpu";
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
