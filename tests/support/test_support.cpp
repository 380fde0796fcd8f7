#include "test_support.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>

#include <unistd.h>

#include "engine/model/make_model.h"

namespace qtts_test {

std::shared_ptr<const qtts::Checkpoint> tiny_checkpoint_with_decoder(const std::string& name,
                                                                     void (*edit)(qtts::DecoderConfig*), uint64_t seed) {
    qtts::ModelPreset preset = qtts::model_preset("tiny-customvoice");
    if (edit) edit(&preset.speech_config.decoder);
    const std::string dir = temp_dir() + "/" + name;
    qtts::model_write_random(preset, dir, seed);
    return qtts::checkpoint_load(dir);
}

void decoder_release_size(qtts::DecoderConfig* decoder) { *decoder = qtts::DecoderConfig{}; }

std::string reference_dir() {
    if (const char* env = std::getenv("QTTS_REFERENCE_DIR")) return env;
    return QTTS_REFERENCE_DIR;
}

bool reference_available() {
    return std::filesystem::exists(reference_dir() + "/golden/scenarios.json");
}

std::string reference_model_dir(const std::string& model) { return reference_dir() + "/models/" + model; }

std::string golden_path(const std::string& model, const std::string& scenario) {
    return reference_dir() + "/golden/" + model + "--" + scenario + ".safetensors";
}

namespace {
struct TempDir {
    std::string path;
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "qtts-test-XXXXXX").string();
        path = mkdtemp(tmpl.data()) ? tmpl : std::string();
    }
    ~TempDir() {
        std::error_code ec;
        if (!path.empty()) std::filesystem::remove_all(path, ec);
    }
};
}  // namespace

std::string temp_dir() {
    static TempDir dir;
    return dir.path;
}

double rel_error(const float* a, const float* b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; ++i) {
        const double d = double(a[i]) - double(b[i]);
        num += d * d;
        den += double(b[i]) * double(b[i]);
    }
    return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double max_abs_error(const float* a, const float* b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
    return m;
}

std::vector<float> random_floats(size_t n, uint64_t seed, float lo, float hi) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

}  // namespace qtts_test
