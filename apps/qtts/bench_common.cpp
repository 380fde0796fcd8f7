#include "apps/qtts/bench_common.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "apps/qtts/cli.h"
#include "engine/common/device.h"
#include "engine/common/error.h"
#include "engine/common/strings.h"
#include "engine/model/config.h"
#include "engine/model/make_model.h"
#include "engine/text/prompt.h"

namespace qtts_cli {

std::string bench_model_dir(const Args& args, double* make_model_seconds) {
    const auto preset = args.get("preset");
    if (!preset) return model_dir_or_default(args);
    if (args.get("model")) qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "give --model or --preset, not both");
    std::string cache = args.get_or("cache", "");
    if (cache.empty()) {
        const char* env = std::getenv("QTTS_CACHE_DIR");
        cache = env && *env ? env : "/tmp/qtts-bench";
    }
    const qtts::ModelPreset spec = qtts::model_preset(*preset);  // throws for an unknown name
    const std::string dir = cache + "/" + *preset;
    if (!std::filesystem::exists(dir + "/model.safetensors")) {
        std::printf("writing random-weight checkpoint %s to %s ...\n", preset->c_str(), dir.c_str());
        const qtts::MakeModelStats stats = qtts::model_write_random(spec, dir, 1234);
        if (make_model_seconds) *make_model_seconds = stats.seconds;
    }
    return dir;
}

qtts::Prompt bench_prompt(const qtts::ModelConfig& config, int text_repeat) {
    qtts::PromptRequest request;
    // "<|im_start|>assistant\n" + a fixed 22-token English text (text_repeat times) +
    // "<|im_end|>\n<|im_start|>assistant\n"
    const std::vector<int32_t> text = {785, 3974, 13876, 38835, 34208, 916, 279, 15678, 5562, 13, 2585,
                                       525, 498,  30,    9707,  1879,  11,  419, 374,   264,  1273, 13};
    request.input_ids = {151644, 77091, 198};
    for (int r = 0; r < text_repeat; ++r) request.input_ids.insert(request.input_ids.end(), text.begin(), text.end());
    for (const int32_t id : {151645, 198, 151644, 77091, 198}) request.input_ids.push_back(id);
    request.language = "english";
    request.layout = qtts::TextLayout::TEXT_LAYOUT_NON_STREAMING;
    if (config.type == qtts::ModelType::MODEL_TYPE_CUSTOM_VOICE && !config.talker.speaker_ids.empty())
        request.speaker = config.talker.speaker_ids.begin()->first;
    if (config.type == qtts::ModelType::MODEL_TYPE_BASE) {
        request.x_vector.assign(size_t(config.talker.hidden_size), 0.0f);
        for (size_t i = 0; i < request.x_vector.size(); ++i) request.x_vector[i] = 0.01f * float(int(i % 17) - 8);
    }
    return qtts::prompt_build(config, request);
}

void bench_json_write(const std::string& path, const nlohmann::json& j) {
    std::ofstream f(path);
    if (!f) qtts::fail(qtts::ErrorCode::ERROR_IO, "cannot write {}", path);
    f << j.dump(2) << "\n";
    if (!f) qtts::fail(qtts::ErrorCode::ERROR_IO, "writing {} failed", path);
    std::printf("  wrote %s\n", path.c_str());
}

bool bench_gpu_present(const char* command, const char* what, int device) {
#ifdef QTTS_HAVE_CUDA
    if (qtts::cuda_device_count() > 0) return true;
#endif
    std::fprintf(stderr, "qtts %s: %s; the benchmark measures %s and needs a GPU\n", command,
                 qtts::cuda_describe(device).c_str(), what);
    return false;
}

std::vector<int> bench_sizes(const std::string& text, const char* option) {
    std::vector<int> out;
    std::string bad;
    if (qtts::ascii_trim(text).empty())
        qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--{}: no sizes given", option);
    if (!qtts::int_list_parse(text, 1, 1000, &out, &bad))
        qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "--{}: '{}' is not a size in 1..1000", option, bad);
    return out;
}

std::vector<std::string> bench_names(const std::string& text) {
    std::vector<std::string> out;
    std::stringstream ss(text);
    for (std::string item; std::getline(ss, item, ',');)
        if (!qtts::ascii_trim(item).empty()) out.push_back(qtts::ascii_trim(item));
    return out;
}

}  // namespace qtts_cli
