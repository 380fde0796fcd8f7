// The safetensors reader validates everything it maps and names the exact problem.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>

#include "engine/common/error.h"
#include "engine/model/safetensors.h"
#include "test_support.h"

using namespace qtts;

namespace {

std::string write_raw(const std::string& name, const std::string& header, size_t data_bytes, size_t header_len_override = 0) {
    const std::string path = qtts_test::temp_dir() + "/" + name;
    std::ofstream out(path, std::ios::binary);
    uint64_t len = header_len_override ? header_len_override : header.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(header.data(), std::streamsize(header.size()));
    std::string data(data_bytes, '\x01');
    out.write(data.data(), std::streamsize(data.size()));
    return path;
}

std::string error_of(const std::string& path) {
    try {
        SafetensorsFile::open(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even and round-trips", "[safetensors]") {
    for (float v : {0.0f, 1.0f, -2.5f, 3.140625f, 1e-20f, 65504.0f}) {
        CHECK(bf16_to_f32(f32_to_bf16(v)) == Approx(v).epsilon(1e-2));
    }
    // 1 + 2^-8 is exactly half way between two bf16 values: ties go to the even mantissa (1.0).
    CHECK(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256.0f)) == 1.0f);
    CHECK(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256.0f)) == Approx(1.0f + 4.0f / 256.0f));
    CHECK(f16_to_f32(0x3C00) == 1.0f);
    CHECK(f16_to_f32(0xC000) == -2.0f);
    CHECK(f16_to_f32(0x0001) == Approx(5.96046448e-8f));
}

TEST_CASE("writer and reader round-trip every dtype", "[safetensors]") {
    SafetensorsWriter w;
    const auto values = qtts_test::random_floats(6, 7);
    w.add_f32("a.f32", {2, 3}, values);
    w.add("b.bf16", DType::DTYPE_BF16, {3}, [](uint8_t* dst, size_t n) {
        const uint16_t v[3] = {f32_to_bf16(1.5f), f32_to_bf16(-2.0f), f32_to_bf16(0.25f)};
        std::memcpy(dst, v, n);
    });
    w.add("c.i64", DType::DTYPE_I64, {2}, [](uint8_t* dst, size_t n) {
        const int64_t v[2] = {-5, 1LL << 40};
        std::memcpy(dst, v, n);
    });
    w.add("d.i32", DType::DTYPE_I32, {1}, [](uint8_t* dst, size_t n) {
        const int32_t v = 42;
        std::memcpy(dst, &v, n);
    });
    w.add("e.u8", DType::DTYPE_U8, {2}, [](uint8_t* dst, size_t) { dst[0] = 200, dst[1] = 3; });
    w.add("f.f16", DType::DTYPE_F16, {1}, [](uint8_t* dst, size_t) { dst[0] = 0x00, dst[1] = 0x3C; });
    w.set_metadata("format", "pt");
    const std::string path = qtts_test::temp_dir() + "/roundtrip.safetensors";
    w.write(path);

    auto f = SafetensorsFile::open(path);
    REQUIRE(f->tensors().size() == 6);
    CHECK(f->metadata().at("format") == "pt");
    CHECK(tensor_to_f32(f->get("a.f32")) == values);
    CHECK(tensor_to_f32(f->get("b.bf16")) == std::vector<float>{1.5f, -2.0f, 0.25f});
    CHECK(tensor_to_i64(f->get("c.i64")) == std::vector<int64_t>{-5, 1LL << 40});
    CHECK(tensor_to_i64(f->get("d.i32")) == std::vector<int64_t>{42});
    CHECK(tensor_to_i64(f->get("e.u8")) == std::vector<int64_t>{200, 3});
    CHECK(tensor_to_f32(f->get("f.f16")) == std::vector<float>{1.0f});
    CHECK(f->get("a.f32").shape_str() == "[2, 3]");
    std::vector<float> row(3);
    tensor_rows_to_f32(f->get("a.f32"), 1, 1, row.data());
    CHECK(row == std::vector<float>(values.begin() + 3, values.end()));
    CHECK_THROWS_AS(tensor_to_f32(f->get("c.i64")), Error);
    CHECK_THROWS_WITH(f->get("nope"), Catch::Contains("missing tensor 'nope'"));
}

// Found by fuzz_safetensors (tests/fuzz): converting an empty F32 tensor passed the empty output
// vector's null data() to memcpy (undefined behaviour; a QTTS_SANITIZE_UNDEFINED build reports it).
TEST_CASE("empty tensors convert to empty vectors", "[safetensors]") {
    SafetensorsWriter w;
    w.add_f32("empty.f32", {0, 4}, {});
    w.add("empty.bf16", DType::DTYPE_BF16, {4, 0}, [](uint8_t*, size_t) {});
    w.add("empty.i64", DType::DTYPE_I64, {0}, [](uint8_t*, size_t) {});
    const std::string path = qtts_test::temp_dir() + "/empty.safetensors";
    w.write(path);
    auto f = SafetensorsFile::open(path);
    CHECK(tensor_to_f32(f->get("empty.f32")).empty());
    CHECK(tensor_to_f32(f->get("empty.bf16")).empty());
    CHECK(tensor_to_i64(f->get("empty.i64")).empty());
    tensor_rows_to_f32(f->get("empty.f32"), 0, 0, nullptr);
    CHECK_THROWS_AS(tensor_to_f32(f->get("empty.i64")), Error);  // still an integer tensor
}

TEST_CASE("corrupt safetensors files give clear errors", "[safetensors]") {
    SECTION("missing file") { CHECK_THAT(error_of(qtts_test::temp_dir() + "/absent.safetensors"), Catch::Contains("cannot open")); }
    SECTION("shorter than the length prefix") {
        const std::string path = qtts_test::temp_dir() + "/tiny.safetensors";
        std::ofstream(path) << "abc";
        CHECK_THAT(error_of(path), Catch::Contains("truncated"));
    }
    SECTION("header length beyond the file") {
        CHECK_THAT(error_of(write_raw("len.safetensors", "{}", 0, 1000)), Catch::Contains("header length"));
    }
    SECTION("invalid JSON") { CHECK_THAT(error_of(write_raw("json.safetensors", "{not json", 0)), Catch::Contains("invalid JSON")); }
    SECTION("unknown dtype") {
        CHECK_THAT(error_of(write_raw("dt.safetensors", R"({"x":{"dtype":"F8","shape":[1],"data_offsets":[0,1]}})", 1)),
                   Catch::Contains("unsupported dtype F8"));
    }
    SECTION("size does not match shape x dtype") {
        CHECK_THAT(error_of(write_raw("sz.safetensors", R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4)),
                   Catch::Contains("does not match shape [2]"));
    }
    SECTION("truncated data") {
        CHECK_THAT(error_of(write_raw("tr.safetensors", R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)),
                   Catch::Contains("truncated") && Catch::Contains("'x'"));
    }
    SECTION("overlapping tensors") {
        CHECK_THAT(error_of(write_raw("ov.safetensors",
                                      R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                      12)),
                   Catch::Contains("overlap"));
    }
    SECTION("negative dimension") {
        CHECK_THAT(error_of(write_raw("neg.safetensors", R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4)),
                   Catch::Contains("negative"));
    }
    SECTION("missing offsets") {
        CHECK_THAT(error_of(write_raw("off.safetensors", R"({"x":{"dtype":"F32","shape":[1]}})", 4)),
                   Catch::Contains("data_offsets"));
    }
}
