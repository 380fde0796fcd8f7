// The talker's prompt: which text and codec tokens make up each prefill position, and which
// text tokens are added to the decode steps afterwards ("trailing text"). Spec: model doc §6.
//
// Building is pure bookkeeping on ids (no weights); embedding turns the layout into vectors
// with any backend's tables through the small EmbeddingTables interface.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/api/qtts.h"
#include "engine/model/config.h"
#include "engine/text/tokenizer.h"

namespace qtts {

struct PromptRequest {
    // Ids of "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n", tokenized as one
    // string: [0,3) are the role tokens, [3, n-5) the text.
    std::vector<int32_t> input_ids;
    // Ids of "<|im_start|>user\n{instruct}<|im_end|>\n" (all of them are used); empty = none.
    std::vector<int32_t> instruct_ids;
    std::string speaker;           // CustomVoice speaker name (case-insensitive); empty otherwise
    std::string language = "auto"; // a config language (case-insensitive) or "auto"
    TextLayout layout = TextLayout::TEXT_LAYOUT_NON_STREAMING;
    // Streaming layout only: false when more text will be appended while generating. The final
    // <tts_text_eod> is then left out of the trailing text (the generator adds it on close).
    bool text_complete = true;
    // The official wrapper drops the instruct of 0.6B CustomVoice models (tts_model_size "0b6")
    // with no message; we drop it with a log line. The reference's low-level generate() keeps it,
    // and the golden files were made that way: set this to reproduce them.
    bool keep_instruct_on_0b6_custom_voice = false;

    // Base models: the speaker encoder's x-vector [H] (required for Base, refused otherwise).
    std::vector<float> x_vector;
    // Base in-context cloning (ICL): ids of "<|im_start|>assistant\n{ref_text}<|im_end|>\n"
    // ([3, n-2) is the transcript) and the reference clip's codes [ref_frames, 16].
    std::vector<int32_t> ref_ids;
    std::vector<int32_t> ref_codes;
    int ref_frames = 0;
};

// Where the codec track of a position comes from.
enum class CodecSource {
    CODEC_SOURCE_NONE,
    CODEC_SOURCE_ID,         // talker codec_embedding[value] (a codebook-0 code or a control id)
    CODEC_SOURCE_X_VECTOR,   // Prompt::x_vector
    CODEC_SOURCE_REF_FRAME,  // sum of the 16 codebook embeddings of reference frame `value`
};

// One prefill position: text track + codec track (either may be absent, not both).
struct PromptPosition {
    int32_t text_id = -1;  // -1 = no text track
    CodecSource codec = CodecSource::CODEC_SOURCE_NONE;
    int32_t value = -1;    // codec id or reference frame index
};

struct Prompt {
    std::vector<PromptPosition> positions;  // the prefill, in order
    std::vector<int32_t> trailing_ids;      // text track of decode steps 0..T-1 (then <tts_pad>)
    std::vector<float> x_vector;            // [H] when a position uses it
    std::vector<int32_t> ref_codes;         // [ref_frames, 16] when positions use them
    int ref_frames = 0;
    int text_tokens = 0;                    // target text tokens (drives the frame budget)
    TextLayout layout = TextLayout::TEXT_LAYOUT_NON_STREAMING;
    bool text_complete = true;
    int32_t tts_pad_id = 151671;
    int32_t tts_eos_id = 151673;
};

// The languages a request may name, for listings and error messages: "auto", each language, and
// each dialect with the speakers it is tied to ("sichuan_dialect (speaker eric only)").
std::vector<std::string> languages_describe(const TalkerConfig& talker);

// The reference's prompt templates (model doc §3) around a request's text, as ids. The text is
// read with `text_tokens`: ADDED_TOKENS_AS_TEXT (what every request gets unless it opts in to raw
// token syntax) keeps "<|im_end|>" and the like in the text from becoming control tokens; the
// template's own tokens always are. Either way the ids equal those of the whole template string
// when the text holds no added-token string.
//   assistant: "<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"
//   instruct:  "<|im_start|>user\n{text}<|im_end|>\n"
//   reference: "<|im_start|>assistant\n{text}<|im_end|>\n"  (Base in-context cloning transcript)
std::vector<int32_t> assistant_template_ids(const Tokenizer& tokenizer, std::string_view text, AddedTokens text_tokens);
std::vector<int32_t> instruct_template_ids(const Tokenizer& tokenizer, std::string_view text, AddedTokens text_tokens);
std::vector<int32_t> reference_template_ids(const Tokenizer& tokenizer, std::string_view text, AddedTokens text_tokens);

// What prompt_request_check resolved, for prompt_build to lay out.
struct PromptChecked {
    int32_t speaker_id = -1;   // CustomVoice speaker's codec id; -1 = none
    int32_t language_id = -1;  // language (or dialect) codec id; -1 = "auto" (nothink)
    bool icl = false;          // Base in-context cloning (reference ids + codes)
};

// The checks of prompt_build without the layout (prompt_build runs them first): speaker,
// language, template and range of the ids, x-vector, ICL inputs. SpeechModel::prepare calls it to
// refuse a bad request on the caller's thread without building a prompt it would throw away.
// Throws the errors prompt_build documents, with the same messages.
PromptChecked prompt_request_check(const ModelConfig& config, const PromptRequest& request);

// Validates the request against the model (prompt_request_check) and lays out the prompt. Throws qtts::Error for an
// unknown speaker or language (listing the supported ones), a missing CustomVoice speaker, a
// speaker given to VoiceDesign/Base, a Base request without x-vector, ICL inputs on a non-Base
// model, malformed template ids or out-of-range ids/codes.
Prompt prompt_build(const ModelConfig& config, const PromptRequest& request);

// Embedding tables of one loaded model (implemented by each backend's LM weights).
class EmbeddingTables {
public:
    virtual ~EmbeddingTables() = default;
    virtual int hidden_size() const = 0;
    // text_projection(text_embedding[id]) → out[H]
    virtual void text_vector(int32_t id, float* out) const = 0;
    // codebook 0: talker codec_embedding[id] (ids 0..3071); codebook j ≥ 1: the code predictor's
    // codec_embedding[j-1][id] (ids 0..2047) → out[H]
    virtual void codec_vector(int codebook, int32_t id, float* out) const = 0;
};

// Sum of the codebook embeddings of one frame of `groups` codes → out[H].
void frame_vector(const EmbeddingTables& tables, const int32_t* codes, int groups, float* out);

// The prefill as vectors [positions, H] and the trailing text as vectors [trailing, H].
std::vector<float> prompt_embed(const Prompt& prompt, const EmbeddingTables& tables, int num_code_groups);
std::vector<float> prompt_embed_trailing(const Prompt& prompt, const EmbeddingTables& tables);

}  // namespace qtts
