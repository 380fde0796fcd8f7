#include "engine/text/prompt.h"

#include <algorithm>
#include <cctype>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/common/strings.h"

namespace qtts {

namespace {

constexpr int ROLE_TOKENS = 3;         // <|im_start|> assistant \n
constexpr int TEXT_SUFFIX_TOKENS = 5;  // <|im_end|> \n <|im_start|> assistant \n
constexpr int REF_SUFFIX_TOKENS = 2;   // <|im_end|> \n

std::string names_join(const std::vector<std::string>& names) {
    std::string out;
    for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
    return out;
}

// The speakers whose dialect is `language` (CustomVoice: eric for sichuan_dialect, dylan for
// beijing_dialect); empty when `language` is not a dialect.
std::vector<std::string> dialect_speakers(const TalkerConfig& t, const std::string& language) {
    std::vector<std::string> names;
    for (const auto& [speaker, dialect] : t.speaker_dialect)
        if (!dialect.empty() && dialect == language) names.push_back(speaker);
    return names;
}


std::vector<std::string> speakers_supported(const TalkerConfig& t) {
    std::vector<std::string> names;
    for (const auto& [name, id] : t.speaker_ids) names.push_back(name);
    return names;
}

void ids_check_range(const std::vector<int32_t>& ids, int vocab, const char* what) {
    for (size_t i = 0; i < ids.size(); ++i)
        if (ids[i] < 0 || ids[i] >= vocab)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}: id {} at index {} is outside the text vocabulary [0, {})", what,
                 ids[i], i, vocab);
}

// Checks the assistant template around the text: "<|im_start|>assistant\n" … suffix.
void template_check(const ModelConfig& config, const std::vector<int32_t>& ids, int suffix, const char* what) {
    const size_t n = ids.size();
    if (n < size_t(ROLE_TOKENS + suffix))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "{}: {} ids are too few for the template \"<|im_start|>assistant\\n...<|im_end|>\\n{}\" ({} at least)",
             what, n, suffix == TEXT_SUFFIX_TOKENS ? "<|im_start|>assistant\\n" : "", ROLE_TOKENS + suffix);
    if (ids[0] != config.im_start_token_id || ids[1] != config.assistant_token_id)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "{}: must start with <|im_start|>assistant (ids {} {}), got {} {}", what, config.im_start_token_id,
             config.assistant_token_id, ids[0], ids[1]);
    if (ids[n - size_t(suffix)] != config.im_end_token_id)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "{}: expected <|im_end|> (id {}) at index {}, got {}", what,
             config.im_end_token_id, n - size_t(suffix), ids[n - size_t(suffix)]);
    if (suffix == TEXT_SUFFIX_TOKENS &&
        (ids[n - 3] != config.im_start_token_id || ids[n - 2] != config.assistant_token_id))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "{}: must end with <|im_end|>\\n<|im_start|>assistant\\n (the generation prompt)", what);
}

// The speaker's codec id (CustomVoice) after the checks of model doc §6.6.
int32_t speaker_resolve(const ModelConfig& config, const PromptRequest& request, std::string* speaker_key) {
    const TalkerConfig& t = config.talker;
    const std::string key = ascii_lower(request.speaker);
    switch (config.type) {
        case ModelType::MODEL_TYPE_CUSTOM_VOICE: {
            if (key.empty())
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "a CustomVoice model needs a speaker; supported: {}",
                     names_join(speakers_supported(t)));
            const auto it = t.speaker_ids.find(key);
            if (it == t.speaker_ids.end())
                fail(ErrorCode::ERROR_NOT_FOUND, "unknown speaker '{}'; supported (case-insensitive): {}",
                     request.speaker, names_join(speakers_supported(t)));
            *speaker_key = key;
            return it->second;
        }
        case ModelType::MODEL_TYPE_VOICE_DESIGN:
            if (!key.empty())
                fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                     "a VoiceDesign model has no preset speakers (got '{}'): describe the voice in the instruct text",
                     request.speaker);
            return -1;
        case ModelType::MODEL_TYPE_BASE:
            if (!key.empty())
                fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                     "a Base model has no preset speakers (got '{}'): it clones the voice of a reference clip",
                     request.speaker);
            return -1;
    }
    return -1;
}

// The language codec id, or -1 for "auto" (dialect rule applied). A dialect named as the language
// is accepted only with a speaker of that dialect, for whom it means what "chinese" and "auto"
// mean (model doc §6.1): the official API reaches dialects only through their speakers, and the
// model was trained on them only with those speakers.
int32_t language_resolve(const ModelConfig& config, const std::string& language, const std::string& speaker_key) {
    const TalkerConfig& t = config.talker;
    const std::string key = ascii_lower(language.empty() ? std::string("auto") : language);
    int32_t id = -1;
    if (key != "auto") {
        const auto it = t.language_ids.find(key);
        if (it == t.language_ids.end())
            fail(ErrorCode::ERROR_NOT_FOUND, "unknown language '{}'; supported (case-insensitive): {}", language,
                 names_join(languages_describe(t)));
        const auto speakers = dialect_speakers(t, key);
        if (!speakers.empty() && std::find(speakers.begin(), speakers.end(), speaker_key) == speakers.end())
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "language '{}' is a dialect spoken only by speaker {} (got speaker '{}'); choose that speaker, or "
                 "another language",
                 language, names_join(speakers), speaker_key.empty() ? "none" : speaker_key);
        id = it->second;
    }
    // A dialect speaker speaks its dialect whenever the language is Chinese or left to the model.
    if ((key == "chinese" || key == "auto") && !speaker_key.empty()) {
        const auto d = t.speaker_dialect.find(speaker_key);
        if (d != t.speaker_dialect.end() && !d->second.empty()) {
            const auto dialect = t.language_ids.find(d->second);
            if (dialect == t.language_ids.end())
                fail(ErrorCode::ERROR_FORMAT, "config: speaker '{}' has dialect '{}' which is not in codec_language_id",
                     speaker_key, d->second);
            id = dialect->second;
        }
    }
    return id;
}

void position_add(Prompt& p, int32_t text_id, CodecSource codec, int32_t value) {
    p.positions.push_back(PromptPosition{text_id, codec, value});
}

}  // namespace

std::vector<std::string> languages_describe(const TalkerConfig& talker) {
    std::vector<std::string> names{"auto"};
    for (const auto& [name, id] : talker.language_ids) {
        const auto speakers = dialect_speakers(talker, name);
        names.push_back(speakers.empty() ? name : name + " (speaker " + names_join(speakers) + " only)");
    }
    return names;
}

std::vector<int32_t> assistant_template_ids(const Tokenizer& tokenizer, std::string_view text, AddedTokens text_tokens) {
    constexpr AddedTokens kTemplate = AddedTokens::ADDED_TOKENS_MATCH;
    return tokenizer.encode(std::vector<TextPart>{{"<|im_start|>assistant\n", kTemplate},
                                                  {text, text_tokens},
                                                  {"<|im_end|>\n<|im_start|>assistant\n", kTemplate}});
}

std::vector<int32_t> instruct_template_ids(const Tokenizer& tokenizer, std::string_view text, AddedTokens text_tokens) {
    constexpr AddedTokens kTemplate = AddedTokens::ADDED_TOKENS_MATCH;
    return tokenizer.encode(
        std::vector<TextPart>{{"<|im_start|>user\n", kTemplate}, {text, text_tokens}, {"<|im_end|>\n", kTemplate}});
}

std::vector<int32_t> reference_template_ids(const Tokenizer& tokenizer, std::string_view text, AddedTokens text_tokens) {
    constexpr AddedTokens kTemplate = AddedTokens::ADDED_TOKENS_MATCH;
    return tokenizer.encode(
        std::vector<TextPart>{{"<|im_start|>assistant\n", kTemplate}, {text, text_tokens}, {"<|im_end|>\n", kTemplate}});
}

PromptChecked prompt_request_check(const ModelConfig& config, const PromptRequest& request) {
    const TalkerConfig& t = config.talker;
    const int groups = t.num_code_groups;
    const int cb_size = t.code_predictor.vocab_size > 0 ? t.code_predictor.vocab_size : 2048;
    PromptChecked checked;

    template_check(config, request.input_ids, TEXT_SUFFIX_TOKENS, "input_ids");
    ids_check_range(request.input_ids, t.text_vocab_size, "input_ids");
    ids_check_range(request.instruct_ids, t.text_vocab_size, "instruct_ids");
    if (request.input_ids.size() == size_t(ROLE_TOKENS + TEXT_SUFFIX_TOKENS))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "input_ids hold no text between the role tokens and <|im_end|>");

    const bool streaming = request.layout == TextLayout::TEXT_LAYOUT_STREAMING;
    if (!streaming && !request.text_complete)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "the non-streaming text layout needs the whole text up front; use the streaming layout to append text");

    std::string speaker_key;
    checked.speaker_id = speaker_resolve(config, request, &speaker_key);
    checked.language_id = language_resolve(config, request.language, speaker_key);

    const bool is_base = config.type == ModelType::MODEL_TYPE_BASE;
    if (is_base && request.x_vector.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "a Base model needs the reference speaker's x-vector (speaker encoder output, {} values)", t.hidden_size);
    if (!request.x_vector.empty() && !is_base)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "an x-vector is only accepted by Base models (this is {})",
             model_type_name(config.type));
    if (!request.x_vector.empty() && int(request.x_vector.size()) != t.hidden_size)
        fail(ErrorCode::ERROR_SHAPE, "x-vector has {} values; the talker hidden size is {}", request.x_vector.size(),
             t.hidden_size);

    checked.icl = !request.ref_ids.empty() || request.ref_frames > 0 || !request.ref_codes.empty();
    if (checked.icl) {
        if (!is_base)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "in-context cloning (reference text + codes) needs a Base model");
        if (request.ref_ids.empty() || request.ref_frames <= 0)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "in-context cloning needs both the reference transcript ids and the reference codes ({} ids, {} frames)",
                 request.ref_ids.size(), request.ref_frames);
        template_check(config, request.ref_ids, REF_SUFFIX_TOKENS, "ref_ids");
        ids_check_range(request.ref_ids, t.text_vocab_size, "ref_ids");
        if (request.ref_codes.size() != size_t(request.ref_frames) * size_t(groups))
            fail(ErrorCode::ERROR_SHAPE, "ref_codes has {} values; expected ref_frames {} × {} codebooks",
                 request.ref_codes.size(), request.ref_frames, groups);
        for (size_t i = 0; i < request.ref_codes.size(); ++i)
            if (request.ref_codes[i] < 0 || request.ref_codes[i] >= cb_size)
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "ref_codes[{}][{}] = {} is outside [0, {})", i / size_t(groups),
                     i % size_t(groups), request.ref_codes[i], cb_size);
    }
    return checked;
}

Prompt prompt_build(const ModelConfig& config, const PromptRequest& request) {
    const PromptChecked checked = prompt_request_check(config, request);
    const TalkerConfig& t = config.talker;
    const int32_t speaker_id = checked.speaker_id, language_id = checked.language_id;
    const bool icl = checked.icl;
    const bool is_base = config.type == ModelType::MODEL_TYPE_BASE;
    const bool streaming = request.layout == TextLayout::TEXT_LAYOUT_STREAMING;
    const std::vector<int32_t> text(request.input_ids.begin() + ROLE_TOKENS,
                                    request.input_ids.end() - TEXT_SUFFIX_TOKENS);

    Prompt p;
    p.layout = request.layout;
    p.text_complete = request.text_complete;
    p.text_tokens = int(text.size());
    p.tts_pad_id = config.tts_pad_token_id;
    p.tts_eos_id = config.tts_eos_token_id;
    const int32_t PAD = config.tts_pad_token_id, BOS = config.tts_bos_token_id, EOS = config.tts_eos_token_id;

    // Instruct block (text only).
    bool use_instruct = !request.instruct_ids.empty();
    if (use_instruct && config.type == ModelType::MODEL_TYPE_CUSTOM_VOICE && config.size_tag == "0b6" &&
        !request.keep_instruct_on_0b6_custom_voice) {
        QTTS_LOG_WARN("instruct ignored: 0.6B CustomVoice models do not support instructions (as the official API)");
        use_instruct = false;
    }
    if (use_instruct)
        for (const int32_t id : request.instruct_ids) position_add(p, id, CodecSource::CODEC_SOURCE_NONE, -1);

    // Role tokens (text only).
    for (int i = 0; i < ROLE_TOKENS; ++i) position_add(p, request.input_ids[size_t(i)], CodecSource::CODEC_SOURCE_NONE, -1);

    // Codec prefix: think/nothink tags, optional speaker, pad, bos. Every entry but the last (bos)
    // goes into the prefill over <tts_pad>, the one before bos over <tts_text_bos>.
    struct Entry {
        CodecSource source;
        int32_t value;
    };
    std::vector<Entry> prefix;
    prefix.reserve(8);
    if (language_id >= 0) {
        prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_think_id});
        prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_think_bos_id});
        prefix.push_back({CodecSource::CODEC_SOURCE_ID, language_id});
        prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_think_eos_id});
    } else {
        prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_nothink_id});
        prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_think_bos_id});
        prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_think_eos_id});
    }
    if (speaker_id >= 0) prefix.push_back({CodecSource::CODEC_SOURCE_ID, speaker_id});
    if (is_base) {
        prefix.push_back({CodecSource::CODEC_SOURCE_X_VECTOR, 0});
        p.x_vector = request.x_vector;
    }
    prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_pad_id});
    prefix.push_back({CodecSource::CODEC_SOURCE_ID, t.codec_bos_id});
    for (size_t i = 0; i + 1 < prefix.size(); ++i)
        position_add(p, i + 2 < prefix.size() ? PAD : BOS, prefix[i].source, prefix[i].value);

    if (icl) {
        // Model doc §6.5: text = ref transcript ++ target text (++ <tts_text_eod>),
        // codec = codec_bos ++ reference frames.
        std::vector<int32_t> text_track(request.ref_ids.begin() + ROLE_TOKENS,
                                        request.ref_ids.end() - REF_SUFFIX_TOKENS);
        text_track.insert(text_track.end(), text.begin(), text.end());
        if (request.text_complete) text_track.push_back(EOS);
        std::vector<Entry> codec_track{{CodecSource::CODEC_SOURCE_ID, t.codec_bos_id}};
        for (int f = 0; f < request.ref_frames; ++f) codec_track.push_back({CodecSource::CODEC_SOURCE_REF_FRAME, f});
        p.ref_codes = request.ref_codes;
        p.ref_frames = request.ref_frames;
        const size_t t1 = text_track.size(), t2 = codec_track.size();
        if (!streaming) {
            for (const int32_t id : text_track) position_add(p, id, CodecSource::CODEC_SOURCE_ID, t.codec_pad_id);
            for (const Entry& e : codec_track) position_add(p, PAD, e.source, e.value);
            p.trailing_ids = {PAD};
        } else if (t1 > t2) {
            for (size_t i = 0; i < t2; ++i) position_add(p, text_track[i], codec_track[i].source, codec_track[i].value);
            p.trailing_ids.assign(text_track.begin() + long(t2), text_track.end());
        } else {
            for (size_t i = 0; i < t2; ++i)
                position_add(p, i < t1 ? text_track[i] : PAD, codec_track[i].source, codec_track[i].value);
            if (request.text_complete) p.trailing_ids = {PAD};
        }
        return p;
    }

    if (streaming) {
        // Model doc §6.3: the first text token rides with codec_bos, the rest trail one per frame.
        position_add(p, text[0], CodecSource::CODEC_SOURCE_ID, t.codec_bos_id);
        p.trailing_ids.assign(text.begin() + 1, text.end());
        if (request.text_complete) p.trailing_ids.push_back(EOS);
    } else {
        // Model doc §6.4: the whole text over codec_pad, then <tts_text_eod>, then <tts_pad> + codec_bos.
        for (const int32_t id : text) position_add(p, id, CodecSource::CODEC_SOURCE_ID, t.codec_pad_id);
        position_add(p, EOS, CodecSource::CODEC_SOURCE_ID, t.codec_pad_id);
        position_add(p, PAD, CodecSource::CODEC_SOURCE_ID, t.codec_bos_id);
        p.trailing_ids = {PAD};
    }
    return p;
}

void frame_vector(const EmbeddingTables& tables, const int32_t* codes, int groups, float* out) {
    const int H = tables.hidden_size();
    tables.codec_vector(0, codes[0], out);
    std::vector<float> row(static_cast<size_t>(H));
    for (int g = 1; g < groups; ++g) {
        tables.codec_vector(g, codes[g], row.data());
        for (int i = 0; i < H; ++i) out[i] += row[size_t(i)];
    }
}

std::vector<float> prompt_embed(const Prompt& prompt, const EmbeddingTables& tables, int num_code_groups) {
    const size_t H = size_t(tables.hidden_size());
    std::vector<float> out(prompt.positions.size() * H, 0.0f);
    std::vector<float> text(H), codec(H);
    for (size_t i = 0; i < prompt.positions.size(); ++i) {
        const PromptPosition& pos = prompt.positions[i];
        float* row = out.data() + i * H;
        bool has_codec = true;
        switch (pos.codec) {
            case CodecSource::CODEC_SOURCE_NONE:
                has_codec = false;
                break;
            case CodecSource::CODEC_SOURCE_ID:
                tables.codec_vector(0, pos.value, codec.data());
                break;
            case CodecSource::CODEC_SOURCE_X_VECTOR:
                QTTS_ASSERT(prompt.x_vector.size() == H);
                std::copy(prompt.x_vector.begin(), prompt.x_vector.end(), codec.begin());
                break;
            case CodecSource::CODEC_SOURCE_REF_FRAME:
                QTTS_ASSERT(pos.value >= 0 && pos.value < prompt.ref_frames);
                frame_vector(tables, prompt.ref_codes.data() + size_t(pos.value) * size_t(num_code_groups),
                             num_code_groups, codec.data());
                break;
        }
        QTTS_ASSERT(has_codec || pos.text_id >= 0);
        if (pos.text_id >= 0) tables.text_vector(pos.text_id, text.data());
        for (size_t c = 0; c < H; ++c)
            row[c] = (pos.text_id >= 0 ? text[c] : 0.0f) + (has_codec ? codec[c] : 0.0f);
    }
    return out;
}

std::vector<float> prompt_embed_trailing(const Prompt& prompt, const EmbeddingTables& tables) {
    const size_t H = size_t(tables.hidden_size());
    std::vector<float> out(prompt.trailing_ids.size() * H);
    for (size_t i = 0; i < prompt.trailing_ids.size(); ++i) tables.text_vector(prompt.trailing_ids[i], out.data() + i * H);
    return out;
}

}  // namespace qtts
