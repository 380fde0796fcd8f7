#include "engine/model/weights.h"

#include <filesystem>
#include <set>

#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts {

namespace {

using Init = TensorSpec::Init;
using Shape = std::vector<int64_t>;

std::string shape_to_string(const Shape& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// Binds expected tensors to a file, collecting every problem; with no file it only records the
// specs (used to write random checkpoints with exactly the layout the loader expects).
class Binder {
public:
    explicit Binder(const SafetensorsFile* file) : file_(file) {}

    Tensor get(const std::string& name, Shape shape, Init init = Init::WEIGHT, int fan_in = 0) {
        specs_.push_back({name, shape, init, fan_in > 0 ? fan_in : 1});
        if (!file_) return nullptr;
        used_.insert(name);
        const TensorView* t = file_->find(name);
        if (!t) {
            missing_.push_back(name + " " + shape_to_string(shape));
            return nullptr;
        }
        if (t->shape != shape) {
            wrong_.push_back(fmt::format("tensor '{}' has shape {}, expected {}", name, t->shape_str(), shape_to_string(shape)));
            return nullptr;
        }
        if (t->dtype != DType::DTYPE_BF16 && t->dtype != DType::DTYPE_F32 && t->dtype != DType::DTYPE_F16) {
            wrong_.push_back(fmt::format("tensor '{}' has dtype {}, expected BF16, F16 or F32", name, dtype_name(t->dtype)));
            return nullptr;
        }
        return t;
    }

    ConvWeights conv(const std::string& prefix, int out, int in, int k, bool bias = true, Init init = Init::WEIGHT) {
        ConvWeights c;
        c.w = get(prefix + ".weight", {out, in, k}, init, in * k);
        c.b = bias ? get(prefix + ".bias", {out}, Init::ZERO) : nullptr;
        return c;
    }

    // Throws one error listing every problem (missing first, then wrong shapes).
    void finish(const std::string& what) const {
        if (!file_ || (missing_.empty() && wrong_.empty())) return;
        std::string msg = fmt::format("{}: not a valid {} file:", file_->path(), what);
        size_t shown = 0;
        for (const auto& m : missing_) {
            if (shown++ < 12) msg += "\n  missing tensor " + m;
        }
        for (const auto& w : wrong_) {
            if (shown++ < 12) msg += "\n  " + w;
        }
        if (shown > 12) msg += fmt::format("\n  ... and {} more problems", shown - 12);
        throw Error(missing_.empty() ? ErrorCode::ERROR_SHAPE : ErrorCode::ERROR_NOT_FOUND, msg);
    }

    std::vector<std::string> unexpected() const {
        std::vector<std::string> out;
        if (!file_) return out;
        for (const auto& [name, t] : file_->tensors()) {
            if (!used_.count(name)) out.push_back(name);
        }
        return out;
    }

    const std::vector<TensorSpec>& specs() const { return specs_; }

private:
    const SafetensorsFile* file_;
    std::vector<TensorSpec> specs_;
    std::set<std::string> used_;
    std::vector<std::string> missing_;
    std::vector<std::string> wrong_;
};

TransformerLayerWeights bind_qwen3_layer(Binder& b, const std::string& p, const TransformerConfig& c) {
    const int H = c.hidden_size, I = c.intermediate_size, hd = c.head_dim;
    const int q = c.num_heads * hd, kv = c.num_kv_heads * hd;
    TransformerLayerWeights w;
    w.input_norm = b.get(p + ".input_layernorm.weight", {H}, Init::NORM_ONE);
    w.q_proj = b.get(p + ".self_attn.q_proj.weight", {q, H}, Init::WEIGHT, H);
    w.k_proj = b.get(p + ".self_attn.k_proj.weight", {kv, H}, Init::WEIGHT, H);
    w.v_proj = b.get(p + ".self_attn.v_proj.weight", {kv, H}, Init::WEIGHT, H);
    w.o_proj = b.get(p + ".self_attn.o_proj.weight", {H, q}, Init::SMALL, q);
    w.q_norm = b.get(p + ".self_attn.q_norm.weight", {hd}, Init::NORM_ONE);
    w.k_norm = b.get(p + ".self_attn.k_norm.weight", {hd}, Init::NORM_ONE);
    w.post_norm = b.get(p + ".post_attention_layernorm.weight", {H}, Init::NORM_ONE);
    w.gate_proj = b.get(p + ".mlp.gate_proj.weight", {I, H}, Init::WEIGHT, H);
    w.up_proj = b.get(p + ".mlp.up_proj.weight", {I, H}, Init::WEIGHT, H);
    w.down_proj = b.get(p + ".mlp.down_proj.weight", {H, I}, Init::SMALL, I);
    return w;
}

void bind_model(Binder& b, const ModelConfig& c, TalkerWeights* talker, CodePredictorWeights* cp,
                std::optional<SpeakerEncoderWeights>* speaker) {
    const TalkerConfig& t = c.talker;
    const int H = t.hidden_size, Ht = t.text_hidden_size;
    talker->codec_embedding = b.get("talker.model.codec_embedding.weight", {t.vocab_size, H}, Init::WEIGHT, 16);
    talker->text_embedding = b.get("talker.model.text_embedding.weight", {t.text_vocab_size, Ht}, Init::WEIGHT, 1);
    talker->layers.clear();
    for (int l = 0; l < t.num_layers; ++l)
        talker->layers.push_back(bind_qwen3_layer(b, "talker.model.layers." + std::to_string(l), t));
    talker->norm = b.get("talker.model.norm.weight", {H}, Init::NORM_ONE);
    talker->codec_head = b.get("talker.codec_head.weight", {t.vocab_size, H}, Init::WEIGHT, H);
    talker->text_fc1_w = b.get("talker.text_projection.linear_fc1.weight", {Ht, Ht}, Init::WEIGHT, Ht);
    talker->text_fc1_b = b.get("talker.text_projection.linear_fc1.bias", {Ht}, Init::ZERO);
    talker->text_fc2_w = b.get("talker.text_projection.linear_fc2.weight", {H, Ht}, Init::WEIGHT, Ht);
    talker->text_fc2_b = b.get("talker.text_projection.linear_fc2.bias", {H}, Init::ZERO);

    const CodePredictorConfig& p = t.code_predictor;
    const int Hc = p.hidden_size;
    cp->layers.clear();
    for (int l = 0; l < p.num_layers; ++l)
        cp->layers.push_back(bind_qwen3_layer(b, "talker.code_predictor.model.layers." + std::to_string(l), p));
    cp->norm = b.get("talker.code_predictor.model.norm.weight", {Hc}, Init::NORM_ONE);
    cp->codec_embedding.clear();
    cp->lm_head.clear();
    for (int g = 0; g < t.num_code_groups - 1; ++g) {
        cp->codec_embedding.push_back(b.get("talker.code_predictor.model.codec_embedding." + std::to_string(g) + ".weight",
                                            {p.vocab_size, H}, Init::WEIGHT, 16));
    }
    for (int g = 0; g < t.num_code_groups - 1; ++g) {
        cp->lm_head.push_back(
            b.get("talker.code_predictor.lm_head." + std::to_string(g) + ".weight", {p.vocab_size, Hc}, Init::WEIGHT, Hc));
    }
    if (Hc != H) {
        cp->proj_w = b.get("talker.code_predictor.small_to_mtp_projection.weight", {Hc, H}, Init::WEIGHT, H);
        cp->proj_b = b.get("talker.code_predictor.small_to_mtp_projection.bias", {Hc}, Init::ZERO);
    } else {
        cp->proj_w = cp->proj_b = nullptr;
    }

    speaker->reset();
    if (c.type == ModelType::MODEL_TYPE_BASE && c.speaker_encoder) {
        const SpeakerEncoderConfig& s = *c.speaker_encoder;
        SpeakerEncoderWeights w;
        const auto& ch = s.enc_channels;
        const auto& ks = s.enc_kernel_sizes;
        w.block0 = b.conv("speaker_encoder.blocks.0.conv", ch[0], s.mel_dim, ks[0]);
        for (int i = 1; i <= 3; ++i) {
            const std::string p2 = "speaker_encoder.blocks." + std::to_string(i);
            const int C = ch[i], Cin = ch[i - 1], sub = C / s.enc_res2net_scale;
            SpeakerEncoderBlockWeights blk;
            blk.tdnn1 = b.conv(p2 + ".tdnn1.conv", C, Cin, 1);
            for (int j = 0; j < s.enc_res2net_scale - 1; ++j)
                blk.res2net.push_back(b.conv(p2 + ".res2net_block.blocks." + std::to_string(j) + ".conv", sub, sub, ks[i]));
            blk.tdnn2 = b.conv(p2 + ".tdnn2.conv", C, C, 1);
            blk.se_conv1 = b.conv(p2 + ".se_block.conv1", s.enc_se_channels, C, 1);
            blk.se_conv2 = b.conv(p2 + ".se_block.conv2", C, s.enc_se_channels, 1);
            w.blocks.push_back(std::move(blk));
        }
        const int C4 = ch[4];
        w.mfa = b.conv("speaker_encoder.mfa.conv", C4, ch[1] + ch[2] + ch[3], ks[4]);
        w.asp_tdnn = b.conv("speaker_encoder.asp.tdnn.conv", s.enc_attention_channels, 3 * C4, 1);
        w.asp_conv = b.conv("speaker_encoder.asp.conv", C4, s.enc_attention_channels, 1);
        w.fc = b.conv("speaker_encoder.fc", s.enc_dim, 2 * C4, 1);
        *speaker = std::move(w);
    }
}

SnakeWeights bind_snake(Binder& b, const std::string& p, int C) {
    return {b.get(p + ".alpha", {C}, Init::LOG_SCALE), b.get(p + ".beta", {C}, Init::LOG_SCALE)};
}

void bind_decoder(Binder& b, const SpeechTokenizerConfig& sc, SpeechDecoderWeights* w) {
    const DecoderConfig& d = sc.decoder;
    const int cs = d.codebook_size, cd = d.codebook_dim, half = cd / 2, latent = d.latent_dim, D = d.hidden_size;
    const std::string q = "decoder.quantizer.";
    w->rvq_first_embedding_sum = b.get(q + "rvq_first.vq.layers.0._codebook.embedding_sum", {cs, half}, Init::WEIGHT, 1);
    w->rvq_first_cluster_usage = b.get(q + "rvq_first.vq.layers.0._codebook.cluster_usage", {cs}, Init::USAGE);
    b.get(q + "rvq_first.input_proj.weight", {half, cd, 1}, Init::WEIGHT, cd);  // encoder side; unused by decoding
    w->rvq_first_output_proj = b.get(q + "rvq_first.output_proj.weight", {cd, half, 1}, Init::WEIGHT, half);
    w->rvq_rest_embedding_sum.clear();
    w->rvq_rest_cluster_usage.clear();
    for (int k = 0; k < d.num_quantizers - 1; ++k) {
        const std::string p = q + "rvq_rest.vq.layers." + std::to_string(k) + "._codebook.";
        w->rvq_rest_embedding_sum.push_back(b.get(p + "embedding_sum", {cs, half}, Init::WEIGHT, 1));
        w->rvq_rest_cluster_usage.push_back(b.get(p + "cluster_usage", {cs}, Init::USAGE));
    }
    b.get(q + "rvq_rest.input_proj.weight", {half, cd, 1}, Init::WEIGHT, cd);
    w->rvq_rest_output_proj = b.get(q + "rvq_rest.output_proj.weight", {cd, half, 1}, Init::WEIGHT, half * 4);
    w->pre_conv = b.conv("decoder.pre_conv.conv", latent, cd, 3);

    const std::string t = "decoder.pre_transformer.";
    const int qd = d.num_heads * d.head_dim, kvd = d.num_kv_heads * d.head_dim, I = d.intermediate_size;
    w->tr_input_proj_w = b.get(t + "input_proj.weight", {D, latent}, Init::WEIGHT, latent);
    w->tr_input_proj_b = b.get(t + "input_proj.bias", {D}, Init::ZERO);
    w->tr_layers.clear();
    for (int l = 0; l < d.num_layers; ++l) {
        const std::string p = t + "layers." + std::to_string(l) + ".";
        DecoderTransformerLayerWeights lw;
        lw.input_norm = b.get(p + "input_layernorm.weight", {D}, Init::NORM_ONE);
        lw.q_proj = b.get(p + "self_attn.q_proj.weight", {qd, D}, Init::WEIGHT, D);
        lw.k_proj = b.get(p + "self_attn.k_proj.weight", {kvd, D}, Init::WEIGHT, D);
        lw.v_proj = b.get(p + "self_attn.v_proj.weight", {kvd, D}, Init::WEIGHT, D);
        lw.o_proj = b.get(p + "self_attn.o_proj.weight", {D, qd}, Init::WEIGHT, qd);
        lw.attn_scale = b.get(p + "self_attn_layer_scale.scale", {D}, Init::SMALL);
        lw.post_norm = b.get(p + "post_attention_layernorm.weight", {D}, Init::NORM_ONE);
        lw.gate_proj = b.get(p + "mlp.gate_proj.weight", {I, D}, Init::WEIGHT, D);
        lw.up_proj = b.get(p + "mlp.up_proj.weight", {I, D}, Init::WEIGHT, D);
        lw.down_proj = b.get(p + "mlp.down_proj.weight", {D, I}, Init::WEIGHT, I);
        lw.mlp_scale = b.get(p + "mlp_layer_scale.scale", {D}, Init::SMALL);
        w->tr_layers.push_back(lw);
    }
    w->tr_norm = b.get(t + "norm.weight", {D}, Init::NORM_ONE);
    w->tr_output_proj_w = b.get(t + "output_proj.weight", {latent, D}, Init::WEIGHT, D);
    w->tr_output_proj_b = b.get(t + "output_proj.bias", {latent}, Init::ZERO);

    w->upsample_conv.clear();
    w->upsample_convnext.clear();
    for (size_t i = 0; i < d.upsampling_ratios.size(); ++i) {
        const std::string p = "decoder.upsample." + std::to_string(i) + ".";
        const int r = d.upsampling_ratios[i];
        ConvWeights up;
        up.w = b.get(p + "0.conv.weight", {latent, latent, r}, Init::WEIGHT, latent);
        up.b = b.get(p + "0.conv.bias", {latent}, Init::ZERO);
        w->upsample_conv.push_back(up);
        ConvNeXtWeights cx;
        cx.dwconv.w = b.get(p + "1.dwconv.conv.weight", {latent, 1, 7}, Init::WEIGHT, 7);
        cx.dwconv.b = b.get(p + "1.dwconv.conv.bias", {latent}, Init::ZERO);
        cx.norm_w = b.get(p + "1.norm.weight", {latent}, Init::NORM_ONE);
        cx.norm_b = b.get(p + "1.norm.bias", {latent}, Init::ZERO);
        cx.pw1_w = b.get(p + "1.pwconv1.weight", {4 * latent, latent}, Init::WEIGHT, latent);
        cx.pw1_b = b.get(p + "1.pwconv1.bias", {4 * latent}, Init::ZERO);
        cx.pw2_w = b.get(p + "1.pwconv2.weight", {latent, 4 * latent}, Init::WEIGHT, 4 * latent);
        cx.pw2_b = b.get(p + "1.pwconv2.bias", {latent}, Init::ZERO);
        cx.gamma = b.get(p + "1.gamma", {latent}, Init::SMALL);
        w->upsample_convnext.push_back(cx);
    }
    w->conv_in = b.conv("decoder.decoder.0.conv", d.decoder_dim, latent, 7);
    w->blocks.clear();
    int C = d.decoder_dim;
    for (size_t i = 0; i < d.upsample_rates.size(); ++i) {
        const int r = d.upsample_rates[i];
        const int Cout = C / 2;
        const std::string p = "decoder.decoder." + std::to_string(i + 1) + ".block.";
        DecoderBlockWeights blk;
        blk.snake = bind_snake(b, p + "0", C);
        blk.upsample.w = b.get(p + "1.conv.weight", {C, Cout, 2 * r}, Init::WEIGHT, C * 2);
        blk.upsample.b = b.get(p + "1.conv.bias", {Cout}, Init::ZERO);
        for (int u = 0; u < 3; ++u) {
            const std::string pu = p + std::to_string(2 + u) + ".";
            ResidualUnitWeights ru;
            ru.act1 = bind_snake(b, pu + "act1", Cout);
            ru.conv1 = b.conv(pu + "conv1.conv", Cout, Cout, 7);
            ru.act2 = bind_snake(b, pu + "act2", Cout);
            ru.conv2 = b.conv(pu + "conv2.conv", Cout, Cout, 1, true, Init::SMALL);
            blk.units.push_back(ru);
        }
        w->blocks.push_back(std::move(blk));
        C = Cout;
    }
    w->snake_out = bind_snake(b, "decoder.decoder." + std::to_string(d.upsample_rates.size() + 1), C);
    w->conv_out = b.conv("decoder.decoder." + std::to_string(d.upsample_rates.size() + 2) + ".conv", 1, C, 7, true, Init::OUTPUT);
}

void bind_encoder(Binder& b, const SpeechTokenizerConfig& sc, SpeechEncoderWeights* w) {
    const EncoderConfig& e = sc.encoder;
    const std::string p = "encoder.encoder.layers.";
    int idx = 0;
    w->conv_in = b.conv(p + std::to_string(idx++) + ".conv", e.num_filters, 1, e.kernel_size);
    int C = e.num_filters;
    w->res.clear();
    w->down.clear();
    for (auto it = e.upsampling_ratios.rbegin(); it != e.upsampling_ratios.rend(); ++it) {
        const int r = *it;
        EncoderResBlockWeights rb;
        const std::string pr = p + std::to_string(idx) + ".block.";
        rb.conv1 = b.conv(pr + "1.conv", C / e.compress, C, e.residual_kernel_size);
        rb.conv2 = b.conv(pr + "3.conv", C, C / e.compress, 1, true, Init::SMALL);
        w->res.push_back(rb);
        idx += 2;  // res block, ELU
        w->down.push_back(b.conv(p + std::to_string(idx++) + ".conv", 2 * C, C, 2 * r));
        C *= 2;
    }
    ++idx;  // ELU
    w->conv_out = b.conv(p + std::to_string(idx) + ".conv", e.hidden_size, C, e.last_kernel_size);

    const int D = e.hidden_size, qd = e.num_heads * e.head_dim, kvd = e.num_kv_heads * e.head_dim;
    w->tr_layers.clear();
    for (int l = 0; l < e.num_layers; ++l) {
        const std::string pl = "encoder.encoder_transformer.layers." + std::to_string(l) + ".";
        EncoderTransformerLayerWeights lw;
        lw.input_norm_w = b.get(pl + "input_layernorm.weight", {D}, Init::NORM_ONE);
        lw.input_norm_b = b.get(pl + "input_layernorm.bias", {D}, Init::ZERO);
        lw.q_proj = b.get(pl + "self_attn.q_proj.weight", {qd, D}, Init::WEIGHT, D);
        lw.k_proj = b.get(pl + "self_attn.k_proj.weight", {kvd, D}, Init::WEIGHT, D);
        lw.v_proj = b.get(pl + "self_attn.v_proj.weight", {kvd, D}, Init::WEIGHT, D);
        lw.o_proj = b.get(pl + "self_attn.o_proj.weight", {D, qd}, Init::WEIGHT, qd);
        lw.attn_scale = b.get(pl + "self_attn_layer_scale.scale", {D}, Init::SMALL);
        lw.post_norm_w = b.get(pl + "post_attention_layernorm.weight", {D}, Init::NORM_ONE);
        lw.post_norm_b = b.get(pl + "post_attention_layernorm.bias", {D}, Init::ZERO);
        lw.fc1 = b.get(pl + "mlp.fc1.weight", {e.intermediate_size, D}, Init::WEIGHT, D);
        lw.fc2 = b.get(pl + "mlp.fc2.weight", {D, e.intermediate_size}, Init::WEIGHT, e.intermediate_size);
        lw.mlp_scale = b.get(pl + "mlp_layer_scale.scale", {D}, Init::SMALL);
        w->tr_layers.push_back(lw);
    }
    w->downsample = b.conv("encoder.downsample.conv", D, D, 2 * e.compress, false);
    const std::string q = "encoder.quantizer.";
    const int cd = e.codebook_dim, cs = e.codebook_size;
    w->semantic_input_proj = b.get(q + "semantic_residual_vector_quantizer.input_proj.weight", {cd, D, 1}, Init::WEIGHT, D);
    b.get(q + "semantic_residual_vector_quantizer.output_proj.weight", {D, cd, 1}, Init::WEIGHT, cd);
    w->acoustic_input_proj = b.get(q + "acoustic_residual_vector_quantizer.input_proj.weight", {cd, D, 1}, Init::WEIGHT, D);
    b.get(q + "acoustic_residual_vector_quantizer.output_proj.weight", {D, cd, 1}, Init::WEIGHT, cd);
    auto bind_books = [&](const std::string& which, int n, std::vector<Tensor>* sums, std::vector<Tensor>* usage) {
        sums->clear();
        usage->clear();
        for (int k = 0; k < n; ++k) {
            const std::string pk = q + which + ".layers." + std::to_string(k) + ".codebook.";
            usage->push_back(b.get(pk + "cluster_usage", {cs}, Init::USAGE));
            sums->push_back(b.get(pk + "embed_sum", {cs, cd}, Init::WEIGHT, 1));
            b.get(pk + "initialized", {1}, Init::NORM_ONE);
        }
    };
    bind_books("semantic_residual_vector_quantizer", e.num_semantic_quantizers, &w->semantic_embed_sum,
               &w->semantic_cluster_usage);
    bind_books("acoustic_residual_vector_quantizer", e.num_quantizers - e.num_semantic_quantizers, &w->acoustic_embed_sum,
               &w->acoustic_cluster_usage);
}

constexpr const char* kLayoutHint =
    "expected the official Hugging Face layout:\n"
    "  DIR/config.json, DIR/generation_config.json, DIR/model.safetensors,\n"
    "  DIR/vocab.json, DIR/merges.txt, DIR/tokenizer_config.json,\n"
    "  DIR/speech_tokenizer/config.json, DIR/speech_tokenizer/model.safetensors\n"
    "get one with e.g. `huggingface-cli download Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice --local-dir DIR`,\n"
    "or write a random-weight one with `qtts make-model --preset tiny-customvoice --out DIR`";

void require_file(const std::string& path) {
    if (!std::filesystem::exists(path)) fail(ErrorCode::ERROR_NOT_FOUND, "missing file {}\n{}", path, kLayoutHint);
}

}  // namespace

std::vector<TensorSpec> model_tensor_specs(const ModelConfig& config) {
    Binder b(nullptr);
    TalkerWeights t;
    CodePredictorWeights cp;
    std::optional<SpeakerEncoderWeights> s;
    bind_model(b, config, &t, &cp, &s);
    return b.specs();
}

std::vector<TensorSpec> speech_tokenizer_tensor_specs(const SpeechTokenizerConfig& config) {
    Binder b(nullptr);
    SpeechDecoderWeights d;
    SpeechEncoderWeights e;
    bind_decoder(b, config, &d);
    bind_encoder(b, config, &e);
    return b.specs();
}

std::shared_ptr<const Checkpoint> checkpoint_load(const std::string& dir) {
    if (!std::filesystem::is_directory(dir))
        fail(ErrorCode::ERROR_NOT_FOUND, "model directory '{}' does not exist or is not a directory\n{}", dir, kLayoutHint);
    auto ckpt = std::make_shared<Checkpoint>();
    ckpt->dir = dir;
    const std::string config_path = dir + "/config.json";
    const std::string gen_path = dir + "/generation_config.json";
    const std::string model_path = dir + "/model.safetensors";
    const std::string st_dir = dir + "/speech_tokenizer";
    const std::string st_config_path = st_dir + "/config.json";
    const std::string st_model_path = st_dir + "/model.safetensors";
    require_file(config_path);
    require_file(model_path);
    if (!std::filesystem::is_directory(st_dir))
        fail(ErrorCode::ERROR_NOT_FOUND, "missing folder {} (the speech tokenizer)\n{}", st_dir, kLayoutHint);
    require_file(st_config_path);
    require_file(st_model_path);

    ckpt->config = model_config_load(config_path);
    if (std::filesystem::exists(gen_path)) {
        ckpt->generation = generation_config_load(gen_path);
    } else {
        QTTS_LOG_WARN("{} not found; using the reference sampling defaults", gen_path);
    }
    ckpt->speech_config = speech_tokenizer_config_load(st_config_path);

    ckpt->model_file = SafetensorsFile::open(model_path);
    {
        Binder b(ckpt->model_file.get());
        bind_model(b, ckpt->config, &ckpt->talker, &ckpt->code_predictor, &ckpt->speaker_encoder);
        b.finish("Qwen3-TTS model");
        for (auto& name : b.unexpected()) ckpt->unexpected_tensors.push_back(model_path + ": " + name);
    }
    if (ckpt->config.type == ModelType::MODEL_TYPE_BASE && !ckpt->speaker_encoder)
        fail(ErrorCode::ERROR_FORMAT, "{}: Base model without speaker_encoder_config", config_path);

    ckpt->speech_file = SafetensorsFile::open(st_model_path);
    {
        Binder b(ckpt->speech_file.get());
        bind_decoder(b, ckpt->speech_config, &ckpt->decoder);
        b.finish("speech tokenizer decoder");
        // The encoder is only needed for voice cloning; validate it when its tensors are there.
        if (ckpt->speech_file->find("encoder.encoder.layers.0.conv.weight")) {
            SpeechEncoderWeights enc;
            bind_encoder(b, ckpt->speech_config, &enc);
            b.finish("speech tokenizer encoder");
            ckpt->encoder = std::move(enc);
        }
        for (auto& name : b.unexpected()) ckpt->unexpected_tensors.push_back(st_model_path + ": " + name);
    }
    if (!ckpt->unexpected_tensors.empty()) {
        QTTS_LOG_WARN("{} unexpected tensors in {} (ignored), first: {}", ckpt->unexpected_tensors.size(), dir,
                      ckpt->unexpected_tensors.front());
    }
    return ckpt;
}

std::vector<ParameterCount> checkpoint_parameter_counts(const Checkpoint& ckpt) {
    std::vector<ParameterCount> out;
    auto count_prefix = [](const SafetensorsFile& f, const std::string& prefix, const std::string& exclude) {
        ParameterCount c;
        for (const auto& [name, t] : f.tensors()) {
            if (name.rfind(prefix, 0) != 0) continue;
            if (!exclude.empty() && name.rfind(exclude, 0) == 0) continue;
            c.params += t.numel();
            c.bytes += int64_t(t.nbytes);
        }
        return c;
    };
    ParameterCount talker = count_prefix(*ckpt.model_file, "talker.", "talker.code_predictor.");
    talker.network = "talker";
    ParameterCount cp = count_prefix(*ckpt.model_file, "talker.code_predictor.", "");
    cp.network = "code_predictor";
    out.push_back(talker);
    out.push_back(cp);
    if (ckpt.speaker_encoder) {
        ParameterCount s = count_prefix(*ckpt.model_file, "speaker_encoder.", "");
        s.network = "speaker_encoder";
        out.push_back(s);
    }
    ParameterCount dec = count_prefix(*ckpt.speech_file, "decoder.", "");
    dec.network = "speech_decoder";
    out.push_back(dec);
    if (ckpt.encoder) {
        ParameterCount enc = count_prefix(*ckpt.speech_file, "encoder.", "");
        enc.network = "speech_encoder";
        out.push_back(enc);
    }
    return out;
}

}  // namespace qtts
