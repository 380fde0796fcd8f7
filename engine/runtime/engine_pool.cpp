// EnginePool: several engines in one process, one engine thread each, and the router in front
// of them (docs/server.md, "Several engines").
#include "engine/runtime/engine_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <tuple>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/strings.h"
#include "engine/model/make_model.h"

namespace qtts {

namespace {

constexpr int kDeviceMax = 63;  // CUDA device indices accepted in a target

const char* const kTargetsAccepted = "accepted: cpu, cpu-fast, cuda:N or a CUDA device index N (N in 0..63), comma-separated";

// Parses a device index: digits only, 0..kDeviceMax.
int device_parse(const std::string& text, const std::string& entry) {
    if (text.empty() || text.size() > 3 || !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "engine '{}': '{}' is not a device index; {}", entry, text, kTargetsAccepted);
    const int device = std::stoi(text);
    if (device > kDeviceMax)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "engine '{}': device index {} is out of range 0..{}", entry, device, kDeviceMax);
    return device;
}

bool is_cpu(const std::string& backend) { return backend == "cpu" || backend == "cpu-fast"; }

std::string target_text(const EngineTarget& t) {
    if (is_cpu(t.backend)) return t.backend;
    return t.backend + ":" + std::to_string(t.device);
}

// The label before loading: GPU engines by their device, CPU engines by their place in the list.
// "auto" becomes one or the other once loaded (label_loaded).
std::string label_planned(const EngineTarget& t, size_t index) {
    if (t.backend == "cuda") return "cuda:" + std::to_string(t.device);
    if (is_cpu(t.backend)) return t.backend + "#" + std::to_string(index);
    return "auto#" + std::to_string(index);
}

std::string label_loaded(const Engine& engine, size_t index) {
    const std::string backend = engine.backend_name();
    return is_cpu(backend) ? backend + "#" + std::to_string(index) : backend;
}

}  // namespace

std::vector<EngineTarget> engine_targets_parse(const std::string& list) {
    std::vector<EngineTarget> targets;
    if (ascii_trim(list).empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the engine list is empty; {} (e.g. cuda:0,cuda:1)", kTargetsAccepted);
    size_t start = 0;
    for (;;) {
        const size_t comma = list.find(',', start);
        const std::string entry = ascii_trim(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (entry.empty())
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "engine list '{}': entry {} is empty (a doubled or trailing comma?)", list,
                 targets.size() + 1);
        const std::string name = ascii_lower(entry);
        EngineTarget t;
        if (is_cpu(name)) {
            t.backend = name;
        } else if (name.rfind("cuda:", 0) == 0) {
            t.backend = "cuda";
            t.device = device_parse(name.substr(5), entry);
        } else if (name == "cuda") {
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "engine 'cuda': name the device, e.g. cuda:0");
        } else if (!name.empty() && name[0] >= '0' && name[0] <= '9') {
            t.backend = "cuda";
            t.device = device_parse(name, entry);
        } else {
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown engine '{}'; {}", entry, kTargetsAccepted);
        }
        targets.push_back(t);
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    engine_targets_validate(targets);
    return targets;
}

void engine_targets_validate(const std::vector<EngineTarget>& targets) {
    if (targets.empty()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "an engine pool needs at least one engine; {}", kTargetsAccepted);
    if (targets.size() > ENGINE_POOL_MAX_ENGINES)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{} engines asked for; at most {} in one process", targets.size(),
             ENGINE_POOL_MAX_ENGINES);
    for (size_t i = 0; i < targets.size(); ++i) {
        const EngineTarget& t = targets[i];
        if (!is_cpu(t.backend) && t.backend != "cuda" && t.backend != "auto")
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "engine {}: unknown backend '{}' (cpu, cpu-fast, cuda or auto)", i + 1,
                 t.backend);
        if (t.device < 0 || t.device > kDeviceMax)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "engine {}: device index {} is out of range 0..{}", i + 1, t.device, kDeviceMax);
        if (is_cpu(t.backend)) continue;
        // One engine per GPU: two would split its memory and its time, and each already batches.
        // ("auto" may become cuda:N, so it counts as that GPU.)
        for (size_t j = 0; j < i; ++j)
            if (!is_cpu(targets[j].backend) && targets[j].device == t.device)
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "CUDA device {} is listed twice ({} and {}); one engine per GPU",
                     t.device, target_text(targets[j]), target_text(t));
    }
}

const char* engine_state_name(EngineState state) {
    switch (state) {
        case EngineState::ENGINE_STATE_SERVING: return "serving";
        case EngineState::ENGINE_STATE_FAILED: return "failed";
        case EngineState::ENGINE_STATE_NOT_LOADED: return "not_loaded";
    }
    return "unknown";
}

std::vector<size_t> engine_route_order(const std::vector<RouteCandidate>& candidates, size_t rotation) {
    // Turns go round the engines that serve, so one that is out does not give its turns to the next.
    std::vector<size_t> serving;
    for (size_t i = 0; i < candidates.size(); ++i)
        if (candidates[i].serving) serving.push_back(i);
    const size_t n = serving.size();
    using Key = std::tuple<bool, bool, int64_t, double, size_t>;
    std::vector<std::pair<Key, size_t>> keyed;
    keyed.reserve(n);
    for (size_t k = 0; k < n; ++k) {
        const size_t i = serving[k];
        const RouteCandidate& c = candidates[i];
        const int64_t streams = c.load.active + c.load.queued;
        const bool full = streams >= c.load.max_streams;
        // An engine without streams is behind no one: its last rounds' factor is history (the
        // engine thread may not have cleared it yet when its last stream has just ended).
        const double rtf = streams > 0 ? c.load.rtf : 0.0;
        const bool lagging = rtf > ROUTE_LAGGING_RTF;
        const size_t turn = (k + n - rotation % n) % n;  // 0 for the engine whose turn it is
        keyed.push_back({Key{full, lagging, streams, rtf, turn}, i});
    }
    std::sort(keyed.begin(), keyed.end());
    std::vector<size_t> order;
    order.reserve(keyed.size());
    for (const auto& k : keyed) order.push_back(k.second);
    return order;
}

// ---------------------------------------------------------------------------------------------
// EnginePool
// ---------------------------------------------------------------------------------------------

struct EnginePool::Impl {
    struct Entry {
        EngineTarget target;
        std::string label;
        std::unique_ptr<Engine> engine;  // null when it failed to load
        std::string load_error;
        std::atomic<int64_t> routed{0};
    };
    std::vector<std::unique_ptr<Entry>> entries;  // fixed after the constructor
    std::atomic<size_t> rotation{0};
    int max_streams = 0;

    std::string failure_text() const {
        std::string text = "no engine serves:";
        for (const auto& e : entries) {
            const std::string why = e->engine ? e->engine->failure() : "not loaded: " + e->load_error;
            text += " " + e->label + ": " + (why.empty() ? "serving" : why) + ";";
        }
        text.pop_back();
        return text;
    }
    const Engine& first_loaded() const {
        for (const auto& e : entries)
            if (e->engine) return *e->engine;
        fail(ErrorCode::ERROR_INTERNAL, "an engine pool without a loaded engine");
    }
};

EnginePool::EnginePool(const EnginePoolOptions& options) : impl_(std::make_unique<Impl>()) {
    std::vector<EngineTarget> targets = options.targets;
    if (targets.empty()) targets.push_back(EngineTarget{options.engine.backend.name, options.engine.backend.device});
    engine_targets_validate(targets);
    EngineOptions base = options.engine;
    // Resolved once here: the engines load at the same time and must not each write the demo model.
    if (base.model_dir.empty()) base.model_dir = default_model_dir();
    impl_->max_streams = base.max_streams;

    std::vector<std::exception_ptr> errors(targets.size());
    for (size_t i = 0; i < targets.size(); ++i) {
        auto entry = std::make_unique<Impl::Entry>();
        entry->target = targets[i];
        entry->label = label_planned(targets[i], i);
        impl_->entries.push_back(std::move(entry));
    }
    // One thread per engine: each Engine constructor returns once its own engine thread has loaded
    // (and, on a GPU, warmed up) its model, so the engines load side by side.
    std::vector<std::thread> loaders;
    for (size_t i = 0; i < targets.size(); ++i) {
        loaders.emplace_back([&, i] {
            Impl::Entry& entry = *impl_->entries[i];
            EngineOptions o = base;
            o.backend.name = entry.target.backend;
            o.backend.device = entry.target.device;
            if (entry.target.backend != "auto") o.label = entry.label;
            try {
                entry.engine = std::make_unique<Engine>(o);
            } catch (const std::exception& e) {
                entry.load_error = e.what();
                errors[i] = std::current_exception();
            }
        });
    }
    for (auto& t : loaders) t.join();

    size_t loaded = 0;
    std::string names;
    for (size_t i = 0; i < targets.size(); ++i) {
        Impl::Entry& entry = *impl_->entries[i];
        if (!entry.engine) {
            if (targets.size() == 1) continue;  // its error is thrown below, as a single engine's
            const std::string target = target_text(entry.target);
            QTTS_LOG_ERROR("engine pool: {}{} failed to load and is left out: {}", entry.label,
                           target == entry.label ? std::string() : " (" + target + ")", entry.load_error);
            continue;
        }
        entry.label = label_loaded(*entry.engine, i);
        ++loaded;
        names += (names.empty() ? "" : ", ") + entry.label;
    }
    if (loaded == 0) {
        ErrorCode code = ErrorCode::ERROR_INTERNAL;
        try {
            std::rethrow_exception(errors[0]);
        } catch (const Error& e) {
            code = e.code();
        } catch (...) {
        }
        std::string reasons;
        for (const auto& e : impl_->entries) reasons += (reasons.empty() ? "" : "; ") + e->label + ": " + e->load_error;
        if (targets.size() == 1) std::rethrow_exception(errors[0]);  // one engine: its own error, as before
        fail(code, "none of the {} engines could be loaded: {}", targets.size(), reasons);
    }
    if (targets.size() > 1)
        QTTS_LOG_INFO("engine pool: {} of {} engines serve: {}", loaded, targets.size(), names);
}

EnginePool::~EnginePool() = default;  // each engine stops its own thread

std::shared_ptr<Stream> EnginePool::submit(const SpeechRequest& request) {
    const auto& entries = impl_->entries;
    std::vector<RouteCandidate> candidates(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
        const Engine* engine = entries[i]->engine.get();
        if (engine && engine->healthy()) candidates[i] = RouteCandidate{true, engine->load()};
    }
    const std::vector<size_t> order = engine_route_order(candidates, impl_->rotation.fetch_add(1));
    std::string busy;  // each refusing engine's reason: its stream limit or its real-time capacity
    for (const size_t i : order) {
        Engine& engine = *entries[i]->engine;
        try {
            std::shared_ptr<Stream> stream = engine.submit(request);
            entries[i]->routed.fetch_add(1);
            return stream;
        } catch (const Error& e) {
            // Full, or lost since the look above: the next engine may take it. Anything else is
            // the request's fault and every engine would say the same.
            if (e.code() == ErrorCode::ERROR_BUSY) {
                busy += (busy.empty() ? "" : "; ") + entries[i]->label + ": " + e.what();
                continue;
            }
            if (!engine.healthy()) continue;
            throw;
        }
    }
    if (!busy.empty()) fail(ErrorCode::ERROR_BUSY, "every engine is busy: {}", busy);
    fail(ErrorCode::ERROR_CUDA, "{}", impl_->failure_text());
}

std::vector<EngineStatus> EnginePool::status() const {
    std::vector<EngineStatus> out;
    out.reserve(impl_->entries.size());
    for (const auto& e : impl_->entries) {
        EngineStatus s;
        s.label = e->label;
        s.routed = e->routed.load();
        if (!e->engine) {
            s.backend = target_text(e->target);
            s.state = EngineState::ENGINE_STATE_NOT_LOADED;
            s.error = e->load_error;
        } else {
            s.backend = e->engine->backend_name();
            s.error = e->engine->failure();
            s.state = s.error.empty() ? EngineState::ENGINE_STATE_SERVING : EngineState::ENGINE_STATE_FAILED;
            s.load = e->engine->load();
            s.stats = e->engine->stats();
        }
        out.push_back(std::move(s));
    }
    return out;
}

size_t EnginePool::size() const { return impl_->entries.size(); }

Engine* EnginePool::engine(size_t index) const {
    if (index >= impl_->entries.size())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "engine {} of a pool of {}", index, impl_->entries.size());
    return impl_->entries[index]->engine.get();
}

bool EnginePool::healthy() const {
    for (const auto& e : impl_->entries)
        if (e->engine && e->engine->healthy()) return true;
    return false;
}

std::string EnginePool::failure() const { return healthy() ? std::string() : impl_->failure_text(); }

ModelInfo EnginePool::model_info() const { return impl_->first_loaded().model_info(); }
std::vector<std::string> EnginePool::speakers() const { return impl_->first_loaded().speakers(); }
std::vector<std::string> EnginePool::languages() const { return impl_->first_loaded().languages(); }

std::string EnginePool::backend_name() const {
    std::string names;
    for (const auto& e : impl_->entries)
        if (e->engine) names += (names.empty() ? "" : ",") + e->engine->backend_name();
    return names;
}

}  // namespace qtts
