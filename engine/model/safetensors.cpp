#include "engine/model/safetensors.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <thread>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"

namespace qtts {

using json = nlohmann::json;

size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::DTYPE_BF16: return 2;
        case DType::DTYPE_F16: return 2;
        case DType::DTYPE_F32: return 4;
        case DType::DTYPE_I64: return 8;
        case DType::DTYPE_I32: return 4;
        case DType::DTYPE_U8: return 1;
    }
    return 0;
}

const char* dtype_name(DType dtype) {
    switch (dtype) {
        case DType::DTYPE_BF16: return "BF16";
        case DType::DTYPE_F16: return "F16";
        case DType::DTYPE_F32: return "F32";
        case DType::DTYPE_I64: return "I64";
        case DType::DTYPE_I32: return "I32";
        case DType::DTYPE_U8: return "U8";
    }
    return "?";
}

static bool dtype_parse(const std::string& s, DType* out) {
    static const std::pair<const char*, DType> table[] = {
        {"BF16", DType::DTYPE_BF16}, {"F16", DType::DTYPE_F16}, {"F32", DType::DTYPE_F32},
        {"I64", DType::DTYPE_I64},   {"I32", DType::DTYPE_I32}, {"U8", DType::DTYPE_U8}};
    for (const auto& [name, dt] : table) {
        if (s == name) {
            *out = dt;
            return true;
        }
    }
    return false;
}

float bf16_to_f32(uint16_t v) {
    uint32_t bits = uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t f32_to_bf16(float v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (std::isnan(v)) return uint16_t((bits >> 16) | 0x40);
    const uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
    return uint16_t((bits + rounding) >> 16);
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = uint32_t(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while ((mant & 0x400) == 0) {
                mant <<= 1;
                --exp;
            }
            mant &= 0x3FF;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7F800000 | (mant << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

int64_t TensorView::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

std::string TensorView::shape_str() const {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

static void convert_span_to_f32(const TensorView& t, size_t first, size_t count, float* out) {
    switch (t.dtype) {
        case DType::DTYPE_F32:
            // An empty tensor's `out` may be null (an empty vector's data()), which memcpy must not get.
            if (count > 0) std::memcpy(out, t.data + first * 4, count * 4);
            return;
        case DType::DTYPE_BF16: {
            const uint8_t* p = t.data + first * 2;
            for (size_t i = 0; i < count; ++i) {
                uint16_t v;
                std::memcpy(&v, p + 2 * i, 2);
                out[i] = bf16_to_f32(v);
            }
            return;
        }
        case DType::DTYPE_F16: {
            const uint8_t* p = t.data + first * 2;
            for (size_t i = 0; i < count; ++i) {
                uint16_t v;
                std::memcpy(&v, p + 2 * i, 2);
                out[i] = f16_to_f32(v);
            }
            return;
        }
        default:
            fail(ErrorCode::ERROR_SHAPE, "{}: tensor '{}' has dtype {}, expected a floating-point dtype", t.file,
                 t.name, dtype_name(t.dtype));
    }
}

void tensor_to_f32(const TensorView& t, float* out) { convert_span_to_f32(t, 0, size_t(t.numel()), out); }

std::vector<float> tensor_to_f32(const TensorView& t) {
    std::vector<float> out(size_t(t.numel()));
    tensor_to_f32(t, out.data());
    return out;
}

void tensor_rows_to_f32(const TensorView& t, int64_t row_begin, int64_t rows, float* out) {
    if (t.shape.size() != 2) fail(ErrorCode::ERROR_SHAPE, "tensor '{}' is not 2-D", t.name);
    if (row_begin < 0 || rows < 0 || row_begin + rows > t.shape[0])
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "rows [{}, {}) outside tensor '{}' {}", row_begin, row_begin + rows,
             t.name, t.shape_str());
    const size_t width = size_t(t.shape[1]);
    convert_span_to_f32(t, size_t(row_begin) * width, size_t(rows) * width, out);
}

std::vector<int64_t> tensor_to_i64(const TensorView& t) {
    std::vector<int64_t> out(size_t(t.numel()));
    for (size_t i = 0; i < out.size(); ++i) {
        switch (t.dtype) {
            case DType::DTYPE_I64: std::memcpy(&out[i], t.data + 8 * i, 8); break;
            case DType::DTYPE_I32: {
                int32_t v;
                std::memcpy(&v, t.data + 4 * i, 4);
                out[i] = v;
                break;
            }
            case DType::DTYPE_U8: out[i] = t.data[i]; break;
            default:
                fail(ErrorCode::ERROR_SHAPE, "{}: tensor '{}' has dtype {}, expected an integer dtype", t.file,
                     t.name, dtype_name(t.dtype));
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Reader
// ---------------------------------------------------------------------------------------------

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
    std::shared_ptr<SafetensorsFile> file(new SafetensorsFile());
    file->path_ = path;

    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(ErrorCode::ERROR_IO, "{}: cannot open: {}", path, std::strerror(errno));
    struct stat st {};
    if (fstat(fd, &st) != 0) {
        const int e = errno;
        ::close(fd);
        fail(ErrorCode::ERROR_IO, "{}: cannot stat: {}", path, std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd);
        fail(ErrorCode::ERROR_IO, "{}: not a regular file", path);
    }
    file->size_ = size_t(st.st_size);
    if (file->size_ < 8) {
        ::close(fd);
        fail(ErrorCode::ERROR_FORMAT, "{}: truncated safetensors file ({} bytes; the 8-byte header length is missing)",
             path, file->size_);
    }
    void* map = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) fail(ErrorCode::ERROR_IO, "{}: mmap failed: {}", path, std::strerror(errno));
    file->map_ = map;
    const uint8_t* base = static_cast<const uint8_t*>(map);

    uint64_t header_len = 0;
    std::memcpy(&header_len, base, 8);
    if (header_len == 0 || header_len > 100u * 1024 * 1024 || header_len > file->size_ - 8)
        fail(ErrorCode::ERROR_FORMAT,
             "{}: corrupt safetensors header: header length {} does not fit a {}-byte file", path, header_len,
             file->size_);

    json header;
    try {
        header = json::parse(reinterpret_cast<const char*>(base + 8), reinterpret_cast<const char*>(base + 8 + header_len));
    } catch (const json::exception& e) {
        fail(ErrorCode::ERROR_FORMAT, "{}: corrupt safetensors header: invalid JSON ({})", path, e.what());
    }
    if (!header.is_object()) fail(ErrorCode::ERROR_FORMAT, "{}: corrupt safetensors header: not a JSON object", path);

    const size_t data_begin = 8 + size_t(header_len);
    const size_t data_size = file->size_ - data_begin;
    struct Span {
        size_t begin, end;
        const std::string* name;
    };
    std::vector<Span> spans;

    for (auto it = header.begin(); it != header.end(); ++it) {
        const std::string& name = it.key();
        const json& entry = it.value();
        if (name == "__metadata__") {
            if (entry.is_object()) {
                for (auto m = entry.begin(); m != entry.end(); ++m)
                    file->metadata_[m.key()] = m.value().is_string() ? m.value().get<std::string>() : m.value().dump();
            }
            continue;
        }
        auto bad = [&](const std::string& what) {
            fail(ErrorCode::ERROR_FORMAT, "{}: tensor '{}': {}", path, name, what);
        };
        if (!entry.is_object()) bad("header entry is not an object");
        if (!entry.contains("dtype") || !entry["dtype"].is_string()) bad("missing dtype");
        if (!entry.contains("shape") || !entry["shape"].is_array()) bad("missing shape");
        if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2)
            bad("missing data_offsets [begin, end]");

        TensorView view;
        view.name = name;
        view.file = path;
        if (!dtype_parse(entry["dtype"].get<std::string>(), &view.dtype))
            bad("unsupported dtype " + entry["dtype"].get<std::string>() + " (supported: BF16, F16, F32, I64, I32, U8)");
        uint64_t numel = 1;
        for (const json& d : entry["shape"]) {
            if (!d.is_number_integer() || d.get<int64_t>() < 0) bad("shape has a non-integer or negative dimension");
            const uint64_t dim = d.get<uint64_t>();
            if (dim != 0 && numel > (uint64_t(1) << 48) / dim) bad("shape is implausibly large");
            numel *= dim;
            view.shape.push_back(int64_t(dim));
        }
        const json& off = entry["data_offsets"];
        if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) bad("data_offsets are not unsigned integers");
        const uint64_t begin = off[0].get<uint64_t>();
        const uint64_t end = off[1].get<uint64_t>();
        if (end < begin) bad(fmt::format("data_offsets [{}, {}] end before begin", begin, end));
        const uint64_t expected = numel * dtype_size(view.dtype);
        if (end - begin != expected)
            bad(fmt::format("size {} bytes does not match shape {} x {} ({} bytes)", end - begin, view.shape_str(),
                            dtype_name(view.dtype), expected));
        if (end > data_size)
            fail(ErrorCode::ERROR_FORMAT,
                 "{}: file is truncated: tensor '{}' ends at byte {} of the data section but only {} bytes are present",
                 path, name, end, data_size);
        view.data = base + data_begin + begin;
        view.nbytes = size_t(expected);
        auto [pos, inserted] = file->tensors_.emplace(name, std::move(view));
        if (!inserted) bad("duplicate tensor name");
        spans.push_back({size_t(begin), size_t(end), &pos->first});
    }

    std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
    for (size_t i = 1; i < spans.size(); ++i) {
        if (spans[i].begin < spans[i - 1].end)
            fail(ErrorCode::ERROR_FORMAT, "{}: tensors '{}' and '{}' overlap in the data section", path,
                 *spans[i - 1].name, *spans[i].name);
    }
    return file;
}

SafetensorsFile::~SafetensorsFile() {
    if (map_) munmap(map_, size_);
}

const TensorView* SafetensorsFile::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

const TensorView& SafetensorsFile::get(const std::string& name) const {
    const TensorView* t = find(name);
    if (!t) fail(ErrorCode::ERROR_NOT_FOUND, "{}: missing tensor '{}'", path_, name);
    return *t;
}

// ---------------------------------------------------------------------------------------------
// Writer
// ---------------------------------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, DType dtype, std::vector<int64_t> shape, FillFn fill) {
    entries_.push_back({name, dtype, std::move(shape), std::move(fill)});
}

void SafetensorsWriter::add_f32(const std::string& name, std::vector<int64_t> shape, const std::vector<float>& values) {
    size_t numel = 1;
    for (int64_t d : shape) numel *= size_t(d);
    QTTS_ASSERT(numel == values.size());
    add(name, DType::DTYPE_F32, std::move(shape),
        [values](uint8_t* dst, size_t nbytes) {
            if (nbytes > 0) std::memcpy(dst, values.data(), nbytes);  // an empty tensor has no buffers
        });
}

size_t SafetensorsWriter::write(const std::string& path, int threads) const {
    // Header: tensors in declaration order, contiguous.
    json header = json::object();
    std::vector<size_t> offsets;
    size_t cursor = 0;
    for (const Entry& e : entries_) {
        size_t nbytes = dtype_size(e.dtype);
        for (int64_t d : e.shape) nbytes *= size_t(d);
        header[e.name] = {{"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {cursor, cursor + nbytes}}};
        offsets.push_back(cursor);
        cursor += nbytes;
    }
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    std::string header_text = header.dump();
    while ((header_text.size() + 8) % 8 != 0) header_text.push_back(' ');  // align the data section
    const size_t data_begin = 8 + header_text.size();
    const size_t total = data_begin + cursor;

    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail(ErrorCode::ERROR_IO, "{}: cannot create: {}", path, std::strerror(errno));
    if (ftruncate(fd, off_t(total)) != 0) {
        const int e = errno;
        ::close(fd);
        fail(ErrorCode::ERROR_IO, "{}: cannot size file to {} bytes: {}", path, total, std::strerror(e));
    }
    void* map = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (map == MAP_FAILED) fail(ErrorCode::ERROR_IO, "{}: mmap failed: {}", path, std::strerror(errno));
    uint8_t* base = static_cast<uint8_t*>(map);
    const uint64_t header_len = header_text.size();
    std::memcpy(base, &header_len, 8);
    std::memcpy(base + 8, header_text.data(), header_text.size());

    // Fill tensors in parallel (largest first for balance).
    std::vector<size_t> order(entries_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    auto bytes_of = [&](size_t i) {
        size_t n = dtype_size(entries_[i].dtype);
        for (int64_t d : entries_[i].shape) n *= size_t(d);
        return n;
    };
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return bytes_of(a) > bytes_of(b); });
    const int nthreads = threads > 0 ? threads : std::max(1, int(std::thread::hardware_concurrency()));
    std::atomic<size_t> next{0};
    std::exception_ptr error;
    std::atomic<bool> failed{false};
    auto worker = [&]() {
        for (;;) {
            const size_t k = next.fetch_add(1);
            if (k >= order.size() || failed.load()) return;
            const size_t i = order[k];
            try {
                entries_[i].fill(base + data_begin + offsets[i], bytes_of(i));
            } catch (...) {
                if (!failed.exchange(true)) error = std::current_exception();
            }
        }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < nthreads; ++t) pool.emplace_back(worker);
    worker();
    for (auto& th : pool) th.join();
    msync(map, total, MS_ASYNC);
    munmap(map, total);
    if (error) std::rethrow_exception(error);
    return total;
}

}  // namespace qtts
