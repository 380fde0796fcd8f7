// The smallest embedding of qtts: an application that links only the engine library
// (qtts_engine: no audio devices, codecs or network) and includes only the public header.
// It speaks one text and writes the audio as raw 16-bit little-endian PCM (SAMPLE_RATE Hz, mono)
// to a file or to standard output, e.g.
//
//   qtts-embed-example "Hello from an embedded assistant." out.pcm
//   qtts-embed-example "Hello." - | aplay -f S16_LE -r 24000 -c 1
//
// Without a model folder (third argument) it uses the embedded demo model, like `qtts say`.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/api/qtts.h"

namespace {

int speak(const std::string& text, const std::string& out_path, const std::string& model_dir) {
    qtts::EngineOptions options;
    options.model_dir = model_dir;  // empty: the embedded demo model
    qtts::Engine engine(options);

    qtts::SpeechRequest request;
    request.text = text;
    const std::shared_ptr<qtts::Stream> stream = engine.submit(request);

    FILE* out = out_path == "-" ? stdout : std::fopen(out_path.c_str(), "wb");
    if (!out) {
        std::fprintf(stderr, "qtts-embed-example: cannot open %s for writing\n", out_path.c_str());
        return 1;
    }
    // The consumer side of the stream: wait for audio, read what is there, convert, write.
    std::vector<float> pcm(static_cast<size_t>(qtts::SAMPLES_PER_FRAME));  // [samples] one frame's worth per read
    std::vector<int16_t> s16(pcm.size());
    int64_t samples = 0;
    while (!stream->finished()) {
        stream->wait(std::chrono::milliseconds(100));
        size_t n = 0;
        while ((n = stream->read(pcm.data(), pcm.size())) > 0) {
            for (size_t i = 0; i < n; ++i)
                s16[i] = int16_t(std::lround(std::clamp(pcm[i], -1.0f, 1.0f) * 32767.0f));
            std::fwrite(s16.data(), sizeof(int16_t), n, out);
            samples += int64_t(n);
        }
    }
    if (out != stdout) std::fclose(out);
    const qtts::StreamMetrics m = stream->metrics();
    std::fprintf(stderr, "qtts-embed-example: %lld samples (%.2f s), first audio after %.1f ms, stop: %s%s%s\n",
                 static_cast<long long>(samples), double(samples) / qtts::SAMPLE_RATE, m.ttfa_gen_ms,
                 qtts::stop_reason_name(m.stop_reason), stream->error().empty() ? "" : ", error: ",
                 stream->error().c_str());
    return stream->error().empty() && samples > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc < 3 || argc > 4) {
        std::fprintf(stderr, "usage: qtts-embed-example TEXT OUT.pcm|- [MODEL_DIR]\n");
        return 2;
    }
    try {
        return speak(argv[1], argv[2], argc == 4 ? argv[3] : "");
    } catch (const qtts::Error& e) {
        std::fprintf(stderr, "qtts-embed-example: error (%s): %s\n", qtts::error_code_name(e.code()), e.what());
        return 1;
    }
}
