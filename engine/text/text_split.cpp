#include "engine/text/text_split.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <string>

#include "engine/common/error.h"
#include "engine/text/tokenizer.h"

namespace qtts {

namespace {

struct Span {
    size_t begin;
    size_t end;
};

// Decodes the code point at text[i] of well-formed UTF-8 (the input is sanitised first) and
// stores its byte length in len.
uint32_t cp_at(std::string_view text, size_t i, size_t& len) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const unsigned char b = p[i];
    if (b < 0x80) {
        len = 1;
        return b;
    }
    len = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    uint32_t cp = len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
    return cp;
}

// Start of the code point that ends just before position i (i > 0).
size_t cp_start_before(std::string_view text, size_t i) {
    do {
        --i;
    } while (i > 0 && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80);
    return i;
}

bool is_newline(uint32_t cp) { return cp == '\n' || cp == '\r' || cp == 0x85 || cp == 0x2028 || cp == 0x2029; }

bool is_space(uint32_t cp) {
    return cp == ' ' || cp == '\t' || cp == '\v' || cp == '\f' || is_newline(cp) || cp == 0xA0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200A) || cp == 0x202F || cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

// Full-width sentence ends: a boundary wherever they occur (CJK has no spaces between sentences).
bool is_cjk_terminator(uint32_t cp) { return cp == 0x3002 || cp == 0xFF01 || cp == 0xFF1F || cp == 0xFF61; }

// May continue a terminator run ("?!", "...", "。。").
bool is_terminator_run(uint32_t cp) {
    return cp == '.' || cp == '!' || cp == '?' || cp == 0x2026 || cp == 0x203D || is_cjk_terminator(cp);
}

// Closing quotes and brackets that belong to the sentence they close.
bool is_closer(uint32_t cp) {
    switch (cp) {
        case '"': case '\'': case ')': case ']': case '}':
        case 0x2019: case 0x201D: case 0x00BB: case 0x300D: case 0x300F: case 0xFF09:
        case 0x3011: case 0x300B: case 0x3009: case 0x3015: case 0xFF02: case 0xFF07:
            return true;
        default:
            return false;
    }
}

// Scripts written without spaces: an ASCII '.'/'!'/'?' directly followed by one still ends a
// sentence.
bool is_cjk(uint32_t cp) {
    return (cp >= 0x2E80 && cp <= 0x9FFF) || (cp >= 0xAC00 && cp <= 0xD7AF) || (cp >= 0xF900 && cp <= 0xFAFF) ||
           (cp >= 0xFF00 && cp <= 0xFFEF) || cp >= 0x20000;
}

// Clause marks, preferred cut points inside an over-long sentence.
bool is_clause_mark(uint32_t cp) {
    return cp == ',' || cp == ';' || cp == ':' || cp == 0xFF0C || cp == 0x3001 || cp == 0xFF1B || cp == 0xFF1A ||
           cp == 0x2014;
}

bool is_letter(uint32_t cp) {
    const utf8proc_category_t c = utf8proc_category(utf8proc_int32_t(cp));
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT ||
           c == UTF8PROC_CATEGORY_LM || c == UTF8PROC_CATEGORY_LO;
}

// Abbreviations after which '.' never ends a sentence (compared lower-case, without the dot).
constexpr std::array<const char*, 23> TITLE_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "mt", "rev", "hon", "gen", "col",
    "lt", "sgt", "capt", "gov", "sen", "rep", "messrs", "mme", "mlle"};
// Abbreviations that do not end a sentence when a number follows ("No. 5", "Fig. 3").
constexpr std::array<const char*, 14> NUMBER_ABBREVIATIONS = {
    "no", "nos", "fig", "figs", "eq", "p", "pp", "vol", "ch", "sec", "art", "approx", "ca", "nr"};

template <size_t N>
bool word_in(const std::string& lower, const std::array<const char*, N>& list) {
    return std::any_of(list.begin(), list.end(), [&](const char* w) { return lower == w; });
}

// Decides whether the single '.' at text[dot] (followed, after closers, by whitespace or the end)
// ends a sentence. next_visible is the first non-space code point after it (0 at the end).
bool period_ends_sentence(std::string_view text, size_t dot, uint32_t next_visible) {
    // The word before the dot: letters and inner dots ("e.g", "U.S", "Dr").
    size_t word_begin = dot;
    while (word_begin > 0) {
        const size_t prev = cp_start_before(text, word_begin);
        size_t len = 0;
        const uint32_t cp = cp_at(text, prev, len);
        if (!is_letter(cp) && cp != '.') break;
        word_begin = prev;
    }
    const std::string_view word = text.substr(word_begin, dot - word_begin);
    if (!word.empty()) {
        std::string lower;
        for (char c : word) lower += char(std::tolower(static_cast<unsigned char>(c)));
        if (word.find('.') != std::string_view::npos) return false;     // e.g. / i.e. / U.S.
        if (word_in(lower, TITLE_ABBREVIATIONS)) return false;          // Dr. Smith
        if (word.size() == 1 && word[0] >= 'A' && word[0] <= 'Z' && word[0] != 'I') return false;  // J. K. Rowling
        if (next_visible >= '0' && next_visible <= '9' && word_in(lower, NUMBER_ABBREVIATIONS)) return false;
    }
    // "approx. five", "etc. and so on": a lower-case continuation is not a new sentence.
    if (next_visible != 0 && utf8proc_category(utf8proc_int32_t(next_visible)) == UTF8PROC_CATEGORY_LL) return false;
    return true;
}

// Sentence spans (untrimmed, possibly blank) of sanitised text.
std::vector<Span> sentence_spans(std::string_view text) {
    std::vector<Span> spans;
    const size_t n = text.size();
    size_t start = 0;
    size_t i = 0;
    while (i < n) {
        size_t len = 0;
        const uint32_t cp = cp_at(text, i, len);
        if (is_newline(cp)) {
            spans.push_back({start, i});
            start = i + len;
            i += len;
            continue;
        }
        if (!is_terminator_run(cp) || cp == 0x2026 || cp == 0x203D) {
            i += len;
            continue;
        }
        // A run of terminators, then closing quotes/brackets.
        size_t j = i;
        size_t run_length = 0;
        bool run_has_cjk = false;
        while (j < n) {
            size_t l = 0;
            const uint32_t c = cp_at(text, j, l);
            if (!is_terminator_run(c)) break;
            run_has_cjk = run_has_cjk || is_cjk_terminator(c);
            ++run_length;
            j += l;
        }
        while (j < n) {
            size_t l = 0;
            if (!is_closer(cp_at(text, j, l))) break;
            j += l;
        }
        bool boundary = run_has_cjk;
        if (!boundary) {
            size_t l = 0;
            const uint32_t after = j < n ? cp_at(text, j, l) : 0;
            if (j == n || is_space(after) || is_cjk(after)) {
                boundary = true;
                if (cp == '.' && run_length == 1) {
                    size_t k = j;
                    uint32_t next_visible = 0;
                    while (k < n) {
                        size_t lk = 0;
                        const uint32_t c = cp_at(text, k, lk);
                        if (!is_space(c)) {
                            next_visible = c;
                            break;
                        }
                        k += lk;
                    }
                    boundary = period_ends_sentence(text, i, next_visible);
                }
            }
        }
        if (boundary) {
            spans.push_back({start, j});
            start = j;
        }
        i = j;
    }
    spans.push_back({start, n});
    return spans;
}

// Shrinks a span to exclude leading and trailing whitespace.
Span span_trim(std::string_view text, Span s) {
    while (s.begin < s.end) {
        size_t len = 0;
        if (!is_space(cp_at(text, s.begin, len))) break;
        s.begin += len;
    }
    while (s.end > s.begin) {
        const size_t prev = cp_start_before(text, s.end);
        size_t len = 0;
        if (!is_space(cp_at(text, prev, len))) break;
        s.end = prev;
    }
    return s;
}

// Where to cut the trimmed span s (longer than max_bytes): a position in (s.begin, s.begin + max_bytes].
size_t cut_position(std::string_view text, Span s, size_t max_bytes) {
    const size_t limit = s.begin + max_bytes;
    size_t last_clause = 0, last_space = 0, last_boundary = 0;
    size_t i = s.begin;
    while (i <= limit && i < s.end) {
        size_t len = 0;
        const uint32_t cp = cp_at(text, i, len);
        if (i > s.begin) {
            const utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(cp));
            // Never separate a combining mark from its base.
            if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC && cat != UTF8PROC_CATEGORY_ME) last_boundary = i;
            if (is_space(cp)) last_space = i;
        }
        if (is_clause_mark(cp) && i + len <= limit) {
            // ASCII clause marks count only before a space ("1,000" and "12:30" stay whole).
            size_t l2 = 0;
            const bool ascii = cp < 0x80;
            if (!ascii || (i + len < s.end && is_space(cp_at(text, i + len, l2)))) last_clause = i + len;
        }
        i += len;
    }
    if (last_clause > s.begin && last_clause - s.begin >= max_bytes / 2) return last_clause;
    if (last_space > s.begin) return last_space;
    if (last_boundary > s.begin) return last_boundary;
    // max_bytes is smaller than the first character: emit it whole (its code point and any
    // combining marks after it).
    size_t len = 0;
    cp_at(text, s.begin, len);
    size_t end = s.begin + len;
    while (end < s.end) {
        const utf8proc_category_t cat = utf8proc_category(utf8proc_int32_t(cp_at(text, end, len)));
        if (cat != UTF8PROC_CATEGORY_MN && cat != UTF8PROC_CATEGORY_MC && cat != UTF8PROC_CATEGORY_ME) break;
        end += len;
    }
    return end;
}

}  // namespace

std::vector<std::string> text_sentences(std::string_view input) {
    const std::string text = utf8_sanitize(input);
    std::vector<std::string> sentences;
    for (Span s : sentence_spans(text)) {
        s = span_trim(text, s);
        if (s.end > s.begin) sentences.emplace_back(text.substr(s.begin, s.end - s.begin));
    }
    return sentences;
}

std::vector<std::string> text_split_sentences(std::string_view input, size_t max_bytes) {
    if (max_bytes == 0) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text_split_sentences: max_bytes must be at least 1");
    const std::string text = utf8_sanitize(input);
    std::vector<std::string> chunks;
    bool have_chunk = false;
    Span chunk{0, 0};
    auto chunk_flush = [&]() {
        if (have_chunk) chunks.emplace_back(text.substr(chunk.begin, chunk.end - chunk.begin));
        have_chunk = false;
    };
    // Adds a trimmed piece of at most max_bytes, merging it into the open chunk when it fits.
    auto piece_add = [&](Span piece) {
        if (have_chunk && piece.end - chunk.begin <= max_bytes) {
            chunk.end = piece.end;
            return;
        }
        chunk_flush();
        chunk = piece;
        have_chunk = true;
    };
    for (Span s : sentence_spans(text)) {
        s = span_trim(text, s);
        while (s.end - s.begin > max_bytes) {
            const size_t cut = cut_position(text, s, max_bytes);
            const Span head = span_trim(text, {s.begin, cut});
            if (head.end > head.begin) piece_add(head);
            s = span_trim(text, {cut, s.end});
        }
        if (s.end > s.begin) piece_add(s);
    }
    chunk_flush();
    return chunks;
}

bool text_is_blank(std::string_view text) {
    return std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isspace(c) != 0; });
}

}  // namespace qtts
