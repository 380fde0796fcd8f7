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

}  // namespace qtts
