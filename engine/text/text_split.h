// Splitting long input text into chunks that are synthesised one after another. A chunk ends
// at a sentence boundary whenever possible, so that prosody resets where a reader would pause.
// The rules are in docs/text-frontend.md ("Long text").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace qtts {

// Default chunk limit: ~600 bytes is 100-150 English words or ~200 CJK characters, well
// inside what the talker handles without drifting, and short enough that the first chunk starts
// playing quickly.
constexpr size_t TEXT_SPLIT_DEFAULT_MAX_BYTES = 600;

// True when text is empty or only ASCII whitespace: nothing to speak (requests refuse it).
bool text_is_blank(std::string_view text);

// The sentences of text, trimmed of surrounding whitespace, empty ones dropped. Boundaries:
// newlines; '.', '!', '?' runs followed by whitespace, the end, or a CJK character (not inside
// numbers like 3.14 or after abbreviations such as "e.g." or "Dr."); '。', '！', '？' anywhere.
// Closing quotes and brackets after the punctuation stay with the sentence. Invalid UTF-8 is
// replaced by U+FFFD first.
std::vector<std::string> text_sentences(std::string_view text);

// Chunks of at most max_bytes bytes: consecutive sentences are merged while they fit (the chunk
// is the original text from the first sentence's start to the last one's end), and a sentence
// longer than max_bytes is cut at a clause mark (, ; : and CJK equivalents) or whitespace, else at
// a code point boundary. Empty or whitespace-only text gives an empty list. Throws qtts::Error
// (ERROR_INVALID_ARGUMENT) when max_bytes is 0. A single character (a code point with its
// combining marks) longer than max_bytes becomes a chunk of its own, the only case where a chunk
// exceeds the limit.
std::vector<std::string> text_split_sentences(std::string_view text, size_t max_bytes = TEXT_SPLIT_DEFAULT_MAX_BYTES);

}  // namespace qtts
