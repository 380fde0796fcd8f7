// Opus encoding for network streaming of 24 kHz mono speech.
//
// Two encoders share one option set:
//  - OggOpusStreamEncoder: an Ogg Opus (RFC 7845) byte stream through libopusenc, tuned for
//    latency: decision and muxing delays are 0 and a page is flushed after every write, so each
//    PCM chunk becomes one Ogg page at once (libopusenc's defaults hold ~3 s before the first
//    page). Used for HTTP `response_format=opus`, the plain TCP mode and WebSocket `ogg`.
//  - OpusPacketEncoder: raw Opus packets straight from libopus (no container, no resampling:
//    libopus takes 24 kHz input as is), for WebSocket binary frames. Each packet travels with the
//    small header described at opus_packet_frame() below.
//
// Both use 20 ms frames (480 samples at 24 kHz), OPUS_SIGNAL_VOICE and a configurable bitrate.
// Thread safety: one encoder per thread (or externally serialised). Not real-time safe
// (they allocate); never use them in an audio callback.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/api/qtts.h"

struct OggOpusEnc;     // libopusenc's encoder (opusenc.h)
struct OpusEncoder;    // libopus's encoder (opus.h)

namespace qtts {

struct OpusEncoderOptions {
    int sample_rate = SAMPLE_RATE;  // input rate: 8000, 12000, 16000, 24000 or 48000
    int bitrate = 32000;      // bits per second, 6000..510000 (24-32 kb/s suits speech)
    int complexity = 6;       // 0..10: CPU cost vs quality (10 is libopus' default; 6 keeps a
                              // 16-stream server cheap at a barely audible cost for speech)
    uint32_t serial = 0;      // Ogg stream serial number; 0 = derived from a counter
};

// Validates the options and throws qtts::Error (ERROR_INVALID_ARGUMENT) with the accepted ranges.
void opus_encoder_options_validate(const OpusEncoderOptions& options);

class OggOpusStreamEncoder {
public:
    explicit OggOpusStreamEncoder(const OpusEncoderOptions& options = {});
    ~OggOpusStreamEncoder();
    OggOpusStreamEncoder(const OggOpusStreamEncoder&) = delete;
    OggOpusStreamEncoder& operator=(const OggOpusStreamEncoder&) = delete;

    // The identification (OpusHead) and comment (OpusTags) pages. Call before the first write
    // to send them early (a player can set up while the first audio is generated); otherwise the
    // first write returns them in front of its audio page.
    std::string header_pages();

    // Encodes n samples and returns the Ogg pages completed by this call: all the whole 20 ms
    // frames in one flushed page. The remainder of a frame waits for the next call.
    std::string write(const float* pcm, size_t n);

    // Encodes what is buffered (padded to a whole frame), writes the end-of-stream page and
    // returns the remaining bytes. Afterwards the encoder accepts nothing more.
    std::string finish();

    bool finished() const { return finished_; }
    int64_t samples_written() const { return samples_written_; }
    // Input samples a decoder gets from the pages returned so far (their last granule position,
    // less the pre-skip): what a client that received exactly those pages can play. Equals
    // samples_written() after finish().
    int64_t samples_paged() const { return samples_paged_; }

private:
    std::string pages_collect(bool flush);
    void page_note(const unsigned char* page, size_t len);

    OggOpusEnc* enc_ = nullptr;
    int sample_rate_ = SAMPLE_RATE;
    bool finished_ = false;
    int64_t samples_written_ = 0;
    int64_t samples_paged_ = 0;
    int64_t pre_skip_48k_ = -1;  // from the OpusHead page; -1 until it has gone out
};

// One raw Opus packet with its place on the encoder's timeline.
struct OpusPacket {
    std::string data;         // the Opus packet (TOC byte first)
    uint32_t sequence = 0;    // 0, 1, 2, ... within one stream
    uint64_t position = 0;    // index of the packet's first sample at the input rate, on the
                              // encoder timeline (which starts `pre_skip` samples early)
    bool last = false;        // the final packet of the stream (set by finish())
};

class OpusPacketEncoder {
public:
    explicit OpusPacketEncoder(const OpusEncoderOptions& options = {});
    ~OpusPacketEncoder();
    OpusPacketEncoder(const OpusPacketEncoder&) = delete;
    OpusPacketEncoder& operator=(const OpusPacketEncoder&) = delete;

    int sample_rate() const { return sample_rate_; }
    int frame_samples() const { return frame_samples_; }  // 20 ms at the input rate
    // Samples of encoder delay at the input rate: a decoder drops this many samples from the
    // start of its output to line up with the input (Ogg's pre-skip, here at the input rate).
    int pre_skip() const { return pre_skip_; }

    // Encodes every whole frame now available and appends the packets to out.
    void write(const float* pcm, size_t n, std::vector<OpusPacket>& out);

    // Pads with zeros until every input sample (delayed by pre_skip) is inside a packet, appends
    // the final packets (at least one; the very last has last = true) and ends the stream.
    void finish(std::vector<OpusPacket>& out);

    bool finished() const { return finished_; }
    int64_t samples_written() const { return samples_written_; }
    // Input samples a decoder gets from the packets up to and including `packet` once it drops
    // pre_skip: the part of the input that packet's end covers.
    int64_t samples_covered(const OpusPacket& packet) const;

private:
    void frame_encode(const float* frame, std::vector<OpusPacket>& out);

    OpusEncoder* enc_ = nullptr;
    int sample_rate_ = SAMPLE_RATE;
    int frame_samples_ = 480;
    int pre_skip_ = 0;
    std::vector<float> pending_;     // less than one frame, waiting for more input
    std::vector<unsigned char> packet_buf_;
    uint32_t sequence_ = 0;
    uint64_t position_ = 0;
    int64_t samples_written_ = 0;
    bool finished_ = false;
};

// The WebSocket binary frame for one packet: a 12-byte little-endian header, then the packet.
//   byte 0      version, always 1
//   byte 1      flags: bit 0 = last packet of the stream; other bits 0
//   bytes 2-3   u16 samples per packet at 24 kHz (480 = 20 ms)
//   bytes 4-7   u32 sequence number (0-based, per stream)
//   bytes 8-11  u32 position of the first sample at 24 kHz on the encoder timeline
//   bytes 12-   the Opus packet
constexpr size_t kOpusFrameHeaderBytes = 12;
constexpr uint8_t kOpusFrameVersion = 1;

struct OpusFrameHeader {
    uint8_t version = 0;
    bool last = false;
    uint16_t frame_samples = 0;
    uint32_t sequence = 0;
    uint32_t position = 0;
};

std::string opus_frame_pack(const OpusPacket& packet, int frame_samples);
// Splits a binary frame into header and packet; throws qtts::Error (ERROR_FORMAT) when it is
// shorter than the header or has an unknown version.
OpusFrameHeader opus_frame_unpack(const std::string& frame, std::string* packet);

}  // namespace qtts
