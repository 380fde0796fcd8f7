// The server's shared pieces: audio formatters, the pump threads, the core state.
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "audio_io/server/core.h"
#include "engine/common/error.h"
#include "engine/common/log.h"

namespace qtts::server {

const char* const kServerName = "qtts/" QTTS_VERSION;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string base64_encode(const std::string& bytes) {
    static const char* const kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((bytes.size() + 2) / 3 * 4);
    const auto* s = reinterpret_cast<const unsigned char*>(bytes.data());
    size_t i = 0;
    for (; i + 3 <= bytes.size(); i += 3) {
        const uint32_t v = (uint32_t(s[i]) << 16) | (uint32_t(s[i + 1]) << 8) | s[i + 2];
        out += kAlphabet[(v >> 18) & 63];
        out += kAlphabet[(v >> 12) & 63];
        out += kAlphabet[(v >> 6) & 63];
        out += kAlphabet[v & 63];
    }
    const size_t rest = bytes.size() - i;
    if (rest > 0) {
        uint32_t v = uint32_t(s[i]) << 16;
        if (rest == 2) v |= uint32_t(s[i + 1]) << 8;
        out += kAlphabet[(v >> 18) & 63];
        out += kAlphabet[(v >> 12) & 63];
        out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
        out += '=';
    }
    return out;
}

// ---------------------------------------------------------------------------------------------
// Formatters
// ---------------------------------------------------------------------------------------------
namespace {

class OggFormatter : public AudioFormatter {
public:
    explicit OggFormatter(const OpusEncoderOptions& o) : enc_(o) {}
    void start(std::vector<AudioPiece>& out) override { push(enc_.header_pages(), out); }
    void write(const float* pcm, size_t n, std::vector<AudioPiece>& out) override { push(enc_.write(pcm, n), out); }
    void finish(std::vector<AudioPiece>& out) override { push(enc_.finish(), out); }

private:
    void push(std::string bytes, std::vector<AudioPiece>& out) const {
        if (!bytes.empty()) out.push_back(AudioPiece{std::move(bytes), enc_.samples_paged()});
    }
    OggOpusStreamEncoder enc_;
};

class PacketFormatter : public AudioFormatter {
public:
    explicit PacketFormatter(const OpusEncoderOptions& o) : enc_(o) {}
    void start(std::vector<AudioPiece>&) override {}
    void write(const float* pcm, size_t n, std::vector<AudioPiece>& out) override {
        packets_.clear();
        enc_.write(pcm, n, packets_);
        frame(out);
    }
    void finish(std::vector<AudioPiece>& out) override {
        packets_.clear();
        enc_.finish(packets_);
        frame(out);
    }
    int pre_skip() const override { return enc_.pre_skip(); }

private:
    void frame(std::vector<AudioPiece>& out) {
        for (const auto& p : packets_) out.push_back(AudioPiece{opus_frame_pack(p, enc_.frame_samples()), enc_.samples_covered(p)});
    }
    OpusPacketEncoder enc_;
    std::vector<OpusPacket> packets_;
};

class PcmFormatter : public AudioFormatter {
public:
    explicit PcmFormatter(bool wav_header) : wav_header_(wav_header) {}
    void start(std::vector<AudioPiece>& out) override {
        if (wav_header_) out.push_back(AudioPiece{wav_header_s16_streaming(SAMPLE_RATE, 1), 0});
    }
    void write(const float* pcm, size_t n, std::vector<AudioPiece>& out) override {
        std::string bytes;
        pcm_append_s16le(pcm, n, bytes);
        samples_ += int64_t(n);
        if (!bytes.empty()) out.push_back(AudioPiece{std::move(bytes), samples_});
    }
    void finish(std::vector<AudioPiece>&) override {}

private:
    bool wav_header_;
    int64_t samples_ = 0;
};

}  // namespace

std::unique_ptr<AudioFormatter> audio_formatter_create(AudioFormat format, const OpusEncoderOptions& opus) {
    switch (format) {
        case AudioFormat::AUDIO_FORMAT_OGG_OPUS: return std::make_unique<OggFormatter>(opus);
        case AudioFormat::AUDIO_FORMAT_OPUS_PACKETS: return std::make_unique<PacketFormatter>(opus);
        case AudioFormat::AUDIO_FORMAT_WAV: return std::make_unique<PcmFormatter>(true);
        case AudioFormat::AUDIO_FORMAT_PCM: return std::make_unique<PcmFormatter>(false);
    }
    fail(ErrorCode::ERROR_INTERNAL, "unknown audio format {}", int(format));
}

void wav_header_patch(std::string& body) {
    QTTS_ASSERT(body.size() >= kWavHeaderBytes);
    const std::string header = wav_header_s16(SAMPLE_RATE, 1, uint32_t(body.size() - kWavHeaderBytes));
    body.replace(0, kWavHeaderBytes, header);
}

// ---------------------------------------------------------------------------------------------
// Pumps
// ---------------------------------------------------------------------------------------------
PumpPool::PumpPool(ServerCore& core, int threads) : core_(core) {
    threads_.reserve(size_t(threads));
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { worker_run(); });
}

PumpPool::~PumpPool() { stop(); }

void PumpPool::job_add(PumpJob job) {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!stop_) {
            jobs_.push_back(std::move(job));
            cv_.notify_one();
            return;
        }
    }
    job_abandon(job);  // the server is stopping: no thread will run it
}

void PumpPool::job_abandon(PumpJob& job) {
    job.stream->cancel();
    job.stream.reset();
    core_.stream_slot_release();
    StreamOutcome outcome;
    outcome.cancelled = true;
    outcome.server_stop = true;
    outcome.terminal = CounterHold(core_.terminals_pending);
    job.sink->pump_end(std::move(outcome));
    job.sink.reset();
}

void PumpPool::stop() {
    {
        std::lock_guard<std::mutex> lock(mutex_);
        stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_)
        if (t.joinable()) t.join();
    threads_.clear();
    // Jobs never started: their streams were admitted, so cancel them and give the slots back.
    std::deque<PumpJob> left;
    {
        std::lock_guard<std::mutex> lock(mutex_);
        left.swap(jobs_);
    }
    for (auto& job : left) job_abandon(job);
}

void PumpPool::worker_run() {
    for (;;) {
        PumpJob job;
        {
            std::unique_lock<std::mutex> lock(mutex_);
            cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // stop_ and nothing left
            job = std::move(jobs_.front());
            jobs_.pop_front();
        }
        job_run(job);
    }
}

void PumpPool::job_run(PumpJob& job) {
    Stream& stream = *job.stream;
    PumpSink& sink = *job.sink;
    StreamOutcome outcome;
    std::vector<AudioPiece> pieces;
    // One second per read: more than an engine chunk, so one read takes everything that is ready.
    std::vector<float> pcm(static_cast<size_t>(SAMPLE_RATE));
    // Real-time tracking for the stall count: a listener who starts playing at the first audio.
    bool playing = false;
    bool in_stall = false;
    Clock::time_point play_start;

    const auto deliver = [&](int64_t samples) {
        if (pieces.empty() && samples == 0) return;
        size_t bytes = 0;
        for (const auto& p : pieces) bytes += p.bytes.size();
        sink.pump_backlog().fetch_add(bytes);
        sink.pump_audio(std::move(pieces), bytes, samples);
        pieces.clear();
    };

    try {
        job.formatter->start(pieces);
        deliver(0);
        for (;;) {
            if (core_.stopping.load() || sink.pump_abandoned()) {
                outcome.cancelled = true;
                outcome.server_stop = !sink.pump_abandoned();
                break;
            }
            if (sink.pump_backlog().load() > core_.options.max_backlog_bytes) {
                outcome.slow_client = true;
                break;
            }
            int64_t samples = 0;
            // Read only once wait() reports audio, and stop at the first short read: a read that
            // finds the ring empty mid-stream is what the engine counts as a consumer stall.
            if (stream.wait(std::chrono::milliseconds(20))) {
                for (int round = 0; round < 4; ++round) {
                    const size_t n = stream.read(pcm.data(), pcm.size());
                    if (n > 0) job.formatter->write(pcm.data(), n, pieces);
                    samples += int64_t(n);
                    if (n < pcm.size()) break;
                }
            }
            outcome.samples += samples;
            deliver(samples);
            if (samples > 0 && !playing) {
                playing = true;
                play_start = Clock::now();
            }
            if (stream.finished()) {
                job.formatter->finish(pieces);
                deliver(0);
                break;
            }
            if (playing && !stream.generation_done()) {
                const bool behind = seconds_since(play_start) > double(outcome.samples) / SAMPLE_RATE;
                if (behind && !in_stall) ++outcome.stalls;
                in_stall = behind;
            }
        }
    } catch (const std::exception& e) {
        QTTS_LOG_ERROR("stream {}: encoding failed: {}", stream.id(), e.what());
        outcome.error = std::string("internal error while encoding: ") + e.what();
    }

    if (outcome.cancelled || outcome.slow_client || !outcome.error.empty()) {
        stream.cancel();
        // Give the engine a moment to end the stream, so its slot is free again when this one is
        // released (otherwise a new request could pass our count and be refused by the engine).
        const auto deadline = Clock::now() + core_.options.cancel_grace;
        while (!stream.generation_done() && Clock::now() < deadline) {
            stream.wait(std::chrono::milliseconds(10));
            while (stream.read(pcm.data(), pcm.size()) > 0) {
            }  // discard: wait() returns at once while unread audio is left
        }
    }
    outcome.metrics = stream.metrics();
    if (outcome.error.empty()) outcome.error = stream.error();

    StreamReport report;
    report.audio_seconds = double(outcome.samples) / SAMPLE_RATE;
    report.rtf = outcome.metrics.rtf;
    report.stalls = outcome.stalls;
    report.cancelled = outcome.cancelled || outcome.slow_client;
    report.failed = !report.cancelled && !outcome.error.empty();
    report.completed = !report.cancelled && !report.failed;
    core_.metrics.stream_finished(report);
    if (outcome.slow_client) core_.metrics.error_count("slow_client");
    if (report.failed) core_.metrics.error_count("stream_error");

    // Release before telling the client, so a client that starts its next request the moment
    // this one ends finds the slot free.
    job.stream.reset();
    core_.stream_slot_release();
    outcome.terminal = CounterHold(core_.terminals_pending);
    sink.pump_end(std::move(outcome));
    job.sink.reset();
}

// ---------------------------------------------------------------------------------------------
// Core
// ---------------------------------------------------------------------------------------------
ServerCore::ServerCore(SpeechService& service_, const ServerOptions& options_)
    : service(service_), options(options_), ioc(std::max(1, options_.io_threads)) {
    limits.max_text_bytes = options.max_text_bytes;
    opus.sample_rate = SAMPLE_RATE;
    opus.bitrate = options.bitrate;
    opus.complexity = options.opus_complexity;
}

void ServerCore::request_limits_apply(SpeechRequest& request) const {
    if (options.max_audio_seconds > 0.0) {
        // 80 ms codec frames: 12.5 per second.
        const int frames = int(std::ceil(options.max_audio_seconds * 12.5 - 1e-9));
        request.max_frames = request.max_frames > 0 ? std::min(request.max_frames, frames) : frames;
    }
}

bool ServerCore::stream_slot_acquire() {
    int64_t current = active_streams.load();
    while (current < options.max_streams) {
        if (active_streams.compare_exchange_weak(current, current + 1)) return true;
    }
    return false;
}

void ServerCore::stream_slot_release() { active_streams.fetch_sub(1); }

std::string ServerCore::unready_reason() const {
    if (stopping.load()) return "stopping";
    if (draining.load()) return "draining";
    if (!service.failure().empty()) return "failed";
    if (!service.ready()) return "loading";
    return "";
}

RequestError ServerCore::unready_error(const std::string& reason) const {
    std::string message;
    if (reason == "loading") {
        message = "the model is still loading; retry in a few seconds (GET /readyz answers 200 once it is ready)";
    } else if (reason == "failed") {
        message = "this server's speech backend failed (" + service.failure() + "); retry on another instance";
    } else if (reason == "draining") {
        message = "the server is shutting down and takes no new streams; retry on another instance";
    } else {
        message = "the server is stopping; retry on another instance";
    }
    return RequestError(RequestErrorKind::REQUEST_ERROR_UNAVAILABLE, "", message);
}

MetricGauges ServerCore::gauges() const {
    MetricGauges g;
    g.active_streams = active_streams.load();
    g.max_streams = options.max_streams;
    g.connections = connections.load();
    g.engines = service.engines();
    return g;
}

std::string ServerCore::health_body(const std::string& unready) const {
    nlohmann::json body = {{"status", unready.empty() ? "ok" : unready},
                           {"model", service.model_name()},
                           {"backend", service.backend_name()},
                           {"active_streams", active_streams.load()},
                           {"max_streams", options.max_streams}};
    const std::vector<EngineStatus> engines = service.engines();
    if (!engines.empty()) {
        int64_t serving = 0;
        nlohmann::json list = nlohmann::json::array();
        for (const EngineStatus& e : engines) {
            serving += e.state == EngineState::ENGINE_STATE_SERVING ? 1 : 0;
            list.push_back({{"engine", e.label},
                            {"backend", e.backend},
                            {"state", engine_state_name(e.state)},
                            {"error", e.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.error)},
                            {"active_streams", e.load.active},
                            {"queued_streams", e.load.queued},
                            {"real_time_factor", e.load.rtf},
                            {"requests", e.routed},
                            {"completed", e.stats.completed},
                            {"cancelled", e.stats.cancelled},
                            {"failed", e.stats.errors}});
        }
        body["engines_serving"] = serving;
        body["engines"] = std::move(list);
    }
    return body.dump();
}

nlohmann::json outcome_json(const StreamOutcome& o, double ttfa_seconds) {
    const StreamMetrics& m = o.metrics;
    nlohmann::json j;
    j["stop_reason"] = o.slow_client ? "slow_client" : o.cancelled ? "cancelled" : stop_reason_name(m.stop_reason);
    j["samples"] = o.samples;
    j["audio_seconds"] = double(o.samples) / SAMPLE_RATE;
    j["frames"] = m.frames;
    j["ttfa_ms"] = ttfa_seconds >= 0 ? nlohmann::json(ttfa_seconds * 1000.0) : nlohmann::json(nullptr);
    j["ttfa_gen_ms"] = m.ttfa_gen_ms;
    j["generation_ms"] = m.generation_ms;
    j["rtf"] = m.rtf;
    j["stalls"] = o.stalls;
    return j;
}

RequestError submit_error_map(const std::exception& e) {
    if (dynamic_cast<const ServiceBusyError*>(&e))
        return RequestError(RequestErrorKind::REQUEST_ERROR_BUSY, "", std::string("the engine is busy: ") + e.what());
    if (dynamic_cast<const ServiceUnavailableError*>(&e))
        return RequestError(RequestErrorKind::REQUEST_ERROR_UNAVAILABLE, "", std::string(e.what()) + "; retry in a few seconds");
    if (const auto* err = dynamic_cast<const Error*>(&e)) {
        const RequestErrorKind kind = request_error_kind(err->code());
        if (kind != RequestErrorKind::REQUEST_ERROR_INTERNAL) return RequestError(kind, "", err->what());
    }
    return RequestError(RequestErrorKind::REQUEST_ERROR_INTERNAL, "",
                        std::string("the request failed inside the server: ") + e.what());
}

std::string submit_error_code(const std::exception& e) {
    if (const auto* busy = dynamic_cast<const ServiceBusyError*>(&e)) return busy->code();
    return "";
}

const char* request_error_metric(const RequestError& e) {
    switch (e.kind()) {
        case RequestErrorKind::REQUEST_ERROR_BUSY: return "busy";
        case RequestErrorKind::REQUEST_ERROR_UNAVAILABLE: return "unavailable";
        case RequestErrorKind::REQUEST_ERROR_INTERNAL: return "internal";
        case RequestErrorKind::REQUEST_ERROR_TOO_LARGE:
        case RequestErrorKind::REQUEST_ERROR_HEADER_TOO_LARGE: return "too_large";
        case RequestErrorKind::REQUEST_ERROR_TIMEOUT: return "timeout";
        default: return "bad_request";
    }
}

}  // namespace qtts::server
