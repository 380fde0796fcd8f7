// CUDA graph behaviour of the frame step (realtime-and-graphs.md, "What the graph tests must
// cover"), on a full-size random 1.7B checkpoint when QTTS_TEST_MODEL_DIR points to one
// (tools/gpu-run.sh generates it with `qtts make-model`), else on a random tiny checkpoint:
//   graph replay == eager for 200 frames with seeded sampling; the graphs-off switch; an
//   uncaptured chunk size falls back to eager; determinism; no aliasing across replays;
//   the owner guard (other thread, re-entrant replay, replay during capture); graph memory;
//   a fused first chunk (frames + audio in one replay) hands its codes and audio over before the
//   talker step after it, and the row after the chunk lands at the next call.
#include <catch2/catch.hpp>

// CPU-only builds compile this file to nothing (test_main skips the gpu label without a device).
#ifdef QTTS_HAVE_CUDA

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "engine/common/error.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_generator.h"
#include "engine/cuda/gpu_speech_decoder.h"
#include "engine/model/make_model.h"
#include "engine/model/weights.h"
#include "engine/generation/sampling.h"
#include "test_support.h"
#include "engine/text/prompt.h"

namespace qc = qtts::cuda;
using qtts::FrameCodes;
using qtts::FrameStatus;

namespace {

constexpr int FRAMES = 200;

qc::GpuContext& context() {
    static qc::GpuContext ctx(0);
    static bool init = [] {
        ctx.guard().set_mode(qc::OwnerGuardMode::OWNER_GUARD_THROW);  // the guard is tested below
        return true;
    }();
    (void)init;
    return ctx;
}

std::shared_ptr<const qtts::Checkpoint> test_checkpoint() {
    static std::shared_ptr<const qtts::Checkpoint> checkpoint = [] {
        std::string dir;
        if (const char* env = std::getenv("QTTS_TEST_MODEL_DIR")) {
            dir = env;
        } else {
            dir = qtts_test::temp_dir() + "/tiny";
            qtts::model_write_random(qtts::model_preset("tiny-customvoice"), dir, 99);
        }
        return qtts::checkpoint_load(dir);
    }();
    return checkpoint;
}

std::shared_ptr<const qc::GpuLmWeights> test_weights() {
    static auto weights = qc::GpuLmWeights::upload(test_checkpoint(), context().device());
    return weights;
}

qtts::Prompt test_prompt() {
    const auto& config = test_checkpoint()->config;
    qtts::PromptRequest r;
    r.input_ids = {151644, 77091, 198, 785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 151645, 198,
                   151644, 77091, 198};
    r.language = "english";
    if (config.type == qtts::ModelType::MODEL_TYPE_CUSTOM_VOICE) r.speaker = config.talker.speaker_ids.begin()->first;
    return qtts::prompt_build(config, r);
}

qtts::GenerationParams sampled_params() {
    qtts::GenerationParams p = qtts::generation_params_from_config(test_checkpoint()->generation);
    p.talker.greedy = false;
    p.predictor.greedy = false;
    p.min_new_tokens = 1 << 20;  // EOS masked: exactly FRAMES frames
    p.max_frames = FRAMES;
    return p;
}

qtts::BackendOptions options(bool graphs, std::vector<int> chunk_sizes = {1, 4}) {
    qtts::BackendOptions o;
    o.max_context = 1024;
    o.prefill_chunk = 64;
    o.cuda_graphs = graphs;
    o.chunk_sizes = std::move(chunk_sizes);
    return o;
}

// FRAMES frames in chunks of `first`, then `steady` frames, as the engine asks for them.
std::vector<FrameCodes> run(qc::GpuGenerator& gen, uint64_t seed, int first = 1, int steady = 4) {
    gen.start(test_prompt(), sampled_params(), seed);
    std::vector<FrameCodes> out;
    while (int(out.size()) < FRAMES) {
        const int k = std::min(out.empty() ? first : steady, FRAMES - int(out.size()));
        const size_t before = out.size();
        const qtts::ChunkStatus status = gen.chunk(k, &out, nullptr);
        CHECK(int(out.size() - before) == k);  // EOS is masked: every chunk is whole
        if (status != qtts::ChunkStatus::CHUNK_STATUS_FULL) break;
    }
    return out;
}

const std::vector<FrameCodes>& eager_reference() {
    static const std::vector<FrameCodes> ref = [] {
        qc::GpuGenerator eager(test_weights(), context(), options(false));
        REQUIRE(!eager.graphs_enabled());
        return run(eager, 1234);
    }();
    return ref;
}

}  // namespace

TEST_CASE("graph replay equals eager execution bitwise for 200 sampled frames", "[gpu][graphs]") {
    const auto& ref = eager_reference();
    REQUIRE(ref.size() == size_t(FRAMES));
    qc::GpuGenerator gen(test_weights(), context(), options(true));
    REQUIRE(gen.graphs_enabled());
    REQUIRE(gen.graphs().has(1));
    REQUIRE(gen.graphs().has(4));
    const auto got = run(gen, 1234);
    CHECK(got == ref);

    SECTION("determinism: the same seed replays the same codes; another seed does not") {
        CHECK(run(gen, 1234) == ref);
        CHECK(run(gen, 4321) != ref);
    }
    SECTION("no aliasing: the device still holds every frame exactly as it was handed out") {
        std::vector<int32_t> device_codes(size_t(FRAMES) * 16);
        gen.lm().codes_read(0, FRAMES, device_codes.data());
        for (int f = 0; f < FRAMES; ++f)
            for (int g = 0; g < 16; ++g) REQUIRE(device_codes[size_t(f) * 16 + g] == got[size_t(f)][size_t(g)]);
    }
    SECTION("graph memory stays within budget (no graph allocates)") {
        INFO("graph device memory " << gen.graphs().device_bytes() << " bytes");
        CHECK(gen.graphs().device_bytes() < 64ll << 20);
        size_t pool = 1;
        REQUIRE(cudaDeviceGetGraphMemAttribute(context().device(), cudaGraphMemAttrUsedMemCurrent, &pool) == cudaSuccess);
        CHECK(pool == 0);
    }
}

TEST_CASE("an uncaptured chunk size falls back to eager with identical codes", "[gpu][graphs]") {
    const auto& ref = eager_reference();
    qc::GpuGenerator gen(test_weights(), context(), options(true));
    CHECK(!gen.graphs().has(3));
    CHECK(run(gen, 1234, 3, 3) == ref);
    // A mix: first chunk from a captured graph (1), the rest eager (3).
    CHECK(run(gen, 1234, 1, 3) == ref);
}

TEST_CASE("programmatic dependent launch on or off gives identical codes", "[gpu][graphs]") {
    const auto& ref = eager_reference();
    const bool was = context().pdl();
    context().pdl_set(!was);
    qc::GpuGenerator flipped(test_weights(), context(), options(true));
    const auto got = run(flipped, 1234);
    context().pdl_set(was);
    CHECK(got == ref);
}

TEST_CASE("a fused first chunk hands over its audio before the talker step after it", "[gpu][graphs][fused]") {
    const auto decoder_weights = qc::GpuSpeechDecoderWeights::upload(*test_checkpoint(), context().device(), {});
    qtts::BackendOptions fused_options = options(true);
    fused_options.fused_chunks = true;
    qc::GpuGenerator fused(test_weights(), context(), fused_options);
    fused.decoder_attach(std::make_unique<qc::GpuSpeechDecoder>(decoder_weights, context()));
    REQUIRE(fused.fused_sizes() == std::vector<int>{1, 4});
    qtts::BackendOptions separate_options = options(true);
    separate_options.fused_chunks = false;
    qc::GpuGenerator separate(test_weights(), context(), separate_options);
    separate.decoder_attach(std::make_unique<qc::GpuSpeechDecoder>(decoder_weights, context()));
    REQUIRE(separate.fused_sizes().empty());

    // 1 + 4 + 4 frames, sampled, EOS masked: the last chunk ends at the frame limit.
    qtts::GenerationParams params = sampled_params();
    params.max_frames = 9;
    for (const uint64_t seed : {5u, 6u}) {
        fused.start(test_prompt(), params, seed);
        separate.start(test_prompt(), params, seed);
        std::vector<FrameCodes> fused_codes, separate_codes;
        std::vector<float> fused_pcm, separate_pcm;
        int chunk = 0;
        for (const int k : {1, 4, 4}) {
            INFO("seed " << seed << ", chunk " << chunk << " of " << k << " frames");
            const qtts::ChunkStatus want = separate.chunk(k, &separate_codes, &separate_pcm);
            CHECK(!separate.tail_pending());  // no fused graph: nothing runs on after a chunk
            const qtts::ChunkStatus got = fused.chunk(k, &fused_codes, &fused_pcm);
            CHECK(got == want);
            // Its codes and audio are here. After the first chunk (the early-audio size) the talker
            // step after it may still run, and only a later call takes the row after the chunk in;
            // the steady size's graph is one piece.
            CHECK(fused.tail_pending() == (chunk == 0));
            CHECK(fused_codes == separate_codes);
            CHECK(fused_pcm == separate_pcm);  // the same decoder kernels on the same codes: bit for bit
            if (chunk == 0) {
                CHECK(fused.batch_ready(4));  // waits for the tail: the next chunk can be batched
                CHECK(!fused.tail_pending());
            }
            ++chunk;
        }
        CHECK(fused_codes.size() == 9);
        CHECK(fused.stop_reason() == qtts::StopReason::STOP_MAX_FRAMES);
        CHECK(separate.stop_reason() == qtts::StopReason::STOP_MAX_FRAMES);
        fused.decoder_reset();
        separate.decoder_reset();
    }
}

TEST_CASE("the owner guard refuses foreign and re-entrant replays", "[gpu][graphs][owner]") {
    qc::GpuContext& ctx = context();
    qc::GpuGenerator gen(test_weights(), ctx, options(true));
    gen.start(test_prompt(), sampled_params(), 1);

    std::atomic<int> refused{0};
    std::thread other([&] {
        try {
            gen.graphs().run(1);
        } catch (const qtts::Error& e) {
            if (e.code() == qtts::ErrorCode::ERROR_INTERNAL) ++refused;
        }
        try {
            std::vector<float> logits(size_t(gen.lm().weights().codec_vocab));
            gen.lm().talker_logits_read(logits.data());
        } catch (const qtts::Error& e) {
            if (e.code() == qtts::ErrorCode::ERROR_INTERNAL) ++refused;
        }
    });
    other.join();
    CHECK(refused == 2);

    {
        qc::OwnerGuard::Scope replay(ctx.guard(), "a replay in progress");
        CHECK_THROWS_AS(gen.graphs().run(1), qtts::Error);  // re-entrant replay
        CHECK_THROWS_AS(gen.graphs().run(3), qtts::Error);  // re-entrant eager steps
    }
    // A replay attempted while a capture is in progress is refused, and the capture unwinds.
    CHECK_THROWS_AS(qc::graph_capture(ctx, "bad capture", [&] { gen.graphs().run(1); }, nullptr), qtts::Error);
    CHECK(!ctx.guard().busy());
    // The context is still healthy: generation continues from where it was.
    std::vector<FrameCodes> c;
    CHECK(gen.chunk(1, &c, nullptr) == qtts::ChunkStatus::CHUNK_STATUS_FULL);
    CHECK(gen.chunk(1, &c, nullptr) == qtts::ChunkStatus::CHUNK_STATUS_FULL);
    CHECK(c.size() == 2);
}

#endif  // QTTS_HAVE_CUDA
