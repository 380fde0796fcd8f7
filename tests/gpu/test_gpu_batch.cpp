// The batched frame step (engine/cuda/gpu_batch.h): every stream of a batch gets the codes it gets
// alone, whatever the batch holds and whichever bucket replays it. On a full-size random 1.7B
// checkpoint when QTTS_TEST_MODEL_DIR points to one (tools/gpu-run.sh), else on a random tiny
// checkpoint. Streams differ in prompt (speaker, instruction, text length), in sampling (greedy,
// seeded with different parameters) and in position; one stops mid-chunk; one joins while the
// others run. "Alone" is GpuLm's own frame step (the path the engine runs today).
#include <catch2/catch.hpp>

#ifdef QTTS_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/cuda/gpu_batch.h"
#include "engine/cuda/gpu_prefill_batch.h"
#include "engine/generation/sampling.h"
#include "engine/model/make_model.h"
#include "engine/model/weights.h"
#include "engine/text/prompt.h"
#include "test_support.h"

namespace qc = qtts::cuda;

namespace {

constexpr int MAX_CONTEXT = 512;

qc::GpuContext& context() {
    static qc::GpuContext ctx(0);
    return ctx;
}

std::shared_ptr<const qtts::Checkpoint> test_checkpoint() {
    static std::shared_ptr<const qtts::Checkpoint> checkpoint = [] {
        std::string dir;
        if (const char* env = std::getenv("QTTS_TEST_MODEL_DIR")) {
            dir = env;
        } else {
            dir = qtts_test::temp_dir() + "/tiny-batch";
            qtts::model_write_random(qtts::model_preset("tiny-customvoice"), dir, 1717);
        }
        return qtts::checkpoint_load(dir);
    }();
    return checkpoint;
}

std::shared_ptr<const qc::GpuLmWeights> test_weights() {
    static auto weights = qc::GpuLmWeights::upload(test_checkpoint(), context().device());
    return weights;
}

// What distinguishes the streams of the tests.
struct StreamSpec {
    int words = 3;                // text length (prompt and text-track rows)
    int speaker = 0;              // index into the model's speakers
    bool instruction = false;     // a style instruction in the prompt
    bool greedy = false;
    uint64_t seed = 1;
    float temperature = 0.9f;
    int top_k = 50;
    float top_p = 1.0f;
    int frame_end = 0x7fffffff;   // the stream's frame limit (device-side stop)
};

qtts::Prompt spec_prompt(const StreamSpec& s) {
    const auto& config = test_checkpoint()->config;
    qtts::PromptRequest r;
    // <|im_start|>assistant\n + words + <|im_end|>\n<|im_start|>assistant\n (ids of the text vocabulary)
    r.input_ids = {151644, 77091, 198};
    for (int i = 0; i < s.words; ++i) r.input_ids.push_back(int32_t(785 + 97 * i));
    for (int32_t id : {151645, 198, 151644, 77091, 198}) r.input_ids.push_back(id);
    if (s.instruction) r.instruct_ids = {151644, 872, 198, 9707, 11, 1281, 13, 151645, 198};
    r.language = "english";
    if (config.type == qtts::ModelType::MODEL_TYPE_CUSTOM_VOICE) {
        auto it = config.talker.speaker_ids.begin();
        std::advance(it, s.speaker % int(config.talker.speaker_ids.size()));
        r.speaker = it->first;
    }
    return qtts::prompt_build(config, r);
}

qc::GpuGenerationSetup spec_setup(const StreamSpec& s) {
    qc::GpuGenerationSetup setup;
    setup.seed = s.seed;
    qtts::SamplingParams p;
    p.greedy = s.greedy;
    p.temperature = s.temperature;
    p.top_k = s.top_k;
    p.top_p = s.top_p;
    p.repetition_penalty = 1.05f;
    setup.talker = p;
    setup.predictor = p;
    setup.predictor.repetition_penalty = 1.0f;
    setup.min_new_tokens = 1 << 20;  // EOS masked: the frame counts are known
    setup.frame_end = s.frame_end;
    return setup;
}

constexpr int PREFILL_CHUNK = 64;  // prompt rows per prefill pass of the tests' streams

std::unique_ptr<qc::GpuLm> stream_new() {
    qc::GpuLmOptions o;
    o.max_context = MAX_CONTEXT;
    o.prefill_chunk = PREFILL_CHUNK;
    return std::make_unique<qc::GpuLm>(test_weights(), context(), o);
}

std::unique_ptr<qc::GpuLm> stream_start(const StreamSpec& s) {
    auto lm = stream_new();
    lm->generation_start(spec_prompt(s), spec_setup(s));
    return lm;
}

std::vector<int32_t> codes_of(qc::GpuLm& lm, int frames) {
    std::vector<int32_t> codes(size_t(frames) * 16);
    lm.codes_read(0, frames, codes.data());
    return codes;
}

// The stream alone: `frames` of GpuLm's frame steps (the steps past a frame_end are the
// single-stream path's business; the comparison only reads frames before it).
struct Alone {
    std::vector<int32_t> codes;
    std::vector<float> logits;  // talker logits after the last step
};

Alone run_alone(const StreamSpec& s, int frames) {
    auto lm = stream_start(s);
    for (int f = 0; f < frames; ++f) lm->frame_step_enqueue();
    Alone a;
    a.codes = codes_of(*lm, frames);
    a.logits.resize(size_t(test_weights()->codec_vocab));
    lm->talker_logits_read(a.logits.data());
    return a;
}

// Whether a stream's codes may part from its codes alone at one neighbour draw (check_codes): on
// a path whose products are not bitwise those of the stream alone (tensor cores, cuBLAS, batched
// prefill: logits within rounding, 1e-5 relative), for a stream that samples from the whole
// vocabulary (no greedy pick, top-k or top-p).
bool neighbour_draw_allowed(const StreamSpec& s, bool bitwise_path) {
    return !bitwise_path && !s.greedy && s.top_k <= 0 && s.top_p >= 1.0f;
}

// Frames [0, n) equal; with a frame_end, frames from it on were never completed: the frame at
// frame_end holds only the codebook-0 draw that ended the stream, later frames nothing (-1).
// With `neighbour_allowed` (above) the stream may part from its codes alone at one draw: the
// sampler picks the first index whose running sum (in index order) passes the draw's target, and
// with ~2048 candidates the sums' boundaries are ~5e-4 apart, so a last-bit difference in the
// logits moves a draw that lands that close to one to the neighbouring index
// (seen on an H100: 325 for 326, the 166th draw of a 12-frame run). That draw must be a
// neighbour (a wrong product gives an arbitrary code, and from the first frames); the stream's
// history differs after it, so nothing later is compared and false is returned. Streams that
// draw among few candidates (greedy, top-k, top-p) match at every draw.
bool check_codes(const std::vector<int32_t>& batched, const std::vector<int32_t>& alone, int frames, int frame_end,
                 const std::string& what, bool neighbour_allowed = false) {
    INFO(what);
    const int valid = std::min(frames, frame_end);
    for (int f = 0; f < valid; ++f)
        for (int g = 0; g < 16; ++g) {
            INFO("frame " << f << " codebook " << g);
            const int32_t got = batched[size_t(f) * 16 + g], want = alone[size_t(f) * 16 + g];
            if (got != want && neighbour_allowed) {
                REQUIRE(std::abs(got - want) == 1);
                WARN(what << ": a whole-vocabulary draw moved to the neighbouring code at frame " << f << " codebook "
                          << g << " (" << got << " for " << want << "); later draws not compared");
                return false;
            }
            REQUIRE(got == want);
        }
    for (int f = valid; f < frames; ++f)
        for (int g = f == frame_end ? 1 : 0; g < 16; ++g) {
            INFO("frame " << f << " (after the stream stopped) codebook " << g);
            REQUIRE(batched[size_t(f) * 16 + g] == -1);
        }
    return true;
}

double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
    double scale = 0.0, diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) {
        scale = std::max(scale, double(std::fabs(b[i])));
        diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    }
    return diff / std::max(scale, 1e-30);
}

std::vector<StreamSpec> mixed_specs() {
    std::vector<StreamSpec> specs(5);
    specs[0] = {3, 0, false, true, 11};                        // greedy, short
    specs[1] = {9, 1, true, false, 22};                        // sampled, instruction, longer
    specs[2] = {5, 2, false, false, 33, 0.7f, 20, 0.8f};       // top-p
    specs[3] = {14, 3, true, true, 44};                        // greedy, longest prompt
    specs[4] = {2, 4, false, false, 55, 1.0f, 0, 1.0f};        // plain sampling, no top-k
    return specs;
}

struct BatchRun {
    std::vector<std::vector<int32_t>> codes;
    std::vector<std::vector<float>> logits;
};

// All specs in one batch (rows in the given order), `frames` frames in chunks of `chunk`.
BatchRun run_batched(const std::vector<StreamSpec>& specs, const std::vector<int>& order, int frames, int chunk,
                     qc::GpuBatchOptions options) {
    std::vector<std::unique_ptr<qc::GpuLm>> lms;
    for (const StreamSpec& s : specs) lms.push_back(stream_start(s));
    qc::GpuBatch batch(test_weights(), context(), MAX_CONTEXT, options);
    batch.capture();
    std::vector<qc::GpuLm*> rows;
    for (int i : order) rows.push_back(lms[size_t(i)].get());
    batch.bind(rows);
    for (int done = 0; done < frames; done += chunk) batch.run(std::min(chunk, frames - done));
    BatchRun r;
    for (size_t i = 0; i < specs.size(); ++i) r.codes.push_back(codes_of(*lms[i], frames));
    for (size_t row = 0; row < order.size(); ++row) {
        std::vector<float> l(size_t(test_weights()->codec_vocab));
        batch.talker_logits_read(int(row), l.data());
        r.logits.push_back(l);
    }
    return r;
}

}  // namespace

TEST_CASE("a batch gives every stream its codes alone, whatever the bucket and the product path", "[gpu][batch]") {
    constexpr int FRAMES = 12;
    const std::vector<StreamSpec> specs = mixed_specs();
    std::vector<Alone> alone;
    for (const StreamSpec& s : specs) alone.push_back(run_alone(s, FRAMES));

    struct Case {
        std::string name;
        std::vector<int> buckets;
        std::vector<int> chunks;
        int chunk;
        bool graphs;
        int wide_rows;
        int skinny_max_rows;  // tensor-core products up to this many rows in one launch; more: split cuBLAS
        std::vector<int> order;
        bool bitwise;  // gemv everywhere: bitwise equal logits
        int long_slices_rows = 0;  // GpuBatchOptions::long_slices_rows (0: by SM count)
        // GpuBatchOptions::short_slices_blocks and slice_blocks_per_sm (the cases that set them
        // set long_slices_rows past their bucket, so that the slices stay short on any GPU; the
        // tests' 512-position caches have 4 slices per KV head, a context past 16 keys several).
        // The others keep the options' defaults.
        int short_slices_blocks = qc::GpuBatchOptions{}.short_slices_blocks;
        int slice_blocks_per_sm = qc::GpuBatchOptions{}.slice_blocks_per_sm;
    };
    const int skinny = qtts::kernels::SKINNY_MAX_ROWS;
    const std::vector<Case> cases = {
        {"gemv, bucket 8 (3 idle rows), graphs, 1-frame chunks", {1, 2, 4, 8}, {1}, 1, true, 1 << 20, skinny, {0, 1, 2, 3, 4}, true},
        {"gemv, exact bucket 5, eager, reversed rows", {5}, {1}, 1, false, 1 << 20, skinny, {4, 3, 2, 1, 0}, true},
        {"one-launch tensor-core products for every product, bucket 16, 4-frame graphs", {16}, {4}, 4, true, 1, skinny, {2, 0, 4, 1, 3}, false},
        {"split cuBLAS products for every product, bucket 16, 4-frame graphs", {16}, {4}, 4, true, 1, 0, {2, 0, 4, 1, 3}, false},
        {"long attention slices (one per 128 keys) from 1 row, bucket 8", {8}, {4}, 4, true, 1, skinny, {4, 2, 0, 3, 1}, false, 1},
        {"short attention slices (16 keys) taken in turn by one block per stream and KV head, bucket 8", {8}, {4}, 4, true, 1, skinny, {1, 4, 2, 0, 3}, false, 64, 1, 0},
        {"short attention slices taken in turn by two blocks per stream and KV head, bucket 5, eager", {5}, {1}, 1, false, 1, skinny, {0, 2, 4, 1, 3}, false, 64, 2, 0},
        {"a block per short attention slice (short_slices_blocks 0), bucket 8", {8}, {4}, 4, true, 1, skinny, {3, 0, 4, 2, 1}, false, 64, 0},
        {"tensor cores from 8 rows (the predictor's first pass), bucket 6", {6}, {3}, 3, true, 8, skinny, {1, 3, 0, 2, 4}, false},
        {"one launch up to 8 rows, split cuBLAS past (the predictor's first pass of bucket 6: 12 rows), eager", {6}, {3}, 3, false, 4, 8, {3, 1, 4, 0, 2}, false},
    };
    for (const Case& c : cases) {
        SECTION(c.name) {
            qc::GpuBatchOptions o;
            o.buckets = c.buckets;
            o.chunk_frames = c.chunks;
            o.cuda_graphs = c.graphs;
            o.wide_rows = c.wide_rows;
            o.skinny_max_rows = c.skinny_max_rows;
            o.long_slices_rows = c.long_slices_rows;
            o.short_slices_blocks = c.short_slices_blocks;
            o.slice_blocks_per_sm = c.slice_blocks_per_sm;
            const BatchRun run = run_batched(specs, c.order, FRAMES, c.chunk, o);
            std::vector<bool> same(specs.size());
            for (size_t i = 0; i < specs.size(); ++i)
                same[i] = check_codes(run.codes[i], alone[i].codes, FRAMES, specs[i].frame_end,
                                      "stream " + std::to_string(i), neighbour_draw_allowed(specs[i], c.bitwise));
            for (size_t row = 0; row < c.order.size(); ++row) {
                if (!same[size_t(c.order[row])]) continue;  // its history parted at a neighbour draw
                const Alone& a = alone[size_t(c.order[row])];
                const double rel = max_relative(run.logits[row], a.logits);
                INFO("row " << row << " (stream " << c.order[row] << "): max relative logit difference " << rel);
                if (c.bitwise)
                    REQUIRE(rel == 0.0);
                else
                    REQUIRE(rel <= 1e-5);
            }
        }
    }
}

TEST_CASE("fused split passes give the bits of three launches per product", "[gpu][batch]") {
    constexpr int FRAMES = 8;
    const std::vector<StreamSpec> specs = mixed_specs();
    const std::vector<int> order = {3, 1, 4, 0, 2};
    // Every product on the split cuBLAS path (skinny_max_rows 0), 4-frame graphs; then eagerly with
    // the one-launch kernel up to 6 rows, so only the predictor's first pass (10 rows) is split.
    for (const bool graphs : {true, false}) {
        qc::GpuBatchOptions o;
        o.buckets = {5};
        o.chunk_frames = {4};
        o.cuda_graphs = graphs;
        o.wide_rows = 2;
        o.skinny_max_rows = graphs ? 0 : 6;
        o.split_fusion = true;
        const BatchRun fused = run_batched(specs, order, FRAMES, 4, o);
        o.split_fusion = false;
        const BatchRun unfused = run_batched(specs, order, FRAMES, 4, o);
        INFO((graphs ? "graphs, every product split" : "eager, the first predictor pass split"));
        for (size_t i = 0; i < specs.size(); ++i) REQUIRE(fused.codes[i] == unfused.codes[i]);
        for (size_t row = 0; row < order.size(); ++row) REQUIRE(max_relative(fused.logits[row], unfused.logits[row]) == 0.0);
    }
}

TEST_CASE("a stream that stops mid-chunk stays put while the others go on", "[gpu][batch]") {
    constexpr int FRAMES = 12;
    std::vector<StreamSpec> specs = mixed_specs();
    specs[1].frame_end = 5;  // stops inside the second 4-frame chunk
    specs[3].frame_end = 1;  // stops after its first frame
    std::vector<Alone> alone;
    for (const StreamSpec& s : specs) alone.push_back(run_alone(s, FRAMES));
    qc::GpuBatchOptions o;
    o.buckets = {8};
    o.chunk_frames = {4};
    const BatchRun run = run_batched(specs, {0, 1, 2, 3, 4}, FRAMES, 4, o);
    for (size_t i = 0; i < specs.size(); ++i)
        check_codes(run.codes[i], alone[i].codes, FRAMES, specs[i].frame_end, "stream " + std::to_string(i),
                    neighbour_draw_allowed(specs[i], false));
}

TEST_CASE("a stream joins a running batch; rows are re-bound between chunks", "[gpu][batch]") {
    constexpr int FIRST = 6, SECOND = 6;
    const std::vector<StreamSpec> specs = mixed_specs();
    std::vector<Alone> alone;
    for (const StreamSpec& s : specs) alone.push_back(run_alone(s, FIRST + SECOND));

    qc::GpuBatchOptions o;
    o.buckets = {2, 4, 8};
    o.chunk_frames = {2};
    qc::GpuBatch batch(test_weights(), context(), MAX_CONTEXT, o);
    batch.capture();
    std::vector<std::unique_ptr<qc::GpuLm>> lms;
    for (int i = 0; i < 3; ++i) lms.push_back(stream_start(specs[size_t(i)]));
    batch.bind({lms[0].get(), lms[1].get(), lms[2].get()});
    for (int f = 0; f < FIRST; f += 2) batch.run(2);
    // Two newcomers; the old streams move to other rows.
    lms.push_back(stream_start(specs[3]));
    lms.push_back(stream_start(specs[4]));
    batch.bind({lms[3].get(), lms[2].get(), lms[0].get(), lms[4].get(), lms[1].get()});
    REQUIRE(batch.bucket_for(batch.bound()) == 8);
    for (int f = 0; f < SECOND; f += 2) batch.run(2);
    for (int i = 0; i < 3; ++i)
        check_codes(codes_of(*lms[size_t(i)], FIRST + SECOND), alone[size_t(i)].codes, FIRST + SECOND, 1 << 30,
                    "early stream " + std::to_string(i), neighbour_draw_allowed(specs[size_t(i)], false));
    for (int i = 3; i < 5; ++i)
        check_codes(codes_of(*lms[size_t(i)], SECOND), alone[size_t(i)].codes, SECOND, 1 << 30,
                    "newcomer " + std::to_string(i), neighbour_draw_allowed(specs[size_t(i)], false));
}

TEST_CASE("prompts prefilled together give every stream its logits and codes alone", "[gpu][batch][prefill]") {
    // The mixed streams plus two longer prompts: one past a prefill chunk (two passes, the second
    // at position 64 with fewer members), one of ~50 rows. Row caps: all in one group; one chunk
    // per group (every stream in its own group, the long one's second pass alone); groups of 1-3.
    constexpr int FRAMES = 6;
    std::vector<StreamSpec> specs = mixed_specs();
    specs.push_back({90, 5, true, false, 66});
    specs.push_back({40, 6, false, true, 77});
    std::vector<int> positions_alone;
    for (const StreamSpec& s : specs) positions_alone.push_back(int(spec_prompt(s).positions.size()));
    REQUIRE(*std::max_element(positions_alone.begin(), positions_alone.end()) > PREFILL_CHUNK);
    struct Start {
        std::vector<float> logits;  // codebook-0 logits of frame 0 (the prefill's last row)
        std::vector<int32_t> codes;
    };
    const int V = test_weights()->codec_vocab;
    auto finish = [&](qc::GpuLm& lm) {
        Start r;
        r.logits.resize(size_t(V));
        lm.talker_logits_read(r.logits.data());
        for (int f = 0; f < FRAMES; ++f) lm.frame_step_enqueue();
        r.codes = codes_of(lm, FRAMES);
        return r;
    };
    std::vector<Start> alone;
    for (const StreamSpec& s : specs) alone.push_back(finish(*stream_start(s)));

    for (const int max_rows : {512, PREFILL_CHUNK, 100}) {
        SECTION("at most " + std::to_string(max_rows) + " rows per pass") {
            qc::GpuPrefillBatch prefill(test_weights(), context(), PREFILL_CHUNK, max_rows);
            std::vector<std::unique_ptr<qc::GpuLm>> lms;
            std::vector<qc::GpuLm*> streams;
            std::vector<qc::GpuLm::PromptRows> rows;
            std::vector<int> positions;
            for (const StreamSpec& s : specs) {
                lms.push_back(stream_new());
                streams.push_back(lms.back().get());
                rows.push_back(lms.back()->prompt_load(spec_prompt(s)));
                positions.push_back(rows.back().positions);
            }
            CHECK(positions == positions_alone);
            prefill.run(streams, positions);
            for (size_t i = 0; i < specs.size(); ++i) lms[i]->generation_begin(rows[i], spec_setup(specs[i]));
            for (size_t i = 0; i < specs.size(); ++i) {
                const Start got = finish(*lms[i]);
                const double rel = max_relative(got.logits, alone[i].logits);
                INFO("stream " << i << " (" << positions[i] << " rows): max relative logit difference " << rel);
                CHECK(rel <= 1e-5);
                check_codes(got.codes, alone[i].codes, FRAMES, 1 << 30, "stream " + std::to_string(i),
                            neighbour_draw_allowed(specs[i], false));
            }
        }
    }
}

TEST_CASE("a refused prompt leaves its stream as it was; batched prefill arguments are checked",
          "[gpu][batch][prefill]") {
    const StreamSpec spec{6, 1, false, true, 9};
    qtts::Prompt bad = spec_prompt(spec);
    const auto text = std::find_if(bad.positions.begin(), bad.positions.end(),
                                   [](const qtts::PromptPosition& p) { return p.text_id >= 0; });
    REQUIRE(text != bad.positions.end());
    text->text_id = test_weights()->text_vocab + 5;
    auto lm = stream_new();
    try {
        (void)lm->prompt_load(bad);
        FAIL("an out-of-vocabulary text id was accepted");
    } catch (const qtts::Error& e) {
        CHECK(e.code() == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
    }
    // The same stream then starts a good prompt through a batched prefill, as alone.
    auto reference = stream_start(spec);
    qc::GpuPrefillBatch prefill(test_weights(), context(), PREFILL_CHUNK, 128);
    const qc::GpuLm::PromptRows rows = lm->prompt_load(spec_prompt(spec));
    auto other = stream_new();
    const qc::GpuLm::PromptRows other_rows = other->prompt_load(spec_prompt(StreamSpec{}));
    prefill.run({lm.get(), other.get()}, {rows.positions, other_rows.positions});
    lm->generation_begin(rows, spec_setup(spec));
    for (int f = 0; f < 4; ++f) {
        lm->frame_step_enqueue();
        reference->frame_step_enqueue();
    }
    check_codes(codes_of(*lm, 4), codes_of(*reference, 4), 4, 1 << 30, "after a refused prompt");

    // A pass must hold a whole prompt chunk; streams must have that chunk size.
    CHECK_THROWS_AS(qc::GpuPrefillBatch(test_weights(), context(), PREFILL_CHUNK, PREFILL_CHUNK - 1), qtts::Error);
    qc::GpuLmOptions o;
    o.max_context = MAX_CONTEXT;
    o.prefill_chunk = PREFILL_CHUNK / 2;
    qc::GpuLm other_chunk(test_weights(), context(), o);
    (void)other_chunk.prompt_load(spec_prompt(spec));
    CHECK_THROWS_AS(prefill.run({&other_chunk}, {rows.positions}), qtts::Error);
}

TEST_CASE("batch options and bindings are checked", "[gpu][batch]") {
    using qtts::ErrorCode;
    auto expect_invalid = [](auto&& f) {
        try {
            f();
            FAIL("no error was raised");
        } catch (const qtts::Error& e) {
            CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
        }
    };
    qc::GpuBatchOptions bad;
    bad.buckets = {4, 2};
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.buckets = {0};
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.buckets = {129};
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.buckets = {};
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.buckets = {2};
    bad.skinny_max_rows = qtts::kernels::SKINNY_MAX_ROWS + 1;
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.skinny_max_rows = -1;
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.skinny_max_rows = 16;
    bad.skinny_tiles = 3;
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.skinny_tiles = -1;
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.skinny_tiles = 0;
    bad.long_slices_rows = -1;
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.long_slices_rows = 0;
    bad.short_slices_blocks = -1;
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });
    bad.short_slices_blocks = 0;
    bad.slice_blocks_per_sm = -1;
    expect_invalid([&] { qc::gpu_batch_options_validate(bad); });

    qc::GpuBatchOptions o;
    o.buckets = {1, 2};
    o.cuda_graphs = false;
    qc::GpuBatch batch(test_weights(), context(), MAX_CONTEXT, o);
    CHECK(batch.bucket_for(1) == 1);
    CHECK(batch.bucket_for(2) == 2);
    expect_invalid([&] { (void)batch.bucket_for(0); });
    expect_invalid([&] { (void)batch.bucket_for(3); });
    auto a = stream_start(StreamSpec{});
    auto b = stream_start(StreamSpec{});
    auto c = stream_start(StreamSpec{});
    expect_invalid([&] { batch.bind({a.get(), b.get(), c.get()}); });  // more than the largest bucket
    expect_invalid([&] { batch.bind({a.get(), a.get()}); });           // bound twice
    qc::GpuLmOptions other;
    other.max_context = MAX_CONTEXT / 2;
    qc::GpuLm short_context(test_weights(), context(), other);
    expect_invalid([&] { batch.bind({a.get(), &short_context}); });  // another cache size
    batch.bind({a.get(), b.get()});
    CHECK(batch.bound() == 2);
    batch.bind({});
    CHECK(batch.bound() == 0);
    batch.run(1);  // nothing bound: nothing to do
}

#endif  // QTTS_HAVE_CUDA

