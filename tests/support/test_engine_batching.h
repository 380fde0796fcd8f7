// The engine's batching rules, checked on any batching backend: what a test's readers heard from
// an engine's streams (EngineHeard), a run where newcomers join a running stream
// (speak_joining), and three scheduling cases written once for the backends that batch.
// test_engine runs them on the CPU (cpu-fast, the embedded demo model, in CI); test_gpu_runtime
// on CUDA (the tiny reference model, on a GPU machine). Each backend says how a batched stream
// must compare with the same stream on an engine without batching (SameSpeech): cpu-fast codes
// bitwise, CUDA within its products' rounding.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/api/qtts.h"
#include "engine/generation/frame.h"
#include "engine/runtime/engine_debug.h"
#include "test_streams.h"

namespace qtts_test {

// What a test's reader heard from one stream of an engine, and how the engine made it.
struct EngineHeard {
    std::vector<float> pcm;
    std::vector<qtts::FrameCodes> codes;
    std::string error;
    std::vector<qtts::EngineTraceEntry> trace;  // its chunks, when the test traced the engine
    uint64_t id = 0;
    qtts::StopReason stop = qtts::StopReason::STOP_NONE;
};

inline std::vector<qtts::FrameCodes> stream_codes(const qtts::Stream& s) {
    std::vector<qtts::FrameCodes> out;
    for (const auto& f : s.codes()) {
        qtts::FrameCodes c{};
        std::copy(f.begin(), f.end(), c.begin());
        out.push_back(c);
    }
    return out;
}

// requests[0] starts first; once its second chunk is heard (it is a steady stream then) the
// others are submitted, arriving while it runs (the engine pauses `pause` after each chunk, the
// slow-device seam); every stream is read to its end on its own thread. Each stream's speech,
// error, stop and traced chunks.
inline std::vector<EngineHeard> speak_joining(const qtts::EngineOptions& options,
                                              const std::vector<qtts::SpeechRequest>& requests,
                                              std::chrono::milliseconds pause, qtts::EngineStats* stats) {
    qtts::Engine engine(options);
    qtts::engine_trace_start(engine, 4096);
    qtts::engine_chunk_delay_set(engine, pause);
    std::vector<std::shared_ptr<qtts::Stream>> streams{engine.submit(requests[0])};
    std::vector<EngineHeard> heard(requests.size());
    std::vector<std::thread> readers;
    readers.emplace_back([&] { heard[0].pcm = stream_read_all(*streams[0]); });
    const int64_t first_chunk = int64_t(qtts::FIRST_CHUNK_FRAMES_DEFAULT) * qtts::SAMPLES_PER_FRAME;
    while (streams[0]->metrics().samples <= first_chunk) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (size_t i = 1; i < requests.size(); ++i) streams.push_back(engine.submit(requests[i]));
    for (size_t i = 1; i < requests.size(); ++i) readers.emplace_back([&, i] { heard[i].pcm = stream_read_all(*streams[i]); });
    for (auto& r : readers) r.join();
    const std::vector<qtts::EngineTraceEntry> trace = qtts::engine_trace_take(engine);
    for (size_t i = 0; i < streams.size(); ++i) {
        REQUIRE(streams[i]->finished());
        heard[i].error = streams[i]->error();
        heard[i].codes = stream_codes(*streams[i]);
        heard[i].id = streams[i]->id();
        heard[i].stop = streams[i]->metrics().stop_reason;
        for (const auto& t : trace)
            if (t.stream_id == heard[i].id) heard[i].trace.push_back(t);
        REQUIRE(!heard[i].trace.empty());
    }
    if (stats) *stats = engine.stats();
    return heard;
}

// Each stream ran to its frame cap (the test models do not stop sooner on the capped cases'
// sentences).
inline void ran_to_caps(const std::vector<EngineHeard>& heard, const std::vector<qtts::SpeechRequest>& requests) {
    REQUIRE(heard.size() == requests.size());
    for (size_t i = 0; i < heard.size(); ++i) {
        INFO("stream " << i);
        CHECK(heard[i].stop == qtts::StopReason::STOP_MAX_FRAMES);
        CHECK(int(heard[i].codes.size()) == requests[i].max_frames);
    }
}

// How a batched run (variant `variant` of the batched engine options) must compare with the same
// requests on an engine without batching.
using SameSpeech = std::function<void(const std::vector<EngineHeard>& batched, const std::vector<EngineHeard>& alone,
                                      const std::vector<qtts::SpeechRequest>& requests, size_t variant)>;

// A long stream keeps the engine busy (a 30 ms pause after each of its chunks), so three
// requests submitted during a pause all arrive for the same round: they start together
// (SpeechModel::batch_start), their first chunks come from one batched step (which the long
// stream, a steady one by then, joins with a one-frame chunk), and their second chunks from
// that round's steady step with it. `unbatched`: the reference engine; `batched`: the variants
// checked against it.
inline void newcomers_start_together(const qtts::EngineOptions& unbatched, const std::vector<qtts::EngineOptions>& batched,
                                     const SameSpeech& same, uint64_t greedy_seed) {
    std::vector<qtts::SpeechRequest> requests = {
        greedy_request("A long stream keeps the engine busy while the others arrive.", 40, greedy_seed),
        greedy_request("First newcomer.", 12, greedy_seed + 1),
        greedy_request("The second newcomer says more than that.", 20, greedy_seed + 2),
        greedy_request("Third newcomer, sampled.", 16, 5150),
    };
    requests[3].greedy = false;
    qtts::EngineStats alone_stats;
    const std::vector<EngineHeard> alone = speak_joining(unbatched, requests, std::chrono::milliseconds(30), &alone_stats);
    CHECK(alone_stats.batch_started == 0);
    for (size_t v = 0; v < batched.size(); ++v) {
        INFO("batched variant " << v);
        qtts::EngineStats batched_stats;
        const std::vector<EngineHeard> heard = speak_joining(batched[v], requests, std::chrono::milliseconds(30), &batched_stats);
        CHECK(batched_stats.batch_started == 3);  // the three newcomers started together
        // The newcomers' first chunks: one frame each, in the same round, made by a batched step;
        // then, in that round too, their second chunks in the steady step with the long stream.
        const uint64_t first_round = heard[1].trace.front().round;
        for (size_t i = 1; i < heard.size(); ++i) {
            INFO("newcomer " << i);
            const qtts::EngineTraceEntry& first = heard[i].trace.front();
            CHECK(first.frames == qtts::FIRST_CHUNK_FRAMES_DEFAULT);
            CHECK(first.round == first_round);
            CHECK(first.batched);
            CHECK_FALSE(alone[i].trace.front().batched);
            REQUIRE(heard[i].trace.size() >= 2);
            const qtts::EngineTraceEntry& second = heard[i].trace[1];
            CHECK(second.round == first_round);
            CHECK(second.frames == qtts::CHUNK_FRAMES_DEFAULT);
            CHECK(second.batched);
            CHECK(alone[i].trace[1].round > alone[i].trace[0].round);  // one chunk a round without batching
        }
        // The long stream in that round: a one-frame chunk from the newcomers' first step, then
        // its steady chunk from the steady step.
        std::vector<std::pair<int32_t, bool>> long_chunks;  // (frames, batched) in that round
        for (const qtts::EngineTraceEntry& t : heard[0].trace)
            if (t.round == first_round) long_chunks.emplace_back(t.frames, t.batched);
        const std::vector<std::pair<int32_t, bool>> joined = {{qtts::FIRST_CHUNK_FRAMES_DEFAULT, true},
                                                              {qtts::CHUNK_FRAMES_DEFAULT, true}};
        CHECK(long_chunks == joined);
        same(heard, alone, requests, v);
    }
}

// A long stream keeps a batch going; three newcomers capped at 1 + 4 + 2, 1 + 4 + 4 + 1 and
// 1 + 4 + 3 frames end with a chunk shorter than the engine's 4. Their stream joins the batched
// step for it (not a step of its own for its last frames), and its chunk keeps the frames up to
// its cap.
inline void capped_last_chunk_joins(const qtts::EngineOptions& unbatched, const std::vector<qtts::EngineOptions>& batched,
                                    const SameSpeech& same, uint64_t greedy_seed) {
    std::vector<qtts::SpeechRequest> requests = {
        greedy_request("A long stream keeps the batch going while the others end.", 40, greedy_seed),
        greedy_request("Seven frames.", 7, greedy_seed + 1),
        greedy_request("Ten frames, sampled.", 10, 6262),
        greedy_request("Eight frames here.", 8, greedy_seed + 3),
    };
    requests[2].greedy = false;
    const int last_chunk[] = {0, 2, 1, 3};
    const std::vector<EngineHeard> alone = speak_joining(unbatched, requests, std::chrono::milliseconds(10), nullptr);
    ran_to_caps(alone, requests);
    for (size_t v = 0; v < batched.size(); ++v) {
        INFO("batched variant " << v);
        const std::vector<EngineHeard> heard = speak_joining(batched[v], requests, std::chrono::milliseconds(10), nullptr);
        ran_to_caps(heard, requests);
        for (size_t i = 1; i < heard.size(); ++i) {
            INFO("capped stream " << i);
            const qtts::EngineTraceEntry& last = heard[i].trace.back();
            CHECK(last.frames == last_chunk[i]);
            CHECK(last.batched);
            CHECK(alone[i].trace.back().frames == last_chunk[i]);
            CHECK_FALSE(alone[i].trace.back().batched);
        }
        same(heard, alone, requests, v);
    }
}

// Three newcomers capped at 1 + 4 + 2, 1 + 4 + 1 and 1 + 4 + 2 frames arrive while a stream
// capped at 12 runs (it has made 5 frames then: with its one-frame chunk in their first step and
// its steady chunk, at most 2 are left to it after their round). In the round after, every stream
// of the step ends within it: the step makes 2 frames, not the engine's 4, and each keeps its own
// (2, 1, 2). (The sentences of the capped case above: the test models speak each past these caps.)
inline void step_trimmed_to_what_streams_keep(const qtts::EngineOptions& unbatched,
                                              const std::vector<qtts::EngineOptions>& batched, const SameSpeech& same,
                                              uint64_t greedy_seed) {
    std::vector<qtts::SpeechRequest> requests = {
        greedy_request("A long stream keeps the batch going while the others end.", 12, greedy_seed),
        greedy_request("Seven frames.", 7, greedy_seed + 1),
        greedy_request("Ten frames, sampled.", 6, 6262),
        greedy_request("Eight frames here.", 7, greedy_seed + 3),
    };
    requests[2].greedy = false;
    const int last_chunk[] = {0, 2, 1, 2};
    const std::vector<EngineHeard> alone = speak_joining(unbatched, requests, std::chrono::milliseconds(30), nullptr);
    ran_to_caps(alone, requests);
    for (size_t v = 0; v < batched.size(); ++v) {
        INFO("batched variant " << v);
        const std::vector<EngineHeard> heard = speak_joining(batched[v], requests, std::chrono::milliseconds(30), nullptr);
        ran_to_caps(heard, requests);
        for (size_t i = 0; i < heard.size(); ++i) {
            INFO("stream " << i);
            for (const qtts::EngineTraceEntry& t : heard[i].trace) {
                INFO("round " << t.round << ", " << t.frames << " frames");
                CHECK(t.batched == (t.step_frames > 0));
                if (t.batched) CHECK(t.step_frames >= t.frames);
            }
        }
        const uint64_t last_round = heard[1].trace.back().round;
        for (size_t i = 1; i < heard.size(); ++i) {
            INFO("capped newcomer " << i);
            const qtts::EngineTraceEntry& last = heard[i].trace.back();
            CHECK(last.round == last_round);
            CHECK(last.frames == last_chunk[i]);
            CHECK(last.ended);
            CHECK(last.step_frames == 2);  // the most any of them keeps, not CHUNK_FRAMES_DEFAULT
        }
        same(heard, alone, requests, v);
    }
}

}  // namespace qtts_test
