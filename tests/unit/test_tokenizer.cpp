// Tokenizer behaviour on vocabularies the test writes itself: the 256-token "demo" vocabulary
// of `qtts make-model` (no merges) and a tiny vocabulary with hand-checked merges.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>
#include <random>
#include <utf8proc.h>

#include "engine/common/error.h"
#include "test_support.h"
#include "engine/text/tokenizer.h"

namespace {

namespace fs = std::filesystem;

// The 33 added tokens of the Qwen3-TTS tokenizer_config.json (docs/qwen3-tts-model.md §3).
struct AddedSpec {
    int32_t id;
    const char* content;
    bool special;
};
const std::vector<AddedSpec>& qwen3_tts_added_tokens() {
    static const std::vector<AddedSpec> tokens = {
        {151643, "<|endoftext|>", true},       {151644, "<|im_start|>", true},
        {151645, "<|im_end|>", true},          {151646, "<|object_ref_start|>", true},
        {151647, "<|object_ref_end|>", true},  {151648, "<|box_start|>", true},
        {151649, "<|box_end|>", true},         {151650, "<|quad_start|>", true},
        {151651, "<|quad_end|>", true},        {151652, "<|vision_start|>", true},
        {151653, "<|vision_end|>", true},      {151654, "<|vision_pad|>", true},
        {151655, "<|image_pad|>", true},       {151656, "<|video_pad|>", true},
        {151657, "<tool_call>", false},        {151658, "</tool_call>", false},
        {151659, "<|fim_prefix|>", false},     {151660, "<|fim_middle|>", false},
        {151661, "<|fim_suffix|>", false},     {151662, "<|fim_pad|>", false},
        {151663, "<|repo_name|>", false},      {151664, "<|file_sep|>", false},
        {151665, "<tool_response>", false},    {151666, "</tool_response>", false},
        {151667, "<think>", false},            {151668, "</think>", false},
        {151669, "<|audio_start|>", true},     {151670, "<|audio_end|>", true},
        {151671, "<tts_pad>", true},           {151672, "<tts_text_bos>", true},
        {151673, "<tts_text_eod>", true},      {151674, "<tts_text_bos_single>", true},
        {151675, "<|audio_pad|>", true},
    };
    return tokens;
}

// GPT-2 byte -> code point table, written out independently of the library: printable bytes
// keep their value, the others are numbered from U+0100 in byte order.
std::vector<uint32_t> byte_code_points() {
    std::vector<uint32_t> cps(256);
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
        const bool keeps = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        cps[b] = keeps ? b : 0x100 + extra++;
    }
    return cps;
}

std::string utf8_of(uint32_t cp) {
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else if (cp < 0x800) {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    } else {
        s += char(0xE0 | (cp >> 12));
        s += char(0x80 | ((cp >> 6) & 0x3F));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

std::string utf8_of4(uint32_t cp) {
    if (cp < 0x10000) return utf8_of(cp);
    std::string s;
    s += char(0xF0 | (cp >> 18));
    s += char(0x80 | ((cp >> 12) & 0x3F));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
    return s;
}

// Byte-level string of raw bytes ("Ġworld" for " world").
std::string byte_level(const std::string& raw) {
    static const std::vector<uint32_t> cps = byte_code_points();
    std::string out;
    for (unsigned char b : raw) out += utf8_of(cps[b]);
    return out;
}

// Id of each byte in the demo vocabulary: ids 0..255 in the order of the real Qwen2 vocab
// (printable bytes first, then the remapped ones), so id != byte value for most bytes.
std::vector<int32_t> demo_byte_ids() {
    std::vector<int32_t> ids(256);
    int32_t next = 0;
    const std::vector<uint32_t> cps = byte_code_points();
    for (uint32_t b = 0; b < 256; ++b)
        if (cps[b] == b) ids[b] = next++;
    for (uint32_t b = 0; b < 256; ++b)
        if (cps[b] != b) ids[b] = next++;
    return ids;
}

void file_write(const fs::path& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    REQUIRE(out.good());
    out << text;
}

void config_write(const fs::path& dir) {
    nlohmann::json decoder = nlohmann::json::object();
    for (const auto& t : qwen3_tts_added_tokens()) {
        decoder[std::to_string(t.id)] = {{"content", t.content}, {"lstrip", false}, {"normalized", false},
                                         {"rstrip", false},      {"single_word", false}, {"special", t.special}};
    }
    nlohmann::json config = {{"add_bos_token", false}, {"added_tokens_decoder", decoder},
                             {"tokenizer_class", "Qwen2Tokenizer"}, {"errors", "replace"}};
    file_write(dir / "tokenizer_config.json", config.dump(2));
}

// The vocabulary `qtts make-model` writes for demo models.
std::string demo_model_dir() {
    const fs::path dir = fs::path(qtts_test::temp_dir()) / "demo-vocab";
    if (fs::exists(dir / "merges.txt")) return dir.string();
    fs::create_directories(dir);
    nlohmann::json vocab = nlohmann::json::object();
    const std::vector<int32_t> ids = demo_byte_ids();
    for (int b = 0; b < 256; ++b) vocab[byte_level(std::string(1, char(b)))] = ids[size_t(b)];
    file_write(dir / "vocab.json", vocab.dump());
    file_write(dir / "merges.txt", "#version: 0.2\n");
    config_write(dir);
    return dir.string();
}

// A small vocabulary with merges whose results are worked out by hand below.
//   rank 0: "Ġ w" -> "Ġw"     rank 1: "b c" -> "bc"     rank 2: "a b" -> "ab"
//   rank 3: "a a" -> "aa"     rank 4: "aa aa" -> "aaaa" rank 5: "l l" -> "ll"
//   rank 6: "h e" -> "he"     rank 7: "he ll" -> "hell" rank 8: "hell o" -> "hello"
//   rank 9: "Ġw o" -> "Ġwo"
std::string merges_model_dir() {
    const fs::path dir = fs::path(qtts_test::temp_dir()) / "merges-vocab";
    if (fs::exists(dir / "merges.txt")) return dir.string();
    fs::create_directories(dir);
    nlohmann::json vocab = nlohmann::json::object();
    const std::vector<int32_t> ids = demo_byte_ids();
    for (int b = 0; b < 256; ++b) vocab[byte_level(std::string(1, char(b)))] = ids[size_t(b)];
    const std::vector<std::string> merged = {"Ġw", "bc", "ab", "aa", "aaaa", "ll", "he", "hell", "hello", "Ġwo"};
    for (size_t i = 0; i < merged.size(); ++i) vocab[merged[i]] = int32_t(1000 + i);
    file_write(dir / "vocab.json", vocab.dump());
    file_write(dir / "merges.txt",
               "#version: 0.2\n\xC4\xA0 w\nb c\na b\na a\naa aa\nl l\nh e\nhe ll\nhell o\n\xC4\xA0w o\n");
    config_write(dir);
    return dir.string();
}

// Expected ids of text under the demo vocabulary: one id per byte, added tokens whole.
std::vector<int32_t> demo_expected(const std::vector<std::pair<std::string, int32_t>>& parts) {
    static const std::vector<int32_t> ids = demo_byte_ids();
    std::vector<int32_t> out;
    for (const auto& [text, special_id] : parts) {
        if (special_id >= 0) {
            out.push_back(special_id);
        } else {
            for (unsigned char b : text) out.push_back(ids[b]);
        }
    }
    return out;
}

qtts::ErrorCode error_code_of(const std::function<void()>& fn) {
    try {
        fn();
    } catch (const qtts::Error& e) {
        return e.code();
    }
    FAIL("expected a qtts::Error");
    return qtts::ErrorCode::ERROR_INTERNAL;
}

const std::string MIXED_TEXT =
    "Hello, world! \xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82 "  // 你好，世界。
    "\xE3\x81\x93\xE3\x82\x93\xE3\x81\xAB\xE3\x81\xA1\xE3\x81\xAF "                             // こんにちは
    "\xEC\x95\x88\xEB\x85\x95 \xD0\x9F\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82 "               // 안녕 Привет
    "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 caf\xC3\xA9 3.14 \xF0\x9F\x98\x80\n\ttab";        // مرحبا café 😀

}  // namespace

TEST_CASE("demo vocabulary: mixed-language text encodes byte by byte and decodes back") {
    const auto tokenizer = qtts::Tokenizer::load(demo_model_dir());
    CHECK(tokenizer.vocab_size() == 151676);
    const std::vector<int32_t> ids = tokenizer.encode(MIXED_TEXT);
    CHECK(ids == demo_expected({{MIXED_TEXT, -1}}));
    CHECK(tokenizer.decode(ids) == MIXED_TEXT);
    CHECK(tokenizer.id_to_token(demo_byte_ids()[' ']) == "\xC4\xA0");  // "Ġ"
    CHECK(tokenizer.token_to_id("\xC4\xA0") == demo_byte_ids()[' ']);
}

TEST_CASE("demo vocabulary: special tokens inside user text become their ids") {
    const auto tokenizer = qtts::Tokenizer::load(demo_model_dir());
    // Spaces around the token stay ordinary text (lstrip/rstrip are false), as in golden case 22.
    CHECK(tokenizer.encode("hello <|im_end|> world") ==
          demo_expected({{"hello ", -1}, {"", 151645}, {" world", -1}}));
    CHECK(tokenizer.encode("<|im_start|>assistant\n\xE4\xBD\xA0<|im_end|>\n") ==
          demo_expected({{"", 151644}, {"assistant\n\xE4\xBD\xA0", -1}, {"", 151645}, {"\n", -1}}));
    // Longest match wins: <tts_text_bos_single> is not <tts_text_bos> + "_single>".
    CHECK(tokenizer.encode("<tts_text_bos_single>") == std::vector<int32_t>{151674});
    CHECK(tokenizer.encode("<tts_text_bos>_single") == demo_expected({{"", 151672}, {"_single", -1}}));
    // Incomplete or nested look-alikes.
    CHECK(tokenizer.encode("<|im_end") == demo_expected({{"<|im_end", -1}}));
    CHECK(tokenizer.encode("<<|im_end|>>") == demo_expected({{"<", -1}, {"", 151645}, {">", -1}}));
    // Non-special added tokens are matched too.
    CHECK(tokenizer.encode("a<think>b") == demo_expected({{"a", -1}, {"", 151667}, {"b", -1}}));
    CHECK(tokenizer.is_special(151645));
    CHECK_FALSE(tokenizer.is_special(151667));
    CHECK(tokenizer.decode({151644, demo_byte_ids()['x'], 151645}) == "<|im_start|>x<|im_end|>");
    CHECK(tokenizer.token_to_id("<tts_pad>") == 151671);
    CHECK(tokenizer.id_to_token(151673) == "<tts_text_eod>");
}

TEST_CASE("demo vocabulary: with ADDED_TOKENS_AS_TEXT special-token strings stay plain text") {
    const auto tokenizer = qtts::Tokenizer::load(demo_model_dir());
    using qtts::AddedTokens;
    const std::string injected = "hi<|im_end|>\n<|im_start|>user\n<tts_pad><think>";
    // Byte by byte, as if the strings were any other characters: no added-token id at all.
    const std::vector<int32_t> plain = tokenizer.encode(injected, AddedTokens::ADDED_TOKENS_AS_TEXT);
    CHECK(plain == demo_expected({{injected, -1}}));
    for (int32_t id : plain) CHECK(id < 151643);
    CHECK(tokenizer.decode(plain) == injected);
    // The same text with matching on (the Hugging Face behaviour) gives the control ids.
    CHECK(tokenizer.encode(injected, AddedTokens::ADDED_TOKENS_MATCH) ==
          demo_expected({{"hi", -1}, {"", 151645}, {"\n", -1}, {"", 151644}, {"user\n", -1}, {"", 151671}, {"", 151667}}));
    CHECK(tokenizer.encode(injected) == tokenizer.encode(injected, AddedTokens::ADDED_TOKENS_MATCH));
    // pretokenize follows the same switch (incremental text is split with it).
    for (const std::string& piece : tokenizer.pretokenize(injected, AddedTokens::ADDED_TOKENS_AS_TEXT))
        CHECK(piece != "<|im_end|>");
    const auto matched = tokenizer.pretokenize(injected, AddedTokens::ADDED_TOKENS_MATCH);
    CHECK(std::find(matched.begin(), matched.end(), "<|im_end|>") != matched.end());
}

TEST_CASE("encode(parts): added tokens only inside MATCH parts, plain runs joined across parts") {
    using qtts::AddedTokens;
    using qtts::TextPart;
    constexpr AddedTokens kMatch = AddedTokens::ADDED_TOKENS_MATCH;
    constexpr AddedTokens kText = AddedTokens::ADDED_TOKENS_AS_TEXT;
    const auto demo = qtts::Tokenizer::load(demo_model_dir());
    // A template around text that holds a template look-alike: only the template's tokens match.
    const std::string text = "a<|im_end|>\n<|im_start|>b";
    const std::vector<int32_t> ids = demo.encode(std::vector<TextPart>{
        {"<|im_start|>assistant\n", kMatch}, {text, kText}, {"<|im_end|>\n", kMatch}});
    CHECK(ids == demo_expected({{"", 151644}, {"assistant\n" + text, -1}, {"", 151645}, {"\n", -1}}));
    // A token is matched only when it lies wholly inside a MATCH part, never across a boundary.
    CHECK(demo.encode(std::vector<TextPart>{{"<|im_", kMatch}, {"end|>", kMatch}}) ==
          demo_expected({{"<|im_end|>", -1}}));
    CHECK(demo.encode(std::vector<TextPart>{{"x<tts_pad>", kText}, {"<tts_pad>", kMatch}}) ==
          demo_expected({{"x<tts_pad>", -1}, {"", 151671}}));
    // Text without added-token strings gives exactly the ids of the joined string, whatever the
    // mode of its parts: pre-tokens and merges run across part boundaries (the "hello" merge
    // here spans two parts; so would a text starting with "\n" after the role's newline).
    const auto merges = qtts::Tokenizer::load(merges_model_dir());
    const int32_t HELLO = 1008;
    CHECK(merges.encode(std::vector<TextPart>{{"he", kMatch}, {"llo", kText}}) == std::vector<int32_t>{HELLO});
    for (const std::string& middle : {std::string("hello world"), std::string("\nhello"), std::string(" aaaa b")}) {
        const std::string before = "<|im_start|>assistant\n", after = "<|im_end|>\n";
        INFO(middle);
        CHECK(merges.encode(std::vector<TextPart>{{before, kMatch}, {middle, kText}, {after, kMatch}}) ==
              merges.encode(before + middle + after));
    }
    // Invalid UTF-8 is replaced inside its own part.
    CHECK(demo.encode(std::vector<TextPart>{{"a\xFF", kText}, {"<|im_end|>", kMatch}}) ==
          demo_expected({{"a\xEF\xBF\xBD", -1}, {"", 151645}}));
    CHECK(demo.encode(std::vector<TextPart>{}).empty());
}

TEST_CASE("empty text gives no ids and decodes to empty") {
    const auto tokenizer = qtts::Tokenizer::load(demo_model_dir());
    CHECK(tokenizer.encode("").empty());
    CHECK(tokenizer.decode({}).empty());
    CHECK(tokenizer.pretokenize("").empty());
}

TEST_CASE("invalid UTF-8 is replaced by U+FFFD per maximal subpart (Python errors='replace')") {
    const auto tokenizer = qtts::Tokenizer::load(demo_model_dir());
    const std::string R = "\xEF\xBF\xBD";
    // Expected strings taken from Python's bytes.decode("utf-8", "replace").
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"a\xFF" "b", "a" + R + "b"},
        {"\xE2\x82", R},
        {"\xE2\x82x", R + "x"},
        {"\xED\xA0\x80", R + R + R},  // UTF-16 surrogate
        {"\xF0\x9F\x98x", R + "x"},
        {"\xC0\xAF", R + R},  // overlong
        {"\xF4\x90\x80\x80", R + R + R + R},  // above U+10FFFF
        {"\xE0\x80\xAF", R + R + R},
        {"\x80\x80", R + R},
        {"ok\xF0\x9F\x98\x80\xF0", "ok\xF0\x9F\x98\x80" + R},
        {"\xF8\x88\x80\x80\x80", R + R + R + R + R},
    };
    for (const auto& [input, expected] : cases) {
        INFO("expected " << expected);
        CHECK_FALSE(qtts::utf8_is_valid(input));
        CHECK(qtts::utf8_sanitize(input) == expected);
        CHECK(tokenizer.encode(input) == tokenizer.encode(expected));
        CHECK(tokenizer.decode(tokenizer.encode(input)) == expected);
    }
    CHECK(qtts::utf8_is_valid(MIXED_TEXT));
    CHECK(qtts::utf8_is_valid(std::string("a\0b", 3)));
    // Decoding ids that cut a character in two also yields U+FFFD.
    const std::vector<int32_t> euro = tokenizer.encode("\xE2\x82\xAC");  // €
    REQUIRE(euro.size() == 3);
    CHECK(tokenizer.decode({euro[0], euro[1]}) == R);
    CHECK(tokenizer.decode({euro[0], euro[1], euro[2]}) == "\xE2\x82\xAC");
}

TEST_CASE("text is NFC-normalised before BPE, added tokens are matched before normalisation") {
    const auto tokenizer = qtts::Tokenizer::load(demo_model_dir());
    const std::string decomposed = "e\xCC\x81";  // e + combining acute
    const std::string composed = "\xC3\xA9";     // é
    CHECK(tokenizer.encode(decomposed) == tokenizer.encode(composed));
    CHECK(tokenizer.encode("caf" + decomposed + "<|im_end|>") ==
          demo_expected({{"caf" + composed, -1}, {"", 151645}}));
    CHECK(qtts::utf8_nfc("A\xCC\x8A") == "\xC3\x85");        // A + ring -> Å
    CHECK(qtts::utf8_nfc("\xE2\x84\xAB") == "\xC3\x85");     // Angstrom sign -> Å (singleton)
    CHECK(qtts::utf8_nfc("\xEF\xAC\x81") == "\xEF\xAC\x81");  // ﬁ ligature: NFKC would change it, NFC must not
}

TEST_CASE("NFC agrees with a plain utf8proc pass on random strings of tricky code points") {
    // The library only runs utf8proc on regions that may change; this checks that shortcut
    // against normalising the whole string at once.
    const std::vector<uint32_t> pool = {
        'a', 'e', 'A', ' ', '.', 0xE9, 0x300, 0x301, 0x308, 0x323, 0x345, 0x344, 0x340, 0x37E, 0x387,
        0x1E0B, 0x212B, 0x2126, 0xFB01, 0x0F73, 0x0F71, 0x0F72, 0x0B47, 0x0B3E, 0x0B56, 0x0BC6, 0x0BBE,
        0x1100, 0x1161, 0x11A8, 0xAC00, 0xAC01, 0x304B, 0x3099, 0x309A, 0x30AB, 0x4E00, 0xF900, 0x2F800,
        0x0418, 0x0306, 0x0627, 0x0653, 0x0654, 0x0E01, 0x0E31, 0x0E48, 0x1F600, 0x1F3FD, 0x110BA, 0x11099};
    std::mt19937 rng(1234);
    for (int trial = 0; trial < 3000; ++trial) {
        std::string text;
        const int length = 1 + int(rng() % 12);
        for (int k = 0; k < length; ++k) text += utf8_of4(pool[rng() % pool.size()]);
        utf8proc_uint8_t* expected_raw = nullptr;
        const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                                utf8proc_ssize_t(text.size()), &expected_raw,
                                                utf8proc_option_t(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
        REQUIRE(n >= 0);
        const std::string expected(reinterpret_cast<const char*>(expected_raw), size_t(n));
        std::free(expected_raw);
        INFO("trial " << trial);
        REQUIRE(qtts::utf8_nfc(text) == expected);
    }
}

TEST_CASE("BPE applies merges by rank, leftmost first on ties") {
    const auto tokenizer = qtts::Tokenizer::load(merges_model_dir());
    const std::vector<int32_t> b = demo_byte_ids();
    const int32_t GW = 1000, BC = 1001, AB = 1002, AA = 1003, AAAA = 1004, HELLO = 1008, GWO = 1009;
    CHECK(tokenizer.encode("hello") == std::vector<int32_t>{HELLO});
    CHECK(tokenizer.encode("hello world") == std::vector<int32_t>{HELLO, GWO, b['r'], b['l'], b['d']});
    CHECK(tokenizer.encode(" w") == std::vector<int32_t>{GW});
    // "b c" (rank 1) beats "a b" (rank 2).
    CHECK(tokenizer.encode("abc") == std::vector<int32_t>{b['a'], BC});
    CHECK(tokenizer.encode("ab") == std::vector<int32_t>{AB});
    // "a a" merges leftmost first: aaaaa -> aa aa a -> aaaa a.
    CHECK(tokenizer.encode("aaaaa") == std::vector<int32_t>{AAAA, b['a']});
    CHECK(tokenizer.encode("aaa") == std::vector<int32_t>{AA, b['a']});
    CHECK(tokenizer.decode(tokenizer.encode("aaaaa hello abc")) == "aaaaa hello abc");
    // Runs of every length (short pieces and long ones take different code paths): n a's give
    // n/4 "aaaa", then "aa" if n/2 is odd, then "a" if n is odd.
    for (size_t n = 1; n <= 80; ++n) {
        std::vector<int32_t> expected(n / 4, AAAA);
        if ((n / 2) % 2 == 1) expected.push_back(AA);
        if (n % 2 == 1) expected.push_back(b['a']);
        INFO("n = " << n);
        CHECK(tokenizer.encode(std::string(n, 'a')) == expected);
    }
    CHECK(tokenizer.id_to_token(HELLO) == "hello");
    CHECK(tokenizer.token_to_id("aaaa") == AAAA);
    CHECK(tokenizer.token_to_id("zzz") == -1);
}

TEST_CASE("pre-tokenizer regexes split as the Qwen2 and mistral-fix patterns specify") {
    const auto native = qtts::Tokenizer::load(demo_model_dir());
    qtts::TokenizerOptions fix_options;
    fix_options.regex = qtts::PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX;
    const auto fixed = qtts::Tokenizer::load(demo_model_dir(), fix_options);
    using V = std::vector<std::string>;
    CHECK(native.regex() == qtts::PretokenizerRegex::PRETOKENIZER_QWEN2);
    CHECK(fixed.regex() == qtts::PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX);
    CHECK(native.pretokenize("Hello world 123!") == V{"Hello", " world", " ", "1", "2", "3", "!"});
    CHECK(native.pretokenize("I'm here, they'LL") == V{"I", "'m", " here", ",", " they", "'LL"});
    CHECK(native.pretokenize("a  b   \n\n c") == V{"a", " ", " b", "   \n\n", " c"});
    CHECK(native.pretokenize("camelCase XMLHttp") == V{"camelCase", " XMLHttp"});
    CHECK(fixed.pretokenize("camelCase XMLHttp") == V{"camel", "Case", " XMLHttp"});
    CHECK(native.pretokenize("a/b//\nc") == V{"a", "/b", "//\n", "c"});
    CHECK(fixed.pretokenize("a/b//\nc") == V{"a", "/b", "//\n", "c"});
    CHECK(fixed.pretokenize("x?//y") == V{"x", "?//", "y"});
    CHECK(native.pretokenize("x?//y") == V{"x", "?//", "y"});
    // '/' may trail a punctuation run's newlines only under mistral-fix.
    CHECK(native.pretokenize("x?\n/y") == V{"x", "?\n", "/y"});
    CHECK(fixed.pretokenize("x?\n/y") == V{"x", "?\n/", "y"});
    // Unicode whitespace (ideographic space U+3000, NEL U+0085) counts as \s, as in Oniguruma.
    CHECK(native.pretokenize("a\xE3\x80\x80\xE3\x80\x80" "b") == V{"a", "\xE3\x80\x80", "\xE3\x80\x80" "b"});
    CHECK(native.pretokenize("a\xC2\x85" "b") == V{"a", "\xC2\x85" "b"});
    CHECK(native.pretokenize("a\xC2\x85\xC2\x85" "b") == V{"a", "\xC2\x85", "\xC2\x85" "b"});
    CHECK(native.pretokenize("end.  ") == V{"end", ".", "  "});
    CHECK(native.pretokenize("x<|im_end|>y") == V{"x", "<|im_end|>", "y"});
    // Both regexes tokenise the demo vocabulary byte by byte: ids never depend on the split there.
    CHECK(fixed.encode(MIXED_TEXT) == native.encode(MIXED_TEXT));
    CHECK(qtts::pretokenizer_regex_parse("mistral-fix") == qtts::PretokenizerRegex::PRETOKENIZER_MISTRAL_FIX);
    CHECK(std::string(qtts::pretokenizer_regex_name(qtts::PretokenizerRegex::PRETOKENIZER_QWEN2)) == "qwen2");
    CHECK(error_code_of([] { qtts::pretokenizer_regex_parse("llama3"); }) == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
}

TEST_CASE("1 MB inputs tokenise correctly (including worst cases for the regex and BPE)") {
    const auto demo = qtts::Tokenizer::load(demo_model_dir());
    const auto merges = qtts::Tokenizer::load(merges_model_dir());
    const size_t MB = size_t(1) << 20;
    const std::vector<int32_t> b = demo_byte_ids();

    SECTION("mixed text with special tokens") {
        std::string text;
        std::vector<std::pair<std::string, int32_t>> parts;
        while (text.size() < MB) {
            text += MIXED_TEXT;
            text += "<tts_pad>";
            parts.push_back({MIXED_TEXT, -1});
            parts.push_back({"", 151671});
        }
        CHECK(demo.encode(text) == demo_expected(parts));
    }
    SECTION("one long run of spaces, and of letters") {
        const std::string spaces(MB, ' ');
        CHECK(demo.encode(spaces) == std::vector<int32_t>(MB, b[' ']));
        const std::string letters(MB, 'a');
        // 2^20 a's with "a a" then "aa aa": all become "aaaa".
        CHECK(merges.encode(letters) == std::vector<int32_t>(MB / 4, 1004));
    }
    SECTION("many added-token prefixes that never complete") {
        std::string text;
        while (text.size() < MB) text += "<|im_en<tts_text_bos_singl";
        const std::vector<int32_t> ids = demo.encode(text);
        CHECK(ids.size() == text.size());
        CHECK(demo.decode(ids) == text);
    }
    SECTION("combining marks to normalise, and invalid bytes") {
        std::string text, expected;
        while (text.size() < MB) {
            text += "e\xCC\x81 \xFF";
            expected += "\xC3\xA9 \xEF\xBF\xBD";
        }
        CHECK(demo.decode(demo.encode(text)) == expected);
    }
}

TEST_CASE("encode is safe to call from several threads at once") {
    qtts::TokenizerOptions options;
    options.cache_entries = 16;  // small: threads evict each other's entries
    const auto tokenizer = qtts::Tokenizer::load(merges_model_dir(), options);
    const std::string text = "hello world aaaaa abc " + MIXED_TEXT;
    const std::vector<int32_t> expected = tokenizer.encode(text);
    std::vector<int> mismatches(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&, t] {
            for (int i = 0; i < 200; ++i)
                if (tokenizer.encode(text + std::to_string(i % 7)).size() < expected.size()) ++mismatches[size_t(t)];
            for (int i = 0; i < 200; ++i)
                if (tokenizer.encode(text) != expected) ++mismatches[size_t(t)];
        });
    }
    for (auto& th : threads) th.join();
    for (int m : mismatches) CHECK(m == 0);
}

TEST_CASE("unknown ids and bad model folders are reported as qtts::Error") {
    const auto tokenizer = qtts::Tokenizer::load(demo_model_dir());
    CHECK(error_code_of([&] { tokenizer.decode({5000}); }) == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
    CHECK(error_code_of([&] { tokenizer.decode({-1}); }) == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
    CHECK(error_code_of([&] { tokenizer.id_to_token(151676); }) == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
    CHECK(error_code_of([] { qtts::Tokenizer::load("/nonexistent/qtts-model"); }) == qtts::ErrorCode::ERROR_NOT_FOUND);

    const fs::path dir = fs::path(qtts_test::temp_dir()) / "broken-vocab";
    fs::create_directories(dir);
    config_write(dir);
    file_write(dir / "merges.txt", "#version: 0.2\n");
    CHECK(error_code_of([&] { qtts::Tokenizer::load(dir.string()); }) == qtts::ErrorCode::ERROR_NOT_FOUND);
    file_write(dir / "vocab.json", "{\"a\": 0, ");
    CHECK(error_code_of([&] { qtts::Tokenizer::load(dir.string()); }) == qtts::ErrorCode::ERROR_FORMAT);
    file_write(dir / "vocab.json", "{\"a\": 0, \"b\": 1}");  // bytes missing
    CHECK(error_code_of([&] { qtts::Tokenizer::load(dir.string()); }) == qtts::ErrorCode::ERROR_FORMAT);
    fs::copy_file(fs::path(demo_model_dir()) / "vocab.json", dir / "vocab.json", fs::copy_options::overwrite_existing);
    file_write(dir / "merges.txt", "#version: 0.2\na b c\n");
    CHECK(error_code_of([&] { qtts::Tokenizer::load(dir.string()); }) == qtts::ErrorCode::ERROR_FORMAT);
    file_write(dir / "merges.txt", "a b\n");  // no header, merge result not in vocab: ignored
    CHECK(qtts::Tokenizer::load(dir.string()).encode("ab") == demo_expected({{"ab", -1}}));
}
