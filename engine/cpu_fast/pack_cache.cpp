#include "engine/cpu_fast/pack_cache.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <unistd.h>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::cpu_fast {

namespace fs = std::filesystem;

namespace {

constexpr char MAGIC_BEGIN[8] = {'Q', 'T', 'T', 'S', 'P', 'A', 'C', 'K'};
constexpr char MAGIC_END[8] = {'Q', 'T', 'T', 'S', 'D', 'O', 'N', 'E'};
constexpr uint32_t LAYOUT_VERSION = 1;
constexpr uint32_t KEY_MAX = 4096;

// 64-bit hash of a buffer, eight bytes a step (a multiply-xorshift mix; not cryptographic: it
// catches truncation and flipped bytes, not tampering).
uint64_t buffer_hash(uint64_t h, const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    const uint64_t mul = 0x9e3779b97f4a7c15ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t word;
        std::memcpy(&word, p + i, 8);
        h = (h ^ word) * mul;
        h ^= h >> 29;
    }
    uint64_t tail = n;  // the length too: "ab" + "c" differs from "a" + "bc"
    for (; i < n; ++i) tail = (tail << 8) | p[i];
    h = (h ^ tail) * mul;
    return h ^ (h >> 32);
}

}  // namespace

const char* pack_cache_status_name(PackCacheStatus status) {
    switch (status) {
        case PackCacheStatus::PACK_CACHE_OFF: return "off";
        case PackCacheStatus::PACK_CACHE_HIT: return "hit";
        case PackCacheStatus::PACK_CACHE_WRITTEN: return "written";
        case PackCacheStatus::PACK_CACHE_REBUILT: return "rebuilt";
        case PackCacheStatus::PACK_CACHE_WRITE_FAILED: return "write-failed";
    }
    return "?";
}

std::string pack_cache_dir_from_env() {
    const char* dir = std::getenv("QTTS_CPU_PACK_CACHE");
    return dir ? std::string(dir) : std::string();
}

std::string pack_cache_key(const std::string& checkpoint_dir, WeightFormat format) {
    std::error_code ec;
    const fs::path model = fs::absolute(fs::path(checkpoint_dir) / "model.safetensors", ec);
    const auto size = fs::file_size(model, ec);
    const auto mtime = fs::last_write_time(model, ec);
    const long long ns =
        ec ? 0LL
           : (long long)std::chrono::duration_cast<std::chrono::nanoseconds>(mtime.time_since_epoch()).count();
    return "qtts-pack v" + std::to_string(LAYOUT_VERSION) + " | " + model.string() + " | " +
           std::to_string(ec ? 0 : (unsigned long long)size) + " bytes | mtime " + std::to_string(ns) + " | " +
           weight_format_name(format);
}

std::string pack_cache_path(const std::string& dir, const std::string& key) {
    char name[32];
    std::snprintf(name, sizeof(name), "%016llx.qpack", (unsigned long long)buffer_hash(0, key.data(), key.size()));
    return (fs::path(dir) / name).string();
}

PackSource::PackSource(WeightFormat format) : format_(format) {}

PackSource::PackSource(WeightFormat format, const std::string& path, const std::string& key, bool write)
    : format_(format), path_(path), write_(write) {
    if (key.size() > KEY_MAX) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "pack cache key of {} bytes", key.size());
    const uint32_t key_len = uint32_t(key.size());
    if (write_) {
        std::error_code ec;
        fs::create_directories(fs::path(path_).parent_path(), ec);
        tmp_path_ = path_ + ".tmp." + std::to_string(::getpid());
        file_ = std::fopen(tmp_path_.c_str(), "wb");
        if (!file_) {
            QTTS_LOG_WARN("pack cache: cannot write {}: packed weights will not be cached", tmp_path_);
            write_failed_ = true;
            return;
        }
        bytes_write(MAGIC_BEGIN, sizeof(MAGIC_BEGIN));
        bytes_write(&LAYOUT_VERSION, sizeof(LAYOUT_VERSION));
        bytes_write(&key_len, sizeof(key_len));
        bytes_write(key.data(), key.size());
        return;
    }
    file_ = std::fopen(path_.c_str(), "rb");
    if (!file_) throw PackCacheInvalid{"no file"};
    char magic[8];
    uint32_t version = 0, stored_len = 0;
    bytes_read(magic, sizeof(magic));
    bytes_read(&version, sizeof(version));
    bytes_read(&stored_len, sizeof(stored_len));
    if (std::memcmp(magic, MAGIC_BEGIN, sizeof(magic)) != 0 || version != LAYOUT_VERSION || stored_len != key_len)
        throw PackCacheInvalid{"not a pack cache file of this version and key"};
    std::string stored(stored_len, '\0');
    bytes_read(stored.data(), stored.size());
    if (stored != key) throw PackCacheInvalid{"made for another checkpoint or format"};
}

PackSource::~PackSource() {
    if (file_) std::fclose(file_);
    if (!tmp_path_.empty()) {
        std::error_code ec;
        fs::remove(tmp_path_, ec);  // left only when finish() did not move it into place
    }
}

void PackSource::bytes_read(void* dst, size_t n) {
    if (n > 0 && std::fread(dst, 1, n, file_) != n) throw PackCacheInvalid{"truncated"};
    hash_ = buffer_hash(hash_, dst, n);
}

void PackSource::bytes_write(const void* src, size_t n) {
    if (write_failed_) return;
    if (n > 0 && std::fwrite(src, 1, n, file_) != n) write_failed_ = true;
    hash_ = buffer_hash(hash_, src, n);
}

PackedMatrix PackSource::matrix_read(int rows, int cols) {
    uint32_t format = 0;
    int32_t stored_rows = 0, stored_cols = 0;
    uint64_t value_bytes = 0, scale_bytes = 0;
    bytes_read(&format, sizeof(format));
    bytes_read(&stored_rows, sizeof(stored_rows));
    bytes_read(&stored_cols, sizeof(stored_cols));
    bytes_read(&value_bytes, sizeof(value_bytes));
    bytes_read(&scale_bytes, sizeof(scale_bytes));
    const bool int8 = format_ == WeightFormat::WEIGHT_FORMAT_INT8;
    const uint64_t want_values = uint64_t(rows) * uint64_t(cols) * (int8 ? 1 : 2);
    const uint64_t want_scales = int8 ? uint64_t(rows) * sizeof(float) : 0;
    if (format != uint32_t(format_) || stored_rows != rows || stored_cols != cols || value_bytes != want_values ||
        scale_bytes != want_scales)
        throw PackCacheInvalid{"matrix " + std::to_string(matrices_) + " has another shape or format"};
    PackedMatrix m;
    m.format = format_;
    m.rows = rows;
    m.cols = cols;
    m.values.resize(size_t(value_bytes));
    bytes_read(m.values.data.get(), size_t(value_bytes));
    if (scale_bytes > 0) {
        m.scales_bytes.resize(size_t(scale_bytes));
        bytes_read(m.scales_bytes.data.get(), size_t(scale_bytes));
    }
    ++matrices_;
    return m;
}

void PackSource::matrix_write(const PackedMatrix& m) {
    const uint32_t format = uint32_t(m.format);
    const int32_t rows = m.rows, cols = m.cols;
    const uint64_t value_bytes = m.values.size, scale_bytes = m.scales_bytes.size;
    bytes_write(&format, sizeof(format));
    bytes_write(&rows, sizeof(rows));
    bytes_write(&cols, sizeof(cols));
    bytes_write(&value_bytes, sizeof(value_bytes));
    bytes_write(&scale_bytes, sizeof(scale_bytes));
    bytes_write(m.values.data.get(), size_t(value_bytes));
    if (scale_bytes > 0) bytes_write(m.scales_bytes.data.get(), size_t(scale_bytes));
    ++matrices_;
}

bool PackSource::finish() {
    if (!file_) return false;
    if (reading()) {
        uint32_t count = 0;
        bytes_read(&count, sizeof(count));
        const uint64_t expected = hash_;
        uint64_t stored = 0;
        char magic[8];
        if (std::fread(&stored, 1, sizeof(stored), file_) != sizeof(stored) ||
            std::fread(magic, 1, sizeof(magic), file_) != sizeof(magic))
            throw PackCacheInvalid{"truncated"};
        if (count != matrices_) throw PackCacheInvalid{"holds another number of matrices"};
        if (stored != expected || std::memcmp(magic, MAGIC_END, sizeof(magic)) != 0)
            throw PackCacheInvalid{"checksum mismatch (corrupt)"};
        if (std::fgetc(file_) != EOF) throw PackCacheInvalid{"has bytes past its end"};
        return true;
    }
    bytes_write(&matrices_, sizeof(matrices_));
    const uint64_t checksum = hash_;
    if (!write_failed_ && (std::fwrite(&checksum, 1, sizeof(checksum), file_) != sizeof(checksum) ||
                           std::fwrite(MAGIC_END, 1, sizeof(MAGIC_END), file_) != sizeof(MAGIC_END)))
        write_failed_ = true;
    if (std::fclose(file_) != 0) write_failed_ = true;
    file_ = nullptr;
    std::error_code ec;
    if (!write_failed_) fs::rename(tmp_path_, path_, ec);
    if (write_failed_ || ec) {
        QTTS_LOG_WARN("pack cache: could not write {}: packed weights not cached", path_);
        return false;
    }
    tmp_path_.clear();
    return true;
}

}  // namespace qtts::cpu_fast
