#include "engine/cuda/gpu_batch_decoder.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/cuda/cuda_check.h"
#include "engine/model/weight_prep.h"

namespace qtts::cuda {

namespace {

GpuSpeechDecoderOptions pass_options(const GpuBatchDecoderOptions& o) {
    GpuSpeechDecoderOptions p;
    p.cuda_graphs = o.cuda_graphs;
    return p;
}

int largest(const std::vector<int>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }

// The options' checks, before the scratch (sized from them) is allocated.
const GpuBatchDecoderOptions& checked(const GpuBatchDecoderOptions& o, const DecoderStateLayout& layout) {
    if (o.max_streams < 1 || o.max_streams > 1024)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuBatchDecoder: max_streams {} (accepted: 1..1024)", o.max_streams);
    if (o.chunk_frames.empty())
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuBatchDecoder: no chunk sizes");
    for (const int n : o.chunk_frames)
        if (n < 1 || n > layout.max_chunk_frames)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "GpuBatchDecoder: chunk of {} frames does not fit the streams' state (1..{} frames)", n,
                 layout.max_chunk_frames);
    for (const int b : o.buckets)
        if (b < 1 || b > o.max_streams)
            fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuBatchDecoder: bucket {} (accepted: 1..{})", b, o.max_streams);
    return o;
}

}  // namespace

GpuBatchDecoder::GpuBatchDecoder(std::shared_ptr<const GpuSpeechDecoderWeights> weights, GpuContext& context,
                                 const DecoderStateLayout& layout, GpuBatchDecoderOptions options)
    : weights_(std::move(weights)),
      context_(context),
      layout_(layout),
      options_(checked(options, layout)),
      max_n_(largest(options_.chunk_frames)),
      pass_(weights_, context_, layout_, options_.max_streams * max_n_, pass_options(options_)) {
    context_.guard().check("GpuBatchDecoder construction");
    QTTS_ASSERT(weights_ && weights_->device() == context_.device());
    if (!(DecoderStateLayout::make(*weights_, layout_.max_chunk_frames) == layout_))
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "GpuBatchDecoder: the state layout does not belong to these weights");
    DeviceScope scope(context_.device());
    const auto t0 = std::chrono::steady_clock::now();
    const size_t free_before = device_free_bytes();
    const int S = options_.max_streams, nq = weights_->config().num_quantizers;
    spare_.allocate(layout_.bytes);
    table_ = DeviceArray<char*>(size_t(S));
    table_host_ = PinnedArray<char*>(size_t(S));
    codes_host_ = PinnedArray<int32_t>(size_t(S) * max_n_ * nq);
    pcm_host_ = PinnedArray<float>(size_t(S) * max_n_ * weights_->samples_per_frame());
    for (int i = 0; i < S; ++i) table_host_.get()[i] = static_cast<char*>(spare_.get());
    CUDA_CHECK(cudaMemsetAsync(spare_.get(), 0, spare_.bytes(), context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(table_.get(), table_host_.get(), size_t(S) * sizeof(char*), cudaMemcpyHostToDevice,
                               context_.stream()));
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));

    if (options_.buckets.empty())
        for (int b = 2; b <= S; ++b) buckets_.push_back(b);
    else
        buckets_ = options_.buckets;
    std::sort(buckets_.begin(), buckets_.end());
    buckets_.erase(std::unique(buckets_.begin(), buckets_.end()), buckets_.end());

    size_t nodes = 0;
    if (options_.cuda_graphs) {
        for (const int n : options_.chunk_frames)
            for (const int b : buckets_) {
                if (graphs_.count({b, n})) continue;
                GraphStats stats;
                const CublasSmLimit narrow(context_, sm_limit(b));
                GraphExec exec = graph_capture(
                    context_, "batched decoder " + std::to_string(b) + " x" + std::to_string(n),
                    [this, b, n] { pass_.enqueue({table_.get(), b}, n); }, &stats);
                nodes += stats.nodes;
                graphs_.emplace(std::make_pair(b, n), std::move(exec));
            }
    }
    const size_t free_after = device_free_bytes();
    QTTS_LOG_INFO("GPU batched speech decoder on device {}: up to {} streams x {} frames, scratch {:.1f} MB, {} graphs "
                  "({} nodes) captured in {:.2f} s, {:.1f} MB in all",
                  context_.device(), S, max_n_, pass_.scratch_bytes() / 1e6, graphs_.size(), nodes,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  free_before > free_after ? (free_before - free_after) / 1e6 : 0.0);
}

int GpuBatchDecoder::sm_limit(int streams) const {
    const bool narrow = options_.narrow_from_streams > 0 && streams >= options_.narrow_from_streams;
    return narrow ? options_.narrow_sms : 0;
}

int GpuBatchDecoder::bucket_for(int streams, int n) const {
    for (const int b : buckets_)
        if (b >= streams && graphs_.count({b, n})) return b;
    return 0;
}

void GpuBatchDecoder::decode(const std::vector<GpuSpeechDecoder*>& streams, const int32_t* codes, int n,
                             float* pcm_out) {
    if (!pcm_out) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batched decoder: pcm_out is null");
    launch(streams, codes, n);
    land(pcm_out);
}

void GpuBatchDecoder::launch(const std::vector<GpuSpeechDecoder*>& streams, const int32_t* codes, int n) {
    enqueue(streams, codes, n, true, options_.cuda_graphs, nullptr);
}

void GpuBatchDecoder::land(float* pcm_out) {
    context_.guard().check("GpuBatchDecoder::land");
    QTTS_ASSERT(in_flight() && pcm_out);
    const size_t samples = size_t(in_flight_streams_) * in_flight_frames_ * weights_->samples_per_frame();
    in_flight_streams_ = in_flight_frames_ = 0;  // landed, even when the wait below fails
    DeviceScope scope(context_.device());
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    std::memcpy(pcm_out, pcm_host_.get(), samples * sizeof(float));
}

std::vector<std::pair<std::string, float>> GpuBatchDecoder::decode_profile(const std::vector<GpuSpeechDecoder*>& streams,
                                                                           const int32_t* codes, int n) {
    std::vector<std::pair<std::string, float>> profile;
    enqueue(streams, codes, n, false, false, &profile);
    in_flight_streams_ = in_flight_frames_ = 0;  // profile() waited for every stage
    return profile;
}

void GpuBatchDecoder::enqueue(const std::vector<GpuSpeechDecoder*>& streams, const int32_t* codes, int n,
                              bool samples, bool graphs, std::vector<std::pair<std::string, float>>* profile) {
    context_.guard().check("GpuBatchDecoder::launch");
    QTTS_ASSERT(!in_flight());  // its pinned buffers are the next pass's
    const int S = int(streams.size());
    if (S < 1 || S > options_.max_streams)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batched decoder: {} streams (accepted: 1..{})", S,
             options_.max_streams);
    if (n < 1 || n > max_n_)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batched decoder: chunk of {} frames (accepted: 1..{})", n, max_n_);
    if (!codes) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batched decoder: codes is null");
    for (int i = 0; i < S; ++i) {
        GpuSpeechDecoder* d = streams[size_t(i)];
        if (!d || d->context().device() != context_.device() || !(d->layout() == layout_))
            fail(ErrorCode::ERROR_INVALID_ARGUMENT,
                 "batched decoder: stream {} is not a decoder of this device with this state layout", i);
        for (int j = 0; j < i; ++j)
            if (streams[size_t(j)] == d)
                fail(ErrorCode::ERROR_INVALID_ARGUMENT, "batched decoder: stream {} appears twice", i);
    }
    const DecoderConfig& config = weights_->config();
    const int nq = config.num_quantizers, spf = weights_->samples_per_frame();
    speech_codes_validate(config, codes, S * n, "GPU batched speech decoder");

    DeviceScope scope(context_.device());
    const int bucket = graphs ? bucket_for(S, n) : 0;
    const int rows = bucket > 0 ? bucket : S;  // streams the pass runs for
    // The pinned buffers may still feed the previous pass's copies only if it threw midway; wait.
    CUDA_CHECK(cudaStreamSynchronize(context_.stream()));
    for (int i = 0; i < options_.max_streams; ++i)
        table_host_.get()[i] = i < S ? streams[size_t(i)]->state_block() : static_cast<char*>(spare_.get());
    const size_t count = size_t(S) * n * nq;
    std::memcpy(codes_host_.get(), codes, count * sizeof(int32_t));
    std::fill(codes_host_.get() + count, codes_host_.get() + size_t(rows) * n * nq, 0);
    CUDA_CHECK(cudaMemcpyAsync(table_.get(), table_host_.get(), size_t(rows) * sizeof(char*), cudaMemcpyHostToDevice,
                               context_.stream()));
    CUDA_CHECK(cudaMemcpyAsync(pass_.codes_device(), codes_host_.get(), size_t(rows) * n * nq * sizeof(int32_t),
                               cudaMemcpyHostToDevice, context_.stream()));
    if (rows > S)  // unused rows start from a clean spare state each time (their output is dropped)
        CUDA_CHECK(cudaMemsetAsync(spare_.get(), 0, spare_.bytes(), context_.stream()));
    if (bucket > 0) {
        graph_replay(context_, graphs_.at({bucket, n}));
    } else {
        OwnerGuard::Scope owner(context_.guard(), "eager batched decoder pass");
        const CublasSmLimit narrow(context_, sm_limit(S));
        const auto enqueue = [&] { pass_.enqueue({table_.get(), S}, n); };
        if (profile)
            *profile = pass_.profile(enqueue);
        else
            enqueue();
    }
    if (samples)
        CUDA_CHECK(cudaMemcpyAsync(pcm_host_.get(), pass_.pcm_device(), size_t(S) * n * spf * sizeof(float),
                                   cudaMemcpyDeviceToHost, context_.stream()));
    in_flight_streams_ = S;
    in_flight_frames_ = n;
    for (GpuSpeechDecoder* d : streams) d->frames_decoded_add(n);
}

}  // namespace qtts::cuda
