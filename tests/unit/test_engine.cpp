// The engine runtime: one engine thread, streams read from other threads, cancellation,
// the concurrency limit, incremental text, and bad requests refused before they are queued.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <type_traits>
#include <thread>

#include "engine/common/error.h"
#include "engine/api/qtts.h"
#include "engine/runtime/engine_debug.h"
#include "engine/runtime/speech_model.h"
#include "engine/runtime/utterance.h"
#include "engine/text/request_check.h"
#include "engine/model/make_model.h"
#include "test_engine_batching.h"
#include "test_streams.h"
#include "test_support.h"

using namespace qtts;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kGreedySeed = 5;  // every greedy request of this file

std::vector<float> read_all(Stream& s) {
    std::vector<float> out = qtts_test::stream_read_all(s);
    REQUIRE(s.finished());
    return out;
}

// The codes of `text` spoken whole in the streaming layout: what the same text given
// incrementally must give.
std::vector<std::vector<int32_t>> streaming_codes(Engine& engine, const std::string& text) {
    SpeechRequest whole = qtts_test::greedy_request(text, 30, kGreedySeed);
    whole.text_layout = TextLayout::TEXT_LAYOUT_STREAMING;
    auto stream = engine.submit(whole);
    read_all(*stream);
    return stream->codes();
}

}  // namespace

TEST_CASE("a stream delivers exactly the utterance's audio and codes", "[engine]") {
    EngineOptions options;
    options.chunk_frames = 3;
    Engine engine(options);
    auto stream = engine.submit(qtts_test::greedy_request("Hello there.", 7, kGreedySeed));
    const std::vector<float> audio = read_all(*stream);
    const StreamMetrics m = stream->metrics();
    CHECK(m.frames == 7);
    CHECK(audio.size() == size_t(7 * 1920));
    CHECK(m.stop_reason == StopReason::STOP_MAX_FRAMES);
    CHECK(m.ttfa_gen_ms >= 0);
    CHECK(stream->error().empty());

    // The same request run directly through an Utterance gives the same samples and codes.
    auto model = SpeechModel::load(default_model_dir());
    Utterance utt(model, model->prepare(qtts_test::greedy_request("Hello there.", 7, kGreedySeed)));
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
    // Incremental text never closed: the stream speaks its words and then waits for more, so the
    // cancel finds it running however late this thread gets to it on a loaded machine.
    qtts::SpeechRequest request = qtts_test::greedy_request("A long sentence that would take a while to speak.", 300, kGreedySeed);
    request.incremental = true;
    auto stream = engine.submit(request);
    std::vector<float> buf(1920);
    while (stream->read(buf.data(), buf.size()) == 0) stream->wait(50ms);
    stream->cancel();
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (!stream->generation_done() && std::chrono::steady_clock::now() < deadline) stream->wait(50ms);
    REQUIRE(stream->generation_done());
    CHECK(stream->metrics().stop_reason == StopReason::STOP_CANCELLED);
    CHECK(stream->metrics().frames < 300);
    // The slot is free again: a new stream is accepted.
    auto second = engine.submit(qtts_test::greedy_request("Next.", 2, kGreedySeed));
    read_all(*second);
    CHECK(engine.stats().cancelled == 1);
}

TEST_CASE("discard (barge-in) drops the buffered audio: the next read returns nothing", "[engine]") {
    EngineOptions options;
    options.max_streams = 1;
    Engine engine(options);
    // Incremental text never closed (as above): still running at the discard, whatever the timing.
    qtts::SpeechRequest request = qtts_test::greedy_request("A long sentence that would take a while to speak.", 300, kGreedySeed);
    request.incremental = true;
    auto stream = engine.submit(request);
    std::vector<float> buf(1920);
    while (stream->read(buf.data(), buf.size()) == 0) stream->wait(50ms);
    // Let audio pile up unread, as it does in a player's buffer while it speaks.
    const auto deadline = std::chrono::steady_clock::now() + 30s;
    while (stream->available() < 3 * 1920 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    REQUIRE(stream->available() >= 3 * 1920);
    stream->discard();
    CHECK(stream->available() == 0);
    CHECK(stream->read(buf.data(), buf.size()) == 0);
    while (!stream->generation_done() && std::chrono::steady_clock::now() < deadline) stream->wait(50ms);
    REQUIRE(stream->generation_done());
    // Nothing the engine made before it stopped comes out, and the stream counts as finished
    // without the reader draining anything.
    CHECK(stream->read(buf.data(), buf.size()) == 0);
    CHECK(stream->finished());
    CHECK(stream->metrics().stop_reason == StopReason::STOP_CANCELLED);
    CHECK(stream->metrics().frames < 300);
    // The slot is free again and a new stream plays normally.
    auto second = engine.submit(qtts_test::greedy_request("Next.", 2, kGreedySeed));
    CHECK(read_all(*second).size() == size_t(2 * 1920));
    CHECK(engine.stats().cancelled == 1);
}

TEST_CASE("the concurrency limit refuses extra streams with ERROR_BUSY", "[engine]") {
    EngineOptions options;
    options.max_streams = 1;
    Engine engine(options);
    auto first = engine.submit(qtts_test::greedy_request("One.", 40, kGreedySeed));
    try {
        engine.submit(qtts_test::greedy_request("Two.", 2, kGreedySeed));
        FAIL("second stream was accepted");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_BUSY);
    }
    first->cancel();
}

TEST_CASE("a fault in one stream's step ends that stream alone; the others finish intact", "[engine][faults]") {
    EngineOptions options;
    options.max_streams = 3;
    Engine engine(options);
    // Reference audio of the two healthy streams, alone.
    const auto request = [](const char* text) { return qtts_test::greedy_request(text, 12, kGreedySeed); };
    const std::vector<float> alone_a = read_all(*engine.submit(request("First healthy stream.")));
    const std::vector<float> alone_b = read_all(*engine.submit(request("Second healthy stream.")));

    auto a = engine.submit(request("First healthy stream."));
    auto victim = engine.submit(qtts_test::greedy_request("This one fails, long before its end.", 300, kGreedySeed));
    auto b = engine.submit(request("Second healthy stream."));
    engine_fault_inject(engine, victim->id());
    const std::vector<float> got_a = read_all(*a);
    const std::vector<float> got_b = read_all(*b);
    qtts_test::stream_read_all(*victim);
    REQUIRE(victim->generation_done());
    CHECK(victim->metrics().stop_reason == StopReason::STOP_ERROR);
    CHECK_THAT(victim->error(), Catch::Contains("injected fault"));
    CHECK(victim->metrics().frames < 300);
    CHECK(got_a == alone_a);
    CHECK(got_b == alone_b);
    CHECK(a->metrics().stop_reason == StopReason::STOP_MAX_FRAMES);
    CHECK(b->metrics().stop_reason == StopReason::STOP_MAX_FRAMES);
    // The engine stays in service: healthy, its slot freed, the next stream complete.
    CHECK(engine.healthy());
    CHECK(engine.failure().empty());
    CHECK(engine.stats().errors == 1);
    CHECK(engine.stats().active_streams == 0);
    CHECK(read_all(*engine.submit(request("First healthy stream."))) == alone_a);
}

TEST_CASE("an incremental request's own text is its first piece; blank text ends with no audio, not spoken", "[engine]") {
    Engine engine(EngineOptions{});
    const auto whole_codes = streaming_codes(engine, "The quick brown fox jumps over the lazy dog. How are you?");

    SpeechRequest opening = qtts_test::greedy_request("The quick brown fox ", 30, kGreedySeed);
    opening.incremental = true;
    auto b = engine.submit(opening);
    b->text_append("jumps over the lazy dog. How are you?");
    b->text_close();
    read_all(*b);
    CHECK(b->error().empty());
    CHECK(b->codes() == whole_codes);

    // Whitespace only, then closed: done at once with no audio (as empty text), the slot freed.
    SpeechRequest blank = qtts_test::greedy_request("   ", 30, kGreedySeed);
    blank.incremental = true;
    auto c = engine.submit(blank);
    c->text_append(" \n\t ");
    c->text_close();
    CHECK(read_all(*c).empty());
    CHECK(c->metrics().stop_reason == StopReason::STOP_EOS);
    CHECK(c->metrics().frames == 0);
    CHECK(c->error().empty());
    CHECK(engine.stats().active_streams == 0);
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
    CHECK_THROWS_WITH(engine.submit(r), Catch::Contains("the limit is"));
    CHECK(engine.stats().requests == 0);
}

namespace {

// The message of the qtts::Error(ERROR_INVALID_ARGUMENT) `call` throws (fails when it returns).
template <typename F>
std::string refusal(F&& call) {
    try {
        call();
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
        return e.what();
    }
    FAIL("accepted");
    return "";
}

}  // namespace

TEST_CASE("one text rule: submit and Stream::text_append refuse the same text with the same error", "[engine]") {
    Engine engine(EngineOptions{});
    const std::string huge(REQUEST_MAX_TEXT_BYTES + 1, 'a');
    const std::string bad("caf\xC3", 4);
    const auto rule = [](const std::string& text, size_t before = 0) {
        return refusal([&] { text_check(text, "text", REQUEST_MAX_TEXT_BYTES, before); });
    };
    SpeechRequest r;
    for (const std::string& text : {huge, bad}) {
        r.text = text;
        CHECK(refusal([&] { engine.submit(r); }) == rule(text));
    }
    CHECK(engine.stats().requests == 0);

    // Appended text: the same check and message; a refused piece is dropped and the stream goes on.
    SpeechRequest inc = qtts_test::greedy_request("", 2, kGreedySeed);
    inc.incremental = true;
    auto stream = engine.submit(inc);
    for (const std::string& text : {huge, bad}) CHECK(refusal([&] { stream->text_append(text); }) == rule(text));
    stream->text_append("Hello.");
    stream->text_close();
    read_all(*stream);
    CHECK(stream->metrics().frames == 2);
    CHECK(stream->error().empty());

    // The limit counts the request's whole text: its own `text` and every piece appended.
    SpeechRequest nearly_full = inc;
    nearly_full.text = std::string(REQUEST_MAX_TEXT_BYTES - 4, ' ');
    auto full = engine.submit(nearly_full);
    CHECK(refusal([&] { full->text_append("Hello"); }) == rule("Hello", REQUEST_MAX_TEXT_BYTES - 4));
    CHECK_NOTHROW(full->text_append("Hi."));
    full->cancel();
    read_all(*full);
}

TEST_CASE("the debug entry speaks token ids and checks them like submit checks text", "[engine]") {
    Engine engine(EngineOptions{});
    SpeechRequest r = qtts_test::greedy_request("", 2, kGreedySeed);
    SpeechRequestDebug debug;
    // "<|im_start|>assistant\nHello world,<|im_end|>\n<|im_start|>assistant\n"
    debug.input_ids = {151644, 77091, 198, 9707, 1879, 11, 151645, 198, 151644, 77091, 198};
    auto stream = engine_submit_debug(engine, r, debug);
    read_all(*stream);
    CHECK(stream->metrics().frames == 2);
    debug.input_ids.erase(debug.input_ids.begin());  // no <|im_start|>
    CHECK_THROWS_WITH(engine_submit_debug(engine, r, debug), Catch::Contains("<|im_start|>assistant"));
    CHECK_THROWS_WITH(engine.submit(r), Catch::Contains("empty"));  // the public entry has no ids
}

TEST_CASE("text appended in pieces gives the same codes as the whole text", "[engine]") {
    Engine engine(EngineOptions{});
    const auto whole_codes = streaming_codes(engine, "The quick brown fox jumps over the lazy dog. How are you?");

    SpeechRequest inc = qtts_test::greedy_request("", 30, kGreedySeed);
    inc.incremental = true;
    auto b = engine.submit(inc);
    for (const char* piece : {"The qu", "ick brown fox ", "jumps over", " the lazy dog.", " How are", " you?"}) {
        b->text_append(piece);
        std::this_thread::sleep_for(5ms);
    }
    b->text_close();
    read_all(*b);
    CHECK(b->codes() == whole_codes);
}

TEST_CASE("telemetry events: started, one per chunk, done; plain values, polled without locks", "[engine]") {
    static_assert(std::is_trivially_copyable<StreamEvent>::value, "events must be plain values");
    static_assert(std::is_trivially_destructible<StreamEvent>::value, "nothing to free on the reader's thread");
    EngineOptions options;
    options.chunk_frames = 3;
    Engine engine(options);
    // Chunks of 1 + 3 + 3 frames.
    auto stream = engine.submit(qtts_test::greedy_request("Hello there.", 7, kGreedySeed));
    const std::vector<float> audio = read_all(*stream);
    std::vector<StreamEvent> events;
    StreamEvent e;
    while (stream->event_poll(&e)) events.push_back(e);
    REQUIRE(events.size() == 5);
    CHECK(events[0].kind == StreamEventKind::STREAM_EVENT_STARTED);
    const int expected_frames[] = {1, 3, 3};
    int64_t total = 0;
    for (int i = 0; i < 3; ++i) {
        INFO("chunk " << i);
        CHECK(events[size_t(1 + i)].kind == StreamEventKind::STREAM_EVENT_CHUNK);
        CHECK(events[size_t(1 + i)].frames == expected_frames[i]);
        total += expected_frames[i];
        CHECK(events[size_t(1 + i)].frames_total == total);
        CHECK(events[size_t(1 + i)].t_ms >= events[size_t(i)].t_ms);
    }
    CHECK(events[4].kind == StreamEventKind::STREAM_EVENT_DONE);
    CHECK(events[4].stop_reason == StopReason::STOP_MAX_FRAMES);
    CHECK(events[4].frames_total == 7);
    CHECK_FALSE(stream->event_poll(&e));
    CHECK(stream->events_dropped() == 0);
    CHECK(audio.size() == size_t(7 * 1920));
}

TEST_CASE("telemetry: a stream waiting for text says so", "[engine]") {
    Engine engine(EngineOptions{});
    SpeechRequest r;
    r.incremental = true;
    r.greedy = true;
    r.max_frames = 6;
    auto stream = engine.submit(r);
    stream->text_append("Hello");
    bool waiting = false;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    StreamEvent e;
    while (!waiting && std::chrono::steady_clock::now() < deadline) {
        while (stream->event_poll(&e)) waiting |= e.kind == StreamEventKind::STREAM_EVENT_WAITING;
        std::vector<float> sink(4096);
        stream->read(sink.data(), sink.size());
        std::this_thread::sleep_for(5ms);
    }
    CHECK(waiting);
    stream->text_close();
    read_all(*stream);
    bool done = false;
    while (stream->event_poll(&e)) done |= e.kind == StreamEventKind::STREAM_EVENT_DONE;
    CHECK(done);
}

// ---------------------------------------------------------------------------------------------
// Scheduling (docs/engine.md, "Scheduling"): deadline order, admission control, underruns.
// ---------------------------------------------------------------------------------------------

namespace {

// Waits (at most 60 s) until `done` holds; false when it never did.
template <typename Done>
bool wait_for(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!done()) {
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(5ms);
    }
    return true;
}

// For each round of `trace` in which both streams made a chunk, in round order: whether `first`
// came before `second`.
std::vector<bool> rounds_in_order(const std::vector<EngineTraceEntry>& trace, uint64_t first, uint64_t second) {
    std::map<uint64_t, std::pair<int, int>> place;  // round -> (index of first, index of second)
    for (size_t i = 0; i < trace.size(); ++i) {
        auto& p = place.try_emplace(trace[i].round, -1, -1).first->second;
        if (trace[i].stream_id == first) p.first = int(i);
        if (trace[i].stream_id == second) p.second = int(i);
    }
    std::vector<bool> ordered;
    for (const auto& [round, p] : place)
        if (p.first >= 0 && p.second >= 0) ordered.push_back(p.first < p.second);
    return ordered;
}

}  // namespace

TEST_CASE("a stream ends with the chunk that makes its last frames, not a round later", "[engine][scheduling]") {
    EngineOptions options;
    options.max_streams = 2;
    Engine engine(options);
    engine_trace_start(engine, 4096);
    // Capped at 5 frames (chunks of 1 then 4: the cap falls on a chunk's end) and at 7 (inside one).
    auto even = engine.submit(qtts_test::greedy_request("The first stream ends on a chunk boundary.", 5, kGreedySeed));
    auto odd = engine.submit(qtts_test::greedy_request("The second one ends inside a chunk.", 7, kGreedySeed + 1));
    read_all(*even);
    read_all(*odd);
    const auto trace = engine_trace_take(engine);
    for (const auto& [stream, frames] : {std::pair{even->id(), 5}, std::pair{odd->id(), 7}}) {
        std::vector<EngineTraceEntry> mine;
        std::copy_if(trace.begin(), trace.end(), std::back_inserter(mine),
                     [id = stream](const EngineTraceEntry& t) { return t.stream_id == id; });
        INFO("stream " << stream);
        REQUIRE_FALSE(mine.empty());
        int total = 0;
        for (const EngineTraceEntry& t : mine) total += t.frames;
        CHECK(total == frames);
        // Only the last chunk ends the stream: the end came with its audio.
        CHECK(mine.back().ended);
        CHECK(std::count_if(mine.begin(), mine.end(), [](const EngineTraceEntry& t) { return t.ended; }) == 1);
    }
    CHECK(even->metrics().stop_reason == StopReason::STOP_MAX_FRAMES);
}

TEST_CASE("deadline order: a newcomer with little audio buffered is served before a stream far ahead", "[engine][scheduling]") {
    EngineOptions options;
    options.max_streams = 2;
    options.backend.batching = false;  // the per-stream order (batched steps: the test below)
    Engine engine(options);
    // Nobody reads `ahead`: its audio piles up in its ring (30 s, more than its 360 frames, so it
    // is never held back), as it does in a client's buffer when the engine is faster than real time.
    auto ahead = engine.submit(qtts_test::greedy_request("A long sentence that keeps the first stream busy.", 360, kGreedySeed));
    REQUIRE(wait_for([&] { return ahead->metrics().frames >= 40; }));
    engine_trace_start(engine, 4096);
    auto newcomer = engine.submit(qtts_test::greedy_request("Another sentence.", 40, kGreedySeed));
    read_all(*newcomer);
    const auto trace = engine_trace_take(engine);
    ahead->cancel();
    // Arrival order would serve `ahead` first in every round after the newcomer's first chunk.
    // The newcomer's deadline is earlier whatever the machine's speed: ahead of real time, `ahead`
    // keeps its lead; behind it, each was last served in the order of the round before.
    const std::vector<bool> ordered = rounds_in_order(trace, newcomer->id(), ahead->id());
    CHECK(ordered.size() >= 5);
    CHECK(std::count(ordered.begin(), ordered.end(), false) == 0);
    // Without batching no chunk says it was made in a batched step.
    CHECK(std::none_of(trace.begin(), trace.end(), [](const EngineTraceEntry& t) { return t.batched; }));
}

TEST_CASE("a request that arrives while first chunks are made gets its first chunk before the steady chunks",
          "[engine][scheduling]") {
    EngineOptions options;
    options.max_streams = 3;
    options.backend.batching = false;  // the per-stream phases (a steady stream would join the first step)
    Engine engine(options);
    auto steady = engine.submit(qtts_test::greedy_request("A long sentence that keeps the first stream busy.", 200, kGreedySeed));
    REQUIRE(wait_for([&] { return steady->metrics().frames >= 8; }));
    // From here every chunk holds the engine thread 500 ms (the slow-device seam): `late` is
    // submitted while the engine rests after `first`'s first chunk, inside a round's first-chunk
    // phase, before that round's steady chunk. The rest is long enough for this thread (polling
    // every few ms) to submit in time on a loaded machine.
    engine_chunk_delay_set(engine, 500ms);
    engine_trace_start(engine, 4096);
    auto first = engine.submit(qtts_test::greedy_request("The first newcomer.", 6, kGreedySeed));
    REQUIRE(wait_for([&] { return first->metrics().samples > 0; }));
    auto late = engine.submit(qtts_test::greedy_request("A late one.", 6, kGreedySeed + 1));
    REQUIRE(wait_for([&] { return late->metrics().samples > 0; }));
    engine_chunk_delay_set(engine, 0us);
    const auto trace = engine_trace_take(engine);
    steady->cancel();
    read_all(*first);
    read_all(*late);
    // In the trace: first's first chunk, then late's first chunk, in the same round, with no
    // steady chunk between them.
    const auto at = [&](uint64_t id) {
        return std::find_if(trace.begin(), trace.end(), [id](const EngineTraceEntry& t) { return t.stream_id == id; });
    };
    const auto f = at(first->id()), l = at(late->id());
    REQUIRE(f != trace.end());
    REQUIRE(l != trace.end());
    CHECK(l > f);
    CHECK(l->round == f->round);
    CHECK(std::none_of(f, l, [&](const EngineTraceEntry& t) { return t.stream_id == steady->id(); }));
}

TEST_CASE("deadline order: a stream back from waiting for text goes before a newer stream far ahead", "[engine][scheduling]") {
    EngineOptions options;
    options.max_streams = 2;
    Engine engine(options);
    SpeechRequest r = qtts_test::greedy_request("Hello there, how are you", 40, kGreedySeed);
    r.incremental = true;
    auto waiting = engine.submit(r);
    bool is_waiting = false;
    StreamEvent e;
    std::vector<float> sink(4096);
    REQUIRE(wait_for([&] {
        while (waiting->event_poll(&e)) is_waiting |= e.kind == StreamEventKind::STREAM_EVENT_WAITING;
        waiting->read(sink.data(), sink.size());
        return is_waiting;
    }));
    REQUIRE(waiting->metrics().frames > 0);  // it has played: it has a deadline, long past now
    const auto submitted = std::chrono::steady_clock::now();
    auto ahead = engine.submit(qtts_test::greedy_request("A long sentence that keeps this stream busy.", 360, kGreedySeed));
    // `ahead` must be well ahead of real time (its listener's buffer), or it rightly becomes the more
    // urgent one within a few rounds. Its lead: audio made minus the time since its first audio.
    const auto lead_s = [&] {
        const StreamMetrics m = ahead->metrics();
        if (m.ttfa_gen_ms < 0) return 0.0;
        const double since_first = std::chrono::duration<double>(std::chrono::steady_clock::now() - submitted).count() -
                                   m.ttfa_gen_ms / 1000.0;
        return double(m.frames) * 0.08 - since_first;
    };
    if (!wait_for([&] { return lead_s() >= 5.0 || ahead->generation_done(); }) || lead_s() < 5.0) {
        WARN("this machine makes one stream at about real time or slower (lead " << lead_s()
                                                                               << " s): the order is not checked");
        ahead->cancel();
        waiting->cancel();
        return;
    }
    engine_trace_start(engine, 4096);
    waiting->text_append(" doing on this fine morning? I hope that all is well with you.");
    waiting->text_close();
    read_all(*waiting);
    const auto trace = engine_trace_take(engine);
    ahead->cancel();
    // Newest first would serve `ahead` first; the deadline puts the older, hungrier stream first.
    // The round in which the text arrives may have ordered the stream as still waiting (the
    // order is made at the start of a round); every later one puts it first.
    const std::vector<bool> ordered = rounds_in_order(trace, waiting->id(), ahead->id());
    REQUIRE(ordered.size() >= 2);
    CHECK(std::count(ordered.begin() + 1, ordered.end(), false) == 0);
}

TEST_CASE("admission control: over the measured capacity new streams get ERROR_BUSY, admitted ones go on", "[engine][scheduling]") {
    EngineOptions options;
    options.max_streams = 4;
    options.admission = true;
    options.admission_headroom = 1.0;
    Engine engine(options);
    // A slow backend: 0.3 s per chunk of at most 4 frames (0.32 s of audio) carries at most
    // 1.07 streams at real time, however fast the machine (its own compute only lowers it).
    engine_chunk_delay_set(engine, 300ms);
    auto first = engine.submit(qtts_test::greedy_request("A long sentence for the only stream.", 300, kGreedySeed));
    REQUIRE(wait_for([&] { return engine.stats().capacity > 0.0; }));
    CHECK(engine.stats().capacity < 1.1);
    try {
        engine.submit(qtts_test::greedy_request("Two.", 4, kGreedySeed));
        FAIL("a second stream was admitted over the engine's capacity");
    } catch (const Error& err) {
        CHECK(err.code() == ErrorCode::ERROR_BUSY);
        CHECK_THAT(err.what(), Catch::Contains("real-time capacity"));
    }
    CHECK(engine.stats().refused_capacity == 1);
    CHECK(engine.stats().refused_limit == 0);
    // The admitted stream keeps going.
    const int64_t frames = first->metrics().frames;
    CHECK(wait_for([&] { return first->metrics().frames >= frames + 8; }));
    // The load drops: the next request is admitted and spoken.
    first->cancel();
    REQUIRE(wait_for([&] { return first->generation_done(); }));
    engine_chunk_delay_set(engine, 0us);
    auto second = engine.submit(qtts_test::greedy_request("Two.", 4, kGreedySeed));
    CHECK(read_all(*second).size() == size_t(4 * 1920));
    CHECK(engine.stats().refused_capacity == 1);
}

TEST_CASE("admission off (the library default): only max_streams refuses", "[engine][scheduling]") {
    EngineOptions options;
    options.max_streams = 2;
    CHECK_FALSE(options.admission);
    Engine engine(options);
    engine_chunk_delay_set(engine, 300ms);
    auto first = engine.submit(qtts_test::greedy_request("A long sentence for the first stream.", 300, kGreedySeed));
    REQUIRE(wait_for([&] { return engine.stats().capacity > 0.0; }));
    auto second = engine.submit(qtts_test::greedy_request("Two.", 2, kGreedySeed));  // over capacity, admitted
    CHECK_THROWS_AS(engine.submit(qtts_test::greedy_request("Three.", 2, kGreedySeed)), Error);
    CHECK(engine.stats().refused_limit == 1);
    CHECK(engine.stats().refused_capacity == 0);
    first->cancel();
    second->cancel();
}

TEST_CASE("admission options are checked where they enter", "[engine][scheduling]") {
    for (const double bad : {0.0, -1.0, 4.5, std::nan("")}) {
        EngineOptions options;
        options.admission_headroom = bad;
        CHECK_THROWS_AS(Engine(options), Error);
    }
}

TEST_CASE("underruns: a stream made slower than real time is counted, with its lag", "[engine][scheduling]") {
    EngineOptions options;
    Engine engine(options);
    // 0.5 s per chunk: every chunk after the first comes after the previous one has played out
    // (1 frame = 0.08 s, then 4 frames = 0.32 s), so a real-time listener runs dry before each.
    engine_chunk_delay_set(engine, 500ms);
    auto stream = engine.submit(qtts_test::greedy_request("Slow speech.", 13, kGreedySeed));  // chunks 1+4+4+4
    double lag_seen = 0.0;
    std::vector<float> sink(4096);
    while (!stream->finished()) {
        lag_seen = std::max(lag_seen, engine.stats().lag_max_s);
        stream->read(sink.data(), sink.size());
        stream->wait(10ms);
    }
    const EngineStats st = engine.stats();
    CHECK(st.underruns == 3);
    CHECK(st.underrun_seconds >= 0.42 + 2 * 0.18);
    CHECK(st.streams_lagged == 1);
    CHECK(lag_seen >= 0.42);
    CHECK(st.batch_size == 0);  // one stream: no batched step
    // Idle again: the gauges say so.
    REQUIRE(wait_for([&] { return engine.stats().lag_max_s == 0.0; }));
    CHECK(engine.stats().queue_depth == 0);
}

TEST_CASE("thread time: the engine thread's wall time by part adds up, and a slow chunk shows in its pass",
          "[engine][scheduling]") {
    EngineOptions options;
    options.backend.batching = false;  // the per-stream pass only (no batched phases to time)
    Engine engine(options);
    const EngineStats::ThreadTime before = engine.stats().thread_time;
    // Chunks 1 + 4 frames, each held 150 ms by the seam inside the per-stream pass.
    engine_chunk_delay_set(engine, 150ms);
    auto stream = engine.submit(qtts_test::greedy_request("Slow speech.", 5, kGreedySeed));
    read_all(*stream);
    engine_chunk_delay_set(engine, 0ms);
    // Idle again for a while: the waits count.
    std::this_thread::sleep_for(100ms);
    REQUIRE(wait_for([&] { return engine.stats().thread_time.idle_s > before.idle_s + 0.05; }));
    const EngineStats::ThreadTime t = engine.stats().thread_time;
    CHECK(t.service_s - before.service_s >= 0.3);
    CHECK(t.starts_s == 0.0);  // no batched starts or steps without batching
    CHECK(t.first_steps_s == 0.0);
    CHECK(t.steps_s == 0.0);
    const double parts = t.starts_s + t.first_steps_s + t.steps_s + t.service_s + t.idle_s;
    INFO("service " << t.service_s << " s, idle " << t.idle_s << " s, total " << t.total_s << " s");
    CHECK(parts <= t.total_s + 1e-6);
    CHECK(t.total_s - parts < 0.25 * t.total_s + 0.1);  // bookkeeping is a small rest
}

namespace {

// An engine on cpu-fast (named: on a machine with a GPU, auto would pick CUDA), four streams,
// with or without batched steps. Every start whole: the demo model's small tokenizer makes
// prompts of 40-90 rows, which sliced starts would spread over rounds (tested on their own).
EngineOptions cpu_fast_options(bool batching, int streams = 4) {
    EngineOptions options;
    options.backend.name = "cpu-fast";
    options.max_streams = streams;
    options.backend.batching = batching;
    options.prefill_slice = 0;
    return options;
}

// cpu-fast's batched step gives every row the arithmetic it gets alone: a batched stream's codes
// are bitwise those of the same request on an engine without batching, greedy or sampled; its
// audio is the same frames decoded in chunks that may be cut elsewhere (a steady stream's
// one-frame chunk in a newcomer's first step), equal within float rounding.
void same_speech_cpu(const std::vector<qtts_test::EngineHeard>& batched, const std::vector<qtts_test::EngineHeard>& alone,
                     const std::vector<SpeechRequest>& requests, size_t) {
    REQUIRE(batched.size() == alone.size());
    for (size_t i = 0; i < alone.size(); ++i) {
        INFO("stream " << i << ": " << requests[i].text);
        CHECK(alone[i].error.empty());
        CHECK(batched[i].error.empty());
        REQUIRE(!alone[i].codes.empty());
        CHECK(batched[i].stop == alone[i].stop);
        CHECK(batched[i].codes == alone[i].codes);
        REQUIRE(batched[i].pcm.size() == alone[i].pcm.size());
        CHECK(alone[i].pcm.size() == alone[i].codes.size() * SAMPLES_PER_FRAME);
        CHECK(qtts_test::max_abs_error(batched[i].pcm.data(), alone[i].pcm.data(), alone[i].pcm.size()) < 1e-5);
    }
}

}  // namespace

TEST_CASE("cpu-fast batches concurrent streams: each speaks as on an engine without batching",
          "[engine][scheduling][batch]") {
    // Greedy and seeded sampling, different lengths (caps inside a chunk and on its end); four
    // streams at once and a fifth joining while they run. The same requests on an engine
    // without batching (every stream its own steps) are the reference.
    const std::vector<SpeechRequest> requests = qtts_test::batch_mix_requests({14, 19, 9, 17, 11}, kGreedySeed);
    const auto speak_all = [&](bool batching, EngineStats* stats, std::vector<EngineTraceEntry>* trace) {
        Engine engine(cpu_fast_options(batching, 5));
        engine_trace_start(engine, 4096);
        std::vector<std::shared_ptr<Stream>> streams;
        for (size_t i = 0; i < 4; ++i) streams.push_back(engine.submit(requests[i]));
        std::vector<qtts_test::EngineHeard> heard(requests.size());
        std::vector<std::thread> readers;
        for (size_t i = 0; i < 4; ++i) readers.emplace_back([&, i] { heard[i].pcm = qtts_test::stream_read_all(*streams[i]); });
        REQUIRE(wait_for([&] { return streams[0]->metrics().frames >= 5; }));
        streams.push_back(engine.submit(requests[4]));
        heard[4].pcm = read_all(*streams[4]);
        for (auto& r : readers) r.join();
        for (size_t i = 0; i < streams.size(); ++i) {
            REQUIRE(streams[i]->finished());
            heard[i].error = streams[i]->error();
            heard[i].codes = qtts_test::stream_codes(*streams[i]);
            heard[i].stop = streams[i]->metrics().stop_reason;
        }
        *trace = engine_trace_take(engine);
        *stats = engine.stats();
        return heard;
    };
    EngineStats alone_stats, batched_stats;
    std::vector<EngineTraceEntry> alone_trace, batched_trace;
    const auto alone = speak_all(false, &alone_stats, &alone_trace);
    const auto batched = speak_all(true, &batched_stats, &batched_trace);
    CHECK(std::none_of(alone_trace.begin(), alone_trace.end(), [](const EngineTraceEntry& t) { return t.batched; }));
    int64_t batched_steps = 0;
    for (size_t n = 2; n < batched_stats.batch_histogram.size(); ++n) batched_steps += batched_stats.batch_histogram[n];
    const auto batched_chunks =
        std::count_if(batched_trace.begin(), batched_trace.end(), [](const EngineTraceEntry& t) { return t.batched; });
    WARN("batched steps: " << batched_steps << ", chunks made in them: " << batched_chunks << " of "
                           << batched_trace.size());
    CHECK(batched_steps > 0);
    CHECK(batched_chunks >= 2 * batched_steps);
    CHECK(batched_stats.batch_decoded_chunks == 0);  // each chunk's audio is decoded in its own chunk() call
    same_speech_cpu(batched, alone, requests, 0);
}

// The engine's scheduling rules for batched steps, shared with test_gpu_runtime
// (test_engine_batching.h), on cpu-fast.
TEST_CASE("cpu-fast: newcomers of one round start together and make their first chunks in one batched step, each as "
          "alone",
          "[engine][scheduling][batch]") {
    qtts_test::newcomers_start_together(cpu_fast_options(false), {cpu_fast_options(true)}, same_speech_cpu, kGreedySeed);
}

TEST_CASE("cpu-fast: a capped stream's last, shorter chunk joins the batched step", "[engine][scheduling][batch]") {
    qtts_test::capped_last_chunk_joins(cpu_fast_options(false), {cpu_fast_options(true)}, same_speech_cpu, kGreedySeed);
}

TEST_CASE("cpu-fast: a batched step whose streams all end within it makes only the frames they keep",
          "[engine][scheduling][batch]") {
    qtts_test::step_trimmed_to_what_streams_keep(cpu_fast_options(false), {cpu_fast_options(true)}, same_speech_cpu,
                                                 kGreedySeed);
}

// Sliced starts (EngineOptions::prefill_slice): a long stream plays (the slow-device seam keeps
// its rounds long), and a newcomer with a prompt of many rows arrives. With slices of 4 rows its
// prefill runs 4 rows a round, in the rounds where the long stream makes its chunks, instead of
// all at once; its speech (sampled: the draws would show any change in its logits) and the long
// stream's are bitwise those of an engine that starts it whole, with and without batched steps.
TEST_CASE("cpu-fast sliced starts: a long prompt is prefilled a few rows a round while another stream plays",
          "[engine][scheduling][slice]") {
    std::vector<SpeechRequest> requests = {
        qtts_test::greedy_request("A long stream plays while the newcomer's prompt is prefilled.", 120, kGreedySeed),
        qtts_test::greedy_request("The newcomer says a sentence long enough to take several slices of its prompt.", 12,
                                  kGreedySeed + 1),
    };
    requests[1].greedy = false;
    requests[1].seed = 808;
    EngineOptions whole = cpu_fast_options(false);
    whole.prefill_slice = 0;
    EngineStats whole_stats;
    const auto reference = qtts_test::speak_joining(whole, requests, std::chrono::milliseconds(30), &whole_stats);
    CHECK(whole_stats.prefill_slices == 0);
    CHECK(whole_stats.sliced_starts == 0);
    for (const bool batching : {false, true}) {
        INFO("batching " << batching);
        EngineOptions sliced = cpu_fast_options(batching);
        sliced.prefill_slice = 4;
        sliced.prefill_slice_by_deadline = false;  // 4 rows a round whatever the margin
        EngineStats stats;
        const auto heard = qtts_test::speak_joining(sliced, requests, std::chrono::milliseconds(30), &stats);
        same_speech_cpu(heard, reference, requests, 0);
        // The long stream started alone, with nobody to stall: whole. The newcomer: in slices.
        CHECK(stats.sliced_starts == 1);
        const int64_t slices = stats.prefill_slices;
        WARN("batching " << batching << ": the newcomer's start took " << slices << " slices of 4 rows");
        CHECK(slices >= 3);
        // One slice a round, the last in the round of its first chunk; the long stream made a
        // chunk in each of those rounds.
        const uint64_t first = heard[1].trace.front().round;
        REQUIRE(first >= uint64_t(slices));
        for (uint64_t r = first - uint64_t(slices) + 1; r <= first; ++r) {
            INFO("round " << r);
            CHECK(std::any_of(heard[0].trace.begin(), heard[0].trace.end(),
                              [r](const EngineTraceEntry& t) { return t.round == r; }));
        }
    }
}

// With the margin rule on (the default), a slice grows to what the playing streams' buffered
// audio covers: the demo model makes audio far faster than real time, so the playing stream's
// listener is seconds from running dry and the newcomer's start, after one slice at the option's
// size (the engine's first measure of its prefill speed), runs whole. A listener already dry
// (the slow-device seam holds each chunk longer than its audio lasts) covers nothing: slices stay
// at the option's rows.
TEST_CASE("cpu-fast sliced starts grow with the playing streams' margin", "[engine][scheduling][slice]") {
    const std::vector<SpeechRequest> requests = {
        qtts_test::greedy_request("A long stream plays while the newcomer's prompt is prefilled.", 40, kGreedySeed),
        qtts_test::greedy_request("The newcomer says a sentence long enough to take several slices of its prompt.", 8,
                                  kGreedySeed + 1),
    };
    EngineOptions options = cpu_fast_options(true);
    options.prefill_slice = 8;
    EngineStats fast_stats, slow_stats;
    const auto fast = qtts_test::speak_joining(options, requests, 30ms, &fast_stats);
    const auto slow = qtts_test::speak_joining(options, requests, 400ms, &slow_stats);
    WARN("margin of seconds: " << fast_stats.prefill_slices << " slices; none: " << slow_stats.prefill_slices);
    CHECK(fast_stats.sliced_starts == 1);
    CHECK(fast_stats.prefill_slices == 2);  // the option's 8 rows, then the rest at once
    CHECK(slow_stats.sliced_starts == 1);
    CHECK(slow_stats.prefill_slices >= 4);  // 8 rows a round: the prompt has more than 24
    for (size_t i = 0; i < requests.size(); ++i) {
        INFO("stream " << i);
        CHECK(fast[i].codes == slow[i].codes);
    }
}

TEST_CASE("cpu-fast sliced starts: a fault in a slice ends that stream alone; the playing one finishes intact",
          "[engine][faults][slice]") {
    const SpeechRequest playing = qtts_test::greedy_request("This stream plays on while the other one fails.", 60, kGreedySeed);
    const SpeechRequest victim = qtts_test::greedy_request(
        "The newcomer's start fails in one of its slices, long before its first audio comes.", 12, kGreedySeed + 1);
    std::vector<FrameCodes> alone;
    {
        Engine engine(cpu_fast_options(true));
        auto s = engine.submit(playing);
        read_all(*s);
        alone = qtts_test::stream_codes(*s);
    }
    EngineOptions options = cpu_fast_options(true);
    options.prefill_slice = 4;
    options.prefill_slice_by_deadline = false;
    Engine engine(options);
    engine_chunk_delay_set(engine, 30ms);
    auto a = engine.submit(playing);
    std::vector<float> pcm_a;
    std::thread reader([&] { pcm_a = read_all(*a); });
    REQUIRE(wait_for([&] { return a->metrics().frames >= 5; }));
    auto b = engine.submit(victim);
    REQUIRE(wait_for([&] { return engine.stats().prefill_slices >= 1; }));
    engine_fault_inject(engine, b->id());
    qtts_test::stream_read_all(*b);
    reader.join();
    REQUIRE(b->generation_done());
    CHECK(b->metrics().stop_reason == StopReason::STOP_ERROR);
    CHECK_THAT(b->error(), Catch::Contains("injected fault"));
    CHECK(b->metrics().frames == 0);
    CHECK(a->metrics().stop_reason == StopReason::STOP_MAX_FRAMES);
    CHECK(qtts_test::stream_codes(*a) == alone);
    CHECK(engine.healthy());
    const EngineStats stats = engine.stats();
    CHECK(stats.errors == 1);
    CHECK(stats.sliced_starts == 0);
    CHECK(stats.active_streams == 0);
}

TEST_CASE("sliced starts in an utterance: each segment's long start runs in slices, and it speaks the same",
          "[engine][slice]") {
    BackendOptions backend;
    backend.name = "cpu-fast";
    const auto model = SpeechModel::load(default_model_dir(), backend);
    // Two segments (as a text of more than 600 bytes gives; short ones here, so that their
    // frame budgets stay small): the second segment's ids appended to the first request's.
    PreparedSpeech prepared = model->prepare(qtts_test::greedy_request("A first sentence starts the text.", 0, kGreedySeed));
    const PreparedSpeech second = model->prepare(qtts_test::greedy_request("Then a second one ends it.", 0, kGreedySeed));
    prepared.segments.push_back(second.segments.at(0));
    REQUIRE(prepared.segments.size() >= 2);
    struct Spoken {
        std::vector<float> pcm;
        std::vector<FrameCodes> codes;
        int slices = 0;        // start_advance() calls
        int later_starts = 0;  // UTTERANCE_STARTING after the first frames: a later segment's start
    };
    const auto speak = [&](int slice) {
        Spoken out;
        Utterance u(model, prepared);
        u.start_slice_set(slice, slice > 0 ? 4 : 0);
        if (slice > 0) {
            CHECK(u.start_pending());  // the first segment's prompt is longer than the slice
            CHECK_FALSE(u.first_request().has_value());
            CHECK(u.first_candidate(1) == nullptr);  // starts nothing
            CHECK(u.start_pending());
        }
        for (int calls = 0; calls < 100000; ++calls) {
            const UtteranceStatus status = u.chunk(4, &out.pcm, &out.codes);
            if (status == UtteranceStatus::UTTERANCE_DONE) break;
            if (status == UtteranceStatus::UTTERANCE_STARTING) {
                REQUIRE(u.start_pending());
                if (u.frames() > 0 && u.start_rows_left() == 0) ++out.later_starts;
                const int left = u.start_rows_left();
                const int ran = u.start_advance();
                CHECK(ran >= 1);
                CHECK(ran <= slice);
                if (left > 0) CHECK(u.start_rows_left() == left - ran);
                ++out.slices;
                continue;
            }
            REQUIRE(status == UtteranceStatus::UTTERANCE_CHUNK);
        }
        return out;
    };
    const Spoken whole = speak(0);
    const Spoken sliced = speak(8);
    CHECK(whole.slices == 0);
    CHECK(sliced.later_starts == int(prepared.segments.size()) - 1);
    CHECK(sliced.slices >= 2 * int(prepared.segments.size()));
    CHECK(sliced.codes == whole.codes);
    CHECK(sliced.pcm == whole.pcm);  // the same chunks through the same decoder: bitwise
    WARN(prepared.segments.size() << " segments, " << whole.codes.size() << " frames, " << sliced.slices
                                  << " slices of 8 rows");
}

TEST_CASE("sliced starts: only backends whose prefill splits exactly slice; the option is checked where it enters",
          "[engine][slice]") {
    for (const char* name : {"cpu", "cpu-fast"}) {
        BackendOptions backend;
        backend.name = name;
        const auto model = SpeechModel::load(default_model_dir(), backend);
        CHECK(model->generator_new()->start_slices() == (std::string(name) == "cpu-fast"));
    }
    for (const int rows : {-1, PREFILL_SLICE_MAX + 1}) {
        EngineOptions options = cpu_fast_options(true);
        options.prefill_slice = rows;
        CHECK_THROWS_WITH(Engine(options), Catch::Contains("prefill_slice must be 0 (off) to 4096 prompt rows"));
    }
}
