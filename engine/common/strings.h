// Small string helpers shared by every layer.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

namespace qtts {

// ASCII lower case (names of speakers, languages, formats, devices; UTF-8 bytes past ASCII are
// left as they are).
inline std::string ascii_lower(std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    return s;
}

// s without the ASCII spaces and tabs around it (list entries such as " cuda:1 ").
inline std::string ascii_trim(const std::string& s) {
    const size_t first = s.find_first_not_of(" \t");
    if (first == std::string::npos) return "";
    return s.substr(first, s.find_last_not_of(" \t") - first + 1);
}

// The whole numbers of a comma-separated list ("1,4,10"; spaces around entries allowed), each in
// [lo, hi], appended to *out. False on an empty list, an entry that is not a whole number ("4a",
// ""), or one out of range; *out then holds the entries read before it and *bad (when given) the
// entry refused.
inline bool int_list_parse(const std::string& text, int lo, int hi, std::vector<int>* out, std::string* bad = nullptr) {
    size_t start = 0;
    for (;;) {
        const size_t comma = text.find(',', start);
        const size_t len = comma == std::string::npos ? std::string::npos : comma - start;
        const std::string item = ascii_trim(text.substr(start, len));
        char* end = nullptr;
        errno = 0;
        const long v = item.empty() ? 0 : std::strtol(item.c_str(), &end, 10);
        if (item.empty() || errno != 0 || *end != '\0' || v < lo || v > hi) {
            if (bad) *bad = item;
            return false;
        }
        out->push_back(int(v));
        if (comma == std::string::npos) return true;
        start = comma + 1;
    }
}

}  // namespace qtts
