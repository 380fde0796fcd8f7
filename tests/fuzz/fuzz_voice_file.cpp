// Fuzz target: the voice file reader (.qv: magic, version, JSON metadata, payload, checksum).
// The file ends with an FNV-1a checksum of the bytes before it, which a mutation almost never
// keeps right; when the input's first byte is odd the target rewrites the last 8 bytes with
// the right checksum, so the fuzzer also reaches the metadata and payload checks behind it.
#include "engine/common/fnv1a.h"
#include "fuzz_support.h"
#include "engine/runtime/voice.h"

#include <cstring>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    static qtts::fuzz::MemoryFile file("fuzz.qv");
    std::vector<uint8_t> bytes(data, data + size);
    if (size >= 9 && (data[0] & 1)) {
        bytes.erase(bytes.begin());
        qtts::Fnv1a fnv;
        fnv.add(bytes.data(), bytes.size() - 8);
        std::memcpy(bytes.data() + bytes.size() - 8, &fnv.h, 8);  // little-endian, as the format
    } else if (size >= 1) {
        bytes.erase(bytes.begin());
    }
    const std::string& path = file.write(bytes.data(), bytes.size());
    try {
        const qtts::Voice voice = qtts::voice_load(path);
        qtts::voice_validate(voice, "loaded voice");  // what load accepts is a valid voice
    } catch (const qtts::Error& e) {
        qtts::fuzz::error_check(e);
    }
    return 0;
}
