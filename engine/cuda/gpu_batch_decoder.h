// Batched speech decoding on the GPU: the next chunk of n frames of S streams in ONE decoder pass
// (cuda/gpu_speech_decoder.h DecoderPass), instead of S replays of a pass sized for one stream.
//
// Why: with many streams the engine's batched LM step (cuda/gpu_batch.h) makes every stream's
// codes in one device step, and the decoder became the bottleneck — at 64 streams and 4-frame
// chunks each stream's own decoder replay costs ~1.7 ms (small products, launch-bound), ~110 ms a
// round against ~33 ms of batched LM work. In one pass the products are S times wider and the
// launches are paid once.
//
// Each stream keeps its own GpuSpeechDecoder: its state block (tails, overlaps, K/V rings,
// position, chunk counter; DecoderStateLayout) is what the batched pass reads and advances, so a
// stream can be decoded alone in one chunk and batched in the next, in any mix, with the same
// samples as if it had always been decoded alone (up to the float rounding of the wider products:
// the kernels that touch carried state are per stream, the GEMMs see more columns).
//
// The pass reads a device table of the streams' state blocks. decode() fills the table for the
// streams it is given, so one graph per (bucket, n) serves any set of streams: a bucket is a
// stream count with a captured graph; rows of the bucket past the given streams decode zeros into
// a spare state block of this object (their samples are thrown away). Sizes without a graph run
// the same kernels eagerly for exactly the given streams.
//
// The pass runs on the stream of the context it was made with, which may be a second context of
// the streams' device (the engine's pool: a pass beside the next LM step, cuda/gpu_generator_pool.h).
// launch() enqueues a pass and returns; land() waits for it and hands its samples over. Between
// the two, the caller keeps every other use of those streams' decoders off the device (it lands
// first): only the pass's own stream orders it.
//
// Use (engine thread, the context's owner):
//   GpuBatchDecoder batch(weights, context, any_stream_decoder.layout(), options);  // captures graphs
//   batch.decode({&dec_a, &dec_b, &dec_c}, codes /*[3, n, nq]*/, n, pcm /*[3, n·spf]*/);
//   batch.launch({&dec_a, &dec_b}, codes, n); ...other device work...; batch.land(pcm);
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/cuda/device_buffer.h"
#include "engine/cuda/frame_graphs.h"
#include "engine/cuda/gpu_context.h"
#include "engine/cuda/gpu_speech_decoder.h"

namespace qtts::cuda {

struct GpuBatchDecoderOptions {
    int max_streams = 64;                  // S at most (sizes the scratch: max_streams · largest n frames)
    std::vector<int> chunk_frames{1, 2, 4};  // frames per stream in a pass; graphs for each
    std::vector<int> buckets;              // stream counts with graphs; empty: every count 2..max_streams
    bool cuda_graphs = true;  // (the products' arithmetic is the weights': DecoderMath)
    // Passes of at least this many streams (0: none) spread their cuBLAS GEMMs over at most
    // `narrow_sms` SMs (GpuContext::cublas_sm_limit; the same sums, another tiling): beside an LM
    // step, a pass that does not take every SM leaves the step's launches room. Measured (1.7B,
    // closed loop, 88 of 132 SMs): every pass on the H200, +1.3% audio-s/s at 32 streams, +0.3% at
    // 16, -0.5% at 10; passes of 17 or more streams on the H100, +1.7% at 32 and +1.2% at 64
    // (docs/performance.md, thirty-first and thirty-third sessions).
    int narrow_from_streams = 0;
    int narrow_sms = 0;
};

class GpuBatchDecoder {
public:
    // `layout` is the state layout of the streams it will decode (GpuSpeechDecoder::layout());
    // every chunk_frames value must fit it (<= layout.max_chunk_frames). Allocates the scratch and
    // captures the graphs (logged: count, time, memory). Owner thread.
    GpuBatchDecoder(std::shared_ptr<const GpuSpeechDecoderWeights> weights, GpuContext& context,
                    const DecoderStateLayout& layout, GpuBatchDecoderOptions options);
    GpuBatchDecoder(const GpuBatchDecoder&) = delete;
    GpuBatchDecoder& operator=(const GpuBatchDecoder&) = delete;

    int max_streams() const { return options_.max_streams; }
    const std::vector<int>& buckets() const { return buckets_; }
    size_t scratch_bytes() const { return pass_.scratch_bytes(); }
    bool has_graph(int streams, int n) const { return graphs_.count({streams, n}) != 0; }

    // Decodes the next n frames of every stream in one pass: codes [S, n, nq] (host, stream-major),
    // pcm_out [S, n·spf] (host). The streams are distinct decoders on this context with this
    // layout; each one's frames_done() advances by n. Codes are checked (0..codebook_size-1)
    // before any state changes. Synchronous (returns with the samples on the host).
    void decode(const std::vector<GpuSpeechDecoder*>& streams, const int32_t* codes, int n, float* pcm_out);
    // decode() in two halves: launch() checks and enqueues the pass (the streams' frames_decoded()
    // advance now) and returns; land() waits for it and writes its samples [S, n·spf] to pcm_out.
    // One pass in flight at a time: launch() requires the last one landed.
    void launch(const std::vector<GpuSpeechDecoder*>& streams, const int32_t* codes, int n);
    void land(float* pcm_out);
    bool in_flight() const { return in_flight_streams_ > 0; }
    int in_flight_frames() const { return in_flight_frames_; }  // frames per stream of the pass in flight
    // Benchmarks: the same pass run eagerly for exactly these streams, with CUDA events between
    // its stages (DecoderPass::profile: (what ran, GPU ms) pairs in launch order); the streams
    // advance as in decode(). Synchronous.
    std::vector<std::pair<std::string, float>> decode_profile(const std::vector<GpuSpeechDecoder*>& streams,
                                                              const int32_t* codes, int n);

private:
    int bucket_for(int streams, int n) const;  // 0: none (eager)
    int sm_limit(int streams) const;           // the cuBLAS SM target of a pass of `streams` (0: all)
    // decode()'s checks and uploads, the pass (a graph when `graphs` and one fits, else eager:
    // `profile` then times its stages) and, with `samples`, their copy to the pinned buffer; the
    // pass is then in flight (land()).
    void enqueue(const std::vector<GpuSpeechDecoder*>& streams, const int32_t* codes, int n, bool samples, bool graphs,
                 std::vector<std::pair<std::string, float>>* profile);

    std::shared_ptr<const GpuSpeechDecoderWeights> weights_;
    GpuContext& context_;
    const DecoderStateLayout layout_;
    GpuBatchDecoderOptions options_;
    std::vector<int> buckets_;
    int max_n_ = 0;
    DecoderPass pass_;
    DeviceBuffer spare_;                // state block for a bucket's unused rows
    DeviceArray<char*> table_;          // [max_streams]: the blocks the pass reads
    PinnedArray<char*> table_host_;
    PinnedArray<int32_t> codes_host_;   // [max_streams · max_n, nq]
    PinnedArray<float> pcm_host_;       // [max_streams, max_n · spf]
    std::map<std::pair<int, int>, GraphExec> graphs_;  // (streams, n)
    int in_flight_streams_ = 0;  // the pass launched and not landed: its streams and frames
    int in_flight_frames_ = 0;
};

}  // namespace qtts::cuda
