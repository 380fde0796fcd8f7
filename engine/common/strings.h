// Small string helpers shared by every layer.
#pragma once

#include <algorithm>
#include <cctype>
#include <string>

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

}  // namespace qtts
