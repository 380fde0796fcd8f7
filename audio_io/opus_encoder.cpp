#include "audio_io/opus_encoder.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include <opus/opus.h>
#include <opus/opusenc.h>

#include "engine/common/error.h"

namespace qtts {

namespace {

constexpr int kFrameMs = 20;
// The largest packet libopus can produce for one frame (RFC 6716, 1275 bytes per frame plus TOC
// and padding headroom); 4000 is the size its documentation recommends for the output buffer.
constexpr int kMaxPacketBytes = 4000;

uint32_t serial_next() {
    static std::atomic<uint32_t> counter{0x51545453u};  // "QTTS": any value works, fixed for repeatability
    return counter.fetch_add(1);
}

void ope_check(int rc, const char* what) {
    if (rc != OPE_OK) fail(ErrorCode::ERROR_INTERNAL, "libopusenc {} failed: {}", what, ope_strerror(rc));
}

void opus_check(int rc, const char* what) {
    if (rc != OPUS_OK) fail(ErrorCode::ERROR_INTERNAL, "libopus {} failed: {}", what, opus_strerror(rc));
}

uint64_t le_read(const unsigned char* p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

// Ogg page layout (RFC 3533): "OggS", version, flags, granule position (8 bytes LE) at 6,
// ..., segment count at 26, the segment table, then the body.
constexpr size_t kOggHeaderBytes = 27;

}  // namespace

void opus_encoder_options_validate(const OpusEncoderOptions& o) {
    const int rate = o.sample_rate;
    if (rate != 8000 && rate != 12000 && rate != 16000 && rate != 24000 && rate != 48000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "Opus input sample rate must be 8000, 12000, 16000, 24000 or 48000 Hz, got {}",
             rate);
    if (o.bitrate < 6000 || o.bitrate > 510000)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "Opus bitrate must be in 6000..510000 bits/s, got {}", o.bitrate);
    if (o.complexity < 0 || o.complexity > 10)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "Opus complexity must be in 0..10, got {}", o.complexity);
}

// ---------------------------------------------------------------------------------------------
// Ogg Opus through libopusenc (pull mode: pages are taken out with ope_encoder_get_page)
// ---------------------------------------------------------------------------------------------

OggOpusStreamEncoder::OggOpusStreamEncoder(const OpusEncoderOptions& options) {
    opus_encoder_options_validate(options);
    OggOpusComments* comments = ope_comments_create();
    if (!comments) fail(ErrorCode::ERROR_INTERNAL, "libopusenc could not allocate the comment header");
    ope_comments_add(comments, "ENCODER", "qtts");
    int error = OPE_OK;
    // Mono, mapping family 0. libopusenc resamples non-48 kHz input internally (its docs: "48 kHz
    // is faster"); at 24 kHz the cost is small and the Ogg timeline is 48 kHz as RFC 7845 wants.
    sample_rate_ = options.sample_rate;
    enc_ = ope_encoder_create_pull(comments, options.sample_rate, 1, 0, &error);
    ope_comments_destroy(comments);
    if (!enc_ || error != OPE_OK)
        fail(ErrorCode::ERROR_INTERNAL, "libopusenc could not create an encoder: {}", ope_strerror(error));
    try {
        const int serial = int(options.serial ? options.serial : serial_next());
        ope_check(ope_encoder_ctl(enc_, OPE_SET_SERIALNO(serial)), "OPE_SET_SERIALNO");
        // Latency first: no look-ahead for variable-duration decisions, no page holding.
        ope_check(ope_encoder_ctl(enc_, OPE_SET_DECISION_DELAY(0)), "OPE_SET_DECISION_DELAY");
        ope_check(ope_encoder_ctl(enc_, OPE_SET_MUXING_DELAY(0)), "OPE_SET_MUXING_DELAY");
        ope_check(ope_encoder_ctl(enc_, OPUS_SET_EXPERT_FRAME_DURATION(OPUS_FRAMESIZE_20_MS)), "frame duration");
        ope_check(ope_encoder_ctl(enc_, OPUS_SET_SIGNAL(OPUS_SIGNAL_VOICE)), "OPUS_SET_SIGNAL");
        ope_check(ope_encoder_ctl(enc_, OPUS_SET_BITRATE(options.bitrate)), "OPUS_SET_BITRATE");
        ope_check(ope_encoder_ctl(enc_, OPUS_SET_COMPLEXITY(options.complexity)), "OPUS_SET_COMPLEXITY");
    } catch (...) {
        ope_encoder_destroy(enc_);
        enc_ = nullptr;
        throw;
    }
}

OggOpusStreamEncoder::~OggOpusStreamEncoder() {
    if (enc_) ope_encoder_destroy(enc_);
}

std::string OggOpusStreamEncoder::pages_collect(bool flush) {
    std::string out;
    unsigned char* page = nullptr;
    opus_int32 len = 0;
    // Each call hands out one page; with flush=1 whatever packets are waiting are put in a page.
    while (ope_encoder_get_page(enc_, &page, &len, flush ? 1 : 0)) {
        page_note(page, size_t(len));
        out.append(reinterpret_cast<const char*>(page), size_t(len));
    }
    return out;
}

// Tracks what the pages handed out so far decode to: the pre-skip from the OpusHead page, the
// granule position (48 kHz, pre-skip included) from each audio page.
void OggOpusStreamEncoder::page_note(const unsigned char* page, size_t len) {
    if (len < kOggHeaderBytes) return;
    const size_t body = kOggHeaderBytes + page[26];
    if (pre_skip_48k_ < 0) {
        // The first page holds the OpusHead packet: "OpusHead", version, channels, pre-skip (u16).
        if (len >= body + 12 && std::memcmp(page + body, "OpusHead", 8) == 0) pre_skip_48k_ = int64_t(le_read(page + body + 10, 2));
        return;
    }
    const int64_t granule = int64_t(le_read(page + 6, 8));
    if (granule < 0) return;  // -1: no packet ends on this page
    const int64_t decoded_48k = std::max<int64_t>(0, granule - pre_skip_48k_);
    samples_paged_ = std::min(samples_written_, decoded_48k * sample_rate_ / 48000);
}

std::string OggOpusStreamEncoder::header_pages() {
    if (finished_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the Ogg Opus stream is already finished");
    const int rc = ope_encoder_flush_header(enc_);
    // OPE_TOO_LATE: the headers already went out with audio; nothing more to send.
    if (rc == OPE_TOO_LATE) return {};
    ope_check(rc, "flush_header");
    return pages_collect(true);
}

std::string OggOpusStreamEncoder::write(const float* pcm, size_t n) {
    if (finished_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the Ogg Opus stream is already finished");
    // Nothing to encode, so no page to take: asking libopusenc for a page before its stream is
    // set up (no header flush, no audio yet) crashes it.
    if (n == 0) return {};
    // libopusenc takes an int count; feed large buffers in slices.
    constexpr size_t kSlice = 1 << 20;
    for (size_t done = 0; done < n;) {
        const size_t take = std::min(kSlice, n - done);
        ope_check(ope_encoder_write_float(enc_, pcm + done, int(take)), "write_float");
        done += take;
    }
    samples_written_ += int64_t(n);
    return pages_collect(true);
}

std::string OggOpusStreamEncoder::finish() {
    if (finished_) return {};
    if (samples_written_ == 0) {
        // An utterance with no audio. libopusenc sets a stream's end position only in a write;
        // drained without one it ends on whatever that field held (seen: an assertion in
        // ope_encoder_drain aborting the whole server, issue 15). A write of no samples sets
        // it to 0, so the drain writes a valid stream of no audio: headers and an end page.
        const float none = 0.0f;
        ope_check(ope_encoder_write_float(enc_, &none, 0), "write_float");
    }
    ope_check(ope_encoder_drain(enc_), "drain");
    finished_ = true;
    return pages_collect(true);
}

// ---------------------------------------------------------------------------------------------
// Raw packets through libopus
// ---------------------------------------------------------------------------------------------

OpusPacketEncoder::OpusPacketEncoder(const OpusEncoderOptions& options) {
    opus_encoder_options_validate(options);
    sample_rate_ = options.sample_rate;
    frame_samples_ = sample_rate_ * kFrameMs / 1000;
    int error = OPUS_OK;
    enc_ = opus_encoder_create(sample_rate_, 1, OPUS_APPLICATION_AUDIO, &error);
    if (!enc_ || error != OPUS_OK)
        fail(ErrorCode::ERROR_INTERNAL, "libopus could not create an encoder: {}", opus_strerror(error));
    try {
        opus_check(opus_encoder_ctl(enc_, OPUS_SET_SIGNAL(OPUS_SIGNAL_VOICE)), "OPUS_SET_SIGNAL");
        opus_check(opus_encoder_ctl(enc_, OPUS_SET_BITRATE(options.bitrate)), "OPUS_SET_BITRATE");
        opus_check(opus_encoder_ctl(enc_, OPUS_SET_COMPLEXITY(options.complexity)), "OPUS_SET_COMPLEXITY");
        opus_int32 lookahead = 0;
        opus_check(opus_encoder_ctl(enc_, OPUS_GET_LOOKAHEAD(&lookahead)), "OPUS_GET_LOOKAHEAD");
        pre_skip_ = int(lookahead);
    } catch (...) {
        opus_encoder_destroy(enc_);
        enc_ = nullptr;
        throw;
    }
    pending_.reserve(size_t(frame_samples_));
    packet_buf_.resize(kMaxPacketBytes);
}

OpusPacketEncoder::~OpusPacketEncoder() {
    if (enc_) opus_encoder_destroy(enc_);
}

void OpusPacketEncoder::frame_encode(const float* frame, std::vector<OpusPacket>& out) {
    const opus_int32 bytes = opus_encode_float(enc_, frame, frame_samples_, packet_buf_.data(), opus_int32(packet_buf_.size()));
    if (bytes < 0) fail(ErrorCode::ERROR_INTERNAL, "libopus opus_encode_float failed: {}", opus_strerror(bytes));
    OpusPacket packet;
    packet.data.assign(reinterpret_cast<const char*>(packet_buf_.data()), size_t(bytes));
    packet.sequence = sequence_++;
    packet.position = position_;
    position_ += uint64_t(frame_samples_);
    out.push_back(std::move(packet));
}

void OpusPacketEncoder::write(const float* pcm, size_t n, std::vector<OpusPacket>& out) {
    if (finished_) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "the Opus packet stream is already finished");
    samples_written_ += int64_t(n);
    const size_t frame = size_t(frame_samples_);
    size_t i = 0;
    if (!pending_.empty()) {
        const size_t take = std::min(n, frame - pending_.size());
        pending_.insert(pending_.end(), pcm, pcm + take);
        i = take;
        if (pending_.size() < frame) return;
        frame_encode(pending_.data(), out);
        pending_.clear();
    }
    for (; i + frame <= n; i += frame) frame_encode(pcm + i, out);
    pending_.insert(pending_.end(), pcm + i, pcm + n);
}

int64_t OpusPacketEncoder::samples_covered(const OpusPacket& packet) const {
    const int64_t end = int64_t(packet.position) + frame_samples_ - pre_skip_;
    return std::max<int64_t>(0, std::min(end, samples_written_));
}

void OpusPacketEncoder::finish(std::vector<OpusPacket>& out) {
    if (finished_) return;
    // The encoder output lags its input by pre_skip samples: keep feeding silence until the
    // timeline covers pre_skip + every input sample, so the tail of the speech is not cut off.
    const uint64_t needed = uint64_t(pre_skip_) + uint64_t(samples_written_);
    const std::vector<float> zeros(size_t(frame_samples_), 0.0f);
    // At least one packet, so that there always is a packet flagged `last`.
    do {
        if (!pending_.empty()) {
            pending_.resize(size_t(frame_samples_), 0.0f);
            frame_encode(pending_.data(), out);
            pending_.clear();
        } else {
            frame_encode(zeros.data(), out);
        }
    } while (position_ < needed);
    out.back().last = true;
    finished_ = true;
}

// ---------------------------------------------------------------------------------------------
// WebSocket framing
// ---------------------------------------------------------------------------------------------

std::string opus_frame_pack(const OpusPacket& packet, int frame_samples) {
    std::string frame;
    frame.reserve(kOpusFrameHeaderBytes + packet.data.size());
    frame.push_back(char(kOpusFrameVersion));
    frame.push_back(char(packet.last ? 1 : 0));
    const uint16_t fs = uint16_t(frame_samples);
    frame.push_back(char(fs & 0xff));
    frame.push_back(char(fs >> 8));
    const uint32_t pos = uint32_t(packet.position & 0xffffffffu);
    for (int s = 0; s < 32; s += 8) frame.push_back(char((packet.sequence >> s) & 0xff));
    for (int s = 0; s < 32; s += 8) frame.push_back(char((pos >> s) & 0xff));
    frame += packet.data;
    return frame;
}

OpusFrameHeader opus_frame_unpack(const std::string& frame, std::string* packet) {
    if (frame.size() < kOpusFrameHeaderBytes)
        fail(ErrorCode::ERROR_FORMAT, "Opus frame of {} bytes is shorter than its {}-byte header", frame.size(),
             kOpusFrameHeaderBytes);
    const auto byte = [&](size_t i) { return uint32_t(uint8_t(frame[i])); };
    OpusFrameHeader h;
    h.version = uint8_t(byte(0));
    if (h.version != kOpusFrameVersion)
        fail(ErrorCode::ERROR_FORMAT, "Opus frame header version {} is not supported (expected {})", int(h.version),
             int(kOpusFrameVersion));
    h.last = (byte(1) & 1u) != 0;
    h.frame_samples = uint16_t(byte(2) | (byte(3) << 8));
    h.sequence = byte(4) | (byte(5) << 8) | (byte(6) << 16) | (byte(7) << 24);
    h.position = byte(8) | (byte(9) << 8) | (byte(10) << 16) | (byte(11) << 24);
    if (packet) packet->assign(frame, kOpusFrameHeaderBytes, std::string::npos);
    return h;
}

}  // namespace qtts
