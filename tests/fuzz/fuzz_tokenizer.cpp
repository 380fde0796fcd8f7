// Fuzz target: the text tokenizer, text -> ids -> text. The vocabulary is the real Qwen2 one of
// ../shared/reference/models/tiny-customvoice when present, else the embedded demo model's
// (written to the qtts cache on first use, as `qtts say` does). QTTS_FUZZ_TOKENIZER_DIR names
// another model folder, or `demo` for the demo model's vocabulary even when the reference is there.
//
// Properties: every id is in the vocabulary, decode() takes what encode() gives, and text with
// no '<' (so no added token can match) comes back as its NFC form.
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "fuzz_support.h"
#include "engine/model/make_model.h"
#include "engine/text/tokenizer.h"

namespace {

std::string tokenizer_dir() {
    const char* chosen = std::getenv("QTTS_FUZZ_TOKENIZER_DIR");
    const std::string choice = chosen ? chosen : "";
    if (choice == "demo") return qtts::default_model_dir();
    if (!choice.empty()) return choice;
    const std::string reference = QTTS_REFERENCE_DIR "/models/tiny-customvoice";
    if (std::filesystem::exists(reference + "/vocab.json")) return reference;
    return qtts::default_model_dir();
}

const qtts::Tokenizer& tokenizer() {
    static const qtts::Tokenizer tok = [] {
        const std::string dir = tokenizer_dir();
        std::fprintf(stderr, "fuzz_tokenizer: vocabulary from %s\n", dir.c_str());
        return qtts::Tokenizer::load(dir);
    }();
    return tok;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    tokenizer();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const qtts::Tokenizer& tok = tokenizer();
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    try {
        const std::vector<int32_t> ids = tok.encode(text);
        for (int32_t id : ids) qtts::fuzz::property(id >= 0 && id < tok.vocab_size(), "id inside the vocabulary");
        const std::string back = tok.decode(ids);
        if (text.find('<') == std::string_view::npos)
            qtts::fuzz::property(back == qtts::utf8_nfc(text), "decode(encode(text)) == NFC(text)");
        tok.pretokenize(text);
        // Request text as the engine reads it: added-token strings stay text, so the round trip
        // holds for every input, '<' included.
        const std::vector<int32_t> plain = tok.encode(text, qtts::AddedTokens::ADDED_TOKENS_AS_TEXT);
        for (int32_t id : plain) {
            qtts::fuzz::property(id >= 0 && id < tok.vocab_size(), "id inside the vocabulary");
            qtts::fuzz::property(!tok.is_special(id), "plain text never yields a control token");
        }
        qtts::fuzz::property(tok.decode(plain) == qtts::utf8_nfc(text), "plain text: decode(encode) == NFC(text)");
    } catch (const qtts::Error& e) {
        qtts::fuzz::error_check(e);
    }
    return 0;
}
