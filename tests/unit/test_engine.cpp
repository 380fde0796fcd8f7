// The engine runtime: one engine thread, streams read from other threads, cancellation,
// the concurrency limit, incremental text, and bad requests refused before they are queued.
#include <catch2/catch.hpp>

#include <cmath>
#include <thread>

#include "common/error.h"
#include "runtime/engine.h"
#include "runtime/synthesizer.h"
#include "model/make_model.h"

using namespace qtts;
using namespace std::chrono_literals;

namespace {

std::vector<float> read_all(Stream& s, std::chrono::seconds limit = 120s) {
    std::vector<float> out;
    std::vector<float> buf(4096);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!s.finished() && std::chrono::steady_clock::now() < deadline) {
        const size_t n = s.read(buf.data(), buf.size());
        out.insert(out.end(), buf.begin(), buf.begin() + long(n));
        if (n == 0) s.wait(50ms);
    }
    REQUIRE(s.finished());
    return out;
}

SpeechRequest greedy_request(const std::string& text, int max_frames) {
    SpeechRequest r;
    r.text = text;
    r.greedy = true;
    r.seed = 5;
    r.max_frames = max_frames;
    return r;
}

}  // namespace

TEST_CASE("a stream delivers exactly the utterance's audio and codes", "[engine]") {
    EngineOptions options;
    options.chunk_frames = 3;
    Engine engine(options);
    auto stream = engine.submit(greedy_request("Hello there.", 7));
    const std::vector<float> audio = read_all(*stream);
    const StreamMetrics m = stream->metrics();
    CHECK(m.frames == 7);
    CHECK(audio.size() == size_t(7 * 1920));
    CHECK(m.stop_reason == StopReason::STOP_MAX_FRAMES);
    CHECK(m.ttfa_gen_ms >= 0);
    CHECK(stream->error().empty());

    // The same request run directly through an Utterance gives the same samples and codes.
    auto model = SpeechModel::load(default_model_dir());
    Utterance utt(model, model->prepare(greedy_request("Hello there.", 7)));
    std::vector<float> pcm;
    std::vector<FrameCodes> codes;
    while (utt.chunk(2, &pcm, &codes) != UtteranceStatus::UTTERANCE_DONE) {
    }
    REQUIRE(pcm.size() == audio.size());
    // Chunk sizes differ (engine 1+3+3, here 2+2+2+1): the streaming decoder is exact up to
    // float rounding of differently sized matrix products.
    double max_diff = 0.0;
    for (size_t i = 0; i < pcm.size(); ++i) max_diff = std::max(max_diff, double(std::fabs(pcm[i] - audio[i])));
    CHECK(max_diff < 1e-5);
    const auto stream_codes = stream->codes();
    REQUIRE(stream_codes.size() == codes.size());
    for (size_t f = 0; f < codes.size(); ++f) CHECK(std::equal(codes[f].begin(), codes[f].end(), stream_codes[f].begin()));
    CHECK(engine.stats().completed == 1);
    CHECK(engine.stats().active_streams == 0);
}

TEST_CASE("cancellation stops a stream within a chunk and frees its slot", "[engine]") {
    EngineOptions options;
    options.max_streams = 1;
    Engine engine(options);
    auto stream = engine.submit(greedy_request("A long sentence that would take a while to speak.", 300));
    std::vector<float> buf(1920);
    while (stream->read(buf.data(), buf.size()) == 0) stream->wait(50ms);
    stream->cancel();
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!stream->generation_done() && std::chrono::steady_clock::now() < deadline) stream->wait(50ms);
    REQUIRE(stream->generation_done());
    CHECK(stream->metrics().stop_reason == StopReason::STOP_CANCELLED);
    CHECK(stream->metrics().frames < 300);
    // The slot is free again: a new stream is accepted.
    auto second = engine.submit(greedy_request("Next.", 2));
    read_all(*second);
    CHECK(engine.stats().cancelled == 1);
}

TEST_CASE("the concurrency limit refuses extra streams with ERROR_BUSY", "[engine]") {
    EngineOptions options;
    options.max_streams = 1;
    Engine engine(options);
    auto first = engine.submit(greedy_request("One.", 40));
    try {
        engine.submit(greedy_request("Two.", 2));
        FAIL("second stream was accepted");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_BUSY);
    }
    first->cancel();
}

TEST_CASE("bad requests fail on submit with clear errors", "[engine]") {
    Engine engine(EngineOptions{});
    SpeechRequest r;
    r.text = "   ";
    CHECK_THROWS_WITH(engine.submit(r), Catch::Contains("empty"));
    r.text = std::string("caf\xC3", 4);
    CHECK_THROWS_WITH(engine.submit(r), Catch::Contains("UTF-8"));
    r.text = "Hello";
    r.speaker = "nobody";
    CHECK_THROWS_WITH(engine.submit(r), Catch::Contains("nobody") && Catch::Contains("vivian"));
    r.speaker = "";
    r.language = "klingon";
    CHECK_THROWS_WITH(engine.submit(r), Catch::Contains("klingon"));
    r.language = "auto";
    r.text = std::string(REQUEST_MAX_TEXT_BYTES + 1, 'a');
    CHECK_THROWS_WITH(engine.submit(r), Catch::Contains("at most"));
    CHECK(engine.stats().requests == 0);
}

TEST_CASE("text appended in pieces gives the same codes as the whole text", "[engine]") {
    const std::string text = "The quick brown fox jumps over the lazy dog. How are you?";
    Engine engine(EngineOptions{});
    SpeechRequest whole = greedy_request(text, 30);
    whole.text_layout = TextLayout::TEXT_LAYOUT_STREAMING;
    auto a = engine.submit(whole);
    read_all(*a);

    SpeechRequest inc = greedy_request("", 30);
    inc.incremental = true;
    auto b = engine.submit(inc);
    for (const char* piece : {"The qu", "ick brown fox ", "jumps over", " the lazy dog.", " How are", " you?"}) {
        b->text_append(piece);
        std::this_thread::sleep_for(5ms);
    }
    b->text_close();
    read_all(*b);
    CHECK(a->codes() == b->codes());
    CHECK(b->metrics().frames == a->metrics().frames);
}
