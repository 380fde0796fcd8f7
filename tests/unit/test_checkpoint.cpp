// A checkpoint directory loads into validated weights; every broken variant fails clearly.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "engine/common/error.h"
#include "engine/model/make_model.h"
#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "test_support.h"

using namespace qtts;
namespace fs = std::filesystem;

namespace {

std::string fresh_model(const std::string& name) {
    const std::string dir = qtts_test::temp_dir() + "/" + name;
    fs::remove_all(dir);
    model_write_random(model_preset("tiny-customvoice"), dir, 99);
    return dir;
}

std::string load_error(const std::string& dir) {
    try {
        checkpoint_load(dir);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Rewrites model.safetensors with one tensor changed by `edit` (or dropped when it returns false).
void rewrite_model(const std::string& dir, const std::string& target,
                   const std::function<bool(std::vector<int64_t>& shape)>& edit) {
    const std::string path = dir + "/model.safetensors";
    auto src = SafetensorsFile::open(path);
    SafetensorsWriter w;
    for (const auto& [name, t] : src->tensors()) {
        std::vector<int64_t> shape = t.shape;
        if (name == target && !edit(shape)) continue;
        size_t n = dtype_size(t.dtype);
        for (auto d : shape) n *= size_t(d);
        const uint8_t* data = t.data;
        const size_t avail = t.nbytes;
        w.add(name, t.dtype, shape, [data, avail](uint8_t* dst, size_t nbytes) {
            std::memcpy(dst, data, std::min(nbytes, avail));
            if (nbytes > avail) std::memset(dst + avail, 0, nbytes - avail);
        });
    }
    const std::string tmp = path + ".new";
    w.write(tmp);
    src.reset();
    fs::rename(tmp, path);
}

}  // namespace

TEST_CASE("a generated tiny checkpoint loads with every network bound", "[checkpoint]") {
    const std::string dir = fresh_model("ok");
    auto ckpt = checkpoint_load(dir);
    CHECK(ckpt->talker.layers.size() == 2);
    CHECK(ckpt->code_predictor.codec_embedding.size() == 15);
    CHECK(ckpt->code_predictor.lm_head.size() == 15);
    CHECK(ckpt->code_predictor.proj_w == nullptr);
    CHECK(ckpt->decoder.blocks.size() == 4);
    CHECK(ckpt->encoder.has_value());
    CHECK(ckpt->unexpected_tensors.empty());
    int64_t total = 0;
    for (const auto& pc : checkpoint_parameter_counts(*ckpt)) total += pc.params;
    int64_t expected = 0;
    for (const auto& [n, t] : ckpt->model_file->tensors()) expected += t.numel();
    for (const auto& [n, t] : ckpt->speech_file->tensors()) expected += t.numel();
    CHECK(total == expected);
}

TEST_CASE("make-model refuses a tokenizer folder without the tokenizer files, writing nothing", "[checkpoint]") {
    const std::string out = qtts_test::temp_dir() + "/no-tokenizer";
    fs::remove_all(out);
    const std::string empty = qtts_test::temp_dir() + "/empty-folder";
    fs::create_directories(empty);
    for (const std::string& from : {empty, qtts_test::temp_dir() + "/missing-folder"}) {
        INFO(from);
        try {
            model_write_random(model_preset("tiny-customvoice"), out, 1, from);
            FAIL("no error");
        } catch (const Error& e) {
            CHECK(e.code() == ErrorCode::ERROR_INVALID_ARGUMENT);
            CHECK(std::string(e.what()).find("vocab.json") != std::string::npos);
        }
        CHECK_FALSE(fs::exists(out));
    }
}

TEST_CASE("broken checkpoints give errors naming the file and tensor", "[checkpoint]") {
    SECTION("missing directory") { CHECK_THAT(load_error("/nonexistent/model"), Catch::Contains("does not exist")); }
    SECTION("missing speech_tokenizer/") {
        const std::string dir = fresh_model("nost");
        fs::remove_all(dir + "/speech_tokenizer");
        CHECK_THAT(load_error(dir), Catch::Contains("speech_tokenizer") && Catch::Contains("huggingface-cli download"));
    }
    SECTION("missing model.safetensors") {
        const std::string dir = fresh_model("nomodel");
        fs::remove(dir + "/model.safetensors");
        CHECK_THAT(load_error(dir), Catch::Contains("model.safetensors") && Catch::Contains("expected the official"));
    }
    SECTION("unreadable config.json") {
        const std::string dir = fresh_model("badjson");
        std::ofstream(dir + "/config.json") << "{\"talker_config\": [";
        CHECK_THAT(load_error(dir), Catch::Contains("config.json") && Catch::Contains("invalid JSON"));
    }
    SECTION("truncated model.safetensors") {
        const std::string dir = fresh_model("trunc");
        const auto size = fs::file_size(dir + "/model.safetensors");
        fs::resize_file(dir + "/model.safetensors", size - 1000);
        CHECK_THAT(load_error(dir), Catch::Contains("model.safetensors") && Catch::Contains("truncated"));
    }
    SECTION("corrupt header") {
        const std::string dir = fresh_model("corrupt");
        std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(8);
        f.write("XXXX", 4);
        f.close();
        CHECK_THAT(load_error(dir), Catch::Contains("invalid JSON"));
    }
    SECTION("missing tensor") {
        const std::string dir = fresh_model("missing");
        rewrite_model(dir, "talker.model.layers.1.mlp.up_proj.weight", [](auto&) { return false; });
        CHECK_THAT(load_error(dir), Catch::Contains("missing tensor talker.model.layers.1.mlp.up_proj.weight [128, 64]"));
    }
    SECTION("wrong shape") {
        const std::string dir = fresh_model("shape");
        rewrite_model(dir, "talker.codec_head.weight", [](auto& s) {
            s[0] = 3000;
            return true;
        });
        CHECK_THAT(load_error(dir), Catch::Contains("'talker.codec_head.weight' has shape [3000, 64], expected [3072, 64]"));
    }
    SECTION("wrong dtype") {
        const std::string dir = fresh_model("dtype");
        const std::string path = dir + "/model.safetensors";
        auto src = SafetensorsFile::open(path);
        SafetensorsWriter w;
        for (const auto& [name, t] : src->tensors()) {
            const bool target = name == "talker.model.norm.weight";
            const uint8_t* data = t.data;
            w.add(name, target ? DType::DTYPE_I32 : t.dtype, target ? std::vector<int64_t>{t.shape[0] / 2} : t.shape,
                  [data](uint8_t* dst, size_t n) { std::memcpy(dst, data, n); });
        }
        w.write(path + ".new");
        src.reset();
        fs::rename(path + ".new", path);
        CHECK_THAT(load_error(dir), Catch::Contains("talker.model.norm.weight"));
    }
}
