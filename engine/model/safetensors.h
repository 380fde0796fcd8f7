// Safetensors files: a memory-mapped, validated reader and a fast writer.
//
// Layout: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {...}},
// then the data buffer. Offsets are relative to the start of the data buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace qtts {

enum class DType { DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_I64, DTYPE_I32, DTYPE_U8 };

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);  // "BF16", "F32", ... as written in the file

// bf16 <-> f32 (round to nearest even, NaN preserved).
float bf16_to_f32(uint16_t v);
uint16_t f32_to_bf16(float v);
float f16_to_f32(uint16_t v);

// One tensor inside a mapped file. `data` points into the mapping and stays valid while the
// owning SafetensorsFile lives.
struct TensorView {
    std::string name;
    std::string file;             // path of the file it came from (for error messages)
    DType dtype = DType::DTYPE_F32;
    std::vector<int64_t> shape;
    const uint8_t* data = nullptr;
    size_t nbytes = 0;

    int64_t numel() const;
    std::string shape_str() const;  // "[3072, 1024]"
};

// Converts any floating-point tensor to fp32 (throws ERROR_SHAPE for integer dtypes).
void tensor_to_f32(const TensorView& t, float* out);
std::vector<float> tensor_to_f32(const TensorView& t);
// Converts rows [row_begin, row_begin + rows) of a 2-D floating-point tensor to fp32.
void tensor_rows_to_f32(const TensorView& t, int64_t row_begin, int64_t rows, float* out);
// Integer tensors (I64/I32/U8) to int64.
std::vector<int64_t> tensor_to_i64(const TensorView& t);

class SafetensorsFile {
public:
    // Maps and validates the file; throws qtts::Error naming the file and the exact problem
    // (bad header length, invalid JSON, unknown dtype, offsets outside the file, overlapping
    // tensors, size not matching shape × dtype, truncated file).
    static std::shared_ptr<SafetensorsFile> open(const std::string& path);
    ~SafetensorsFile();
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;

    const std::string& path() const { return path_; }
    size_t file_size() const { return size_; }
    const std::map<std::string, TensorView>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    const TensorView* find(const std::string& name) const;
    // Throws ERROR_NOT_FOUND naming the file when the tensor is absent.
    const TensorView& get(const std::string& name) const;

private:
    SafetensorsFile() = default;
    std::string path_;
    void* map_ = nullptr;
    size_t size_ = 0;
    std::map<std::string, TensorView> tensors_;
    std::map<std::string, std::string> metadata_;
};

// Writes a safetensors file. Tensors are declared first (name, dtype, shape, fill callback);
// write() lays out the header, maps the output file and runs the fill callbacks in parallel
// directly into the mapping, so multi-gigabyte checkpoints are written in seconds.
class SafetensorsWriter {
public:
    using FillFn = std::function<void(uint8_t* dst, size_t nbytes)>;
    void add(const std::string& name, DType dtype, std::vector<int64_t> shape, FillFn fill);
    void add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values);
    void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
    // Returns the number of bytes written.
    size_t write(const std::string& path, int threads = 0) const;

private:
    struct Entry {
        std::string name;
        DType dtype;
        std::vector<int64_t> shape;
        FillFn fill;
    };
    std::vector<Entry> entries_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace qtts
