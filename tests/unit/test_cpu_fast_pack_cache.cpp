// The on-disk cache of packed weights (engine/cpu_fast/pack_cache.h) on a random tiny model written
// for this test: the first load writes the file, the second reads it and gets byte-identical
// matrices; a truncated file, a flipped byte, a file of another format renamed into place and a
// file of another checkpoint are each detected, repacked and rewritten (the next load hits again);
// each format has its own file.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/cpu_fast/fast_lm.h"
#include "engine/cpu_fast/pack_cache.h"
#include "engine/model/make_model.h"
#include "engine/model/weights.h"
#include "test_support.h"

using namespace qtts;
using namespace qtts::cpu_fast;
namespace fs = std::filesystem;

namespace {

bool matrix_equal(const PackedMatrix& a, const PackedMatrix& b) {
    return a.format == b.format && a.rows == b.rows && a.cols == b.cols && a.values.size == b.values.size &&
           a.scales_bytes.size == b.scales_bytes.size &&
           std::memcmp(a.values.data.get(), b.values.data.get(), a.values.size) == 0 &&
           (a.scales_bytes.size == 0 ||
            std::memcmp(a.scales_bytes.data.get(), b.scales_bytes.data.get(), a.scales_bytes.size) == 0);
}

// Every packed matrix of two loads is the same, byte for byte.
bool weights_equal(const FastLmWeights& a, const FastLmWeights& b) {
    const auto stack_equal = [](const FastStack& x, const FastStack& y) {
        if (x.layers.size() != y.layers.size()) return false;
        for (size_t l = 0; l < x.layers.size(); ++l) {
            const FastLayer &p = x.layers[l], &q = y.layers[l];
            if (!matrix_equal(p.qkv, q.qkv) || !matrix_equal(p.o_proj, q.o_proj) || !matrix_equal(p.gate_up, q.gate_up) ||
                !matrix_equal(p.down_proj, q.down_proj))
                return false;
        }
        return true;
    };
    if (!stack_equal(a.talker, b.talker) || !stack_equal(a.predictor, b.predictor)) return false;
    if (!matrix_equal(a.codec_head, b.codec_head) || a.predictor_head.size() != b.predictor_head.size()) return false;
    for (size_t i = 0; i < a.predictor_head.size(); ++i)
        if (!matrix_equal(a.predictor_head[i], b.predictor_head[i])) return false;
    return a.predictor_proj.empty() == b.predictor_proj.empty() &&
           (a.predictor_proj.empty() || matrix_equal(a.predictor_proj, b.predictor_proj));
}

std::string model_dir(const std::string& name, uint64_t seed) {
    const std::string dir = qtts_test::temp_dir() + "/" + name;
    model_write_random(model_preset("tiny-customvoice"), dir, seed);
    return dir;
}

}  // namespace

TEST_CASE("pack cache: written, read back identical, corrupt files rebuilt", "[cpu_fast][pack_cache]") {
    const uint64_t seed = 4242;
    const auto ckpt = checkpoint_load(model_dir("pack-cache-model", seed));
    const std::string cache = qtts_test::temp_dir() + "/pack-cache";
    INFO("model seed " << seed);

    for (const WeightFormat format : {WeightFormat::WEIGHT_FORMAT_BF16, WeightFormat::WEIGHT_FORMAT_INT8}) {
        INFO(weight_format_name(format));
        const auto plain = FastLmWeights::load(ckpt, format);
        CHECK(plain->cache_status() == PackCacheStatus::PACK_CACHE_OFF);
        const std::string path = pack_cache_path(cache, pack_cache_key(ckpt->dir, format));

        const auto first = FastLmWeights::load(ckpt, format, cache);
        CHECK(first->cache_status() == PackCacheStatus::PACK_CACHE_WRITTEN);
        REQUIRE(fs::exists(path));
        CHECK(weights_equal(*first, *plain));
        const auto size = fs::file_size(path);
        CHECK(size > first->packed_bytes());

        const auto second = FastLmWeights::load(ckpt, format, cache);
        CHECK(second->cache_status() == PackCacheStatus::PACK_CACHE_HIT);
        CHECK(weights_equal(*second, *plain));

        // Truncated: cut in the middle of the matrices, then just before the end marker.
        for (const auto cut : {size / 2, size - 3}) {
            fs::resize_file(path, cut);
            const auto rebuilt = FastLmWeights::load(ckpt, format, cache);
            CAPTURE(cut);
            CHECK(rebuilt->cache_status() == PackCacheStatus::PACK_CACHE_REBUILT);
            CHECK(weights_equal(*rebuilt, *plain));
            CHECK(fs::file_size(path) == size);
            CHECK(FastLmWeights::load(ckpt, format, cache)->cache_status() == PackCacheStatus::PACK_CACHE_HIT);
        }

        // One flipped byte inside a matrix's values: only the checksum can tell.
        {
            std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
            f.seekg(std::streamoff(size / 2));
            char byte = 0;
            f.read(&byte, 1);
            byte = char(byte ^ 0x10);
            f.seekp(std::streamoff(size / 2));
            f.write(&byte, 1);
        }
        const auto flipped = FastLmWeights::load(ckpt, format, cache);
        CHECK(flipped->cache_status() == PackCacheStatus::PACK_CACHE_REBUILT);
        CHECK(weights_equal(*flipped, *plain));

        // Garbage past the end.
        {
            std::ofstream f(path, std::ios::app | std::ios::binary);
            f << "tail";
        }
        CHECK(FastLmWeights::load(ckpt, format, cache)->cache_status() == PackCacheStatus::PACK_CACHE_REBUILT);
        CHECK(FastLmWeights::load(ckpt, format, cache)->cache_status() == PackCacheStatus::PACK_CACHE_HIT);
    }

    // Each format has its own file; one put in the other's place is refused (its key differs).
    const std::string bf16_path = pack_cache_path(cache, pack_cache_key(ckpt->dir, WeightFormat::WEIGHT_FORMAT_BF16));
    const std::string int8_path = pack_cache_path(cache, pack_cache_key(ckpt->dir, WeightFormat::WEIGHT_FORMAT_INT8));
    CHECK(bf16_path != int8_path);
    fs::copy_file(bf16_path, int8_path, fs::copy_options::overwrite_existing);
    const auto swapped = FastLmWeights::load(ckpt, WeightFormat::WEIGHT_FORMAT_INT8, cache);
    CHECK(swapped->cache_status() == PackCacheStatus::PACK_CACHE_REBUILT);
    CHECK(weights_equal(*swapped, *FastLmWeights::load(ckpt, WeightFormat::WEIGHT_FORMAT_INT8)));

    // Another checkpoint (other weights) keys another file, even in the same directory.
    const auto other = checkpoint_load(model_dir("pack-cache-other", seed + 1));
    CHECK(pack_cache_key(other->dir, WeightFormat::WEIGHT_FORMAT_BF16) !=
          pack_cache_key(ckpt->dir, WeightFormat::WEIGHT_FORMAT_BF16));
    const auto other_first = FastLmWeights::load(other, WeightFormat::WEIGHT_FORMAT_BF16, cache);
    CHECK(other_first->cache_status() == PackCacheStatus::PACK_CACHE_WRITTEN);
    CHECK(weights_equal(*other_first, *FastLmWeights::load(other, WeightFormat::WEIGHT_FORMAT_BF16)));
    CHECK(!weights_equal(*other_first, *FastLmWeights::load(ckpt, WeightFormat::WEIGHT_FORMAT_BF16, cache)));
}

TEST_CASE("pack cache: an unwritable directory only costs the cache", "[cpu_fast][pack_cache]") {
    const auto ckpt = checkpoint_load(model_dir("pack-cache-model-ro", 4243));
    const std::string blocked = qtts_test::temp_dir() + "/pack-cache-blocked";
    { std::ofstream(blocked) << "a file where the directory should be"; }
    const auto w = FastLmWeights::load(ckpt, WeightFormat::WEIGHT_FORMAT_BF16, blocked + "/sub");
    CHECK(w->cache_status() == PackCacheStatus::PACK_CACHE_WRITE_FAILED);  // packed all the same
    CHECK(weights_equal(*w, *FastLmWeights::load(ckpt, WeightFormat::WEIGHT_FORMAT_BF16)));
    CHECK(!fs::exists(blocked + "/sub"));
}
