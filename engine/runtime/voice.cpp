#include "engine/runtime/voice.h"
#include "engine/api/qtts.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include <fmt/format.h>

#include "engine/common/error.h"
#include "engine/common/fnv1a.h"
#include "engine/common/log.h"
#include "engine/cpu/speaker_encoder.h"
#include "engine/cpu/speech_encoder.h"
#include "engine/runtime/speech_model.h"
#include "engine/text/prompt.h"
#include "engine/text/tokenizer.h"

namespace qtts {

namespace {

// Name, size and the first and last 4 KiB of one tensor (or "absent").
void fingerprint_tensor(Fnv1a& fnv, const char* role, const TensorView* t) {
    fnv.add_string(role);
    if (!t || !t->data) {
        fnv.add_string("absent");
        return;
    }
    const uint64_t n = t->nbytes;
    fnv.add(&n, sizeof(n));
    const size_t window = std::min<size_t>(4096, t->nbytes);
    fnv.add(t->data, window);
    fnv.add(t->data + (t->nbytes - window), window);
}

}  // namespace

std::string voice_fingerprint(const Checkpoint& checkpoint) {
    Fnv1a fnv;
    fnv.add_string(model_type_name(checkpoint.config.type));
    if (checkpoint.speaker_encoder) {
        fingerprint_tensor(fnv, "speaker_encoder.block0", checkpoint.speaker_encoder->block0.w);
        fingerprint_tensor(fnv, "speaker_encoder.fc", checkpoint.speaker_encoder->fc.w);
    } else {
        fingerprint_tensor(fnv, "speaker_encoder", nullptr);
    }
    if (checkpoint.encoder) {
        fingerprint_tensor(fnv, "encoder.conv_in", checkpoint.encoder->conv_in.w);
        fingerprint_tensor(fnv, "encoder.semantic_embed_sum",
                           checkpoint.encoder->semantic_embed_sum.empty() ? nullptr
                                                                          : checkpoint.encoder->semantic_embed_sum[0]);
    } else {
        fingerprint_tensor(fnv, "encoder", nullptr);
    }
    // The talker reads the reference codes through its codec embedding.
    fingerprint_tensor(fnv, "talker.codec_embedding", checkpoint.talker.codec_embedding);
    return fmt::format("{:016x}", fnv.h);
}

void reference_clip_validate(const std::vector<float>& audio_24k) {
    const double seconds = double(audio_24k.size()) / SAMPLE_RATE;
    if (audio_24k.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the reference audio is empty; voice cloning needs {:.0f} to {:.0f} s of speech",
             VOICE_REF_MIN_SECONDS, VOICE_REF_MAX_SECONDS);
    if (seconds < VOICE_REF_MIN_SECONDS || seconds > VOICE_REF_MAX_SECONDS)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "the reference audio is {:.2f} s long; voice cloning accepts {:.0f} to {:.0f} s of speech (trim or pick "
             "another clip)",
             seconds, VOICE_REF_MIN_SECONDS, VOICE_REF_MAX_SECONDS);
    float peak = 0.0f;
    double energy = 0.0;
    for (float x : audio_24k) {
        if (!std::isfinite(x))
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the reference audio has a non-finite sample; it is not usable audio");
        peak = std::max(peak, std::fabs(x));
        energy += double(x) * double(x);
    }
    const double rms = std::sqrt(energy / double(audio_24k.size()));
    if (rms < VOICE_REF_SILENCE_RMS)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "the reference audio is silent (RMS {:.1e}, peak {:.1e}, below {:.0e}): it holds no voice to clone; check "
             "the recording level or the file",
             rms, double(peak), VOICE_REF_SILENCE_RMS);
}

Voice voice_create(const SpeechModel& model, const std::vector<float>& audio_24k, const std::string& ref_text,
                   bool x_vector_only) {
    const Checkpoint& ckpt = model.checkpoint();
    if (ckpt.config.type != ModelType::MODEL_TYPE_BASE)
        fail(ErrorCode::ERROR_UNSUPPORTED, "voices can only be made with a Base model; {} is a {} model", ckpt.dir,
             model_type_name(ckpt.config.type));
    if (!ckpt.config.speaker_encoder || !ckpt.speaker_encoder)
        fail(ErrorCode::ERROR_UNSUPPORTED, "{}: this Base checkpoint has no speaker encoder", ckpt.dir);
    if (!x_vector_only) {
        if (!ckpt.encoder)
            fail(ErrorCode::ERROR_UNSUPPORTED,
                 "{}: the speech tokenizer has no encoder weights, so in-context cloning is impossible; use "
                 "x-vector-only cloning",
                 ckpt.dir);
        bool blank = true;
        for (unsigned char c : ref_text) blank = blank && std::isspace(c);
        if (blank)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "in-context cloning needs the transcript of the reference audio (--text / --ref-text); give it, or "
                 "choose x-vector-only cloning");
        if (!utf8_is_valid(ref_text)) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the reference transcript is not valid UTF-8");
    }

    reference_clip_validate(audio_24k);

    Voice voice;
    voice.tts_model_type = model_type_name(ckpt.config.type);
    voice.size_tag = ckpt.config.size_tag;
    voice.hidden_size = ckpt.config.talker.hidden_size;
    voice.fingerprint = voice_fingerprint(ckpt);
    voice.x_vector_only = x_vector_only;

    // reference_clip_validate() above is stricter than the encoders' own checks (>= 1 s, finite).
    voice.x_vector = model.speaker_encoder().embed_audio(audio_24k.data(), audio_24k.size());
    if (int(voice.x_vector.size()) != voice.hidden_size)
        fail(ErrorCode::ERROR_SHAPE, "{}: the speaker encoder gives {} values but the talker is {} wide", ckpt.dir,
             voice.x_vector.size(), voice.hidden_size);

    if (!x_vector_only) {
        const cpu::SpeechCodes codes = model.speech_encoder().encode(audio_24k.data(), audio_24k.size());
        if (codes.num_codebooks != VOICE_CODE_GROUPS)
            fail(ErrorCode::ERROR_UNSUPPORTED, "{}: the speech encoder gives {} codebooks; voices hold {}", ckpt.dir,
                 codes.num_codebooks, VOICE_CODE_GROUPS);
        voice.ref_codes = codes.values;
        voice.ref_frames = codes.frames;
        voice.ref_text = ref_text;
        voice.ref_ids = reference_template_ids(model.tokenizer(), ref_text, AddedTokens::ADDED_TOKENS_AS_TEXT);
    }
    voice_validate(voice, "new voice");
    return voice;
}

void voice_check_compatible(const Voice& voice, const Checkpoint& checkpoint) {
    const ModelConfig& config = checkpoint.config;
    const std::string model_type = model_type_name(config.type);
    const std::string want = fmt::format("a {} {} model with hidden size {} (weights fingerprint {})",
                                         voice.tts_model_type, voice.size_tag, voice.hidden_size, voice.fingerprint);
    if (config.type != ModelType::MODEL_TYPE_BASE)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "voices are used by Base models only, and {} is a {} model; this voice needs {}", checkpoint.dir,
             model_type, want);
    if (voice.tts_model_type != model_type || voice.size_tag != config.size_tag ||
        voice.hidden_size != config.talker.hidden_size)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "this voice was made for another model: it needs {}, but {} is a {} {} model with hidden size {}; "
             "create the voice again with this model",
             want, checkpoint.dir, model_type, config.size_tag, config.talker.hidden_size);
    const std::string fingerprint = voice_fingerprint(checkpoint);
    if (voice.fingerprint != fingerprint)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "this voice was made with other weights: it needs {}, but {} has fingerprint {}; create the voice again "
             "with this model",
             want, checkpoint.dir, fingerprint);
}

}  // namespace qtts
