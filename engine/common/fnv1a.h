// FNV-1a, 64-bit: a cheap, stable hash for checksums and fingerprints (not cryptographic).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qtts {

struct Fnv1a {
    uint64_t h = 1469598103934665603ull;
    void add(const void* data, size_t n) {
        const auto* p = static_cast<const uint8_t*>(data);
        for (size_t i = 0; i < n; ++i) {
            h ^= p[i];
            h *= 1099511628211ull;
        }
    }
    void add_string(const std::string& s) {
        const uint64_t n = s.size();
        add(&n, sizeof(n));
        add(s.data(), s.size());
    }
};

}  // namespace qtts
