#include "engine/cuda/gpu_speech_decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>

#include <cublas_v2.h>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cuda/cuda_check.h"
#include "engine/model/weight_prep.h"
#include "engine/model/safetensors.h"

namespace qtts::cuda {

namespace {

constexpr int kMaxWindow = 1024;  // kernels/decoder.cu MAX_WINDOW

void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

// Signal and scratch sizes of one chunk of n frames, walked through the stages.
struct ScratchPlan {
    size_t signal = 0, col = 0, aux = 0, planes = 0;
    void signal_max(size_t v) { signal = std::max(signal, v); }
    void col_max(size_t v) { col = std::max(col, v); }
    void aux_max(size_t v) { aux = std::max(aux, v); }
    void planes_max(size_t v) { planes = std::max(planes, v); }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Weights
// ---------------------------------------------------------------------------------------------

template <typename T>
const T* GpuSpeechDecoderWeights::store_in(const std::vector<T>& host, std::vector<DeviceArray<T>>* buffers) {
    DeviceArray<T> buffer(host.size());
    CUDA_CHECK(cudaMemcpy(buffer.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
    device_bytes_ += buffer.bytes();
    const T* p = buffer.get();
    buffers->push_back(std::move(buffer));
    return p;
}

const float* GpuSpeechDecoderWeights::store(const std::vector<float>& host) { return store_in(host, &buffers_); }
const uint16_t* GpuSpeechDecoderWeights::store(const std::vector<uint16_t>& host) { return store_in(host, &buffers16_); }

const char* decoder_math_name(DecoderMath math) {
    switch (math) {
        case DecoderMath::DECODER_MATH_FP32: return "fp32";
        case DecoderMath::DECODER_MATH_TF32: return "tf32";
        case DecoderMath::DECODER_MATH_BF16X3: return "bf16x3";
    }
    return "?";
}

bool decoder_math_parse(const std::string& name, DecoderMath* out) {
    for (const DecoderMath m :
         {DecoderMath::DECODER_MATH_FP32, DecoderMath::DECODER_MATH_TF32, DecoderMath::DECODER_MATH_BF16X3})
        if (name == decoder_math_name(m)) {
            *out = m;
            return true;
        }
    return false;
}

namespace {

// Rows of fp32 values as bf16 pairs, each row three times as long: [hi | hi | lo] (a row-major
// [rows, cols] matrix), or with `stacked` the whole hi matrix, again, then the lo matrix
// ([3·rows, cols]): the `a3` operand of split_gemm_row_major.
std::vector<uint16_t> split_triple(const std::vector<float>& v, size_t rows, size_t cols, bool stacked) {
    QTTS_ASSERT(v.size() == rows * cols);
    std::vector<uint16_t> out(3 * v.size());
    for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) {
            const float x = v[r * cols + c];
            const uint16_t hi = f32_to_bf16(x), lo = f32_to_bf16(x - bf16_to_f32(hi));
            if (stacked) {
                out[r * cols + c] = hi;
                out[(rows + r) * cols + c] = hi;
                out[(2 * rows + r) * cols + c] = lo;
            } else {
                out[r * 3 * cols + c] = hi;
                out[r * 3 * cols + cols + c] = hi;
                out[r * 3 * cols + 2 * cols + c] = lo;
            }
        }
    return out;
}

}  // namespace

std::shared_ptr<const GpuSpeechDecoderWeights> GpuSpeechDecoderWeights::upload(const Checkpoint& checkpoint, int device,
                                                                               GpuSpeechDecoderWeightOptions options) {
    return upload(checkpoint.speech_config.decoder, checkpoint.decoder, device, std::move(options));
}

std::shared_ptr<const GpuSpeechDecoderWeights> GpuSpeechDecoderWeights::upload(const DecoderConfig& d,
                                                                               const SpeechDecoderWeights& w,
                                                                               int device,
                                                                               GpuSpeechDecoderWeightOptions options) {
    const auto t0 = std::chrono::steady_clock::now();
    DeviceScope scope(device);
    std::shared_ptr<GpuSpeechDecoderWeights> out(new GpuSpeechDecoderWeights());
    GpuSpeechDecoderWeights& g = *out;
    g.config_ = d;
    g.device_ = device;
    g.math_ = options.math;
    const bool split = options.math == DecoderMath::DECODER_MATH_BF16X3;

    speech_decoder_layout_check(d, w, "GPU speech decoder");
    if (d.sliding_window < 1 || d.sliding_window > kMaxWindow)
        fail(ErrorCode::ERROR_UNSUPPORTED, "GPU speech decoder: sliding window {} not supported (1..{})",
             d.sliding_window, kMaxWindow);

    const int cs = d.codebook_size, cd = d.codebook_dim, half = cd / 2;
    const int latent = d.latent_dim, D = d.hidden_size, I = d.intermediate_size;
    const int qd = d.num_heads * d.head_dim, kvd = d.num_kv_heads * d.head_dim;

    // RVQ: codebooks divided by their usage, as the CPU does.
    std::vector<float> books;
    auto book_add = [&](Tensor sum_t, Tensor usage_t) {
        append(books, rvq_codebook_normalised(sum_t, usage_t, cs, half));
    };
    book_add(w.rvq_first_embedding_sum, w.rvq_first_cluster_usage);
    for (int k = 0; k < d.num_quantizers - 1; ++k)
        book_add(w.rvq_rest_embedding_sum[size_t(k)], w.rvq_rest_cluster_usage[size_t(k)]);
    g.codebooks = g.store(books);
    {
        const auto first = speech_weight_f32(w.rvq_first_output_proj, int64_t(cd) * half, "rvq_first.output_proj");
        const auto rest = speech_weight_f32(w.rvq_rest_output_proj, int64_t(cd) * half, "rvq_rest.output_proj");
        std::vector<float> proj(size_t(cd) * cd);
        for (int o = 0; o < cd; ++o) {
            std::copy_n(first.begin() + ptrdiff_t(o) * half, half, proj.begin() + ptrdiff_t(o) * cd);
            std::copy_n(rest.begin() + ptrdiff_t(o) * half, half, proj.begin() + ptrdiff_t(o) * cd + half);
        }
        g.rvq_proj = g.store(proj);
    }

    // Weight rows with the bias column, padded to 16 bytes when asked (4 floats, 8 bf16 values).
    const int align = split ? 8 : 4;  // 16 bytes of bf16 / fp32
    auto row_len = [&](int cols_with_bias) {
        return options.pad_rows ? (cols_with_bias + align - 1) / align * align : cols_with_bias;
    };
    // Dense conv: [cout, cin·k] + bias column (fp32 `w` also under bf16x3 when `keep_f32`).
    auto conv_make = [&](const ConvWeights& cw, int dilation, const char* what, bool keep_f32 = false) {
        if (!cw.w || cw.w->shape.size() != 3)
            fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: conv '{}' is missing or not 3-D", what);
        Conv c;
        c.cout = int(cw.w->shape[0]);
        c.cin = int(cw.w->shape[1]);
        c.k = int(cw.w->shape[2]);
        c.dilation = dilation;
        const std::vector<float> wt = tensor_to_f32(*cw.w);
        const std::vector<float> b = cw.b ? speech_weight_f32(cw.b, c.cout, what) : std::vector<float>(size_t(c.cout), 0.0f);
        const size_t row = size_t(c.cin) * c.k;
        c.row = row_len(int(row) + 1);
        std::vector<float> packed(size_t(c.cout) * c.row, 0.0f);
        for (int o = 0; o < c.cout; ++o) {
            std::copy_n(wt.begin() + ptrdiff_t(o * row), row, packed.begin() + ptrdiff_t(o) * c.row);
            packed[size_t(o) * c.row + row] = b[size_t(o)];
        }
        if (split) c.planes = g.store(split_triple(packed, size_t(c.cout), size_t(c.row), false));
        if (!split || keep_f32) c.w = g.store(packed);
        return c;
    };
    auto trans_conv_make = [&](const ConvWeights& cw, int stride, const char* what) {
        if (!cw.w || cw.w->shape.size() != 3)
            fail(ErrorCode::ERROR_SHAPE, "speech decoder weights: transposed conv '{}' is missing or not 3-D", what);
        TransConv c;
        c.cin = int(cw.w->shape[0]);
        c.cout = int(cw.w->shape[1]);
        c.k = int(cw.w->shape[2]);
        c.stride = stride;
        if (c.k < stride || c.k - stride > stride)
            fail(ErrorCode::ERROR_UNSUPPORTED,
                 "GPU speech decoder: transposed conv '{}' has kernel {} for stride {} (supported: stride..2·stride)", what,
                 c.k, stride);
        const std::vector<float> wt = tensor_to_f32(*cw.w);
        if (split)
            c.planes = g.store(split_triple(wt, size_t(c.cin), size_t(c.cout) * c.k, true));
        else
            c.w = g.store(wt);
        c.b = g.store(speech_weight_f32(cw.b, c.cout, what));
        return c;
    };
    auto snake_make = [&](const SnakeWeights& sw, int channels) {
        const auto la = speech_weight_f32(sw.alpha, channels, "snake alpha");
        const auto lb = speech_weight_f32(sw.beta, channels, "snake beta");
        std::vector<float> alpha(la.size()), inv_beta(lb.size());
        for (size_t i = 0; i < la.size(); ++i) {
            alpha[i] = snake_alpha(la[i]);
            inv_beta[i] = snake_inv_beta(lb[i]);
        }
        kernels::SnakeParams s;
        s.alpha = g.store(alpha);
        s.inv_beta = g.store(inv_beta);
        return s;
    };

    g.pre_conv = conv_make(w.pre_conv, 1, "pre_conv");
    if (g.pre_conv.cin != cd || g.pre_conv.cout != latent)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder pre_conv is {}->{}, expected {}->{}", g.pre_conv.cin,
             g.pre_conv.cout, cd, latent);

    g.tr_input_w = g.store(speech_weight_f32(w.tr_input_proj_w, int64_t(D) * latent, "pre_transformer.input_proj.weight"));
    g.tr_input_b = g.store(speech_weight_f32(w.tr_input_proj_b, D, "pre_transformer.input_proj.bias"));
    for (const auto& lw : w.tr_layers) {
        Layer l;
        l.input_norm = g.store(speech_weight_f32(lw.input_norm, D, "input_layernorm"));
        std::vector<float> qkv = speech_weight_f32(lw.q_proj, int64_t(qd) * D, "q_proj");
        append(qkv, speech_weight_f32(lw.k_proj, int64_t(kvd) * D, "k_proj"));
        append(qkv, speech_weight_f32(lw.v_proj, int64_t(kvd) * D, "v_proj"));
        l.qkv = g.store(qkv);
        l.o = g.store(speech_weight_f32(lw.o_proj, int64_t(D) * qd, "o_proj"));
        l.attn_scale = g.store(speech_weight_f32(lw.attn_scale, D, "self_attn_layer_scale"));
        l.post_norm = g.store(speech_weight_f32(lw.post_norm, D, "post_attention_layernorm"));
        std::vector<float> gate_up = speech_weight_f32(lw.gate_proj, int64_t(I) * D, "gate_proj");
        append(gate_up, speech_weight_f32(lw.up_proj, int64_t(I) * D, "up_proj"));
        l.gate_up = g.store(gate_up);
        l.down = g.store(speech_weight_f32(lw.down_proj, int64_t(D) * I, "down_proj"));
        l.mlp_scale = g.store(speech_weight_f32(lw.mlp_scale, D, "mlp_layer_scale"));
        g.layers.push_back(l);
    }
    g.tr_norm = g.store(speech_weight_f32(w.tr_norm, D, "pre_transformer.norm"));
    g.tr_output_w = g.store(speech_weight_f32(w.tr_output_proj_w, int64_t(latent) * D, "pre_transformer.output_proj.weight"));
    g.tr_output_b = g.store(speech_weight_f32(w.tr_output_proj_b, latent, "pre_transformer.output_proj.bias"));

    // RoPE frequencies from the config, computed by the CPU reference's function.
    g.inv_freq = g.store(rope_inv_freq(d.head_dim, d.rope_theta));

    g.samples_per_frame_ = 1;
    for (size_t i = 0; i < d.upsampling_ratios.size(); ++i) {
        const int r = d.upsampling_ratios[i];
        g.upsample.push_back(trans_conv_make(w.upsample_conv[i], r, "upsample conv"));
        const ConvNeXtWeights& cw = w.upsample_convnext[i];
        if (!cw.dwconv.w || cw.dwconv.w->shape.size() != 3 || int(cw.dwconv.w->shape[0]) != latent ||
            cw.dwconv.w->shape[1] != 1)
            fail(ErrorCode::ERROR_SHAPE, "speech decoder ConvNeXt {} depthwise conv has an unexpected shape", i);
        ConvNeXt cx;
        cx.channels = latent;
        cx.k = int(cw.dwconv.w->shape[2]);
        cx.dw_w = g.store(tensor_to_f32(*cw.dwconv.w));
        cx.dw_b = g.store(cw.dwconv.b ? speech_weight_f32(cw.dwconv.b, latent, "convnext dwconv.bias")
                                      : std::vector<float>(size_t(latent), 0.0f));
        cx.norm_w = g.store(speech_weight_f32(cw.norm_w, latent, "convnext norm.weight"));
        cx.norm_b = g.store(speech_weight_f32(cw.norm_b, latent, "convnext norm.bias"));
        auto linear_with_bias = [](const std::vector<float>& wt, const std::vector<float>& b, int rows, int cols,
                                   int row) {
            std::vector<float> packed(size_t(rows) * row, 0.0f);
            for (int o = 0; o < rows; ++o) {
                std::copy_n(wt.begin() + ptrdiff_t(o) * cols, cols, packed.begin() + ptrdiff_t(o) * row);
                packed[size_t(o) * row + cols] = b[size_t(o)];
            }
            return packed;
        };
        cx.pw1_row = row_len(latent + 1);
        cx.pw2_row = row_len(4 * latent + 1);
        const std::vector<float> pw1 =
            linear_with_bias(speech_weight_f32(cw.pw1_w, int64_t(4) * latent * latent, "convnext pwconv1.weight"),
                             speech_weight_f32(cw.pw1_b, int64_t(4) * latent, "convnext pwconv1.bias"), 4 * latent, latent,
                             cx.pw1_row);
        const std::vector<float> pw2 =
            linear_with_bias(speech_weight_f32(cw.pw2_w, int64_t(4) * latent * latent, "convnext pwconv2.weight"),
                             speech_weight_f32(cw.pw2_b, latent, "convnext pwconv2.bias"), latent, 4 * latent, cx.pw2_row);
        if (split) {
            cx.pw1_planes = g.store(split_triple(pw1, size_t(4) * latent, size_t(cx.pw1_row), false));
            cx.pw2_planes = g.store(split_triple(pw2, size_t(latent), size_t(cx.pw2_row), false));
        } else {
            cx.pw1 = g.store(pw1);
            cx.pw2 = g.store(pw2);
        }
        cx.gamma = g.store(speech_weight_f32(cw.gamma, latent, "convnext gamma"));
        g.convnext.push_back(cx);
        g.samples_per_frame_ *= r;
    }

    g.conv_in = conv_make(w.conv_in, 1, "decoder.0");
    int C = d.decoder_dim;
    if (g.conv_in.cin != latent || g.conv_in.cout != C)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder conv_in is {}->{}, expected {}->{}", g.conv_in.cin, g.conv_in.cout,
             latent, C);
    for (size_t i = 0; i < d.upsample_rates.size(); ++i) {
        const int r = d.upsample_rates[i];
        const DecoderBlockWeights& bw = w.blocks[i];
        Block blk;
        blk.snake = snake_make(bw.snake, C);
        blk.upsample = trans_conv_make(bw.upsample, r, "decoder block upsample");
        if (blk.upsample.cin != C) fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} expects {} input channels", i, C);
        C = blk.upsample.cout;
        for (size_t u = 0; u < size_t(SPEECH_DECODER_RESIDUAL_UNITS); ++u) {
            const ResidualUnitWeights& uw = bw.units[u];
            ResidualUnit ru;
            ru.act1 = snake_make(uw.act1, C);
            ru.conv1 = conv_make(uw.conv1, SPEECH_DECODER_RESIDUAL_DILATIONS[u], "residual conv1");
            ru.act2 = snake_make(uw.act2, C);
            ru.conv2 = conv_make(uw.conv2, 1, "residual conv2");
            if (ru.conv1.cin != C || ru.conv1.cout != C || ru.conv2.cin != C || ru.conv2.cout != C || ru.conv2.k != 1)
                fail(ErrorCode::ERROR_SHAPE, "speech decoder block {} unit {}: unexpected conv shapes", i, u);
            blk.units.push_back(ru);
        }
        g.blocks.push_back(std::move(blk));
        g.samples_per_frame_ *= r;
    }
    g.snake_out = snake_make(w.snake_out, C);
    g.conv_out = conv_make(w.conv_out, 1, "decoder.6", true);
    if (g.conv_out.cin != C || g.conv_out.cout != 1)
        fail(ErrorCode::ERROR_SHAPE, "speech decoder output conv is {}->{}, expected {}->1", g.conv_out.cin,
             g.conv_out.cout, C);

    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    QTTS_LOG_INFO("GPU speech decoder weights on device {}: {:.1f} MB in {} buffers, {} products, uploaded in {:.2f} s",
                  device, g.device_bytes_ / 1e6, g.buffers_.size() + g.buffers16_.size(), decoder_math_name(g.math_),
                  seconds);
    return out;
}

// ---------------------------------------------------------------------------------------------
// State layout
// ---------------------------------------------------------------------------------------------

DecoderStateLayout DecoderStateLayout::make(const GpuSpeechDecoderWeights& w, int max_chunk_frames) {
    const DecoderConfig& d = w.config();
    const int kvd = d.num_kv_heads * d.head_dim;
    DecoderStateLayout out;
    out.max_chunk_frames = max_chunk_frames;
    out.ring_rows = d.sliding_window - 1 + max_chunk_frames;
    size_t at = kernels::DECODER_STATE_HEADER_BYTES;
    // Every piece 256-byte aligned; an empty piece takes no room (its offset is never read).
    auto place = [&at](size_t floats) {
        const size_t here = at;
        at += (floats * sizeof(float) + 255) / 256 * 256;
        return here;
    };
    // Conv input tails have two slots (read one, write the other; see conv_im2col_carry).
    out.pre_conv_tail = place(2 * size_t(w.pre_conv.cin) * w.pre_conv.tail());
    for (size_t l = 0; l < w.layers.size(); ++l) {
        out.k_ring.push_back(place(size_t(out.ring_rows) * kvd));
        out.v_ring.push_back(place(size_t(out.ring_rows) * kvd));
    }
    for (size_t i = 0; i < w.upsample.size(); ++i) {
        out.upsample_overlap.push_back(place(size_t(w.upsample[i].cout) * w.upsample[i].overlap()));
        out.convnext_tail.push_back(place(2 * size_t(w.convnext[i].channels) * (w.convnext[i].k - 1)));
    }
    out.conv_in_tail = place(2 * size_t(w.conv_in.cin) * w.conv_in.tail());
    for (size_t b = 0; b < w.blocks.size(); ++b) {
        out.block_overlap.push_back(place(size_t(w.blocks[b].upsample.cout) * w.blocks[b].upsample.overlap()));
        out.unit_tail.emplace_back();
        for (const auto& unit : w.blocks[b].units)
            out.unit_tail.back().push_back(place(2 * size_t(unit.conv1.cin) * unit.conv1.tail()));
    }
    out.conv_out_tail = place(2 * size_t(w.conv_out.cin) * w.conv_out.tail());
    out.bytes = at;
    return out;
}

bool DecoderStateLayout::operator==(const DecoderStateLayout& o) const {
    return bytes == o.bytes && ring_rows == o.ring_rows && max_chunk_frames == o.max_chunk_frames &&
           pre_conv_tail == o.pre_conv_tail && k_ring == o.k_ring && v_ring == o.v_ring &&
           upsample_overlap == o.upsample_overlap && convnext_tail == o.convnext_tail &&
           conv_in_tail == o.conv_in_tail && block_overlap == o.block_overlap && unit_tail == o.unit_tail &&
           conv_out_tail == o.conv_out_tail;
}

// ---------------------------------------------------------------------------------------------
// The pass: scratch for max_frames frames
// ---------------------------------------------------------------------------------------------

DecoderPass::DecoderPass(std::shared_ptr<const GpuSpeechDecoderWeights> weights, GpuContext& context,
                         const DecoderStateLayout& layout, int max_frames, const GpuSpeechDecoderOptions& options)
    : weights_(std::move(weights)), context_(context), layout_(layout), max_frames_(max_frames), options_(options) {
    QTTS_ASSERT(weights_ && max_frames_ >= 1);
    DeviceScope scope(context_.device());
    const GpuSpeechDecoderWeights& w = *weights_;
    const DecoderConfig& d = w.config();
    const int N = max_frames_;
    ScratchPlan plan;
    const int cd = d.codebook_dim;
    // A product on bf16 pairs (DECODER_MATH_BF16X3) takes its operand as planes, not fp32 columns.
    auto conv_plan = [&](const GpuSpeechDecoderWeights::Conv& c, int T) {
        if (c.planes) {
            plan.planes_max(3 * size_t(c.row) * T);  // [3, row, T] bf16 hi, lo, hi columns
            plan.col_max(size_t(c.row) * std::min(T, kernels::FEW_COLUMNS_MAX));  // few columns: fp32
        } else
            plan.col_max(size_t(c.row) * T);
        plan.signal_max(size_t(c.cout) * T);
    };
    auto trans_plan = [&](const GpuSpeechDecoderWeights::TransConv& tc, size_t T) {
        plan.aux_max(size_t(tc.cout) * tc.k * T);
        if (tc.planes) plan.planes_max(3 * size_t(tc.cin) * T);  // its input as hi, lo, hi planes
    };
    plan.aux_max(size_t(N) * cd);
    plan.signal_max(size_t(cd) * N);
    conv_plan(w.pre_conv, N);
    size_t T = size_t(N);
    for (size_t i = 0; i < w.upsample.size(); ++i) {
        const auto& up = w.upsample[i];
        trans_plan(up, T);
        T *= size_t(up.stride);
        plan.signal_max(size_t(up.cout) * T);
        const auto& cx = w.convnext[i];
        plan.col_max(size_t(cx.pw1_row) * T);
        plan.aux_max(size_t(cx.pw2_row) * T);
        if (cx.pw1_planes) plan.planes_max(3 * size_t(std::max(cx.pw1_row, cx.pw2_row)) * T);  // the products' inputs
    }
    conv_plan(w.conv_in, int(T));
    for (const auto& blk : w.blocks) {
        plan.signal_max(size_t(blk.upsample.cin) * T);
        trans_plan(blk.upsample, T);
        T *= size_t(blk.upsample.stride);
        for (const auto& ru : blk.units) {
            conv_plan(ru.conv1, int(T));
            conv_plan(ru.conv2, int(T));
        }
    }
    conv_plan(w.conv_out, int(T));
    x_ = DeviceArray<float>(plan.signal);
    y_ = DeviceArray<float>(plan.signal);
    col_ = DeviceArray<float>(plan.col);
    aux_ = DeviceArray<float>(plan.aux);
    if (plan.planes > 0) {
        planes_ = DeviceArray<uint16_t>(plan.planes);
        few_partials_ = DeviceArray<float>(kernels::FEW_COLUMNS_PARTIAL_FLOATS);
        few_tickets_ = DeviceArray<uint32_t>(size_t(kernels::FEW_COLUMNS_TICKETS));
        CUDA_CHECK(cudaMemset(few_tickets_.get(), 0, few_tickets_.bytes()));  // every launch leaves them zero
    }
    const int D = d.hidden_size, I = d.intermediate_size, qd = d.num_heads * d.head_dim;
    const int kvd = d.num_kv_heads * d.head_dim;
    h_ = DeviceArray<float>(size_t(N) * D);
    xn_ = DeviceArray<float>(size_t(N) * D);
    qkv_ = DeviceArray<float>(size_t(N) * (qd + 2 * kvd));
    att_ = DeviceArray<float>(size_t(N) * qd);
    tmp_ = DeviceArray<float>(size_t(N) * D);
    gu_ = DeviceArray<float>(size_t(N) * 2 * I);
    act_ = DeviceArray<float>(size_t(N) * I);
    codes_dev_ = DeviceArray<int32_t>(size_t(N) * d.num_quantizers);
    pcm_dev_ = DeviceArray<float>(size_t(N) * w.samples_per_frame());
    scratch_bytes_ = x_.bytes() + y_.bytes() + col_.bytes() + aux_.bytes() + planes_.bytes() + few_partials_.bytes() +
                     few_tickets_.bytes() + h_.bytes() +
                     xn_.bytes() + qkv_.bytes() + att_.bytes() + tmp_.bytes() + gu_.bytes() + act_.bytes() +
                     codes_dev_.bytes() + pcm_dev_.bytes();
    // Defined contents for the (unused) tails of partially filled buffers; capture reads nothing.
    CUDA_CHECK(cudaMemsetAsync(codes_dev_.get(), 0, codes_dev_.bytes(), context_.stream()));
}

// ---------------------------------------------------------------------------------------------
// One stream
// ---------------------------------------------------------------------------------------------

namespace {
// The constructor's checks, before any member that needs valid weights and options is built.
std::shared_ptr<const GpuSpeechDecoderWeights> decoder_weights_checked(std::shared_ptr<const GpuSpeechDecoderWeights> w,
                                                                      GpuContext& context,
                                                                      const GpuSpeechDecoderOptions& options) {
    if (!w) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuSpeechDecoder: no weights");
    if (w->device() != context.device())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuSpeechDecoder: weights are on device {}, the context on device {}",
             w->device(), context.device());
    if (options.max_chunk_frames < 1 || options.max_chunk_frames > 1000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuSpeechDecoder: max_chunk_frames {} (accepted: 1..1000)",
             options.max_chunk_frames);
    context.guard().check("GpuSpeechDecoder construction");
    return w;
}
}  // namespace

GpuSpeechDecoder::GpuSpeechDecoder(std::shared_ptr<const GpuSpeechDecoderWeights> weights, GpuContext& context,
                                   GpuSpeechDecoderOptions options, std::shared_ptr<DecoderPass> shared_pass)
    : weights_(decoder_weights_checked(std::move(weights), context, options)),
      context_(context),
      options_(std::move(options)),
      layout_(DecoderStateLayout::make(*weights_, options_.max_chunk_frames)),
      pass_(shared_pass ? std::move(shared_pass)
                        : std::make_shared<DecoderPass>(weights_, context_, layout_, options_.max_chunk_frames, options_)) {
    if (!(pass_->layout() == layout_) || pass_->weights() != weights_.get() ||
        pass_->max_frames() < options_.max_chunk_frames || pass_->options().small_kernels != options_.small_kernels)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT,
             "GpuSpeechDecoder: the shared pass was made for other weights, chunk sizes or options");
    DeviceScope scope(context_.device());
    const int N = options_.max_chunk_frames;
    state_.allocate(layout_.bytes);
    states_ = DeviceArray<char*>(1);
    char* block = state_block();
    CUDA_CHECK(cudaMemcpyAsync(states_.get(), &block, sizeof(block), cudaMemcpyHostToDevice, context_.stream()));
    codes_host_ = PinnedArray<int32_t>(size_t(N) * config().num_quantizers);
    pcm_host_ = PinnedArray<float>(size_t(N) * samples_per_frame());
    CUDA_CHECK(cudaMemsetAsync(state_.get(), 0, state_.bytes(), context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    QTTS_LOG_INFO("GPU speech decoder on device {}: state {:.2f} MB, scratch {:.1f} MB{} for chunks of up to {} frames",
                  context_.device(), state_.bytes() / 1e6, pass_->scratch_bytes() / 1e6,
                  pass_.use_count() > 1 ? " (shared)" : "", N);

    graphs_enabled_ = options_.cuda_graphs;
    if (graphs_enabled_) {
        for (const int n : options_.graph_chunk_sizes) {
            if (n < 1 || n > N || graphs_.count(n)) continue;
            GraphStats s;
            GraphExec exec = graph_capture(context_, "decoder chunk x" + std::to_string(n), [this, n] { chunk_enqueue(n); }, &s);
            s.frames = n;
            graph_stats_.push_back(s);
            graphs_.emplace(n, std::move(exec));
        }
    }
}

void GpuSpeechDecoder::reset() {
    context_.guard().check("GpuSpeechDecoder::reset");
    DeviceScope scope(context_.device());
    CUDA_CHECK(cudaMemsetAsync(state_.get(), 0, state_.bytes(), context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    frames_done_ = 0;
}

void GpuSpeechDecoder::decode(const int32_t* codes, int n, std::vector<float>* pcm_out) {
    context_.guard().check("GpuSpeechDecoder::decode");
    if (!speech_decode_args_check(config(), codes, n, pcm_out, "GPU speech decoder")) return;
    DeviceScope scope(context_.device());
    const int nq = config().num_quantizers, spf = samples_per_frame();
    for (int done = 0; done < n;) {
        const int m = std::min(options_.max_chunk_frames, n - done);
        codes_upload(codes + size_t(done) * nq, m);
        chunk_run(m);
        CUDA_CHECK(cudaMemcpyAsync(pcm_host_.get(), pass_->pcm_device(), size_t(m) * spf * sizeof(float),
                                   cudaMemcpyDeviceToHost, context_.stream()));
        CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
        pcm_out->insert(pcm_out->end(), pcm_host_.get(), pcm_host_.get() + size_t(m) * spf);
        done += m;
        frames_done_ += m;
    }
}

void GpuSpeechDecoder::codes_upload(const int32_t* codes, int n) {
    context_.guard().check("GpuSpeechDecoder::codes_upload");
    if (n < 1 || n > options_.max_chunk_frames)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GPU speech decoder: chunk of {} frames (accepted: 1..{})", n,
             options_.max_chunk_frames);
    DeviceScope scope(context_.device());
    // The pinned buffer may still feed a previous upload: wait before overwriting it.
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    const size_t count = size_t(n) * config().num_quantizers;
    std::memcpy(codes_host_.get(), codes, count * sizeof(int32_t));
    CUDA_CHECK(cudaMemcpyAsync(pass_->codes_device(), codes_host_.get(), count * sizeof(int32_t), cudaMemcpyHostToDevice,
                               context_.stream()));
}

void GpuSpeechDecoder::chunk_run(int n) {
    if (n < 1 || n > options_.max_chunk_frames)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GPU speech decoder: chunk of {} frames (accepted: 1..{})", n,
             options_.max_chunk_frames);
    auto it = graphs_enabled_ ? graphs_.find(n) : graphs_.end();
    if (it != graphs_.end()) {
        graph_replay(context_, it->second);
        return;
    }
    OwnerGuard::Scope owner(context_.guard(), "eager decoder chunk");
    DeviceScope scope(context_.device());
    chunk_enqueue(n);
}

void GpuSpeechDecoder::chunk_enqueue_for_capture(int n) {
    context_.guard().check("GpuSpeechDecoder::chunk_enqueue_for_capture");
    if (n < 1 || n > options_.max_chunk_frames)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GPU speech decoder: chunk of {} frames (accepted: 1..{})", n,
             options_.max_chunk_frames);
    DeviceScope scope(context_.device());
    chunk_enqueue(n);
}

// ---------------------------------------------------------------------------------------------
// Stages (all asynchronous on the context stream)
// ---------------------------------------------------------------------------------------------

// Row-major C[M, N] = op(A)[M, K] · op(B)[K, N] (+ beta·C): the column-major product Cᵀ = op(B)ᵀ·op(A)ᵀ.
void sgemm_row_major(GpuContext& context, bool trans_a, bool trans_b, int M, int N, int K, const float* A, int lda,
                     const float* B, int ldb, float beta, float* C, int ldc, bool tf32) {
    const float alpha = 1.0f;
    if (tf32) {
        CUBLAS_CHECK(cublasGemmEx(context.cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, K, &alpha, B, CUDA_R_32F, ldb, A,
                                  CUDA_R_32F, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_TF32,
                                  CUBLAS_GEMM_DEFAULT));
        return;
    }
    CUBLAS_CHECK(cublasSgemm(context.cublas(), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                             N, M, K, &alpha, B, ldb, A, lda, &beta, C, ldc));
}

void split_gemm_row_major(GpuContext& context, bool trans_a, int M, int N, int K, const uint16_t* a3, int lda,
                          const uint16_t* b3, float beta, float* C, int ldc) {
    const float one = 1.0f;
    // Column-major Cᵀ = Bᵀ·op(A)ᵀ, as sgemm_row_major, over 3K: [A_hi | A_hi | A_lo]·[B_hi; B_lo; B_hi].
    CUBLAS_CHECK(cublasGemmEx(context.cublas(), CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, N, M, 3 * K, &one,
                              b3, CUDA_R_16BF, N, a3, CUDA_R_16BF, lda, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

// y [cout, S·T] (= or += when beta is 1) conv(snake(x) with each stream's carried tail).
void DecoderPass::conv_enqueue(kernels::DecoderStates states, const GpuSpeechDecoderWeights::Conv& conv,
                               size_t tail_at, const float* x, int T, kernels::SnakeParams snake, float* y,
                               float beta) {
    QTTS_ASSERT(beta == 0.0f || beta == 1.0f);
    const kernels::Launch l = context_.launch();
    const int L = conv.tail(), rows = conv.row, columns = states.count * T;
    const kernels::SplitWeights split =
        conv.planes ? kernels::split_rows(conv.planes, rows, 3 * rows) : kernels::SplitWeights{};
    const bool few = kernels::few_columns_supported(split, conv.cout, columns, rows);  // false without planes
    if (conv.planes && !few) {
        if (L > 0)
            CUDA_CHECK_KERNEL(kernels::conv_im2col_carry_split(states, tail_at, L, x, conv.cin, T, conv.k,
                                                               conv.dilation, snake, planes_.get(), l, rows));
        else
            CUDA_CHECK_KERNEL(kernels::conv_im2col_split(nullptr, 0, x, conv.cin, columns, conv.k, conv.dilation, snake,
                                                         planes_.get(), l, rows));
        mark("conv im2col");
        split_gemm_row_major(context_, false, conv.cout, columns, rows, conv.planes, 3 * rows, planes_.get(), beta, y,
                             columns);
        mark("conv products");
        return;
    }
    if (L > 0)
        CUDA_CHECK_KERNEL(kernels::conv_im2col_carry(states, tail_at, L, x, conv.cin, T, conv.k, conv.dilation, snake,
                                                     col_.get(), l, rows));
    else  // nothing carried: the streams' columns are one signal
        CUDA_CHECK_KERNEL(kernels::conv_im2col(nullptr, 0, x, conv.cin, columns, conv.k, conv.dilation, snake,
                                               col_.get(), l, rows));
    mark("conv im2col");
    if (few)
        CUDA_CHECK_KERNEL(kernels::few_columns_product(split, conv.cout, columns, rows, col_.get(), beta != 0.0f, y,
                                                       few_workspace(), l));
    else
        gemm(false, false, conv.cout, columns, rows, conv.w, rows, col_.get(), columns, beta, y, columns);
    mark("conv products");
}

// y [cout, S·T·s]: one product gives every (output channel, tap) column, then the overlap-add.
void DecoderPass::trans_conv_enqueue(kernels::DecoderStates states, const GpuSpeechDecoderWeights::TransConv& tc,
                                     size_t overlap_at, const float* x, int T, kernels::SnakeParams snake, float* y) {
    const int cols = tc.cout * tc.k, columns = states.count * T;
    const kernels::SplitWeights split =
        tc.planes ? kernels::split_stacked(tc.planes, tc.cin, cols) : kernels::SplitWeights{};
    const bool few = kernels::few_columns_supported(split, cols, columns, tc.cin);  // false without planes
    if (tc.planes && !few) {
        CUDA_CHECK_KERNEL(kernels::split_planes(x, tc.cin, columns, snake, planes_.get(), context_.launch()));
        mark("transposed conv input");
        split_gemm_row_major(context_, true, cols, columns, tc.cin, tc.planes, cols, planes_.get(), 0.0f, aux_.get(),
                             columns);
    } else {
        if (snake.alpha) {  // activated into the other signal buffer (x is the current one)
            float* act = x == x_.get() ? y_.get() : x_.get();
            CUDA_CHECK_KERNEL(kernels::snake_apply(x, tc.cin, columns, snake, act, context_.launch()));
            x = act;
        }
        mark("transposed conv input");
        if (few)
            CUDA_CHECK_KERNEL(
                kernels::few_columns_product(split, cols, columns, tc.cin, x, false, aux_.get(), few_workspace(),
                                              context_.launch()));
        else
            gemm(true, false, cols, columns, tc.cin, tc.w, cols, x, columns, 0.0f, aux_.get(), columns);
    }
    mark("transposed conv products");
    CUDA_CHECK_KERNEL(kernels::trans_conv_overlap_add(aux_.get(), tc.cout, tc.k, tc.stride, T, tc.b, states,
                                                      overlap_at, y, context_.launch()));
    mark("transposed conv overlap-add");
}

// x [C, S·T] += gamma ⊙ pw2(gelu(pw1(LayerNorm(dwconv(x))))), channel-major throughout.
void DecoderPass::convnext_enqueue(kernels::DecoderStates states, const GpuSpeechDecoderWeights::ConvNeXt& cx,
                                   size_t tail_at, float* x, int T) {
    const kernels::Launch l = context_.launch();
    const int C = cx.channels, C4 = 4 * C, columns = states.count * T;
    float* dw = y_.get() == x ? x_.get() : y_.get();  // the other signal buffer
    CUDA_CHECK_KERNEL(
        kernels::depthwise_conv_carry(states, tail_at, cx.k - 1, x, C, T, cx.k, 1, cx.dw_w, cx.dw_b, dw, l));
    CUDA_CHECK_KERNEL(kernels::layer_norm_channels(dw, C, columns, cx.norm_w, cx.norm_b, SPEECH_DECODER_CONVNEXT_EPS, col_.get(),
                                                   l, cx.pw1_row));
    // [4C, S·T] = pw1 · [LN rows; ones; zeros], then [C, S·T] = pw2 · [gelu rows; ones; zeros].
    weight_product(C4, columns, cx.pw1_row, cx.pw1, cx.pw1_planes, col_.get(), aux_.get());
    CUDA_CHECK_KERNEL(kernels::gelu_ones(aux_.get(), C4, columns, l, cx.pw2_row));  // gelu rows, ones, zeros
    weight_product(C, columns, cx.pw2_row, cx.pw2, cx.pw2_planes, aux_.get(), dw);
    CUDA_CHECK_KERNEL(kernels::scaled_add_channels(x, dw, cx.gamma, C, columns, l));
}

void DecoderPass::weight_product(int M, int N, int K, const float* w, const uint16_t* planes, const float* B,
                                 float* C) {
    if (planes) {
        const kernels::SplitWeights split = kernels::split_rows(planes, K, 3 * K);
        if (kernels::few_columns_supported(split, M, N, K)) {
            CUDA_CHECK_KERNEL(
                kernels::few_columns_product(split, M, N, K, B, false, C, few_workspace(), context_.launch()));
            return;
        }
        CUDA_CHECK_KERNEL(kernels::split_planes(B, K, N, {}, planes_.get(), context_.launch()));
        split_gemm_row_major(context_, false, M, N, K, planes, 3 * K, planes_.get(), 0.0f, C, N);
    } else {
        gemm(false, false, M, N, K, w, K, B, N, 0.0f, C, N);
    }
}

// x [latent, S·n] -> x [latent, S·n] through the time-major transformer (rows [S·n, D]).
void DecoderPass::transformer_enqueue(kernels::DecoderStates states, int n, float* x) {
    const GpuSpeechDecoderWeights& w = *weights_;
    const DecoderConfig& d = w.config();
    const kernels::Launch l = context_.launch();
    const int latent = d.latent_dim, D = d.hidden_size, I = d.intermediate_size;
    const int qd = d.num_heads * d.head_dim, kvd = d.num_kv_heads * d.head_dim, qkvd = qd + 2 * kvd;
    const int rows = states.count * n;
    const int ring = layout_.ring_rows;
    float* h = h_.get();
    const int widest = std::max(std::max(latent, D), std::max(qd, I));
    if (options_.small_kernels && kernels::small_linear_fits(rows, widest) && D % 4 == 0 && latent % 4 == 0 &&
        qd % 4 == 0 && I % 4 == 0) {
        // Few rows: one fused launch per product (RMSNorm prologue, residual/SwiGLU epilogue).
        using E = kernels::SmallLinearEpilogue;
        CUDA_CHECK_KERNEL(kernels::small_linear(x, rows, latent, true, nullptr, 0.0f, w.tr_input_w, D, w.tr_input_b,
                                                E::SMALL_LINEAR_STORE, nullptr, h, false, l));
        for (size_t li = 0; li < w.layers.size(); ++li) {
            const GpuSpeechDecoderWeights::Layer& L = w.layers[li];
            CUDA_CHECK_KERNEL(kernels::small_linear(h, rows, D, false, L.input_norm, d.rms_norm_eps, L.qkv, qkvd,
                                                    nullptr, E::SMALL_LINEAR_STORE, nullptr, qkv_.get(), false, l));
            CUDA_CHECK_KERNEL(kernels::rope_kv_store(qkv_.get(), n, d.num_heads, d.num_kv_heads, d.head_dim, w.inv_freq,
                                                     states, layout_.k_ring[li], layout_.v_ring[li], ring, l));
            CUDA_CHECK_KERNEL(kernels::window_attention(qkv_.get(), n, d.num_heads, d.num_kv_heads, d.head_dim, states,
                                                        layout_.k_ring[li], layout_.v_ring[li], ring, d.sliding_window,
                                                        att_.get(), l));
            CUDA_CHECK_KERNEL(kernels::small_linear(att_.get(), rows, qd, false, nullptr, 0.0f, L.o, D, nullptr,
                                                    E::SMALL_LINEAR_SCALED_ADD, L.attn_scale, h, false, l));
            CUDA_CHECK_KERNEL(kernels::small_linear(h, rows, D, false, L.post_norm, d.rms_norm_eps, L.gate_up, I,
                                                    nullptr, E::SMALL_LINEAR_SWIGLU, nullptr, act_.get(), false, l));
            CUDA_CHECK_KERNEL(kernels::small_linear(act_.get(), rows, I, false, nullptr, 0.0f, L.down, D, nullptr,
                                                    E::SMALL_LINEAR_SCALED_ADD, L.mlp_scale, h, false, l));
        }
        CUDA_CHECK_KERNEL(kernels::small_linear(h, rows, D, false, w.tr_norm, d.rms_norm_eps, w.tr_output_w, latent,
                                                w.tr_output_b, E::SMALL_LINEAR_STORE, nullptr, x, true, l));
        return;
    }
    gemm(true, true, rows, D, latent, x, rows, w.tr_input_w, latent, 0.0f, h, D);  // [S·n, D]
    CUDA_CHECK_KERNEL(kernels::bias_add(h, rows, D, w.tr_input_b, false, l));
    for (size_t li = 0; li < w.layers.size(); ++li) {
        const GpuSpeechDecoderWeights::Layer& L = w.layers[li];
        CUDA_CHECK_KERNEL(kernels::rms_norm_rows(h, rows, D, L.input_norm, d.rms_norm_eps, xn_.get(), l));
        gemm(false, true, rows, qkvd, D, xn_.get(), D, L.qkv, D, 0.0f, qkv_.get(), qkvd);
        CUDA_CHECK_KERNEL(kernels::rope_kv_store(qkv_.get(), n, d.num_heads, d.num_kv_heads, d.head_dim, w.inv_freq,
                                                 states, layout_.k_ring[li], layout_.v_ring[li], ring, l));
        CUDA_CHECK_KERNEL(kernels::window_attention(qkv_.get(), n, d.num_heads, d.num_kv_heads, d.head_dim, states,
                                                    layout_.k_ring[li], layout_.v_ring[li], ring, d.sliding_window,
                                                    att_.get(), l));
        gemm(false, true, rows, D, qd, att_.get(), qd, L.o, qd, 0.0f, tmp_.get(), D);
        CUDA_CHECK_KERNEL(kernels::scaled_residual_rows(h, tmp_.get(), L.attn_scale, rows, D, l));
        CUDA_CHECK_KERNEL(kernels::rms_norm_rows(h, rows, D, L.post_norm, d.rms_norm_eps, xn_.get(), l));
        gemm(false, true, rows, 2 * I, D, xn_.get(), D, L.gate_up, D, 0.0f, gu_.get(), 2 * I);
        CUDA_CHECK_KERNEL(kernels::swiglu_rows(gu_.get(), rows, I, act_.get(), l));
        gemm(false, true, rows, D, I, act_.get(), I, L.down, I, 0.0f, tmp_.get(), D);
        CUDA_CHECK_KERNEL(kernels::scaled_residual_rows(h, tmp_.get(), L.mlp_scale, rows, D, l));
    }
    CUDA_CHECK_KERNEL(kernels::rms_norm_rows(h, rows, D, w.tr_norm, d.rms_norm_eps, xn_.get(), l));
    gemm(false, true, latent, rows, D, w.tr_output_w, D, xn_.get(), D, 0.0f, x, rows);  // [latent, S·n]
    CUDA_CHECK_KERNEL(kernels::bias_add(x, latent, rows, w.tr_output_b, true, l));
}

void DecoderPass::mark(const char* stage) {
    if (!marks_) return;
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreate(&e));
    CUDA_CHECK(cudaEventRecord(e, context_.stream()));
    marks_->push_back({stage, e});
}

std::vector<std::pair<std::string, float>> DecoderPass::profile(const std::function<void()>& enqueue) {
    std::vector<std::pair<const char*, cudaEvent_t>> marks;
    marks_set(&marks);
    std::vector<std::pair<std::string, float>> out;
    try {
        cudaEvent_t start = nullptr;
        CUDA_CHECK(cudaEventCreate(&start));
        marks.push_back({"start", start});
        CUDA_CHECK(cudaEventRecord(start, context_.stream()));
        enqueue();
    } catch (...) {
        marks_set(nullptr);
        for (auto& m : marks) cudaEventDestroy(m.second);
        throw;
    }
    marks_set(nullptr);
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    for (size_t i = 1; i < marks.size(); ++i) {
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
        out.push_back({marks[i].first, ms});
    }
    for (auto& m : marks) cudaEventDestroy(m.second);
    return out;
}

std::vector<std::pair<std::string, float>> GpuSpeechDecoder::chunk_profile(int n) {
    if (n < 1 || n > options_.max_chunk_frames)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GPU speech decoder: chunk of {} frames (accepted: 1..{})", n,
             options_.max_chunk_frames);
    OwnerGuard::Scope owner(context_.guard(), "decoder chunk profile");
    DeviceScope scope(context_.device());
    return pass_->profile([&] { chunk_enqueue(n); });
}

void DecoderPass::enqueue(kernels::DecoderStates states, int n) {
    QTTS_ASSERT(n >= 1 && n <= layout_.max_chunk_frames && states.count >= 1 && states.count * n <= max_frames_);
    const GpuSpeechDecoderWeights& w = *weights_;
    const DecoderConfig& d = w.config();
    const DecoderStateLayout& at = layout_;
    const kernels::Launch l = context_.launch();
    const int cd = d.codebook_dim, half = cd / 2;
    const int frames = states.count * n;  // all streams' frames, stream-major
    float* cur = x_.get();
    float* other = y_.get();

    // 1. RVQ dequantize: z [cd, S·n] = [W_first | W_rest] · [q_sem | q_acoustic]ᵀ
    CUDA_CHECK_KERNEL(kernels::rvq_gather(codes_dev_.get(), frames, d.num_quantizers, w.codebooks, d.codebook_size,
                                          half, aux_.get(), l));
    gemm(false, true, cd, frames, cd, w.rvq_proj, cd, aux_.get(), cd, 0.0f, other, frames);
    mark("rvq");

    // 2. pre_conv (causal k3) -> [latent, S·n]
    conv_enqueue(states, w.pre_conv, at.pre_conv_tail, other, n, {}, cur, 0.0f);

    // 3. transformer
    transformer_enqueue(states, n, cur);
    mark("transformer");

    // 4. upsampling: transposed conv ×r, then ConvNeXt
    int T = n;  // columns per stream
    for (size_t i = 0; i < w.upsample.size(); ++i) {
        trans_conv_enqueue(states, w.upsample[i], at.upsample_overlap[i], cur, T, {}, other);
        std::swap(cur, other);
        T *= w.upsample[i].stride;
        convnext_enqueue(states, w.convnext[i], at.convnext_tail[i], cur, T);
        mark("convnext");
    }

    // 5. decoder.0
    conv_enqueue(states, w.conv_in, at.conv_in_tail, cur, T, {}, other, 0.0f);
    std::swap(cur, other);

    // 6. blocks: SnakeBeta -> transposed conv ×r -> 3 residual units
    for (size_t b = 0; b < w.blocks.size(); ++b) {
        const GpuSpeechDecoderWeights::Block& blk = w.blocks[b];
        trans_conv_enqueue(states, blk.upsample, at.block_overlap[b], cur, T, blk.snake, cur);  // x read before y written
        T *= blk.upsample.stride;
        for (size_t u = 0; u < blk.units.size(); ++u) {
            const GpuSpeechDecoderWeights::ResidualUnit& ru = blk.units[u];
            // x += conv2(snake2(conv1(snake1(x))))  (conv2's GEMM accumulates into x)
            conv_enqueue(states, ru.conv1, at.unit_tail[b][u], cur, T, ru.act1, other, 0.0f);
            conv_enqueue(states, ru.conv2, 0, other, T, ru.act2, cur, 1.0f);
        }
    }

    // 7. SnakeBeta -> conv k7 -> 1 channel -> clamp: pcm [S, n·spf]
    const GpuSpeechDecoderWeights::Conv& co = w.conv_out;
    if (kernels::conv_out_direct_fits(co.cin, co.tail())) {
        CUDA_CHECK_KERNEL(kernels::conv_out_carry(states, at.conv_out_tail, co.tail(), cur, co.cin, T, co.k,
                                                  co.dilation, w.snake_out, co.w, pcm_dev_.get(), l));
    } else {
        conv_enqueue(states, co, at.conv_out_tail, cur, T, w.snake_out, pcm_dev_.get(), 0.0f);
        CUDA_CHECK_KERNEL(kernels::clamp_unit(pcm_dev_.get(), states.count * T, l));
    }
    CUDA_CHECK_KERNEL(kernels::position_advance(states, n, l));
    mark("output conv");
}

}  // namespace qtts::cuda
