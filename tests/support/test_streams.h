// Engine streams and requests in tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/api/qtts.h"

namespace qtts_test {

// A greedy request (deterministic codes) for `text`, at most max_frames frames (0: the budget rule).
inline qtts::SpeechRequest greedy_request(const std::string& text, int max_frames, uint64_t seed) {
    qtts::SpeechRequest r;
    r.text = text;
    r.greedy = true;
    r.seed = seed;
    r.max_frames = max_frames;
    return r;
}

// Reads a stream until it is finished or `limit` has passed (no test assertions inside, so it
// may run on any thread); the caller checks s.finished().
inline std::vector<float> stream_read_all(qtts::Stream& s, std::chrono::seconds limit = std::chrono::seconds(120)) {
    std::vector<float> out;
    std::vector<float> buf(4096);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (!s.finished() && std::chrono::steady_clock::now() < deadline) {
        const size_t n = s.read(buf.data(), buf.size());
        out.insert(out.end(), buf.begin(), buf.begin() + long(n));
        if (n == 0) s.wait(std::chrono::milliseconds(20));
    }
    return out;
}

}  // namespace qtts_test
