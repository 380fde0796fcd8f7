// qtts info --model DIR: what a checkpoint is, its dimensions, voices and size.
#include <cstdio>

#include "apps/qtts/cli.h"
#include "engine/common/error.h"
#include "engine/model/weights.h"
#include "engine/text/prompt.h"

namespace {

int cmd_info(const std::vector<std::string>& argv) {
    qtts_cli::Args args(argv, {"model"}, {"help"});
    if (args.has("help")) {
        std::printf(
            "usage: qtts info [--model DIR]\n"
            "  prints the model type, dimensions, speakers, languages and parameter counts\n"
            "  --model DIR    checkpoint directory (default: the embedded demo model)\n");
        return 0;
    }
    if (!args.positional().empty())
        qtts::fail(qtts::ErrorCode::ERROR_INVALID_ARGUMENT, "unexpected argument '{}' (give the model as --model DIR)",
                   args.positional().front());
    auto ckpt = qtts::checkpoint_load(qtts_cli::model_dir_or_default(args));
    const qtts::ModelConfig& c = ckpt->config;
    const qtts::TalkerConfig& t = c.talker;
    const qtts::CodePredictorConfig& p = t.code_predictor;
    const qtts::DecoderConfig& d = ckpt->speech_config.decoder;

    std::printf("model:            %s\n", ckpt->dir.c_str());
    std::printf("type:             %s (size tag %s)\n", qtts::model_type_name(c.type), c.size_tag.c_str());
    std::printf("talker:           hidden %d, layers %d, heads %d (kv %d), head_dim %d, intermediate %d, codec vocab %d\n",
                t.hidden_size, t.num_layers, t.num_heads, t.num_kv_heads, t.head_dim, t.intermediate_size, t.vocab_size);
    std::printf("text:             vocab %d, hidden %d\n", t.text_vocab_size, t.text_hidden_size);
    std::printf("code predictor:   hidden %d, layers %d, heads %d (kv %d), head_dim %d, intermediate %d, %d code groups%s\n",
                p.hidden_size, p.num_layers, p.num_heads, p.num_kv_heads, p.head_dim, p.intermediate_size,
                t.num_code_groups, ckpt->code_predictor.proj_w ? ", small_to_mtp_projection" : "");
    std::printf("speech decoder:   %d quantizers x %d, latent %d, transformer %d x %d (window %d), decoder_dim %d, %d samples/frame\n",
                d.num_quantizers, d.codebook_size, d.latent_dim, d.num_layers, d.hidden_size, d.sliding_window,
                d.decoder_dim, ckpt->speech_config.decode_upsample_rate);
    if (ckpt->speaker_encoder)
        std::printf("speaker encoder:  ECAPA-TDNN, mel %d -> x-vector %d\n", c.speaker_encoder->mel_dim, c.speaker_encoder->enc_dim);
    std::printf("speech encoder:   %s\n", ckpt->encoder ? "present (voice cloning from audio)" : "absent");

    std::string speakers;
    for (const auto& [name, id] : t.speaker_ids) {
        auto it = t.speaker_dialect.find(name);
        speakers += (speakers.empty() ? "" : ", ") + name;
        if (it != t.speaker_dialect.end() && !it->second.empty()) speakers += " (" + it->second + ")";
    }
    std::printf("speakers:         %s\n", speakers.empty() ? "(none)" : speakers.c_str());
    std::string langs;
    for (const auto& name : qtts::languages_describe(t)) langs += (langs.empty() ? "" : ", ") + name;
    std::printf("languages:        %s\n", langs.c_str());

    std::printf("\n%-18s %16s %16s\n", "network", "parameters", "bytes");
    int64_t total_p = 0, total_b = 0;
    for (const auto& pc : qtts::checkpoint_parameter_counts(*ckpt)) {
        std::printf("%-18s %16lld %16lld  (%.2f M, %.2f MB)\n", pc.network.c_str(), (long long)pc.params, (long long)pc.bytes,
                    pc.params / 1e6, pc.bytes / 1e6);
        total_p += pc.params;
        total_b += pc.bytes;
    }
    std::printf("%-18s %16lld %16lld  (%.2f M, %.2f MB)\n", "total", (long long)total_p, (long long)total_b, total_p / 1e6,
                total_b / 1e6);
    if (!ckpt->unexpected_tensors.empty())
        std::printf("\n%zu unexpected tensors ignored (first: %s)\n", ckpt->unexpected_tensors.size(),
                    ckpt->unexpected_tensors.front().c_str());
    return 0;
}

}  // namespace

QTTS_COMMAND("info", "describe a checkpoint: type, dimensions, speakers, parameter counts", cmd_info);
