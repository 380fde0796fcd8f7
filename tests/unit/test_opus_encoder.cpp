// Opus encoders: the Ogg Opus stream (one flushed page per chunk, RFC 7845 headers, exact end
// trimming) parsed here with a small independent Ogg reader and decoded with libopus; the raw
// packet encoder (frame timeline, pre-skip, padding, the `last` flag) and its WebSocket framing.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <opus/opus.h>

#include "audio_io/opus_encoder.h"
#include "engine/common/error.h"
#include "test_support.h"

namespace {

struct OggPage {
    uint8_t flags = 0;  // 0x01 continued, 0x02 first, 0x04 last
    int64_t granule = 0;
    uint32_t serial = 0;
    uint32_t sequence = 0;
    std::vector<std::string> packets;  // packets completed on this page
};

uint32_t u32_at(const std::string& s, size_t at) {
    return uint32_t(uint8_t(s[at])) | uint32_t(uint8_t(s[at + 1])) << 8 | uint32_t(uint8_t(s[at + 2])) << 16 |
           uint32_t(uint8_t(s[at + 3])) << 24;
}

// Splits a byte string into Ogg pages and packets; fails the test on a malformed page.
std::vector<OggPage> ogg_parse(const std::string& b) {
    std::vector<OggPage> pages;
    std::string carry;
    size_t pos = 0;
    while (pos < b.size()) {
        REQUIRE(pos + 27 <= b.size());
        REQUIRE(b.compare(pos, 4, "OggS") == 0);
        REQUIRE(b[pos + 4] == 0);  // stream structure version
        OggPage p;
        p.flags = uint8_t(b[pos + 5]);
        p.granule = int64_t(uint64_t(u32_at(b, pos + 6)) | uint64_t(u32_at(b, pos + 10)) << 32);
        p.serial = u32_at(b, pos + 14);
        p.sequence = u32_at(b, pos + 18);
        const size_t segments = uint8_t(b[pos + 26]);
        REQUIRE(pos + 27 + segments <= b.size());
        size_t data = pos + 27 + segments;
        for (size_t i = 0; i < segments; ++i) {
            const size_t len = uint8_t(b[pos + 27 + i]);
            REQUIRE(data + len <= b.size());
            carry.append(b, data, len);
            data += len;
            if (len < 255) {
                p.packets.push_back(carry);
                carry.clear();
            }
        }
        pages.push_back(p);
        pos = data;
    }
    return pages;
}

// A speech-like test signal: three harmonics under a slow envelope, plus a little noise.
std::vector<float> voice_like(size_t n, uint64_t seed) {
    const auto noise = qtts_test::random_floats(n, seed, -0.01f, 0.01f);
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) {
        const double t = double(i) / 24000.0;
        const double env = 0.5 + 0.4 * std::sin(2 * M_PI * 3.0 * t);
        x[i] = float(env * (0.3 * std::sin(2 * M_PI * 210 * t) + 0.15 * std::sin(2 * M_PI * 420 * t) +
                            0.08 * std::sin(2 * M_PI * 630 * t)) +
                     noise[i]);
    }
    return x;
}

double correlation(const float* a, const float* b, size_t n) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t i = 0; i < n; ++i) {
        ab += double(a[i]) * b[i];
        aa += double(a[i]) * a[i];
        bb += double(b[i]) * b[i];
    }
    return ab / std::sqrt(aa * bb);
}

// Best correlation over small lags (the decoders' alignment is checked to within `max_lag`).
double correlation_near(const std::vector<float>& got, const std::vector<float>& want, int max_lag, int* best_lag) {
    double best = -2;
    for (int lag = -max_lag; lag <= max_lag; ++lag) {
        const size_t start = size_t(std::max(0, lag));
        const size_t n = std::min(got.size() - start, want.size()) - size_t(std::max(0, -lag));
        const double c = correlation(got.data() + start, want.data() + std::max(0, -lag), n);
        if (c > best) {
            best = c;
            *best_lag = lag;
        }
    }
    return best;
}

}  // namespace

TEST_CASE("Ogg Opus: headers first, one page per chunk, exact end granule, decodes to the input", "[unit]") {
    qtts::OpusEncoderOptions o;
    o.serial = 1234;
    qtts::OggOpusStreamEncoder enc(o);
    const auto head = ogg_parse(enc.header_pages());
    REQUIRE(head.size() == 2);
    CHECK(head[0].flags == 0x02);  // beginning of stream
    REQUIRE(head[0].packets.size() == 1);
    const std::string& opus_head = head[0].packets[0];
    REQUIRE(opus_head.size() >= 19);
    CHECK(opus_head.compare(0, 8, "OpusHead") == 0);
    CHECK(uint8_t(opus_head[9]) == 1);  // channels
    const int pre_skip = uint8_t(opus_head[10]) | (uint8_t(opus_head[11]) << 8);
    CHECK(pre_skip > 0);
    CHECK(u32_at(opus_head, 12) == 24000);  // original input rate
    REQUIRE(head[1].packets.size() == 1);
    CHECK(head[1].packets[0].compare(0, 8, "OpusTags") == 0);
    CHECK(head[0].serial == 1234);

    const size_t chunks = 25, chunk = 1920;  // 2 s in 80 ms chunks
    const auto x = voice_like(chunks * chunk, 7);
    std::vector<OggPage> audio_pages;
    for (size_t c = 0; c < chunks; ++c) {
        const auto pages = ogg_parse(enc.write(x.data() + c * chunk, chunk));
        INFO("chunk " << c);
        REQUIRE(pages.size() == 1);  // flushed at once: the chunk is on the wire now
        // 80 ms = four 20 ms packets (the first chunk may hold fewer: encoder look-ahead).
        CHECK(pages[0].packets.size() >= 3);
        CHECK(pages[0].packets.size() <= 5);
        audio_pages.push_back(pages[0]);
    }
    const auto tail = ogg_parse(enc.finish());
    REQUIRE(!tail.empty());
    CHECK((tail.back().flags & 0x04) != 0);  // end of stream
    // RFC 7845: the last granule = pre-skip + the real duration at 48 kHz.
    CHECK(tail.back().granule == pre_skip + int64_t(2 * x.size()));
    audio_pages.insert(audio_pages.end(), tail.begin(), tail.end());
    for (size_t i = 1; i < audio_pages.size(); ++i) CHECK(audio_pages[i].granule >= audio_pages[i - 1].granule);
    CHECK_THROWS_AS(enc.write(x.data(), 10), qtts::Error);

    // Decode every packet at 48 kHz, drop pre-skip, compare at 24 kHz.
    int err = 0;
    OpusDecoder* dec = opus_decoder_create(48000, 1, &err);
    REQUIRE(dec);
    std::vector<float> pcm48, buf(5760);
    for (const auto& page : audio_pages)
        for (const auto& p : page.packets) {
            const int n = opus_decode_float(dec, reinterpret_cast<const unsigned char*>(p.data()), opus_int32(p.size()),
                                            buf.data(), 5760, 0);
            REQUIRE(n == 960);  // 20 ms frames
            pcm48.insert(pcm48.end(), buf.begin(), buf.begin() + n);
        }
    opus_decoder_destroy(dec);
    REQUIRE(pcm48.size() >= size_t(pre_skip) + 2 * x.size());
    std::vector<float> got;
    for (size_t i = size_t(pre_skip); i < size_t(pre_skip) + 2 * x.size(); i += 2) got.push_back(pcm48[i]);
    int lag = 0;
    const double c = correlation_near(got, x, 8, &lag);
    INFO("correlation " << c << " at lag " << lag);
    CHECK(c >= 0.9);
    CHECK(std::abs(lag) <= 2);  // pre-skip lines the output up with the input
}

TEST_CASE("raw Opus packets: 20 ms frames, timeline, padding to cover the delay, last flag", "[unit]") {
    qtts::OpusPacketEncoder enc;
    CHECK(enc.frame_samples() == 480);
    const int pre_skip = enc.pre_skip();
    CHECK(pre_skip > 0);
    CHECK(pre_skip < 480);
    const auto x = voice_like(24000 + 123, 9);
    // Odd write sizes: frames must be cut from the stream, not from each write.
    const size_t sizes[] = {1, 479, 1920, 7, 3333, 480, 481};
    std::vector<qtts::OpusPacket> packets;
    size_t pos = 0;
    for (size_t k = 0; pos < x.size(); ++k) {
        const size_t n = std::min(sizes[k % 7], x.size() - pos);
        enc.write(x.data() + pos, n, packets);
        pos += n;
        CHECK(packets.size() == pos / 480);  // every whole frame is out at once
    }
    enc.finish(packets);
    const size_t expect_packets = (x.size() + size_t(pre_skip) + 479) / 480;
    REQUIRE(packets.size() == expect_packets);
    for (size_t i = 0; i < packets.size(); ++i) {
        CHECK(packets[i].sequence == i);
        CHECK(packets[i].position == i * 480);
        CHECK(packets[i].last == (i + 1 == packets.size()));
    }
    std::vector<qtts::OpusPacket> more;
    enc.finish(more);  // idempotent
    CHECK(more.empty());
    CHECK_THROWS_AS(enc.write(x.data(), 1, more), qtts::Error);

    int err = 0;
    OpusDecoder* dec = opus_decoder_create(24000, 1, &err);
    REQUIRE(dec);
    std::vector<float> pcm, buf(5760);
    for (const auto& p : packets) {
        const int n = opus_decode_float(dec, reinterpret_cast<const unsigned char*>(p.data.data()), opus_int32(p.data.size()),
                                        buf.data(), 5760, 0);
        REQUIRE(n == 480);
        pcm.insert(pcm.end(), buf.begin(), buf.begin() + n);
    }
    opus_decoder_destroy(dec);
    std::vector<float> got(pcm.begin() + pre_skip, pcm.begin() + pre_skip + long(x.size()));
    int lag = 0;
    const double c = correlation_near(got, x, 8, &lag);
    INFO("correlation " << c << " at lag " << lag);
    CHECK(c >= 0.9);
    CHECK(std::abs(lag) <= 1);  // pre_skip lines it up (to the codec's sub-sample phase)
}

TEST_CASE("an utterance with no samples ends as a valid empty stream in both encoders", "[unit]") {
    // Issue 15, item 1: a WebSocket `ogg` utterance that produced nothing used to abort the
    // process inside libopusenc's drain. Each way the server can reach finish() with no audio.
    for (int headers_first = 0; headers_first < 2; ++headers_first) {
        INFO("header pages requested first: " << headers_first);
        qtts::OggOpusStreamEncoder enc;
        std::string bytes = headers_first ? enc.header_pages() : std::string();
        bytes += enc.write(nullptr, 0);
        bytes += enc.finish();
        CHECK(enc.finished());
        CHECK(enc.samples_paged() == 0);
        const auto pages = ogg_parse(bytes);
        REQUIRE(pages.size() >= 2);
        REQUIRE(!pages[0].packets.empty());
        const std::string& opus_head = pages[0].packets[0];
        REQUIRE(opus_head.compare(0, 8, "OpusHead") == 0);
        const int pre_skip = uint8_t(opus_head[10]) | (uint8_t(opus_head[11]) << 8);
        CHECK((pages.back().flags & 0x04) != 0);  // end of stream
        CHECK(pages.back().granule <= pre_skip);  // nothing to play after the pre-skip
        CHECK(enc.finish().empty());              // idempotent
    }
    qtts::OpusPacketEncoder packets_enc;
    std::vector<qtts::OpusPacket> packets;
    packets_enc.finish(packets);
    REQUIRE(!packets.empty());
    CHECK(packets.back().last);
    CHECK(packets_enc.samples_covered(packets.back()) == 0);
}

TEST_CASE("samples_paged and samples_covered say what a client can decode from what it has", "[unit]") {
    const auto x = voice_like(24000 + 700, 5);
    qtts::OggOpusStreamEncoder ogg;
    ogg.header_pages();
    int64_t previous = 0;
    for (size_t pos = 0; pos < x.size(); pos += 1920) {
        const size_t n = std::min<size_t>(1920, x.size() - pos);
        const auto pages = ogg_parse(ogg.write(x.data() + pos, n));
        CHECK(ogg.samples_paged() >= previous);
        CHECK(ogg.samples_paged() <= ogg.samples_written());
        // Recomputed from the page itself: (granule - pre-skip) at 48 kHz, halved.
        if (!pages.empty() && pages.back().granule > 0) CHECK(ogg.samples_paged() > 0);
        previous = ogg.samples_paged();
    }
    CHECK(ogg.samples_paged() < ogg.samples_written());  // the encoder delay holds some back
    ogg.finish();
    CHECK(ogg.samples_paged() == int64_t(x.size()));

    qtts::OpusPacketEncoder enc;
    std::vector<qtts::OpusPacket> packets;
    enc.write(x.data(), x.size(), packets);
    REQUIRE(!packets.empty());
    // Packet k covers the input up to (k + 1) * 480 - pre_skip.
    CHECK(enc.samples_covered(packets[0]) == 480 - enc.pre_skip());
    CHECK(enc.samples_covered(packets.back()) == int64_t(packets.size()) * 480 - enc.pre_skip());
    enc.finish(packets);
    CHECK(enc.samples_covered(packets.back()) == int64_t(x.size()));
}

TEST_CASE("the bitrate option changes the size of the stream", "[unit]") {
    const auto x = voice_like(48000, 3);
    size_t bytes[2] = {0, 0};
    const int rates[2] = {12000, 64000};
    for (int k = 0; k < 2; ++k) {
        qtts::OpusEncoderOptions o;
        o.bitrate = rates[k];
        qtts::OpusPacketEncoder enc(o);
        std::vector<qtts::OpusPacket> packets;
        enc.write(x.data(), x.size(), packets);
        enc.finish(packets);
        for (const auto& p : packets) bytes[k] += p.data.size();
    }
    INFO(bytes[0] << " bytes at 12 kb/s, " << bytes[1] << " at 64 kb/s");
    CHECK(bytes[1] > 2 * bytes[0]);
    // Roughly the asked rate (2 s of audio): within a factor of two.
    CHECK(bytes[0] * 8 / 2 > 6000);
    CHECK(bytes[0] * 8 / 2 < 24000);
}

TEST_CASE("WebSocket frame header round trip and rejection of bad frames", "[unit]") {
    qtts::OpusPacket p;
    p.data = std::string("\x78\x01\x02\x03", 4);
    p.sequence = 0x01020304;
    p.position = 0x0A0B0C0D;
    p.last = true;
    const std::string frame = qtts::opus_frame_pack(p, 480);
    REQUIRE(frame.size() == qtts::kOpusFrameHeaderBytes + 4);
    CHECK(uint8_t(frame[0]) == 1);
    CHECK(uint8_t(frame[1]) == 1);
    CHECK(uint8_t(frame[2]) == 0xE0);  // 480 little-endian
    CHECK(uint8_t(frame[3]) == 0x01);
    CHECK(uint8_t(frame[4]) == 0x04);  // sequence, little-endian
    CHECK(uint8_t(frame[8]) == 0x0D);  // position, little-endian
    std::string packet;
    const auto h = qtts::opus_frame_unpack(frame, &packet);
    CHECK(h.version == 1);
    CHECK(h.last);
    CHECK(h.frame_samples == 480);
    CHECK(h.sequence == 0x01020304u);
    CHECK(h.position == 0x0A0B0C0Du);
    CHECK(packet == p.data);
    CHECK_THROWS_AS(qtts::opus_frame_unpack(frame.substr(0, 11), nullptr), qtts::Error);
    std::string v2 = frame;
    v2[0] = 2;
    CHECK_THROWS_AS(qtts::opus_frame_unpack(v2, nullptr), qtts::Error);
}

TEST_CASE("encoder options are validated with clear errors", "[unit]") {
    qtts::OpusEncoderOptions o;
    CHECK_NOTHROW(qtts::opus_encoder_options_validate(o));
    o.bitrate = 5999;
    CHECK_THROWS_WITH(qtts::opus_encoder_options_validate(o), Catch::Contains("6000..510000"));
    o = {};
    o.sample_rate = 22050;
    CHECK_THROWS_WITH(qtts::OggOpusStreamEncoder(o), Catch::Contains("24000"));
    o = {};
    o.complexity = 11;
    CHECK_THROWS_AS(qtts::OpusPacketEncoder(o), qtts::Error);
}
