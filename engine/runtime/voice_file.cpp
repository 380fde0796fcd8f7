// The voice file (.qv): its consistency checks, writer and reader. Kept apart from voice
// creation (voice.cpp, which runs the encoders) so that the reader links on its own: the unit
// tests and the fuzz target (tests/fuzz/fuzz_voice_file.cpp) need nothing of the engine.
#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "engine/common/error.h"
#include "engine/common/fnv1a.h"
#include "engine/runtime/voice.h"

namespace qtts {

namespace {

const char kMagic[10] = {'Q', 'T', 'T', 'S', 'V', 'O', 'I', 'C', 'E', '\0'};
constexpr size_t kFixedHeaderBytes = sizeof(kMagic) + 4 + 4;
constexpr size_t kMaxJsonBytes = 1 << 20;
constexpr int kMaxRefFrames = 600 * 25 / 2;   // 600 s of reference at 12.5 Hz
constexpr int kMaxRefIds = 1 << 16;
constexpr int kMaxXVectorDim = 1 << 16;
constexpr int32_t kCodeLimit = 2048;           // speech-tokenizer codebook size
constexpr int32_t kTextVocabLimit = 1 << 20;  // generous bound on text token ids

void put_u32(std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(char((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const std::string& in, size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(in[at + i])) << (8 * i);
    return v;
}
uint64_t get_u64(const std::string& in, size_t at) {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= uint64_t(uint8_t(in[at + i])) << (8 * i);
    return v;
}
// 4-byte values; the format is little-endian and so is every supported host.
template <typename T>
void put_array(std::string& out, const std::vector<T>& values) {
    static_assert(sizeof(T) == 4, "voice payload values are 4 bytes");
    const size_t at = out.size();
    out.resize(at + values.size() * 4);
    if (!values.empty()) std::memcpy(&out[at], values.data(), values.size() * 4);
}
template <typename T>
std::vector<T> get_array(const std::string& in, size_t at, size_t count) {
    std::vector<T> values(count);
    if (count) std::memcpy(values.data(), &in[at], count * 4);
    return values;
}

int json_int(const nlohmann::json& j, const char* key, const std::string& source, int lo, int hi) {
    if (!j.contains(key) || !j[key].is_number_integer())
        fail(ErrorCode::ERROR_FORMAT, "{}: voice metadata lacks the integer field '{}'", source, key);
    const int64_t v = j[key].get<int64_t>();
    if (v < lo || v > hi)
        fail(ErrorCode::ERROR_FORMAT, "{}: voice metadata field '{}' = {} is outside {}..{}", source, key, v, lo, hi);
    return int(v);
}

std::string json_string(const nlohmann::json& j, const char* key, const std::string& source) {
    if (!j.contains(key) || !j[key].is_string())
        fail(ErrorCode::ERROR_FORMAT, "{}: voice metadata lacks the string field '{}'", source, key);
    return j[key].get<std::string>();
}

}  // namespace

void voice_validate(const Voice& voice, const std::string& source) {
    if (voice.hidden_size <= 0 || voice.hidden_size > kMaxXVectorDim)
        fail(ErrorCode::ERROR_FORMAT, "{}: hidden size {} is outside 1..{}", source, voice.hidden_size, kMaxXVectorDim);
    if (int(voice.x_vector.size()) != voice.hidden_size)
        fail(ErrorCode::ERROR_FORMAT, "{}: x-vector has {} values, the model's hidden size is {}", source,
             voice.x_vector.size(), voice.hidden_size);
    for (float v : voice.x_vector)
        if (!std::isfinite(v)) fail(ErrorCode::ERROR_FORMAT, "{}: the x-vector holds a NaN or infinite value", source);
    if (voice.ref_frames < 0 || voice.ref_frames > kMaxRefFrames)
        fail(ErrorCode::ERROR_FORMAT, "{}: {} reference frames is outside 0..{}", source, voice.ref_frames, kMaxRefFrames);
    if (voice.ref_codes.size() != size_t(voice.ref_frames) * VOICE_CODE_GROUPS)
        fail(ErrorCode::ERROR_FORMAT, "{}: {} reference codes for {} frames (expected frames × {})", source,
             voice.ref_codes.size(), voice.ref_frames, VOICE_CODE_GROUPS);
    for (int32_t c : voice.ref_codes)
        if (c < 0 || c >= kCodeLimit)
            fail(ErrorCode::ERROR_FORMAT, "{}: reference code {} is outside 0..{}", source, c, kCodeLimit - 1);
    if (voice.ref_ids.size() > size_t(kMaxRefIds))
        fail(ErrorCode::ERROR_FORMAT, "{}: {} reference text ids (at most {})", source, voice.ref_ids.size(), kMaxRefIds);
    for (int32_t id : voice.ref_ids)
        if (id < 0 || id >= kTextVocabLimit)
            fail(ErrorCode::ERROR_FORMAT, "{}: reference text id {} is out of range", source, id);
    if (voice.x_vector_only) {
        if (voice.ref_frames != 0 || !voice.ref_ids.empty())
            fail(ErrorCode::ERROR_FORMAT, "{}: an x-vector-only voice carries reference codes or text ids", source);
    } else if (voice.ref_frames == 0 || voice.ref_ids.size() < 6) {
        fail(ErrorCode::ERROR_FORMAT,
             "{}: an in-context voice needs reference codes and the transcript's template ids (got {} frames, {} ids)",
             source, voice.ref_frames, voice.ref_ids.size());
    }
}

void voice_save(const Voice& voice, const std::string& path) {
    voice_validate(voice, path);
    nlohmann::json meta;
    meta["format"] = "qtts-voice";
    meta["tts_model_type"] = voice.tts_model_type;
    meta["tts_model_size"] = voice.size_tag;
    meta["hidden_size"] = voice.hidden_size;
    meta["fingerprint"] = voice.fingerprint;
    meta["x_vector_only"] = voice.x_vector_only;
    meta["ref_text"] = voice.ref_text;
    meta["x_vector_dim"] = voice.x_vector.size();
    meta["ref_frames"] = voice.ref_frames;
    meta["code_groups"] = VOICE_CODE_GROUPS;
    meta["ref_ids_count"] = voice.ref_ids.size();
    const std::string json = meta.dump();

    std::string bytes(kMagic, sizeof(kMagic));
    put_u32(bytes, VOICE_FILE_VERSION);
    put_u32(bytes, uint32_t(json.size()));
    bytes += json;
    put_array(bytes, voice.x_vector);
    put_array(bytes, voice.ref_codes);
    put_array(bytes, voice.ref_ids);
    Fnv1a fnv;
    fnv.add(bytes.data(), bytes.size());
    put_u64(bytes, fnv.h);

    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out) fail(ErrorCode::ERROR_IO, "{}: cannot create the voice file", path);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.close();
    if (!out) fail(ErrorCode::ERROR_IO, "{}: writing the voice file failed", path);
}

Voice voice_load(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) fail(ErrorCode::ERROR_NOT_FOUND, "{}: voice file not found", path);
    if (S_ISDIR(st.st_mode)) fail(ErrorCode::ERROR_IO, "{}: is a folder, not a voice file", path);
    if (st.st_size > 64 * 1024 * 1024) fail(ErrorCode::ERROR_FORMAT, "{}: too large to be a voice file", path);
    std::ifstream in(path, std::ios::binary);
    if (!in) fail(ErrorCode::ERROR_IO, "{}: cannot open the voice file", path);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());

    if (bytes.size() < sizeof(kMagic) || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
        fail(ErrorCode::ERROR_FORMAT, "{}: not a qtts voice file (no QTTSVOICE header); make one with 'qtts voice create'",
             path);
    if (bytes.size() < kFixedHeaderBytes)
        fail(ErrorCode::ERROR_FORMAT, "{}: voice file is truncated ({} bytes, header incomplete)", path, bytes.size());
    const uint32_t version = get_u32(bytes, sizeof(kMagic));
    if (version != VOICE_FILE_VERSION)
        fail(ErrorCode::ERROR_FORMAT, "{}: voice file version {} is not supported (this build reads version {})", path,
             version, VOICE_FILE_VERSION);
    const uint32_t json_bytes = get_u32(bytes, sizeof(kMagic) + 4);
    if (json_bytes > kMaxJsonBytes || kFixedHeaderBytes + json_bytes > bytes.size())
        fail(ErrorCode::ERROR_FORMAT, "{}: voice file is truncated or corrupt (metadata of {} bytes in a {}-byte file)",
             path, json_bytes, bytes.size());
    nlohmann::json meta;
    try {
        meta = nlohmann::json::parse(bytes.substr(kFixedHeaderBytes, json_bytes));
    } catch (const nlohmann::json::exception& e) {
        fail(ErrorCode::ERROR_FORMAT, "{}: voice metadata is not valid JSON ({})", path, e.what());
    }
    if (!meta.is_object()) fail(ErrorCode::ERROR_FORMAT, "{}: voice metadata is not a JSON object", path);

    Voice voice;
    voice.tts_model_type = json_string(meta, "tts_model_type", path);
    voice.size_tag = json_string(meta, "tts_model_size", path);
    voice.fingerprint = json_string(meta, "fingerprint", path);
    voice.ref_text = json_string(meta, "ref_text", path);
    if (!meta.contains("x_vector_only") || !meta["x_vector_only"].is_boolean())
        fail(ErrorCode::ERROR_FORMAT, "{}: voice metadata lacks the boolean field 'x_vector_only'", path);
    voice.x_vector_only = meta["x_vector_only"].get<bool>();
    voice.hidden_size = json_int(meta, "hidden_size", path, 1, kMaxXVectorDim);
    const int dim = json_int(meta, "x_vector_dim", path, 1, kMaxXVectorDim);
    voice.ref_frames = json_int(meta, "ref_frames", path, 0, kMaxRefFrames);
    json_int(meta, "code_groups", path, VOICE_CODE_GROUPS, VOICE_CODE_GROUPS);
    const int ids = json_int(meta, "ref_ids_count", path, 0, kMaxRefIds);

    const size_t payload = (size_t(dim) + size_t(voice.ref_frames) * VOICE_CODE_GROUPS + size_t(ids)) * 4;
    const size_t expected = kFixedHeaderBytes + json_bytes + payload + 8;
    if (bytes.size() < expected)
        fail(ErrorCode::ERROR_FORMAT, "{}: voice file is truncated ({} bytes, its metadata needs {})", path, bytes.size(),
             expected);
    if (bytes.size() > expected)
        fail(ErrorCode::ERROR_FORMAT, "{}: voice file has {} unexpected trailing bytes", path, bytes.size() - expected);
    Fnv1a fnv;
    fnv.add(bytes.data(), expected - 8);
    if (fnv.h != get_u64(bytes, expected - 8))
        fail(ErrorCode::ERROR_FORMAT, "{}: voice file is corrupt (checksum mismatch); create it again", path);

    size_t at = kFixedHeaderBytes + json_bytes;
    voice.x_vector = get_array<float>(bytes, at, size_t(dim));
    at += size_t(dim) * 4;
    voice.ref_codes = get_array<int32_t>(bytes, at, size_t(voice.ref_frames) * VOICE_CODE_GROUPS);
    at += size_t(voice.ref_frames) * VOICE_CODE_GROUPS * 4;
    voice.ref_ids = get_array<int32_t>(bytes, at, size_t(ids));
    voice_validate(voice, path);
    return voice;
}

}  // namespace qtts
