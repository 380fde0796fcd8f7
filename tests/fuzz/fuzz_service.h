// A SpeechService for the request-parser fuzz targets: the voices and languages of the embedded
// demo model (tiny-customvoice preset), and a submit() that is never reached (parsing only).
#pragma once

#include <cstdlib>
#include <nlohmann/json.hpp>

#include "audio_io/server/request_params.h"
#include "fuzz_support.h"
#include "engine/model/make_model.h"
#include "engine/text/tokenizer.h"

namespace qtts::fuzz {

class ParseOnlyService : public SpeechService {
public:
    ParseOnlyService() {
        const TalkerConfig talker = model_preset("tiny-customvoice").config.talker;
        for (const auto& entry : talker.speaker_ids) voices_.push_back(entry.first);
        languages_.push_back("auto");
        for (const auto& entry : talker.language_ids) languages_.push_back(entry.first);
    }
    std::shared_ptr<Stream> submit(const SpeechRequest&) override { std::abort(); }
    std::vector<std::string> voices() const override { return voices_; }
    std::vector<std::string> languages() const override { return languages_; }
    std::string model_name() const override { return "tiny-customvoice"; }
    std::string backend_name() const override { return "cpu"; }

private:
    std::vector<std::string> voices_;
    std::vector<std::string> languages_;
};

// A refused request: its JSON error body (what every endpoint sends) must be valid JSON, even
// when the message echoes the client's bytes.
inline void request_error_check(const RequestError& e) {
    property(e.status() >= 400 && e.status() < 500, "a refused request is a 4xx");
    const auto body = nlohmann::json::parse(error_body_json(e.what(), e.type(), e.param()));
    property(body.at("error").at("message").is_string(), "error body has a message");
}

// What every accepted request must hold.
inline void accepted_check(const SpeechParams& p, const SpeechLimits& limits) {
    property(utf8_is_valid(p.request.text) && p.request.text.size() <= limits.max_text_bytes, "text checked");
    property(utf8_is_valid(p.request.instruct) && p.request.instruct.size() <= limits.max_text_bytes,
             "instructions checked");
}

}  // namespace qtts::fuzz
