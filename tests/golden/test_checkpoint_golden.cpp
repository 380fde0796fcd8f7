// Every reference checkpoint loads, with the dimensions of its README, and the real configs parse.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/model/config.h"
#include "engine/model/make_model.h"
#include "engine/model/weights.h"
#include "engine/text/tokenizer.h"
#include "test_support.h"

using namespace qtts;

TEST_CASE("the three reference checkpoints load", "[checkpoint][golden]") {
    struct Expect {
        const char* name;
        ModelType type;
        int hidden;
        bool projection;
        bool speaker;
    };
    for (const Expect& e : {Expect{"tiny-customvoice", ModelType::MODEL_TYPE_CUSTOM_VOICE, 64, false, false},
                            Expect{"tiny-voicedesign", ModelType::MODEL_TYPE_VOICE_DESIGN, 96, true, false},
                            Expect{"tiny-base", ModelType::MODEL_TYPE_BASE, 64, false, true}}) {
        INFO(e.name);
        auto ckpt = checkpoint_load(qtts_test::reference_model_dir(e.name));
        CHECK(ckpt->config.type == e.type);
        CHECK(ckpt->config.talker.hidden_size == e.hidden);
        CHECK((ckpt->code_predictor.proj_w != nullptr) == e.projection);
        CHECK(ckpt->speaker_encoder.has_value() == e.speaker);
        CHECK(ckpt->encoder.has_value());
        CHECK(ckpt->unexpected_tensors.empty());
        int64_t counted = 0, present = 0;
        for (const auto& pc : checkpoint_parameter_counts(*ckpt)) counted += pc.params;
        for (const auto& [n, t] : ckpt->model_file->tensors()) present += t.numel();
        for (const auto& [n, t] : ckpt->speech_file->tensors()) present += t.numel();
        CHECK(counted == present);
    }
}

TEST_CASE("the real release configs parse", "[config][golden]") {
    const std::string dir = qtts_test::reference_dir() + "/real-configs/";
    const ModelConfig cv = model_config_load(dir + "qwen3-tts-12hz-0.6b-customvoice.config.json");
    CHECK(cv.talker.hidden_size == 1024);
    CHECK(cv.talker.num_layers == 28);
    CHECK(cv.talker.head_dim == 128);
    CHECK(cv.talker.speaker_ids.size() == 9);
    CHECK(cv.talker.speaker_dialect.at("dylan") == "beijing_dialect");
    CHECK(cv.talker.code_predictor.num_layers == 5);
    const ModelConfig base = model_config_load(dir + "qwen3-tts-12hz-0.6b-base.config.json");
    CHECK(base.type == ModelType::MODEL_TYPE_BASE);
    REQUIRE(base.speaker_encoder.has_value());
    CHECK(base.speaker_encoder->enc_dim == 1024);
    CHECK(base.speaker_encoder->enc_channels[4] == 1536);
    const SpeechTokenizerConfig st = speech_tokenizer_config_load(dir + "speech-tokenizer-12hz.config.json");
    CHECK(st.decoder.decoder_dim == 1536);
    CHECK(st.decoder.sliding_window == 72);
    CHECK(st.encoder.codebook_dim == 256);
    const GenerationConfig g = generation_config_load(dir + "generation_config.json");
    CHECK(g.top_k == 50);
    CHECK(g.repetition_penalty == Approx(1.05f));
}

TEST_CASE("a generated checkpoint takes a real checkpoint's text tokenizer", "[checkpoint][golden]") {
    const std::string real = qtts_test::reference_model_dir("tiny-customvoice");
    const std::string demo = qtts_test::temp_dir() + "/tokenizer-demo", taken = qtts_test::temp_dir() + "/tokenizer-real";
    model_write_random(model_preset("tiny-customvoice"), demo, 5);
    model_write_random(model_preset("tiny-customvoice"), taken, 5, real);
    const auto read = [](const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
    };
    for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"}) {
        INFO(f);
        CHECK(read(taken + "/" + f) == read(real + "/" + f));
    }
    checkpoint_load(taken);  // the weights are the preset's, the tokenizer the real one's
    // A 20-word sentence: ~1 token a word with the real merges, one a byte with the demo's.
    const std::string sentence = "The quick brown fox jumps over the lazy dog while the evening sun slowly sets "
                                 "behind the quiet distant hills.";
    const size_t real_tokens = Tokenizer::load(taken).encode(sentence).size();
    const size_t demo_tokens = Tokenizer::load(demo).encode(sentence).size();
    CHECK(real_tokens == Tokenizer::load(real).encode(sentence).size());
    CHECK(real_tokens < 30);
    CHECK(demo_tokens > 100);
}
