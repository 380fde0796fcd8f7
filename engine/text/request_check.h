// The checks every edge applies to what a person typed into a request: the text rule (valid
// UTF-8, a byte limit) and the seed range. One function per rule, so Engine::submit,
// Stream::text_append, the server's fields and the command line refuse the same input with the
// same message; inside the engine the checked text is trusted (asserted, not checked again).
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qtts {

// The text rule: `text` must be valid UTF-8 (utf8_is_valid, engine/text/tokenizer.h) and, with
// `bytes_before` bytes of the same request already accepted (incremental text), hold at most
// `max_bytes` bytes in all. Throws qtts::Error(ERROR_INVALID_ARGUMENT) naming `field`:
//   "`text` is not valid UTF-8"
//   "`text` is 1048577 bytes long; the limit is 1048576 bytes (UTF-8)"
//   "`text` would reach 210 bytes with this piece; the limit is 200 bytes (UTF-8)"
// The library's limits are REQUEST_MAX_TEXT_BYTES / REQUEST_MAX_INSTRUCT_BYTES (engine/api/qtts.h);
// a server passes its own smaller option.
void text_check(std::string_view text, std::string_view field, size_t max_bytes, size_t bytes_before = 0);

// The one seed range of every entry point (qtts say --seed, the server's `seed` field): an integer
// from 0 to 2^64-1, the engine's whole seed space. Reads decimal text (digits only, as the command
// line gives it); throws qtts::Error(ERROR_INVALID_ARGUMENT) with seed_range_message for anything
// else, negative numbers included.
uint64_t seed_parse(const std::string& text);
// "`seed` must be an integer from 0 to 18446744073709551615 (2^64-1), got <got>"
std::string seed_range_message(const std::string& got);

}  // namespace qtts
