// Fuzz target: the safetensors reader (8-byte header length, JSON header, data offsets) and the
// conversions that read the tensors it accepts.
#include <cstring>

#include <nlohmann/json.hpp>

#include "fuzz_support.h"
#include "engine/model/safetensors.h"

namespace {

// The mapping is not ASan-instrumented, so reads past a tensor's end could go unnoticed: for an
// accepted file, check from the raw header that every tensor lies inside the data section.
void tensor_bounds_check(const uint8_t* data, size_t size, const qtts::SafetensorsFile& st) {
    uint64_t header_len = 0;
    std::memcpy(&header_len, data, 8);
    const size_t data_size = size - 8 - size_t(header_len);
    const auto header = nlohmann::json::parse(data + 8, data + 8 + header_len);
    for (const auto& [name, t] : st.tensors()) {
        const auto& offsets = header.at(name).at("data_offsets");
        const uint64_t begin = offsets.at(0).get<uint64_t>();
        const uint64_t end = offsets.at(1).get<uint64_t>();
        qtts::fuzz::property(begin <= end && end <= data_size, "tensor inside the data section");
        qtts::fuzz::property(end - begin == t.nbytes, "tensor bytes match its data_offsets");
        qtts::fuzz::property(t.nbytes == size_t(t.numel()) * qtts::dtype_size(t.dtype), "bytes = numel x dtype size");
    }
}

void tensor_read(const qtts::TensorView& t) {
    const bool floating = t.dtype == qtts::DType::DTYPE_BF16 || t.dtype == qtts::DType::DTYPE_F16 ||
                          t.dtype == qtts::DType::DTYPE_F32;
    if (!floating) {
        qtts::tensor_to_i64(t);
        return;
    }
    qtts::tensor_to_f32(t);
    if (t.shape.size() == 2 && t.shape[0] > 0) {
        std::vector<float> last_row(size_t(t.shape[1]));
        qtts::tensor_rows_to_f32(t, t.shape[0] - 1, 1, last_row.data());
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static qtts::fuzz::MemoryFile file("fuzz.safetensors");
    const std::string& path = file.write(data, size);
    try {
        const auto st = qtts::SafetensorsFile::open(path);
        tensor_bounds_check(data, size, *st);
        for (const auto& entry : st->tensors()) tensor_read(entry.second);
    } catch (const qtts::Error& e) {
        qtts::fuzz::error_check(e);
    }
    return 0;
}
