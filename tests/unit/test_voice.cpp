// Saved voice files (.qv): round trip, corrupt/truncated/foreign files, and the model
// compatibility check against hand-built checkpoints (no reference data needed).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <sys/stat.h>
#include <vector>

#include "engine/common/error.h"
#include "engine/model/weights.h"
#include "engine/runtime/voice.h"
#include "test_errors.h"
#include "test_support.h"

namespace {

using qtts_test::require_error;

using qtts::ErrorCode;
using qtts::Voice;

std::shared_ptr<qtts::Checkpoint> checkpoint_make(qtts::ModelType type, const std::string& size_tag, int hidden) {
    auto ckpt = std::make_shared<qtts::Checkpoint>();
    ckpt->dir = "/models/test-" + size_tag;
    ckpt->config.type = type;
    ckpt->config.size_tag = size_tag;
    ckpt->config.talker.hidden_size = hidden;
    return ckpt;
}

Voice voice_make(const qtts::Checkpoint& ckpt, bool icl, uint64_t seed) {
    Voice v;
    v.tts_model_type = qtts::model_type_name(ckpt.config.type);
    v.size_tag = ckpt.config.size_tag;
    v.hidden_size = ckpt.config.talker.hidden_size;
    v.fingerprint = qtts::voice_fingerprint(ckpt);
    v.x_vector = qtts_test::random_floats(size_t(v.hidden_size), seed);
    v.x_vector_only = !icl;
    if (icl) {
        v.ref_text = "Ich bin eine Referenz — 参考。";
        v.ref_frames = 7;
        const std::vector<float> r = qtts_test::random_floats(size_t(v.ref_frames) * 16, seed + 1, 0.0f, 2048.0f);
        for (float x : r) v.ref_codes.push_back(int32_t(x));
        v.ref_ids = {151644, 77091, 198, 40, 1079, 264, 5785, 13, 151645, 198};
    }
    return v;
}

std::string file_read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void file_write(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace

TEST_CASE("a voice survives save and load bit for bit", "[voice]") {
    const auto ckpt = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "0b6", 48);
    for (bool icl : {false, true}) {
        const Voice v = voice_make(*ckpt, icl, icl ? 11 : 12);
        const std::string path = qtts_test::temp_dir() + (icl ? "/icl.qv" : "/xvec.qv");
        qtts::voice_save(v, path);
        const Voice w = qtts::voice_load(path);
        CHECK(w.tts_model_type == v.tts_model_type);
        CHECK(w.size_tag == v.size_tag);
        CHECK(w.hidden_size == v.hidden_size);
        CHECK(w.fingerprint == v.fingerprint);
        CHECK(w.ref_text == v.ref_text);
        CHECK(w.x_vector_only == v.x_vector_only);
        CHECK(w.x_vector == v.x_vector);
        CHECK(w.ref_codes == v.ref_codes);
        CHECK(w.ref_frames == v.ref_frames);
        CHECK(w.ref_ids == v.ref_ids);
        CHECK_NOTHROW(qtts::voice_check_compatible(w, *ckpt));
    }
}

TEST_CASE("truncated, corrupt and foreign voice files are refused with clear errors", "[voice]") {
    const auto ckpt = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "0b6", 32);
    const std::string dir = qtts_test::temp_dir();
    const std::string good = dir + "/good.qv";
    qtts::voice_save(voice_make(*ckpt, true, 21), good);
    const std::string bytes = file_read(good);
    REQUIRE(bytes.size() > 100);
    const std::string bad = dir + "/bad.qv";

    // Every truncation point fails (header, metadata, payload, checksum).
    for (size_t keep : {size_t(0), size_t(5), size_t(12), size_t(30), bytes.size() / 2, bytes.size() - 9, bytes.size() - 1}) {
        INFO("kept " << keep << " of " << bytes.size() << " bytes");
        file_write(bad, bytes.substr(0, keep));
        CHECK_THROWS_AS(qtts::voice_load(bad), qtts::Error);
        try {
            qtts::voice_load(bad);
        } catch (const qtts::Error& e) {
            CHECK(e.code() == ErrorCode::ERROR_FORMAT);
        }
    }
    file_write(bad, bytes.substr(0, bytes.size() - 20));
    require_error([&] { qtts::voice_load(bad); }, ErrorCode::ERROR_FORMAT, "truncated");

    // A flipped payload byte is caught by the checksum.
    std::string flipped = bytes;
    flipped[bytes.size() - 30] = char(flipped[bytes.size() - 30] ^ 0x5a);
    file_write(bad, flipped);
    require_error([&] { qtts::voice_load(bad); }, ErrorCode::ERROR_FORMAT, "checksum");

    // Trailing garbage.
    file_write(bad, bytes + "xyz");
    require_error([&] { qtts::voice_load(bad); }, ErrorCode::ERROR_FORMAT, "trailing");

    // Not a voice file at all (a WAV header), and an unknown version.
    file_write(bad, "RIFF\x24\x00\x00\x00WAVEfmt ");
    require_error([&] { qtts::voice_load(bad); }, ErrorCode::ERROR_FORMAT, "not a qtts voice file");
    std::string future = bytes;
    future[10] = 9;
    file_write(bad, future);
    require_error([&] { qtts::voice_load(bad); }, ErrorCode::ERROR_FORMAT, "version 9");

    // Corrupt metadata JSON (the checksum is checked after parsing the sizes, so break the JSON).
    std::string broken = bytes;
    broken[18] = '!';
    file_write(bad, broken);
    CHECK_THROWS_AS(qtts::voice_load(bad), qtts::Error);

    require_error([&] { qtts::voice_load(dir + "/missing.qv"); }, ErrorCode::ERROR_NOT_FOUND, "not found");
    require_error([&] { qtts::voice_load(dir); }, ErrorCode::ERROR_IO, "folder");
}

TEST_CASE("inconsistent voices cannot be saved", "[voice]") {
    const auto ckpt = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "0b6", 16);
    const std::string path = qtts_test::temp_dir() + "/inconsistent.qv";
    Voice v = voice_make(*ckpt, true, 31);
    v.x_vector.pop_back();
    require_error([&] { qtts::voice_save(v, path); }, ErrorCode::ERROR_FORMAT, "x-vector has 15 values");
    v = voice_make(*ckpt, true, 32);
    v.ref_codes[5] = 2048;
    require_error([&] { qtts::voice_save(v, path); }, ErrorCode::ERROR_FORMAT, "reference code 2048");
    v = voice_make(*ckpt, true, 33);
    v.ref_codes.resize(v.ref_codes.size() - 1);
    require_error([&] { qtts::voice_save(v, path); }, ErrorCode::ERROR_FORMAT, "reference codes");
    v = voice_make(*ckpt, true, 34);
    v.x_vector[3] = std::nanf("");
    require_error([&] { qtts::voice_save(v, path); }, ErrorCode::ERROR_FORMAT, "NaN");
    v = voice_make(*ckpt, false, 35);
    v.ref_ids = {1, 2, 3};
    require_error([&] { qtts::voice_save(v, path); }, ErrorCode::ERROR_FORMAT, "x-vector-only");
    struct stat st {};
    CHECK(::stat(path.c_str(), &st) != 0);  // nothing was written
}

TEST_CASE("a voice made for another model is refused", "[voice]") {
    const auto base_small = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "0b6", 64);
    const Voice v = voice_make(*base_small, true, 41);
    CHECK_NOTHROW(qtts::voice_check_compatible(v, *base_small));

    const auto base_large = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "1b7", 128);
    require_error([&] { qtts::voice_check_compatible(v, *base_large); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "made for another model");
    const auto same_size_other_width = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "0b6", 96);
    require_error([&] { qtts::voice_check_compatible(v, *same_size_other_width); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "hidden size 96");
    const auto custom = checkpoint_make(qtts::ModelType::MODEL_TYPE_CUSTOM_VOICE, "0b6", 64);
    require_error([&] { qtts::voice_check_compatible(v, *custom); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "Base models only");

    // Same identity, other weights: the fingerprint differs.
    Voice other = v;
    other.fingerprint = "0123456789abcdef";
    REQUIRE(other.fingerprint != qtts::voice_fingerprint(*base_small));
    require_error([&] { qtts::voice_check_compatible(other, *base_small); }, ErrorCode::ERROR_INVALID_ARGUMENT,
                  "other weights");
}

TEST_CASE("the fingerprint follows the weight bytes", "[voice]") {
    // Two checkpoints whose talker codec embedding differs in one byte.
    std::vector<uint8_t> a(10000, 7), b(10000, 7);
    b[9990] = 8;
    qtts::TensorView ta, tb;
    ta.name = tb.name = "talker.model.codec_embedding.weight";
    ta.dtype = tb.dtype = qtts::DType::DTYPE_BF16;
    ta.shape = tb.shape = {100, 50};
    ta.data = a.data();
    tb.data = b.data();
    ta.nbytes = tb.nbytes = a.size();
    auto ca = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "0b6", 50);
    auto cb = checkpoint_make(qtts::ModelType::MODEL_TYPE_BASE, "0b6", 50);
    ca->talker.codec_embedding = &ta;
    cb->talker.codec_embedding = &tb;
    const std::string fa = qtts::voice_fingerprint(*ca);
    CHECK(fa.size() == 16);
    CHECK(fa == qtts::voice_fingerprint(*ca));
    CHECK(fa != qtts::voice_fingerprint(*cb));
    const Voice v = voice_make(*ca, false, 51);
    CHECK_NOTHROW(qtts::voice_check_compatible(v, *ca));
    CHECK_THROWS_AS(qtts::voice_check_compatible(v, *cb), qtts::Error);
}
