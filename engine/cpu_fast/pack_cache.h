// Packed weights cached on disk, so a second load of the same checkpoint in the same format reads
// the packed bytes instead of converting and rounding every matrix again (int8 0.6B: 3-8 s of
// packing, more under load).
//
// One file per checkpoint and format: <dir>/<16 hex digits of the key's hash>.qpack, where the key
// names the cache layout version, the checkpoint's model file (absolute path, size, modification
// time) and the format. The file holds the key, the matrices in the order the loader packs them
// (format, rows, cols, values, scales), their count and a 64-bit checksum over everything before it:
//
//   "QTTSPACK" u32 version | u32 key length, key | per matrix: u32 format, i32 rows, i32 cols,
//   u64 value bytes, u64 scale bytes, values, scales | u32 matrices | u64 checksum | "QTTSDONE"
//
// A file that is missing, truncated, corrupt (checksum), made for another key, or whose matrices
// do not have the shapes the loader asks for is not used: the loader packs from the checkpoint and
// writes the file again (to a temporary name, renamed into place, so a reader never sees half a
// file). Failing to write it only logs a warning.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "engine/cpu_fast/matvec.h"

namespace qtts::cpu_fast {

enum class PackCacheStatus {
    PACK_CACHE_OFF,      // no cache directory
    PACK_CACHE_HIT,      // read from the file
    PACK_CACHE_WRITTEN,  // no file: packed and written
    PACK_CACHE_REBUILT,  // a file was there but unusable: packed and written again
    PACK_CACHE_WRITE_FAILED,  // packed; the file could not be written (a warning was logged)
};
// "off", "hit", "written", "rebuilt", "write-failed"
const char* pack_cache_status_name(PackCacheStatus status);

// The cache directory from the environment: $QTTS_CPU_PACK_CACHE, or "" (no cache) when unset.
std::string pack_cache_dir_from_env();

// The key of a checkpoint directory's model.safetensors in `format` (what a file is valid for).
std::string pack_cache_key(const std::string& checkpoint_dir, WeightFormat format);
// <dir>/<hash of key>.qpack
std::string pack_cache_path(const std::string& dir, const std::string& key);

// Where the loader's matrices come from: packed from fp32 (and recorded when writing a cache
// file), or read back from a cache file in the same order.
class PackSource {
public:
    // No cache: every matrix is packed.
    explicit PackSource(WeightFormat format);
    // Reads `path` (throws PackCacheInvalid when it cannot be used) or, with write = true, packs and
    // records every matrix for commit().
    PackSource(WeightFormat format, const std::string& path, const std::string& key, bool write);
    ~PackSource();
    PackSource(const PackSource&) = delete;
    PackSource& operator=(const PackSource&) = delete;

    WeightFormat format() const { return format_; }
    bool reading() const { return file_ != nullptr && !write_; }

    // The next matrix, rows × cols: read from the file, or `fp32()` (which fills W [rows, cols]) packed.
    template <typename Fill>
    PackedMatrix matrix(int rows, int cols, Fill&& fp32) {
        if (reading()) return matrix_read(rows, cols);
        std::unique_ptr<float[]> w(new float[size_t(rows) * size_t(cols)]);
        fp32(w.get());
        PackedMatrix m = matrix_pack(w.get(), rows, cols, format_);
        if (write_) matrix_write(m);
        return m;
    }

    // Reading: checks that the file ends here with a matching checksum (throws PackCacheInvalid
    // otherwise). Writing: writes the checksum and moves the file into place (false, with a warning
    // logged, when it could not be written).
    bool finish();

private:
    PackedMatrix matrix_read(int rows, int cols);
    void matrix_write(const PackedMatrix& m);
    void bytes_read(void* dst, size_t n);
    void bytes_write(const void* src, size_t n);

    WeightFormat format_;
    std::string path_, tmp_path_;
    bool write_ = false;
    bool write_failed_ = false;
    std::FILE* file_ = nullptr;
    uint64_t hash_ = 0;
    uint32_t matrices_ = 0;  // written or read so far
};

// Thrown by PackSource when a cache file cannot be used; the loader catches it and packs anew.
struct PackCacheInvalid {
    std::string reason;
};

}  // namespace qtts::cpu_fast
