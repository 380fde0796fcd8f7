#include "engine/text/request_check.h"

#include <algorithm>
#include <cctype>
#include <limits>

#include "engine/common/error.h"
#include "engine/text/tokenizer.h"

namespace qtts {

void text_check(std::string_view text, std::string_view field, size_t max_bytes, size_t bytes_before) {
    if (!utf8_is_valid(text)) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "`{}` is not valid UTF-8", field);
    const size_t total = bytes_before + text.size();
    if (total <= max_bytes) return;
    if (bytes_before == 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "`{}` is {} bytes long; the limit is {} bytes (UTF-8)", field, total,
             max_bytes);
    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "`{}` would reach {} bytes with this piece; the limit is {} bytes (UTF-8)",
         field, total, max_bytes);
}

std::string seed_range_message(const std::string& got) {
    return "`seed` must be an integer from 0 to " + std::to_string(std::numeric_limits<uint64_t>::max()) +
           " (2^64-1), got " + got;
}

uint64_t seed_parse(const std::string& text) {
    const bool digits =
        !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
    if (!digits) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}", seed_range_message("'" + text + "'"));
    uint64_t value = 0;
    for (const char c : text) {
        const uint64_t digit = uint64_t(c - '0');
        if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}", seed_range_message("'" + text + "'"));
        value = value * 10 + digit;
    }
    return value;
}

}  // namespace qtts
