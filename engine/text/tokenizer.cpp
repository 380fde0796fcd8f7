// Qwen2 byte-level BPE. See tokenizer.h for the pipeline and docs/text-frontend.md for the
// behaviour on edge cases (invalid UTF-8, added tokens, long input).
#include "engine/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts {

namespace {

// ---------------------------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------------------------

constexpr char UTF8_REPLACEMENT[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 sequence at s[i], or, when it is ill-formed, minus the length
// of its maximal subpart (the bytes that started a valid sequence before it broke; at least 1).
int utf8_sequence_length(const unsigned char* s, size_t n, size_t i) {
    const unsigned char b0 = s[i];
    if (b0 < 0x80) return 1;
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode Table 3-7)
    if (b0 >= 0xC2 && b0 <= 0xDF) {
        need = 1;
    } else if (b0 == 0xE0) {
        need = 2, lo = 0xA0;
    } else if ((b0 >= 0xE1 && b0 <= 0xEC) || b0 == 0xEE || b0 == 0xEF) {
        need = 2;
    } else if (b0 == 0xED) {
        need = 2, hi = 0x9F;  // excludes UTF-16 surrogates
    } else if (b0 == 0xF0) {
        need = 3, lo = 0x90;
    } else if (b0 >= 0xF1 && b0 <= 0xF3) {
        need = 3;
    } else if (b0 == 0xF4) {
        need = 3, hi = 0x8F;  // nothing above U+10FFFF
    } else {
        return -1;  // 0x80..0xC1, 0xF5..0xFF never start a sequence
    }
    for (int k = 1; k <= need; ++k) {
        if (i + k >= n) return -k;
        const unsigned char b = s[i + k];
        const unsigned char min = k == 1 ? lo : 0x80;
        const unsigned char max = k == 1 ? hi : 0xBF;
        if (b < min || b > max) return -k;
    }
    return need + 1;
}

// Byte length of the code point starting with lead byte b (well-formed input only).
inline int utf8_lead_length(unsigned char b) {
    if (b < 0x80) return 1;
    if (b < 0xE0) return 2;
    if (b < 0xF0) return 3;
    return 4;
}

// GPT-2's reversible byte -> printable code point map: bytes that are printable and not
// whitespace map to themselves, the other 68 to U+0100 onwards in byte order.
std::array<uint32_t, 256> bytes_to_unicode() {
    std::array<uint32_t, 256> map{};
    uint32_t next_extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
        map[b] = printable ? b : next_extra++;
    }
    return map;
}

void utf8_append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out += char(cp);
    } else if (cp < 0x800) {
        out += char(0xC0 | (cp >> 6));
        out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out += char(0xE0 | (cp >> 12));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    } else {
        out += char(0xF0 | (cp >> 18));
        out += char(0x80 | ((cp >> 12) & 0x3F));
        out += char(0x80 | ((cp >> 6) & 0x3F));
        out += char(0x80 | (cp & 0x3F));
    }
}

// Decodes one code point of well-formed UTF-8 at s[i]; advances i.
uint32_t utf8_next(std::string_view s, size_t& i) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const int len = utf8_lead_length(p[i]);
    uint32_t cp = len == 1 ? p[i] : len == 2 ? (p[i] & 0x1F) : len == 3 ? (p[i] & 0x0F) : (p[i] & 0x07);
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
    i += size_t(len);
    return cp;
}

// ---------------------------------------------------------------------------------------------
// NFC
// ---------------------------------------------------------------------------------------------

std::string nfc_full(std::string_view text) {
    if (text.empty()) return std::string();
    utf8proc_uint8_t* result = nullptr;
    const utf8proc_ssize_t rc =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()), utf8proc_ssize_t(text.size()), &result,
                     utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (rc < 0) {
        std::free(result);
        fail(ErrorCode::ERROR_INTERNAL, "NFC normalisation failed: {}", utf8proc_errmsg(rc));
    }
    std::string out(reinterpret_cast<const char*>(result), size_t(rc));
    std::free(result);
    return out;
}

// Code points below this limit have an "inert" flag; all canonical decompositions live below it.
constexpr uint32_t NFC_TABLE_LIMIT = 0x30000;

// inert[cp]: cp is unchanged by NFC, is a starter (ccc 0), and can never be the second half of a
// composition, nor starts with one when decomposed. A string can then be cut just before an
// inert code point and the two parts normalised separately, and a run of inert code points is
// already NFC. That lets utf8proc run only on the few regions that may change (combining
// marks, Hangul jamo, compatibility ideographs...), instead of on all text.
const std::vector<bool>& nfc_inert_table() {
    static const std::vector<bool> table = [] {
        std::vector<bool> maybe_second(NFC_TABLE_LIMIT, false);
        std::vector<bool> not_inert(NFC_TABLE_LIMIT, false);
        std::vector<uint32_t> first_of(NFC_TABLE_LIMIT, 0);  // first code point of the decomposition
        for (uint32_t cp = 0; cp < NFC_TABLE_LIMIT; ++cp) {
            if (cp >= 0xD800 && cp <= 0xDFFF) {
                not_inert[cp] = true;
                continue;
            }
            first_of[cp] = cp;
            if (utf8proc_get_property(utf8proc_int32_t(cp))->combining_class != 0) not_inert[cp] = true;
            utf8proc_int32_t parts[32];
            int boundclass = 0;
            const utf8proc_ssize_t count = utf8proc_decompose_char(utf8proc_int32_t(cp), parts, 32,
                                                                   UTF8PROC_DECOMPOSE, &boundclass);
            if (count <= 0 || (count == 1 && uint32_t(parts[0]) == cp)) continue;  // no canonical decomposition
            first_of[cp] = uint32_t(parts[0]);
            for (utf8proc_ssize_t k = 1; k < count; ++k)
                if (uint32_t(parts[k]) < NFC_TABLE_LIMIT) maybe_second[uint32_t(parts[k])] = true;
            const bool hangul_syllable = cp >= 0xAC00 && cp <= 0xD7A3;  // always NFC
            if (!hangul_syllable) {
                std::string single;
                utf8_append(single, cp);
                if (nfc_full(single) != single) not_inert[cp] = true;
            }
        }
        std::vector<bool> inert(NFC_TABLE_LIMIT, false);
        for (uint32_t cp = 0; cp < NFC_TABLE_LIMIT; ++cp) {
            const uint32_t first = first_of[cp];
            inert[cp] = !not_inert[cp] && !maybe_second[cp] && !(first < NFC_TABLE_LIMIT && maybe_second[first]);
        }
        return inert;
    }();
    return table;
}

// NFC of well-formed UTF-8. Returns text itself when it is already normalised (the common
// case), otherwise a view of storage.
std::string_view nfc_apply(std::string_view text, std::string& storage) {
    const std::vector<bool>& inert = nfc_inert_table();
    auto is_inert = [&](uint32_t cp) { return cp < NFC_TABLE_LIMIT && inert[cp]; };
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    bool changed = false;
    size_t copied = 0;                    // text[0, copied) is already in storage (when changed)
    size_t last_inert = std::string::npos;  // start of the latest inert code point
    size_t i = 0;
    while (i < n) {
        if (p[i] < 0x80) {
            last_inert = i++;
            continue;
        }
        size_t next = i;
        const uint32_t cp = utf8_next(text, next);
        if (is_inert(cp)) {
            last_inert = i;
            i = next;
            continue;
        }
        // A region that may change: from the starter before it to the next inert code point.
        const size_t region_begin = last_inert == std::string::npos ? 0 : last_inert;
        size_t region_end = next;
        while (region_end < n) {
            if (p[region_end] < 0x80) break;
            size_t after = region_end;
            if (is_inert(utf8_next(text, after))) break;
            region_end = after;
        }
        const std::string_view region = text.substr(region_begin, region_end - region_begin);
        const std::string normalised = nfc_full(region);
        if (normalised != region) {
            if (!changed) {
                storage.clear();
                storage.reserve(n + 16);
                changed = true;
            }
            storage.append(text.data() + copied, region_begin - copied);
            storage += normalised;
            copied = region_end;
        }
        i = region_end;
    }
    if (!changed) return text;
    storage.append(text.data() + copied, n - copied);
    return storage;
}

// ---------------------------------------------------------------------------------------------
// Pre-tokenizer regexes
// ---------------------------------------------------------------------------------------------

// The HF tokenizer runs these regexes with Oniguruma, whose Unicode \s is the White_Space
// property. PCRE2 10.42's \s under UCP leaves out U+0085, so the class is spelled out to make
// the match independent of the PCRE2 version.
constexpr const char* WS = "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}"
                           "\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

std::string regex_source(PretokenizerRegex regex) {
    const std::string ws = WS;
    // Shared tail: numbers one digit at a time, punctuation runs, newline runs, whitespace.
    auto tail = [&](const char* punct_trailer) {
        return std::string("|\\p{N}| ?[^") + ws + "\\p{L}\\p{N}]+" + punct_trailer + "|[" + ws + "]*[\\r\\n]+|[" +
               ws + "]+(?![^" + ws + "])|[" + ws + "]+";
    };
    switch (regex) {
        case PretokenizerRegex::PRETOKENIZER_QWEN2:
            // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*
            // |\s*[\r\n]+|\s+(?!\S)|\s+
            return std::string("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+") + tail("[\\r\\n]*");
        case PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX:
            // Case-aware letter runs (camelCase splits, marks stay with their letters), no
            // contraction alternative, and '/' may trail a punctuation run.
            return std::string(
                       "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
                       "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*") +
                   tail("[\\r\\n/]*");
    }
    fail(ErrorCode::ERROR_INTERNAL, "unknown pretokenizer regex {}", int(regex));
}

struct Pcre2CodeDeleter {
    void operator()(pcre2_code* code) const { pcre2_code_free(code); }
};
struct Pcre2MatchDataDeleter {
    void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

std::unique_ptr<pcre2_code, Pcre2CodeDeleter> regex_compile(PretokenizerRegex regex) {
    const std::string source = regex_source(regex);
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.c_str()), source.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error_code, &error_offset, nullptr);
    if (!code) {
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(error_code, message, sizeof(message));
        fail(ErrorCode::ERROR_INTERNAL, "pretokenizer regex '{}' does not compile at offset {}: {}",
             pretokenizer_regex_name(regex), error_offset, reinterpret_cast<const char*>(message));
    }
    uint32_t jit_available = 0;
    pcre2_config(PCRE2_CONFIG_JIT, &jit_available);
    if (jit_available) {
        const int rc = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
        if (rc != 0) QTTS_LOG_DEBUG("tokenizer: PCRE2 JIT compile failed ({}); using the interpreter", rc);
    }
    return std::unique_ptr<pcre2_code, Pcre2CodeDeleter>(code);
}

// ---------------------------------------------------------------------------------------------
// Files
// ---------------------------------------------------------------------------------------------

std::string file_read(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorCode::ERROR_NOT_FOUND, "tokenizer file {} cannot be opened", path.string());
    std::ostringstream buffer;
    buffer << in.rdbuf();
    if (in.bad()) fail(ErrorCode::ERROR_IO, "reading tokenizer file {} failed", path.string());
    return buffer.str();
}

nlohmann::json json_read(const std::filesystem::path& path) {
    const std::string text = file_read(path);
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorCode::ERROR_FORMAT, "{} is not valid JSON: {}", path.string(), e.what());
    }
}

inline uint64_t pair_key(int32_t left, int32_t right) {
    return (uint64_t(uint32_t(left)) << 32) | uint32_t(right);
}

// Reads vocab.json (one flat object of token -> id) with a SAX parser: building the DOM of
// 151k entries first would cost more than the rest of the load together.
class VocabSax : public nlohmann::json_sax<nlohmann::json> {
public:
    explicit VocabSax(std::unordered_map<std::string, int32_t>& tokens) : tokens_(tokens) {}
    std::string error;

    bool null() override { return unexpected("null"); }
    bool boolean(bool) override { return unexpected("a boolean"); }
    bool number_integer(number_integer_t value) override { return id_add(value); }
    bool number_unsigned(number_unsigned_t value) override {
        return id_add(value > number_unsigned_t(INT32_MAX) ? -1 : number_integer_t(value));
    }
    bool number_float(number_float_t, const string_t&) override { return unexpected("a fractional number"); }
    bool string(string_t&) override { return unexpected("a string"); }
    bool binary(binary_t&) override { return unexpected("binary data"); }
    bool start_object(std::size_t) override { return ++depth_ == 1 || unexpected("a nested object"); }
    bool end_object() override {
        --depth_;
        return true;
    }
    bool start_array(std::size_t) override { return unexpected("an array"); }
    bool end_array() override { return true; }
    bool key(string_t& value) override {
        key_ = std::move(value);
        return true;
    }
    bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
        error = fmt::format("not valid JSON at byte {}: {}", position, e.what());
        return false;
    }

private:
    bool id_add(number_integer_t value) {
        if (depth_ != 1) return unexpected("a bare number");
        if (value < 0 || value > INT32_MAX) {
            error = fmt::format("token '{}' has id {}, expected 0..{}", key_, value, INT32_MAX);
            return false;
        }
        tokens_[key_] = int32_t(value);
        return true;
    }
    bool unexpected(const char* what) {
        error = depth_ >= 1 ? fmt::format("token '{}' maps to {}, expected an integer id", key_, what)
                            : fmt::format("found {}, expected an object mapping token strings to ids", what);
        return false;
    }
    std::unordered_map<std::string, int32_t>& tokens_;
    std::string key_;
    int depth_ = 0;
};

void vocab_read(const std::filesystem::path& path, std::unordered_map<std::string, int32_t>& tokens) {
    const std::string text = file_read(path);
    tokens.reserve(text.size() / 12);
    VocabSax sax(tokens);
    const bool ok = nlohmann::json::sax_parse(text, &sax);
    if (!ok || !sax.error.empty())
        fail(ErrorCode::ERROR_FORMAT, "{}: {}", path.string(), sax.error.empty() ? "malformed" : sax.error);
    if (tokens.empty()) fail(ErrorCode::ERROR_FORMAT, "{} holds no tokens", path.string());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Tables (read-only after load) and the cache
// ---------------------------------------------------------------------------------------------

struct Tokenizer::Impl {
    PretokenizerRegex regex = PretokenizerRegex::PRETOKENIZER_QWEN2;
    std::unique_ptr<pcre2_code, Pcre2CodeDeleter> regex_code;

    std::unordered_map<std::string, int32_t> token_ids;  // vocab.json: byte-level string -> id
    std::vector<std::string> id_tokens;                  // [vocab_size] string of each id ("" = gap)
    std::vector<std::string> id_bytes;                   // [vocab_size] raw bytes of byte-level ids
    std::vector<int8_t> id_kinds;                        // [vocab_size] ID_KIND_*
    std::array<int32_t, 256> byte_ids{};                 // id of the single-byte token of each byte
    std::array<int32_t, 324> unicode_bytes{};            // byte-level code point -> byte (-1: none)

    struct MergeRule {
        int32_t rank;
        int32_t merged_id;
    };
    std::unordered_map<uint64_t, MergeRule> merges;  // (left id, right id) -> rule

    std::vector<AddedToken> added;
    std::unordered_map<std::string, int32_t> added_ids;
    std::array<std::vector<int32_t>, 256> added_by_first_byte;  // indices into added, longest first

    // Pre-token -> ids cache. Keys and ids live in two flat arenas so that a lookup allocates
    // nothing; entries are found by a 64-bit hash and confirmed by comparing the bytes.
    struct CacheEntry {
        uint32_t key_offset;
        uint32_t key_length;
        uint32_t ids_offset;
        uint32_t ids_length;
    };
    size_t cache_capacity = 0;
    mutable std::mutex cache_mutex;
    mutable std::unordered_map<uint64_t, CacheEntry> cache;
    mutable std::string cache_keys;            // [sum of key lengths] bytes
    mutable std::vector<int32_t> cache_ids;    // [sum of id counts]

    static constexpr int8_t ID_KIND_NONE = 0;
    static constexpr int8_t ID_KIND_BYTE_LEVEL = 1;
    static constexpr int8_t ID_KIND_ADDED = 2;

    // Calls on_piece(begin, end, added_index) for each plain segment (added_index -1) and each
    // added token of text, in order. An added token may match at byte i only when
    // may_match(i, length) says so. Linear: each position tests only the added tokens that
    // start with its byte, and token length is bounded.
    template <typename MayMatch, typename Fn>
    void added_split(std::string_view text, MayMatch&& may_match, Fn&& on_piece) const;

    // Appends the ids of text (valid UTF-8) to ids; added tokens as may_match allows.
    template <typename MayMatch>
    void ids_append(std::string_view text, MayMatch&& may_match, std::vector<int32_t>& ids) const;

    // NFC + regex pre-tokenisation of one plain segment.
    template <typename Fn>
    void segment_pretokenize(std::string_view segment, Fn&& on_pretoken) const;

    void pretoken_encode(std::string_view piece, std::vector<int32_t>& out) const;
    void bpe_merge(std::string_view piece, std::vector<int32_t>& out) const;
};

template <typename MayMatch, typename Fn>
void Tokenizer::Impl::added_split(std::string_view text, MayMatch&& may_match, Fn&& on_piece) const {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t segment_begin = 0;
    size_t i = 0;
    while (i < n) {
        const auto& candidates = added_by_first_byte[p[i]];
        int32_t found = -1;
        for (int32_t index : candidates) {  // longest first: the first hit is the longest match
            const std::string& content = added[size_t(index)].content;
            if (content.size() <= n - i && std::memcmp(text.data() + i, content.data(), content.size()) == 0 &&
                may_match(i, content.size())) {
                found = index;
                break;
            }
        }
        if (found < 0) {
            ++i;
            continue;
        }
        const AddedToken& token = added[size_t(found)];
        size_t segment_end = i;
        if (token.lstrip) {
            while (segment_end > segment_begin && std::isspace(p[segment_end - 1])) --segment_end;
        }
        if (segment_end > segment_begin) on_piece(segment_begin, segment_end, -1);
        on_piece(i, i + token.content.size(), found);
        i += token.content.size();
        if (token.rstrip) {
            while (i < n && std::isspace(p[i])) ++i;
        }
        segment_begin = i;
    }
    if (n > segment_begin) on_piece(segment_begin, n, -1);
}

template <typename Fn>
void Tokenizer::Impl::segment_pretokenize(std::string_view segment, Fn&& on_pretoken) const {
    std::string storage;
    segment = nfc_apply(segment, storage);
    std::unique_ptr<pcre2_match_data, Pcre2MatchDataDeleter> match(
        pcre2_match_data_create_from_pattern(regex_code.get(), nullptr));
    if (!match) fail(ErrorCode::ERROR_INTERNAL, "out of memory creating PCRE2 match data");
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(segment.data());
    const size_t n = segment.size();
    size_t offset = 0;
    while (offset < n) {
        // The segment was validated once; PCRE2_NO_UTF_CHECK keeps each call O(match length)
        // instead of re-validating the whole subject (which would be quadratic).
        const int rc = pcre2_match(regex_code.get(), subject, n, offset, PCRE2_NO_UTF_CHECK, match.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) {
            on_pretoken(segment.substr(offset));  // "Isolated" split keeps unmatched text
            break;
        }
        if (rc < 0) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(rc, message, sizeof(message));
            fail(ErrorCode::ERROR_INTERNAL, "pretokenizer regex match failed at byte {}: {}", offset,
                 reinterpret_cast<const char*>(message));
        }
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
        const size_t begin = ovector[0];
        size_t end = ovector[1];
        if (begin > offset) on_pretoken(segment.substr(offset, begin - offset));
        if (end == begin) {
            // Cannot happen with these patterns (no alternative matches empty); step one code
            // point so that a future pattern cannot loop forever.
            end = begin + size_t(utf8_lead_length(subject[begin]));
            on_pretoken(segment.substr(begin, end - begin));
        } else {
            on_pretoken(segment.substr(begin, end - begin));
        }
        offset = end;
    }
}

void Tokenizer::Impl::pretoken_encode(std::string_view piece, std::vector<int32_t>& out) const {
    if (piece.size() == 1) {
        out.push_back(byte_ids[(unsigned char)piece[0]]);
        return;
    }
    // Long pieces (a run of letters without spaces) rarely repeat; caching them would only
    // evict useful entries.
    constexpr size_t CACHE_MAX_PIECE = 64;
    const bool cacheable = cache_capacity > 0 && piece.size() <= CACHE_MAX_PIECE;
    uint64_t hash = 0;
    if (cacheable) {
        hash = std::hash<std::string_view>()(piece);
        std::lock_guard<std::mutex> lock(cache_mutex);
        auto it = cache.find(hash);
        if (it != cache.end()) {
            const CacheEntry& e = it->second;
            if (std::string_view(cache_keys).substr(e.key_offset, e.key_length) == piece) {
                out.insert(out.end(), cache_ids.begin() + e.ids_offset, cache_ids.begin() + e.ids_offset + e.ids_length);
                return;
            }
        }
    }
    const size_t first = out.size();
    bpe_merge(piece, out);
    if (cacheable) {
        std::lock_guard<std::mutex> lock(cache_mutex);
        // Entries are few (pieces <= 64 bytes) but the capacity is user-set: also bound the
        // arenas so their 32-bit offsets never overflow.
        if (cache.size() >= cache_capacity || cache_keys.size() > (size_t(1) << 30) ||
            cache_ids.size() > (size_t(1) << 30)) {
            cache.clear();
            cache_keys.clear();
            cache_ids.clear();
        }
        const CacheEntry entry{uint32_t(cache_keys.size()), uint32_t(piece.size()), uint32_t(cache_ids.size()),
                               uint32_t(out.size() - first)};
        if (cache.emplace(hash, entry).second) {  // a (rare) hash collision keeps the older entry
            cache_keys.append(piece);
            cache_ids.insert(cache_ids.end(), out.begin() + long(first), out.end());
        }
    }
}

// BPE of one pre-token: start from one symbol per byte and repeatedly merge the adjacent pair
// with the lowest merge rank (leftmost on ties), as the HF BPE model does. Symbols form a
// doubly linked list; candidate pairs wait in a min-heap and are re-checked when popped, so a
// word of n bytes costs O(n log n) instead of the O(n^2) of rescanning after every merge.
void Tokenizer::Impl::bpe_merge(std::string_view piece, std::vector<int32_t>& out) const {
    const int32_t n = int32_t(piece.size());
    // Short pieces (nearly every word) take an allocation-free path: the ranks of adjacent pairs
    // sit in an array, each merge rescans it and looks up only the two pairs it changed. Same
    // order of merges as the heap below.
    constexpr int32_t SHORT_PIECE = 24;
    if (n <= SHORT_PIECE) {
        std::array<int32_t, SHORT_PIECE> ids{};     // [count] live symbols, in order
        std::array<int32_t, SHORT_PIECE> ranks{};   // [count - 1] rank of (ids[i], ids[i+1]), INT32_MAX: none
        std::array<int32_t, SHORT_PIECE> merged{};  // [count - 1] id the pair merges into
        int32_t count = n;
        auto pair_rank = [&](int32_t i) {
            auto it = merges.find(pair_key(ids[size_t(i)], ids[size_t(i + 1)]));
            ranks[size_t(i)] = it == merges.end() ? INT32_MAX : it->second.rank;
            merged[size_t(i)] = it == merges.end() ? -1 : it->second.merged_id;
        };
        for (int32_t i = 0; i < n; ++i) ids[size_t(i)] = byte_ids[(unsigned char)piece[size_t(i)]];
        for (int32_t i = 0; i + 1 < n; ++i) pair_rank(i);
        while (count > 1) {
            int32_t best_at = 0;
            for (int32_t i = 1; i + 1 < count; ++i)
                if (ranks[size_t(i)] < ranks[size_t(best_at)]) best_at = i;  // strict: leftmost on ties
            if (ranks[size_t(best_at)] == INT32_MAX) break;
            ids[size_t(best_at)] = merged[size_t(best_at)];
            for (int32_t i = best_at + 1; i + 1 < count; ++i) {
                ids[size_t(i)] = ids[size_t(i + 1)];
                ranks[size_t(i)] = ranks[size_t(i + 1)];
                merged[size_t(i)] = merged[size_t(i + 1)];
            }
            --count;
            if (best_at + 1 < count) pair_rank(best_at);
            if (best_at > 0) pair_rank(best_at - 1);
        }
        out.insert(out.end(), ids.begin(), ids.begin() + count);
        return;
    }
    std::vector<int32_t> symbol_ids(size_t(n), 0);  // [n] current token id of each symbol
    std::vector<int32_t> prev(size_t(n), 0);        // [n] index of the previous live symbol, -1 at start
    std::vector<int32_t> next(size_t(n), 0);        // [n] index of the next live symbol, -1 at end
    for (int32_t i = 0; i < n; ++i) {
        symbol_ids[size_t(i)] = byte_ids[(unsigned char)piece[size_t(i)]];
        prev[size_t(i)] = i - 1;
        next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    }

    struct Candidate {
        int32_t rank;
        int32_t left;  // symbol index of the pair's left half
        int32_t left_id;
        int32_t right_id;
        bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    auto candidate_push = [&](int32_t left) {
        const int32_t right = next[size_t(left)];
        if (left < 0 || right < 0) return;
        const int32_t a = symbol_ids[size_t(left)], b = symbol_ids[size_t(right)];
        auto it = merges.find(pair_key(a, b));
        if (it != merges.end()) queue.push(Candidate{it->second.rank, left, a, b});
    };
    for (int32_t i = 0; i + 1 < n; ++i) candidate_push(i);

    while (!queue.empty()) {
        const Candidate top = queue.top();
        queue.pop();
        const int32_t left = top.left;
        const int32_t right = next[size_t(left)];
        // Stale when either half has merged since the pair was queued (their ids changed).
        if (right < 0 || symbol_ids[size_t(left)] != top.left_id || symbol_ids[size_t(right)] != top.right_id) continue;
        symbol_ids[size_t(left)] = merges.at(pair_key(top.left_id, top.right_id)).merged_id;
        symbol_ids[size_t(right)] = -1;  // dead: never equals a queued id
        next[size_t(left)] = next[size_t(right)];
        if (next[size_t(left)] >= 0) prev[size_t(next[size_t(left)])] = left;
        if (prev[size_t(left)] >= 0) candidate_push(prev[size_t(left)]);
        candidate_push(left);
    }
    for (int32_t i = 0; i >= 0; i = next[size_t(i)]) out.push_back(symbol_ids[size_t(i)]);
}

// ---------------------------------------------------------------------------------------------
// Loading
// ---------------------------------------------------------------------------------------------

Tokenizer::Tokenizer(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::load(const std::string& model_dir, const TokenizerOptions& options) {
    namespace fs = std::filesystem;
    const fs::path dir(model_dir);
    if (!fs::is_directory(dir)) fail(ErrorCode::ERROR_NOT_FOUND, "tokenizer: model directory '{}' does not exist", model_dir);
    auto impl = std::make_shared<Impl>();
    impl->regex = options.regex;
    impl->cache_capacity = options.cache_entries;

    const std::array<uint32_t, 256> byte_to_cp = bytes_to_unicode();
    impl->unicode_bytes.fill(-1);
    for (int b = 0; b < 256; ++b) impl->unicode_bytes[byte_to_cp[size_t(b)]] = b;

    // vocab.json: {"token": id}
    const fs::path vocab_path = dir / "vocab.json";
    vocab_read(vocab_path, impl->token_ids);
    int32_t max_id = -1;
    for (const auto& entry : impl->token_ids) max_id = std::max(max_id, entry.second);

    // tokenizer_config.json: added_tokens_decoder {"id": {"content": ..., "special": ...}}
    const fs::path config_path = dir / "tokenizer_config.json";
    const nlohmann::json config = json_read(config_path);
    if (config.contains("added_tokens_decoder")) {
        const auto& decoder = config.at("added_tokens_decoder");
        if (!decoder.is_object()) fail(ErrorCode::ERROR_FORMAT, "{}: added_tokens_decoder must be an object", config_path.string());
        for (const auto& [id_text, entry] : decoder.items()) {
            AddedToken token;
            char* end = nullptr;
            const long id = std::strtol(id_text.c_str(), &end, 10);
            if (end == id_text.c_str() || *end != '\0' || id < 0 || id > INT32_MAX)
                fail(ErrorCode::ERROR_FORMAT, "{}: added_tokens_decoder key '{}' is not an id", config_path.string(), id_text);
            if (!entry.is_object() || !entry.contains("content") || !entry.at("content").is_string())
                fail(ErrorCode::ERROR_FORMAT, "{}: added token {} has no string 'content'", config_path.string(), id_text);
            token.id = int32_t(id);
            token.content = entry.at("content").get<std::string>();
            token.special = entry.value("special", false);
            token.lstrip = entry.value("lstrip", false);
            token.rstrip = entry.value("rstrip", false);
            if (token.content.empty() || !utf8_is_valid(token.content))
                fail(ErrorCode::ERROR_FORMAT, "{}: added token {} has empty or invalid UTF-8 content", config_path.string(), id_text);
            if (entry.value("single_word", false))
                QTTS_LOG_WARN("tokenizer: added token '{}' asks for single_word matching, which is not supported; "
                              "it is matched anywhere", token.content);
            if (entry.value("normalized", false))
                QTTS_LOG_DEBUG("tokenizer: added token '{}' is marked normalized; it is matched in the raw text",
                               token.content);
            max_id = std::max(max_id, token.id);
            impl->added.push_back(std::move(token));
        }
    } else {
        QTTS_LOG_WARN("tokenizer: {} has no added_tokens_decoder; special tokens will be split as text",
                      config_path.string());
    }
    std::sort(impl->added.begin(), impl->added.end(), [](const AddedToken& a, const AddedToken& b) { return a.id < b.id; });

    // Per-id tables, indexed by id: refuse absurd ids rather than allocate gigabytes.
    constexpr int32_t MAX_SUPPORTED_ID = (1 << 24) - 1;
    if (max_id > MAX_SUPPORTED_ID)
        fail(ErrorCode::ERROR_FORMAT, "tokenizer in {} uses id {}; ids up to {} are supported", model_dir, max_id,
             MAX_SUPPORTED_ID);
    const size_t size = size_t(max_id) + 1;
    impl->id_tokens.assign(size, std::string());
    impl->id_bytes.assign(size, std::string());
    impl->id_kinds.assign(size, Impl::ID_KIND_NONE);
    for (const auto& [token, id] : impl->token_ids) {
        std::string bytes;
        bytes.reserve(token.size());
        size_t i = 0;
        bool byte_level = utf8_is_valid(token);
        while (byte_level && i < token.size()) {
            const uint32_t cp = utf8_next(token, i);
            if (cp >= impl->unicode_bytes.size() || impl->unicode_bytes[cp] < 0) {
                byte_level = false;
            } else {
                bytes += char(impl->unicode_bytes[cp]);
            }
        }
        if (!byte_level)
            fail(ErrorCode::ERROR_FORMAT, "{}: token '{}' (id {}) is not in GPT-2 byte-level form", vocab_path.string(),
                 token, id);
        if (impl->id_kinds[size_t(id)] != Impl::ID_KIND_NONE)
            fail(ErrorCode::ERROR_FORMAT, "{}: id {} is used by two tokens", vocab_path.string(), id);
        impl->id_tokens[size_t(id)] = token;
        impl->id_bytes[size_t(id)] = std::move(bytes);
        impl->id_kinds[size_t(id)] = Impl::ID_KIND_BYTE_LEVEL;
    }
    for (size_t index = 0; index < impl->added.size(); ++index) {
        const AddedToken& token = impl->added[index];
        if (impl->id_kinds[size_t(token.id)] == Impl::ID_KIND_ADDED)
            fail(ErrorCode::ERROR_FORMAT, "{}: added token id {} appears twice", config_path.string(), token.id);
        // An added token may shadow a vocab entry with the same id (as in HF); the added
        // content wins for decoding.
        impl->id_tokens[size_t(token.id)] = token.content;
        impl->id_kinds[size_t(token.id)] = Impl::ID_KIND_ADDED;
        impl->added_ids[token.content] = token.id;
        impl->added_by_first_byte[(unsigned char)token.content[0]].push_back(int32_t(index));
    }
    for (auto& bucket : impl->added_by_first_byte) {
        std::stable_sort(bucket.begin(), bucket.end(), [&](int32_t a, int32_t b) {
            return impl->added[size_t(a)].content.size() > impl->added[size_t(b)].content.size();
        });
    }
    for (int b = 0; b < 256; ++b) {
        std::string token;
        utf8_append(token, byte_to_cp[size_t(b)]);
        auto it = impl->token_ids.find(token);
        if (it == impl->token_ids.end())
            fail(ErrorCode::ERROR_FORMAT,
                 "{} lacks the byte-level token '{}' for byte 0x{:02X}; a byte-level BPE vocabulary must hold all 256",
                 vocab_path.string(), token, b);
        impl->byte_ids[size_t(b)] = it->second;
    }

    // merges.txt: "left right" per line, in rank order; an optional "#version" header.
    const fs::path merges_path = dir / "merges.txt";
    const std::string merges_text = file_read(merges_path);
    size_t line_begin = 0;
    size_t line_number = 0;
    int32_t rank = 0;
    size_t merges_skipped = 0;
    std::string left, right, merged;  // reused key buffers
    impl->merges.reserve(impl->token_ids.size());
    while (line_begin < merges_text.size()) {
        size_t line_end = merges_text.find('\n', line_begin);
        if (line_end == std::string::npos) line_end = merges_text.size();
        std::string_view line(merges_text.data() + line_begin, line_end - line_begin);
        line_begin = line_end + 1;
        ++line_number;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
        const size_t space = line.find(' ');
        if (space == std::string_view::npos || space == 0 || space + 1 >= line.size() ||
            line.find(' ', space + 1) != std::string_view::npos)
            fail(ErrorCode::ERROR_FORMAT, "{} line {}: expected two tokens separated by one space, got '{}'",
                 merges_path.string(), line_number, std::string(line));
        left.assign(line.data(), space);
        right.assign(line.data() + space + 1, line.size() - space - 1);
        merged.assign(left).append(right);
        auto left_it = impl->token_ids.find(left);
        auto right_it = impl->token_ids.find(right);
        auto merged_it = impl->token_ids.find(merged);
        if (left_it == impl->token_ids.end() || right_it == impl->token_ids.end() || merged_it == impl->token_ids.end()) {
            ++merges_skipped;  // HF refuses such files; we only note it since it cannot change ids
            ++rank;
            continue;
        }
        impl->merges.emplace(pair_key(left_it->second, right_it->second), Impl::MergeRule{rank, merged_it->second});
        ++rank;
    }
    if (merges_skipped > 0)
        QTTS_LOG_WARN("tokenizer: {} merges in {} use tokens missing from vocab.json and were ignored", merges_skipped,
                      merges_path.string());

    impl->regex_code = regex_compile(options.regex);
    nfc_inert_table();  // built once per process; here rather than inside the first encode()
    QTTS_LOG_DEBUG("tokenizer: loaded {} tokens, {} merges, {} added tokens, regex {}", impl->token_ids.size(),
                   impl->merges.size(), impl->added.size(), pretokenizer_regex_name(options.regex));
    return Tokenizer(std::move(impl));
}

// ---------------------------------------------------------------------------------------------
// Public interface
// ---------------------------------------------------------------------------------------------

template <typename MayMatch>
void Tokenizer::Impl::ids_append(std::string_view text, MayMatch&& may_match, std::vector<int32_t>& ids) const {
    added_split(text, may_match, [&](size_t begin, size_t end, int32_t added_index) {
        if (added_index >= 0) {
            ids.push_back(added[size_t(added_index)].id);
            return;
        }
        segment_pretokenize(text.substr(begin, end - begin), [&](std::string_view piece) { pretoken_encode(piece, ids); });
    });
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, AddedTokens added) const {
    std::string sanitised;
    if (!utf8_is_valid(text)) {
        sanitised = utf8_sanitize(text);
        text = sanitised;
    }
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 8);
    const bool match = added == AddedTokens::ADDED_TOKENS_MATCH;
    impl_->ids_append(text, [match](size_t, size_t) { return match; }, ids);
    return ids;
}

std::vector<int32_t> Tokenizer::encode(const std::vector<TextPart>& parts) const {
    // Each part is sanitised on its own, so its byte range in the joined text is known.
    std::string joined;
    std::vector<std::pair<size_t, size_t>> match_ranges;  // [begin, end) of the MATCH parts
    for (const TextPart& part : parts) {
        const size_t begin = joined.size();
        if (utf8_is_valid(part.text)) joined.append(part.text);
        else joined += utf8_sanitize(part.text);
        if (part.added == AddedTokens::ADDED_TOKENS_MATCH) match_ranges.emplace_back(begin, joined.size());
    }
    const auto inside_match_part = [&match_ranges](size_t at, size_t length) {
        for (const auto& [begin, end] : match_ranges)
            if (at >= begin && at + length <= end) return true;
        return false;
    };
    std::vector<int32_t> ids;
    ids.reserve(joined.size() / 3 + 8);
    impl_->ids_append(joined, inside_match_part, ids);
    return ids;
}

std::vector<std::string> Tokenizer::pretokenize(std::string_view text, AddedTokens added) const {
    const std::string sanitised = utf8_sanitize(text);
    std::vector<std::string> pieces;
    const bool match = added == AddedTokens::ADDED_TOKENS_MATCH;
    impl_->added_split(sanitised, [match](size_t, size_t) { return match; },
                       [&](size_t begin, size_t end, int32_t added_index) {
        const std::string_view segment = std::string_view(sanitised).substr(begin, end - begin);
        if (added_index >= 0) {
            pieces.emplace_back(segment);
            return;
        }
        impl_->segment_pretokenize(segment, [&](std::string_view piece) { pieces.emplace_back(piece); });
    });
    return pieces;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string bytes;
    for (int32_t id : ids) {
        if (id < 0 || size_t(id) >= impl_->id_kinds.size() || impl_->id_kinds[size_t(id)] == Impl::ID_KIND_NONE)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "cannot decode token id {}: not in the vocabulary (size {})", id,
                 vocab_size());
        if (impl_->id_kinds[size_t(id)] == Impl::ID_KIND_ADDED) {
            bytes += impl_->id_tokens[size_t(id)];
        } else {
            bytes += impl_->id_bytes[size_t(id)];
        }
    }
    // Ids may cut a multi-byte character in two (e.g. a streamed prefix); like HF's
    // errors="replace" such bytes become U+FFFD.
    return utf8_is_valid(bytes) ? bytes : utf8_sanitize(bytes);
}

std::string Tokenizer::id_to_token(int32_t id) const {
    if (id < 0 || size_t(id) >= impl_->id_kinds.size() || impl_->id_kinds[size_t(id)] == Impl::ID_KIND_NONE)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "token id {} is not in the vocabulary (size {})", id, vocab_size());
    return impl_->id_tokens[size_t(id)];
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
    const std::string key(token);
    if (auto it = impl_->added_ids.find(key); it != impl_->added_ids.end()) return it->second;
    if (auto it = impl_->token_ids.find(key); it != impl_->token_ids.end()) return it->second;
    return -1;
}

int32_t Tokenizer::vocab_size() const { return int32_t(impl_->id_kinds.size()); }

bool Tokenizer::is_special(int32_t id) const {
    if (id < 0 || size_t(id) >= impl_->id_kinds.size() || impl_->id_kinds[size_t(id)] != Impl::ID_KIND_ADDED) return false;
    auto it = std::lower_bound(impl_->added.begin(), impl_->added.end(), id,
                               [](const AddedToken& t, int32_t value) { return t.id < value; });
    return it != impl_->added.end() && it->id == id && it->special;
}

const std::vector<AddedToken>& Tokenizer::added_tokens() const { return impl_->added; }

PretokenizerRegex Tokenizer::regex() const { return impl_->regex; }

const char* pretokenizer_regex_name(PretokenizerRegex regex) {
    switch (regex) {
        case PretokenizerRegex::PRETOKENIZER_QWEN2: return "qwen2";
        case PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX: return "mistral-fix";
    }
    return "unknown";
}

PretokenizerRegex pretokenizer_regex_parse(std::string_view name) {
    if (name == "qwen2") return PretokenizerRegex::PRETOKENIZER_QWEN2;
    if (name == "mistral-fix") return PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX;
    fail(ErrorCode::ERROR_INVALID_ARGUMENT, "unknown pretokenizer regex '{}' (accepted: qwen2, mistral-fix)", std::string(name));
}

bool utf8_is_valid(std::string_view text) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    size_t i = 0;
    while (i < n) {
        // ASCII fast path, 8 bytes at a time.
        while (i + 8 <= n) {
            uint64_t word;
            std::memcpy(&word, p + i, 8);
            if (word & 0x8080808080808080ull) break;
            i += 8;
        }
        if (i >= n) break;
        const int len = utf8_sequence_length(p, n, i);
        if (len < 0) return false;
        i += size_t(len);
    }
    return true;
}

std::string utf8_sanitize(std::string_view text) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    const size_t n = text.size();
    std::string out;
    out.reserve(n);
    size_t i = 0;
    while (i < n) {
        const int len = utf8_sequence_length(p, n, i);
        if (len > 0) {
            out.append(text.data() + i, size_t(len));
            i += size_t(len);
        } else {
            out += UTF8_REPLACEMENT;
            i += size_t(-len);
        }
    }
    return out;
}

std::string utf8_nfc(std::string_view text) {
    std::string sanitised;
    if (!utf8_is_valid(text)) {
        sanitised = utf8_sanitize(text);
        text = sanitised;
    }
    std::string storage;
    const std::string_view normalised = nfc_apply(text, storage);
    return normalised.data() == storage.data() ? std::move(storage) : std::string(normalised);
}

}  // namespace qtts
