// Engine streams and requests in tests.
#pragma once

#include <array>
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

// The batching tests' five requests: three greedy (seeds greedy_seed, +1, +2) and two sampled with
// seeds of their own (the per-stream random stream must survive batching), different sentences
// and lengths, capped at `frames`; the fifth is the one that joins while the first four run.
inline std::vector<qtts::SpeechRequest> batch_mix_requests(const std::array<int, 5>& frames, uint64_t greedy_seed) {
    std::vector<qtts::SpeechRequest> r = {
        greedy_request("The first stream speaks this sentence.", frames[0], greedy_seed),
        greedy_request("A second, somewhat longer sentence for the batch!", frames[1], greedy_seed + 1),
        greedy_request("Third.", frames[2], greedy_seed + 2),
        greedy_request("The fourth stream samples its codes.", frames[3], 4242),
        greedy_request("A latecomer joins the running batch.", frames[4], 777),
    };
    r[3].greedy = false;
    r[4].greedy = false;
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
