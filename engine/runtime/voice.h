// Saved voices for the Base (voice cloning) models: what the cloning front end extracts from a
// reference clip, stored once so that later requests skip the speaker and speech encoders.
//
//   Voice v = voice_create(model, audio_24k, "transcript of the clip", false);
//   voice_save(v, "alice.qv");
//   Voice w = voice_load("alice.qv");           // throws on a corrupt or truncated file
//   voice_check_compatible(w, model.checkpoint());  // throws for a voice made for another model
//
// File layout (".qv", little-endian; docs/voice-cloning.md has the full description):
//   "QTTSVOICE\0" magic (10 bytes) | u32 version | u32 json_bytes | JSON metadata
//   | f32 x_vector[x_vector_dim] | i32 ref_codes[ref_frames, 16] | i32 ref_ids[ref_ids_count]
//   | u64 FNV-1a checksum of every byte before it
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/weights.h"

namespace qtts {

class SpeechModel;

constexpr uint32_t VOICE_FILE_VERSION = 1;
constexpr int VOICE_CODE_GROUPS = 16;
// The reference clips voice cloning accepts: long enough to carry a voice, short enough for the
// in-context prompt (30 s = 375 frames of reference codes), and not silent (-80 dBFS RMS).
constexpr double VOICE_REF_MIN_SECONDS = 1.0;
constexpr double VOICE_REF_MAX_SECONDS = 30.0;
constexpr double VOICE_REF_SILENCE_RMS = 1e-4;

struct Voice {
    // Identity of the model the voice was made with (checked by voice_check_compatible).
    std::string tts_model_type;  // "base"
    std::string size_tag;        // "0b6", "1b7", ...
    int hidden_size = 0;         // talker hidden size = x-vector width
    std::string fingerprint;     // voice_fingerprint() of the model, 16 hex digits

    std::string ref_text;        // transcript of the reference clip (empty when x_vector_only)
    bool x_vector_only = false;  // true: no in-context (ICL) data
    std::vector<float> x_vector;   // [hidden_size]
    std::vector<int32_t> ref_codes;  // [ref_frames, 16] speech-encoder codes of the clip
    int ref_frames = 0;
    std::vector<int32_t> ref_ids;  // ids of "<|im_start|>assistant\n{ref_text}<|im_end|>\n"
};

// A hash of the bytes of the networks a voice depends on (speaker encoder, speech-tokenizer
// encoder and the talker's codec embedding), sampled from a few tensors so it is cheap.
std::string voice_fingerprint(const Checkpoint& checkpoint);

// Runs the cloning front end on a 24 kHz mono clip: the speaker encoder's x-vector and, unless
// x_vector_only, the speech encoder's codes and the transcript's ids. Throws ERROR_UNSUPPORTED
// for a non-Base model, ERROR_INVALID_ARGUMENT for an unusable clip or an empty transcript
// when ICL data is asked for.
// Throws ERROR_INVALID_ARGUMENT, saying what is accepted, for an empty clip, one outside
// VOICE_REF_MIN_SECONDS..VOICE_REF_MAX_SECONDS, a silent one, or non-finite samples.
void reference_clip_validate(const std::vector<float>& audio_24k);

Voice voice_create(const SpeechModel& model, const std::vector<float>& audio_24k, const std::string& ref_text,
                   bool x_vector_only);

// Checks the voice's own consistency (sizes, code and id ranges, finite values); throws
// ERROR_FORMAT naming `source` and the problem.
void voice_validate(const Voice& voice, const std::string& source);

// Writes the voice (validated first); throws ERROR_IO when the file cannot be written.
void voice_save(const Voice& voice, const std::string& path);
// Reads a voice file; throws ERROR_NOT_FOUND / ERROR_IO for a missing or unreadable file and
// ERROR_FORMAT for a wrong magic, unknown version, truncated or corrupt content.
Voice voice_load(const std::string& path);

// Throws ERROR_INVALID_ARGUMENT when the voice was made for a different model (type, size,
// hidden size or weights fingerprint), saying which model the voice needs.
void voice_check_compatible(const Voice& voice, const Checkpoint& checkpoint);

}  // namespace qtts
