// Several engines in one process (EnginePool): the engine list syntax, the routing policy on
// made-up load numbers, and real CPU engines (the embedded demo model): spreading, limits, an
// engine lost mid-run, an engine that does not load.
#include <catch2/catch.hpp>

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/api/qtts.h"
#include "engine/common/device.h"
#include "engine/runtime/engine_debug.h"
#include "engine/runtime/engine_pool.h"
#include "test_streams.h"

using namespace qtts;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kSeed = 11;

std::string target_text(const EngineTarget& t) { return t.backend + ":" + std::to_string(t.device); }

std::vector<std::string> targets_text(const std::vector<EngineTarget>& targets) {
    std::vector<std::string> out;
    for (const auto& t : targets) out.push_back(t.backend == "cpu" ? "cpu" : target_text(t));
    return out;
}

void check_refused(const std::string& list, const std::string& reason) {
    INFO("list: '" << list << "'");
    try {
        engine_targets_parse(list);
        FAIL("accepted");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
        CHECK_THAT(e.what(), Catch::Contains(reason));
    }
}

RouteCandidate serving(int64_t active, int64_t queued, double rtf, int max_streams = 16) {
    RouteCandidate c;
    c.serving = true;
    c.load.active = active;
    c.load.queued = queued;
    c.load.rtf = rtf;
    c.load.max_streams = max_streams;
    return c;
}

EnginePoolOptions cpu_pool(int engines, int max_streams) {
    EnginePoolOptions o;
    o.engine.max_streams = max_streams;
    o.targets.assign(size_t(engines), EngineTarget{"cpu", 0});
    return o;
}

template <typename Pred>
bool wait_until(Pred pred) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!pred() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
    return pred();
}

// Waits (bounded) until the stream's generation ended.
void wait_done(Stream& s) {
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!s.generation_done() && std::chrono::steady_clock::now() < deadline) {
        std::vector<float> sink(8192);
        while (s.read(sink.data(), sink.size()) > 0) {
        }
        s.wait(20ms);
    }
    REQUIRE(s.generation_done());
}

std::vector<int64_t> routed(const EnginePool& pool) {
    std::vector<int64_t> out;
    for (const auto& s : pool.status()) out.push_back(s.routed);
    return out;
}

// An incremental request that speaks its first words, then waits for more text: it stays on its
// engine until closed or cancelled, whatever the machine's speed.
SpeechRequest waiting_request() {
    SpeechRequest r = qtts_test::greedy_request("Hello there.", 200, kSeed);
    r.incremental = true;
    return r;
}

}  // namespace

TEST_CASE("engine lists: cpu, cuda:N and bare device indices; bad lists are refused naming the problem", "[unit][pool]") {
    CHECK(targets_text(engine_targets_parse("cuda:0,cuda:1")) == std::vector<std::string>{"cuda:0", "cuda:1"});
    CHECK(targets_text(engine_targets_parse("0,1")) == std::vector<std::string>{"cuda:0", "cuda:1"});
    CHECK(targets_text(engine_targets_parse(" CPU , Cuda:3 ")) == std::vector<std::string>{"cpu", "cuda:3"});
    CHECK(targets_text(engine_targets_parse("cpu,cpu,cuda:0")) == std::vector<std::string>{"cpu", "cpu", "cuda:0"});
    CHECK(targets_text(engine_targets_parse("63")) == std::vector<std::string>{"cuda:63"});

    check_refused("", "the engine list is empty");
    check_refused("  ", "the engine list is empty");
    check_refused("0,,1", "entry 2 is empty");
    check_refused("0,", "entry 2 is empty");
    check_refused("cuda", "name the device, e.g. cuda:0");
    check_refused("gpu:0", "unknown engine 'gpu:0'");
    check_refused("cuda:x", "'x' is not a device index");
    check_refused("cuda:-1", "'-1' is not a device index");
    check_refused("1.5", "is not a device index");
    check_refused("cuda:64", "device index 64 is out of range 0..63");
    check_refused("0,cuda:0", "CUDA device 0 is listed twice");
    check_refused("cpu,cuda:2,2", "CUDA device 2 is listed twice");
    std::string many = "cpu";
    for (int i = 0; i < 16; ++i) many += ",cpu";
    check_refused(many, "17 engines asked for; at most 16");

    // The same rule for lists made in code: "auto" may become cuda:N, so it counts as that GPU.
    CHECK_THROWS_WITH(engine_targets_validate({{"auto", 0}, {"cuda", 0}}), Catch::Contains("CUDA device 0 is listed twice"));
    CHECK_THROWS_WITH(engine_targets_validate({}), Catch::Contains("at least one engine"));
    CHECK_THROWS_WITH(engine_targets_validate({{"tpu", 0}}), Catch::Contains("unknown backend 'tpu'"));
    CHECK_NOTHROW(engine_targets_validate({{"cpu", 0}, {"cpu", 0}}));
}

TEST_CASE("routing policy: fewest streams first, lagging and full engines later, ties round-robin", "[unit][pool]") {
    using Order = std::vector<size_t>;
    const std::vector<RouteCandidate> idle = {serving(0, 0, 0.0), serving(0, 0, 0.0), serving(0, 0, 0.0)};
    CHECK(engine_route_order(idle, 0) == Order{0, 1, 2});
    CHECK(engine_route_order(idle, 1) == Order{1, 2, 0});
    CHECK(engine_route_order(idle, 5) == Order{2, 0, 1});

    // Streams count whether running or still queued.
    CHECK(engine_route_order({serving(2, 0, 0.3), serving(0, 0, 0.0), serving(0, 1, 0.0)}, 0) == Order{1, 2, 0});
    CHECK(engine_route_order({serving(0, 2, 0.0), serving(1, 0, 0.2)}, 0) == Order{1, 0});
    // Equally busy: the one with the lower real-time factor, whoever's turn it is.
    CHECK(engine_route_order({serving(1, 0, 0.30), serving(1, 0, 0.10)}, 0) == Order{1, 0});
    // An engine whose streams fall behind real time comes after one that keeps up, even a busier one.
    CHECK(engine_route_order({serving(1, 0, 1.5), serving(3, 0, 0.4)}, 0) == Order{1, 0});
    CHECK(engine_route_order({serving(1, 0, 1.0), serving(2, 0, 0.4)}, 0) == Order{0, 1});  // 1.0 is not behind
    // No streams, no lag: a factor left from the last rounds of an engine that just went idle is ignored.
    CHECK(engine_route_order({serving(1, 0, 0.2), serving(0, 0, 3.0)}, 0) == Order{1, 0});
    CHECK(engine_route_order({serving(0, 0, 0.5), serving(0, 0, 0.0)}, 0) == Order{0, 1});
    // A full engine would refuse: it is tried last, after a lagging one.
    CHECK(engine_route_order({serving(4, 0, 0.1, 4), serving(2, 0, 2.0, 4)}, 0) == Order{1, 0});
    CHECK(engine_route_order({serving(3, 1, 0.1, 4), serving(3, 0, 0.1, 4)}, 0) == Order{1, 0});
    // Engines that do not serve are never tried.
    std::vector<RouteCandidate> some = {serving(0, 0, 0.0), RouteCandidate{}, serving(5, 0, 0.2)};
    CHECK(engine_route_order(some, 1) == Order{0, 2});
    CHECK(engine_route_order({RouteCandidate{}, RouteCandidate{}}, 0).empty());
    // Turns go round the engines that serve: with the middle one out, the other two alternate.
    const std::vector<RouteCandidate> gap = {serving(0, 0, 0.0), RouteCandidate{}, serving(0, 0, 0.0)};
    for (size_t rotation = 0; rotation < 4; ++rotation)
        CHECK(engine_route_order(gap, rotation).front() == (rotation % 2 == 0 ? 0u : 2u));
}

TEST_CASE("a pool of CPU engines: labels, round-robin when idle, the least-loaded one when busy, limits",
          "[unit][pool]") {
    EnginePool pool(cpu_pool(2, 2));
    REQUIRE(pool.size() == 2);
    REQUIRE(pool.healthy());
    CHECK(pool.failure().empty());
    CHECK(pool.backend_name() == "cpu,cpu");
    const auto status = pool.status();
    CHECK(status[0].label == "cpu#0");
    CHECK(status[1].label == "cpu#1");
    CHECK(status[0].state == EngineState::ENGINE_STATE_SERVING);
    CHECK(status[1].backend == "cpu");
    CHECK(pool.model_info().speakers == pool.engine(1)->speakers());

    // Idle engines take turns: four requests one after another, two each.
    std::set<uint64_t> ids;
    for (int i = 0; i < 4; ++i) {
        auto s = pool.submit(qtts_test::greedy_request("Hi.", 2, kSeed));
        ids.insert(s->id());
        wait_done(*s);
        CHECK(s->error().empty());
    }
    CHECK(routed(pool) == std::vector<int64_t>{2, 2});
    CHECK(ids.size() == 4);  // stream ids are unique across engines
    CHECK(pool.status()[0].stats.completed == 2);
    CHECK(pool.status()[1].stats.completed == 2);

    // Busy engines: each new stream goes to the engine with fewer, so two waiting streams land on
    // both, and two more fill both to their limit of 2.
    std::vector<std::shared_ptr<Stream>> held;
    held.push_back(pool.submit(waiting_request()));
    held.push_back(pool.submit(waiting_request()));
    CHECK(routed(pool) == std::vector<int64_t>{3, 3});
    CHECK(pool.engine(0)->load().active + pool.engine(0)->load().queued == 1);
    held.push_back(pool.submit(waiting_request()));
    held.push_back(pool.submit(waiting_request()));
    CHECK(routed(pool) == std::vector<int64_t>{4, 4});
    // Every engine full: the server's busy error, naming the limit.
    try {
        pool.submit(waiting_request());
        FAIL("a fifth stream was accepted by two engines of 2 streams each");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_BUSY);
        CHECK_THAT(e.what(), Catch::Contains("every engine is busy"));
        CHECK_THAT(e.what(), Catch::Contains("at its limit of 2 concurrent streams"));
    }
    // A bad request is refused at once, as by one engine, and not counted as busy.
    try {
        pool.submit(qtts_test::greedy_request("", 2, kSeed));
        FAIL("empty text was accepted");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
    }
    // One engine frees a slot: the next stream goes there, whoever's turn it is.
    held[0]->cancel();
    wait_done(*held[0]);
    // (held[0] went to engine 0, whose turn it was; engine 1 is still full.)
    held.push_back(pool.submit(waiting_request()));
    CHECK(routed(pool) == std::vector<int64_t>{5, 4});
    for (auto& s : held) s->cancel();
    for (auto& s : held) wait_done(*s);
    CHECK(pool.engine(0)->load().active == 0);
    CHECK(pool.engine(1)->load().active == 0);
    // Idle again: no real-time factor to report (set by the engine thread after its last stream).
    CHECK(wait_until([&] { return pool.engine(0)->load().rtf == 0.0 && pool.engine(1)->load().rtf == 0.0; }));
}

TEST_CASE("an engine whose backend is lost mid-run: its stream ends with an error, the other engine serves on",
          "[unit][pool][faults]") {
    EnginePool pool(cpu_pool(2, 4));
    auto a = pool.submit(waiting_request());
    auto b = pool.submit(waiting_request());
    REQUIRE(routed(pool) == std::vector<int64_t>{1, 1});
    // Which stream went where: the pool put one on each; a went first, to the engine whose turn it was (0).
    std::shared_ptr<Stream> on_lost = a, on_kept = b;

    engine_fault_inject_fatal(*pool.engine(0));
    wait_done(*on_lost);
    CHECK(on_lost->metrics().stop_reason == StopReason::STOP_ERROR);
    CHECK_THAT(on_lost->error(), Catch::Contains("injected fault") && Catch::Contains("serves no more streams"));

    CHECK_FALSE(on_kept->generation_done());
    on_kept->text_close();
    wait_done(*on_kept);
    CHECK(on_kept->error().empty());
    CHECK(on_kept->metrics().stop_reason != StopReason::STOP_ERROR);

    const auto status = pool.status();
    CHECK(status[0].state == EngineState::ENGINE_STATE_FAILED);
    CHECK_THAT(status[0].error, Catch::Contains("injected fault"));
    CHECK(status[0].stats.errors == 1);
    CHECK(status[1].state == EngineState::ENGINE_STATE_SERVING);
    CHECK(pool.healthy());
    CHECK(pool.failure().empty());

    // New streams all go to the engine that serves.
    for (int i = 0; i < 3; ++i) {
        auto s = pool.submit(qtts_test::greedy_request("Hi.", 2, kSeed));
        wait_done(*s);
        CHECK(s->error().empty());
    }
    CHECK(routed(pool) == std::vector<int64_t>{1, 4});

    // The last engine goes too: nothing serves, and submit says why for each engine.
    engine_fault_inject_fatal(*pool.engine(1));
    REQUIRE(wait_until([&] { return !pool.engine(1)->healthy(); }));
    CHECK_FALSE(pool.healthy());
    CHECK_THAT(pool.failure(), Catch::Contains("no engine serves: cpu#0:") && Catch::Contains("cpu#1:"));
    try {
        pool.submit(qtts_test::greedy_request("Hi.", 2, kSeed));
        FAIL("a pool with no engine serving accepted a request");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_CUDA);
        CHECK_THAT(e.what(), Catch::Contains("no engine serves"));
    }
}

TEST_CASE("an engine that fails to load is left out; the pool serves with the rest, and fails when none loads",
          "[unit][pool]") {
    // Device 63 exists on no machine this runs on (and this build may have no CUDA at all).
    REQUIRE(cuda_device_count() <= 63);
    EnginePoolOptions options = cpu_pool(1, 2);
    options.targets.push_back(EngineTarget{"cuda", 63});
    EnginePool pool(options);
    REQUIRE(pool.size() == 2);
    CHECK(pool.engine(1) == nullptr);
    const auto status = pool.status();
    CHECK(status[0].state == EngineState::ENGINE_STATE_SERVING);
    CHECK(status[1].label == "cuda:63");
    CHECK(status[1].state == EngineState::ENGINE_STATE_NOT_LOADED);
    CHECK_THAT(status[1].error, Catch::Contains("device 63"));
    CHECK(pool.healthy());
    CHECK(pool.backend_name() == "cpu");
    auto s = pool.submit(qtts_test::greedy_request("Hi.", 2, kSeed));
    wait_done(*s);
    CHECK(s->error().empty());
    CHECK(routed(pool) == std::vector<int64_t>{1, 0});

    EnginePoolOptions none;
    none.targets = {EngineTarget{"cuda", 62}, EngineTarget{"cuda", 63}};
    try {
        EnginePool broken(none);
        FAIL("a pool without a loadable engine was made");
    } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::ERROR_UNSUPPORTED);
        CHECK_THAT(e.what(), Catch::Contains("none of the 2 engines could be loaded: cuda:62: ") &&
                                 Catch::Contains("cuda:63: "));
    }
}
