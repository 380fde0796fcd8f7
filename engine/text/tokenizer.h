// The Qwen2 byte-level BPE text tokenizer (vocab.json + merges.txt + tokenizer_config.json),
// bit-exact with the Hugging Face tokenizer the Qwen3-TTS reference uses with
// add_special_tokens=False.
//
// Pipeline of encode() (docs/text-frontend.md has the details and the reasons):
//   invalid UTF-8 -> U+FFFD  ->  split out added tokens (raw text, leftmost-longest; only where
//   AddedTokens::ADDED_TOKENS_MATCH allows it)
//   -> per plain segment: NFC -> Qwen2 pre-tokenizer regex -> GPT-2 byte->unicode
//   -> BPE by merge rank -> ids
//
// Thread safety: a loaded Tokenizer is immutable except for an internal, mutex-protected
// cache of pre-token -> ids; encode/decode/id_to_token/token_to_id may be called from any
// number of threads at once. Copies share the same tables and cache.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace qtts {

// Which pre-tokenizer split regex to use (docs/qwen3-tts-model.md §3 explains why there are two).
enum class PretokenizerRegex {
    PRETOKENIZER_QWEN2,        // the native Qwen2 regex of the released tokenizer (default)
    PRETOKENIZER_MISTRAL_FIX,  // the regex transformers' fix_mistral_regex=True substitutes
};

// "qwen2" / "mistral-fix".
const char* pretokenizer_regex_name(PretokenizerRegex regex);
// Parses "qwen2" or "mistral-fix"; throws qtts::Error (ERROR_INVALID_ARGUMENT) otherwise.
PretokenizerRegex pretokenizer_regex_parse(std::string_view name);

struct TokenizerOptions {
    PretokenizerRegex regex = PretokenizerRegex::PRETOKENIZER_QWEN2;
    // Entries of the pre-token -> ids cache; 0 disables it. The cache is emptied when full,
    // so memory stays bounded whatever the input.
    size_t cache_entries = 65536;
};

// How added-token strings (<|im_start|>, <|im_end|>, <tts_pad>, ...) inside a text are read.
enum class AddedTokens {
    ADDED_TOKENS_MATCH,    // they become their ids: prompt templates, and HF parity (the goldens)
    ADDED_TOKENS_AS_TEXT,  // they are ordinary characters, split by BPE like any other text: what
                           // user text gets, so it cannot inject prompt structure
};

// A piece of a text to encode in one go (see Tokenizer::encode(parts)).
struct TextPart {
    std::string_view text;
    AddedTokens added = AddedTokens::ADDED_TOKENS_AS_TEXT;
};

// One entry of tokenizer_config.json's added_tokens_decoder.
struct AddedToken {
    int32_t id = -1;
    std::string content;   // matched verbatim in the raw (not normalised) text
    bool special = false;  // control token (<|im_start|>, <tts_pad>, ...) vs plain added token
    bool lstrip = false;   // swallows the whitespace on its left
    bool rstrip = false;   // swallows the whitespace on its right
};

class Tokenizer {
public:
    // Reads vocab.json, merges.txt and tokenizer_config.json from model_dir. Throws
    // qtts::Error: ERROR_NOT_FOUND for a missing file, ERROR_FORMAT for malformed content.
    static Tokenizer load(const std::string& model_dir, const TokenizerOptions& options = {});

    // Text ids, no special tokens added (add_special_tokens=False). With ADDED_TOKENS_MATCH (the
    // Hugging Face behaviour) added/special token strings inside the text become their ids; with
    // ADDED_TOKENS_AS_TEXT they are plain text. Invalid UTF-8 is replaced by U+FFFD first.
    std::vector<int32_t> encode(std::string_view text, AddedTokens added = AddedTokens::ADDED_TOKENS_MATCH) const;

    // The parts joined and encoded as one text, with added tokens matched only where they lie
    // wholly inside an ADDED_TOKENS_MATCH part. A template around user text, e.g.
    // {"<|im_start|>assistant\n", MATCH}, {text, AS_TEXT}, {"<|im_end|>\n", MATCH}, gives exactly
    // encode(joined) whenever the text holds no added-token string (plain runs are pre-tokenized
    // across part boundaries, as in the whole string), and never a control id from the text.
    std::vector<int32_t> encode(const std::vector<TextPart>& parts) const;

    // Bytes of the ids joined; byte sequences that are not valid UTF-8 are replaced by U+FFFD
    // (HF errors="replace"). Special tokens are kept as their text. Throws ERROR_INVALID_ARGUMENT
    // for an id that is not in the vocabulary.
    std::string decode(const std::vector<int32_t>& ids) const;

    // The token's string as stored in vocab.json (byte-level form, e.g. "Ġworld"), or the
    // added token's content. Throws ERROR_INVALID_ARGUMENT for an unknown id.
    std::string id_to_token(int32_t id) const;
    // Inverse of id_to_token (added tokens first); -1 when unknown.
    int32_t token_to_id(std::string_view token) const;

    // One past the largest id (vocabulary and added tokens): 151676 for the Qwen3-TTS files.
    int32_t vocab_size() const;
    // True for added tokens flagged "special".
    bool is_special(int32_t id) const;
    const std::vector<AddedToken>& added_tokens() const;
    PretokenizerRegex regex() const;

    // The pre-tokens (raw UTF-8 pieces after added-token split, NFC and the regex) of a text,
    // matched added tokens included as whole pieces; for incremental text, debugging and tests.
    std::vector<std::string> pretokenize(std::string_view text,
                                         AddedTokens added = AddedTokens::ADDED_TOKENS_MATCH) const;

    struct Impl;

private:
    explicit Tokenizer(std::shared_ptr<Impl> impl);
    std::shared_ptr<Impl> impl_;
};

// UTF-8 helpers used by the text front end.
// True when text is well-formed UTF-8 (no overlongs, surrogates or code points > U+10FFFF): the
// library's one UTF-8 validator (request text goes through text_check, engine/text/request_check.h).
bool utf8_is_valid(std::string_view text);
// Replaces every maximal ill-formed subsequence with U+FFFD (Unicode §3.9 "substitution of
// maximal subparts", which is what Python's bytes.decode(errors="replace") does).
std::string utf8_sanitize(std::string_view text);
// Unicode NFC of well-formed UTF-8 (input is sanitised first).
std::string utf8_nfc(std::string_view text);

}  // namespace qtts
