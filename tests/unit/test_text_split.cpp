// Sentence splitting and chunking of long input text (engine/text/text_split.h).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "engine/common/error.h"
#include "engine/text/text_split.h"
#include "engine/text/tokenizer.h"

namespace {

using V = std::vector<std::string>;

// Every chunk is within the limit, valid UTF-8, trimmed, and the chunks hold all the
// non-whitespace text in order.
void check_chunks(const std::string& text, const V& chunks, size_t max_bytes) {
    std::string joined_visible, text_visible;
    for (const auto& c : chunks) {
        INFO("chunk: [" << c << "]");
        CHECK(!c.empty());
        CHECK(c.size() <= max_bytes);
        CHECK(qtts::utf8_is_valid(c));
        CHECK(c.front() != ' ');
        CHECK(c.back() != ' ');
        for (char ch : c)
            if (ch != ' ' && ch != '\n' && ch != '\t') joined_visible += ch;
    }
    for (char ch : text)
        if (ch != ' ' && ch != '\n' && ch != '\t') text_visible += ch;
    CHECK(joined_visible == text_visible);
}

}  // namespace

TEST_CASE("sentences end at . ! ? and newlines, and at CJK full stops") {
    CHECK(qtts::text_sentences("Hello there. How are you? Fine!") == V{"Hello there.", "How are you?", "Fine!"});
    CHECK(qtts::text_sentences("Wait... what?! Really.") == V{"Wait...", "what?!", "Really."});
    CHECK(qtts::text_sentences("line one\nline two\r\n\r\nline three") == V{"line one", "line two", "line three"});
    // 你好。我们去公园吧！好吗？ -> three sentences, no spaces needed.
    CHECK(qtts::text_sentences("\xE4\xBD\xA0\xE5\xA5\xBD\xE3\x80\x82\xE6\x88\x91\xE4\xBB\xAC\xE5\x8E\xBB\xE5\x85\xAC"
                               "\xE5\x9B\xAD\xE5\x90\xA7\xEF\xBC\x81\xE5\xA5\xBD\xE5\x90\x97\xEF\xBC\x9F") ==
          V{"\xE4\xBD\xA0\xE5\xA5\xBD\xE3\x80\x82", "\xE6\x88\x91\xE4\xBB\xAC\xE5\x8E\xBB\xE5\x85\xAC\xE5\x9B\xAD\xE5\x90\xA7\xEF\xBC\x81",
            "\xE5\xA5\xBD\xE5\x90\x97\xEF\xBC\x9F"});
    // ASCII '.' directly followed by CJK text also ends a sentence.
    CHECK(qtts::text_sentences("OK.\xE5\xA5\xBD") == V{"OK.", "\xE5\xA5\xBD"});
    // Closing quotes and brackets stay with their sentence.
    CHECK(qtts::text_sentences("He said \"stop.\" Then (quietly) left. \xE2\x80\x9CYes.\xE2\x80\x9D Go") ==
          V{"He said \"stop.\"", "Then (quietly) left.", "\xE2\x80\x9CYes.\xE2\x80\x9D", "Go"});
}

TEST_CASE("no sentence break inside numbers, URLs or after abbreviations") {
    CHECK(qtts::text_sentences("Pi is 3.14159 and e is 2.718. Next.") == V{"Pi is 3.14159 and e is 2.718.", "Next."});
    CHECK(qtts::text_sentences("See https://example.com/a?b=1 for more. Done.") ==
          V{"See https://example.com/a?b=1 for more.", "Done."});
    CHECK(qtts::text_sentences("Use fruit, e.g. apples. Or i.e. Pears.") == V{"Use fruit, e.g. apples.", "Or i.e. Pears."});
    CHECK(qtts::text_sentences("Dr. Smith met Mrs. Jones. They talked.") == V{"Dr. Smith met Mrs. Jones.", "They talked."});
    CHECK(qtts::text_sentences("J. K. Rowling wrote it. Fine.") == V{"J. K. Rowling wrote it.", "Fine."});
    CHECK(qtts::text_sentences("See Fig. 3 and No. 5. Then stop.") == V{"See Fig. 3 and No. 5.", "Then stop."});
    CHECK(qtts::text_sentences("It costs approx. five dollars. Cheap.") == V{"It costs approx. five dollars.", "Cheap."});
    CHECK(qtts::text_sentences("The U.S. economy grew. Good.") == V{"The U.S. economy grew.", "Good."});
    // A plain word before the dot with a capital after it is a sentence end.
    CHECK(qtts::text_sentences("I like it. You do too.") == V{"I like it.", "You do too."});
    CHECK(qtts::text_sentences("Version 1.2.3 is out. Yes") == V{"Version 1.2.3 is out.", "Yes"});
}

TEST_CASE("empty and whitespace-only text gives no chunks") {
    CHECK(qtts::text_split_sentences("", 600).empty());
    CHECK(qtts::text_split_sentences("   \n\t \r\n  ", 600).empty());
    CHECK(qtts::text_split_sentences("\xE3\x80\x80\xE3\x80\x80", 600).empty());  // ideographic spaces
    CHECK(qtts::text_sentences(" \n ").empty());
}

TEST_CASE("short sentences are merged up to the limit, keeping the original text between them") {
    const std::string text = "One. Two. Three. Four.";
    CHECK(qtts::text_split_sentences(text, 600) == V{"One. Two. Three. Four."});
    CHECK(qtts::text_split_sentences(text, 9) == V{"One. Two.", "Three.", "Four."});
    CHECK(qtts::text_split_sentences(text, 11) == V{"One. Two.", "Three.", "Four."});
    CHECK(qtts::text_split_sentences(text, 16) == V{"One. Two. Three.", "Four."});
    CHECK(qtts::text_split_sentences("A.\n\nB.", 600) == V{"A.\n\nB."});
    CHECK(qtts::text_split_sentences("  padded.  ", 600) == V{"padded."});
    CHECK(qtts::TEXT_SPLIT_DEFAULT_MAX_BYTES == 600);
    CHECK(qtts::text_split_sentences(text) == V{text});
}

TEST_CASE("an over-long sentence is cut at a clause mark, else whitespace, else a code point boundary") {
    // Clause mark in the second half of the window wins over later whitespace.
    CHECK(qtts::text_split_sentences("alpha beta gamma, delta epsilon zeta", 24) ==
          V{"alpha beta gamma,", "delta epsilon zeta"});
    // "1,000" is not a clause break (no space after the comma).
    CHECK(qtts::text_split_sentences("pay 1,000 dollars now", 12) == V{"pay 1,000", "dollars now"});
    // Whitespace.
    CHECK(qtts::text_split_sentences("aaaa bbbb cccc dddd", 10) == V{"aaaa bbbb", "cccc dddd"});
    // No whitespace: code point boundaries. Each CJK character is 3 bytes; 7 bytes hold 2.
    const std::string cjk = "\xE4\xB8\x80\xE4\xBA\x8C\xE4\xB8\x89\xE5\x9B\x9B\xE4\xBA\x94";  // 一二三四五
    CHECK(qtts::text_split_sentences(cjk, 7) ==
          V{"\xE4\xB8\x80\xE4\xBA\x8C", "\xE4\xB8\x89\xE5\x9B\x9B", "\xE4\xBA\x94"});
    // CJK comma is a clause break without a following space: 一二，三四五 at 12 bytes.
    CHECK(qtts::text_split_sentences("\xE4\xB8\x80\xE4\xBA\x8C\xEF\xBC\x8C\xE4\xB8\x89\xE5\x9B\x9B\xE4\xBA\x94", 12) ==
          V{"\xE4\xB8\x80\xE4\xBA\x8C\xEF\xBC\x8C", "\xE4\xB8\x89\xE5\x9B\x9B\xE4\xBA\x94"});
    // A combining mark stays with its base letter: "e\u0301" (3 bytes) never splits.
    CHECK(qtts::text_split_sentences("ae\xCC\x81" "b", 2) == V{"a", "e\xCC\x81", "b"});
    // A limit below one code point still makes progress (one code point per chunk).
    CHECK(qtts::text_split_sentences("\xE4\xB8\x80\xE4\xBA\x8C", 2) == V{"\xE4\xB8\x80", "\xE4\xBA\x8C"});
    CHECK(qtts::text_split_sentences("abc", 1) == V{"a", "b", "c"});
}

TEST_CASE("a long mixed-language text splits into valid chunks within the limit") {
    std::string text;
    const V parts = {"The quick brown fox jumps over the lazy dog. ",
                     "\xE4\xBB\x8A\xE5\xA4\xA9\xE5\xA4\xA9\xE6\xB0\x94\xE5\xBE\x88\xE5\xA5\xBD\xEF\xBC\x8C"
                     "\xE6\x88\x91\xE4\xBB\xAC\xE5\x8E\xBB\xE5\x85\xAC\xE5\x9B\xAD\xE6\x95\xA3\xE6\xAD\xA5\xE5\x90\xA7\xE3\x80\x82",
                     "It costs 3.14 dollars, e.g. cheap!\n",
                     "wordwithoutanyspacesthatgoesonandonandonandonandonandonandonandonandonandon "};
    for (int i = 0; i < 300; ++i) text += parts[size_t(i) % parts.size()];
    for (size_t max_bytes : {size_t(8), size_t(40), size_t(97), size_t(600), size_t(5000)}) {
        INFO("max_bytes " << max_bytes);
        const V chunks = qtts::text_split_sentences(text, max_bytes);
        check_chunks(text, chunks, max_bytes);
        if (max_bytes >= 600) {
            // Every sentence here is shorter than the limit, so chunks are whole sentences: all
            // but the last end with a terminator.
            for (size_t i = 0; i + 1 < chunks.size(); ++i) {
                const std::string& c = chunks[i];
                const bool ends_sentence = c.back() == '.' || c.back() == '!' || c.back() == '?' ||
                                           c.compare(c.size() - 3, 3, "\xE3\x80\x82") == 0;
                CHECK(ends_sentence);
            }
        }
    }
}

TEST_CASE("1 MB of text splits in linear time without a single separator") {
    const std::string no_space(size_t(1) << 20, 'x');
    const V chunks = qtts::text_split_sentences(no_space, 600);
    CHECK(chunks.size() == (no_space.size() + 599) / 600);
    check_chunks(no_space, chunks, 600);
    std::string spaces_dots;
    while (spaces_dots.size() < (size_t(1) << 20)) spaces_dots += "a. ";
    check_chunks(spaces_dots, qtts::text_split_sentences(spaces_dots, 600), 600);
}

TEST_CASE("invalid UTF-8 is replaced and a zero limit is rejected") {
    CHECK(qtts::text_split_sentences("bad \xFF byte. ok", 600) == V{"bad \xEF\xBF\xBD byte. ok"});
    CHECK(qtts::text_sentences("bad \xFF byte. Ok") == V{"bad \xEF\xBF\xBD byte.", "Ok"});
    try {
        qtts::text_split_sentences("text", 0);
        FAIL("expected qtts::Error");
    } catch (const qtts::Error& e) {
        CHECK(e.code() == qtts::ErrorCode::ERROR_INVALID_ARGUMENT);
    }
}
