#include "engine/api/qtts.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <future>
#include <list>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>

#include <concurrentqueue.h>

#include "engine/common/spsc_ring.h"
#include "engine/common/error.h"
#include "engine/common/log.h"
#include "engine/model/make_model.h"
#include "engine/runtime/engine_debug.h"
#include "engine/runtime/scheduler.h"
#include "engine/runtime/speech_model.h"
#include "engine/runtime/utterance.h"
#include "engine/text/request_check.h"

namespace qtts {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Stream ids are unique in the process, not per engine: with several engines (an EnginePool) an id
// still names one stream in logs and in the server's X-Qtts-Stream-Id.
std::atomic<uint64_t> g_stream_id_next{1};

// Weight of the newest round in the engine's recent real-time factor (EngineLoad::rtf): about the
// last five rounds count.
constexpr double kRtfSmoothing = 0.2;

// Consumer-facing stream. The engine thread is its only producer; one consumer thread reads.
class StreamImpl final : public Stream {
public:
    StreamImpl(uint64_t id, PreparedSpeech prepared, size_t ring_samples, std::function<void()> wake_engine)
        : id_(id), prepared_(std::move(prepared)), ring_(ring_samples, /*pre_touch=*/false),
          wake_engine_(std::move(wake_engine)),
          submitted_(Clock::now()) {}

    uint64_t id() const override { return id_; }

    size_t read(float* out, size_t n) override {
        if (discarded_.load(std::memory_order_acquire)) {
            // Barge-in: everything the ring holds goes, now and until the engine stops; the
            // ring's discard is as wait-free as its read.
            ring_.discard(ring_.capacity());
            return 0;
        }
        const size_t got = ring_.read(out, n);
        // Wait-free: no lock and no wake-up call here (a reader may be an audio callback). A
        // stream held back by a full ring resumes at the engine's next poll (<= 20 ms).
        if (got > 0) {
            was_empty_ = false;
        } else if (!gen_done_.load(std::memory_order_acquire) && !was_empty_) {
            was_empty_ = true;
            stalls_.fetch_add(1, std::memory_order_relaxed);
        }
        return got;
    }

    bool wait(std::chrono::milliseconds timeout) override {
        std::unique_lock<std::mutex> lock(mutex_);
        return cv_.wait_for(lock, timeout, [&] { return available() > 0 || gen_done_.load(std::memory_order_acquire); });
    }

    bool finished() const override { return gen_done_.load(std::memory_order_acquire) && available() == 0; }
    size_t available() const override {
        return discarded_.load(std::memory_order_acquire) ? 0 : ring_.available_read();
    }
    bool generation_done() const override { return gen_done_.load(std::memory_order_acquire); }
    // Whether the reader has left room for `frames` more frames after the chunk whose audio is
    // owed (it is published first). Engine thread (the producer).
    bool room_for(int frames) const {
        return ring_.available_write() >= (size_t(frames) + owed_frames_.size()) * SAMPLES_PER_FRAME;
    }

    // An edge of the library: appended text is checked here, once, with the rule submit applies
    // to `text` (request_check.h), counting the request's text so far; the engine thread trusts it.
    void text_append(const std::string& text) override {
        if (!prepared_.incremental) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "this stream was not opened for incremental text");
        if (text_closed_.load()) fail(ErrorCode::ERROR_INVALID_ARGUMENT, "text was already closed");
        {
            std::lock_guard<std::mutex> lock(text_mutex_);
            text_check(text, "text", REQUEST_MAX_TEXT_BYTES, text_bytes_);
            text_bytes_ += text.size();
        }
        text_queue_.enqueue(text);
        wake_engine_();
    }
    // The request's own text, already checked by SpeechModel::prepare: the first piece. Submitting
    // thread, before the stream is queued.
    void text_first(const std::string& text) {
        text_bytes_ = text.size();
        if (!text.empty()) text_queue_.enqueue(text);
    }
    void text_close() override {
        text_closed_.store(true);
        wake_engine_();
    }
    void cancel() override {
        cancelled_.store(true);
        wake_engine_();
    }
    void discard() override {
        discarded_.store(true, std::memory_order_release);
        cancel();  // wait() then wakes when the engine ends the stream, within a chunk
    }

    StreamMetrics metrics() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        StreamMetrics m = metrics_;
        m.stalls = stalls_.load();
        return m;
    }
    std::string error() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        return error_;
    }
    std::vector<std::vector<int32_t>> codes() const override {
        std::lock_guard<std::mutex> lock(mutex_);
        std::vector<std::vector<int32_t>> out;
        for (const auto& f : codes_) out.emplace_back(f.begin(), f.end());
        return out;
    }
    bool event_poll(StreamEvent* out) override { return events_.read(out, 1) == 1; }
    uint64_t events_dropped() const override { return events_dropped_.load(std::memory_order_relaxed); }

    // ---- engine side ----
    // write() never allocates: the ring was made (and touched) at construction. A full ring (a
    // consumer that never polls) drops the event and counts it.
    void event_emit(StreamEventKind kind, int32_t frames = 0, StopReason reason = StopReason::STOP_NONE) {
        StreamEvent e;
        e.kind = kind;
        e.stop_reason = reason;
        e.frames = frames;
        e.frames_total = frames_emitted_ += frames;
        e.t_ms = ms_since(submitted_);
        if (events_.write(&e, 1) != 1) events_dropped_.fetch_add(1, std::memory_order_relaxed);
    }

    void publish(const std::vector<float>& pcm, const std::vector<FrameCodes>& frames) {
        const size_t written = ring_.write(pcm.data(), pcm.size());
        QTTS_ASSERT(written == pcm.size());  // the engine checked the free space first
        {
            std::lock_guard<std::mutex> lock(mutex_);
            codes_.insert(codes_.end(), frames.begin(), frames.end());
            if (metrics_.ttfa_gen_ms < 0 && !pcm.empty()) metrics_.ttfa_gen_ms = ms_since(submitted_);
            metrics_.frames += int64_t(frames.size());
            metrics_.samples += int64_t(pcm.size());
        }
        cv_.notify_all();
    }
    void finish(StopReason reason, const std::string& error) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            metrics_.stop_reason = reason;
            metrics_.generation_ms = ms_since(submitted_);
            const double audio_ms = metrics_.samples / 24.0;
            metrics_.rtf = audio_ms > 0 ? metrics_.generation_ms / audio_ms : 0.0;
            error_ = error;
        }
        event_emit(StreamEventKind::STREAM_EVENT_DONE, 0, reason);
        {
            // Set under the mutex that wait()'s predicate is checked under: stored outside it, the
            // flag and its notify could fall between a reader's check and its sleep, and that
            // reader would sleep out its whole timeout (bench-serve's closed-loop clients lost up
            // to 50 ms at a stream's end now and then). publish() takes the mutex after writing
            // the ring for the same reason.
            std::lock_guard<std::mutex> lock(mutex_);
            gen_done_.store(true, std::memory_order_release);
        }
        cv_.notify_all();
    }

    const uint64_t id_;
    PreparedSpeech prepared_;
    // Not pre-touched: its producer is the engine thread, and writing 4 MB (30 s) in submit()
    // took time from every request's first audio; the engine's writes fault the pages in.
    SpscRing<float> ring_;
    std::function<void()> wake_engine_;
    Clock::time_point submitted_;
    std::atomic<bool> cancelled_{false};
    std::atomic<bool> discarded_{false};  // discard(): the reader drops everything from now on
    std::atomic<bool> text_closed_{false};
    bool text_close_applied_ = false;  // engine thread only
    moodycamel::ConcurrentQueue<std::string> text_queue_;
    std::mutex text_mutex_;  // appending threads: orders the size check with text_bytes_
    size_t text_bytes_ = 0;  // text accepted so far (the request's and appended), under text_mutex_
    std::unique_ptr<Utterance> utterance_;  // engine thread only
    bool waiting_for_text_ = false;        // engine thread only
    uint64_t served_round_ = 0;            // engine thread only: the last round that serviced it
    // Engine thread only: the frames of the batched step whose chunk service() has not read yet (0:
    // none; the next chunk then takes chunk_size's rule).
    int batched_frames_ = 0;
    // Engine thread only: the round in which this steady stream joined the newcomers' first step
    // (a one-frame chunk ahead of its steady one: first_batch_step).
    uint64_t joined_round_ = 0;
    // Engine thread only: the round whose steady batched step made this stream's next chunk after
    // it had its first chunk earlier in the same round (service_pass then serves it again).
    uint64_t second_round_ = 0;
    uint64_t sliced_round_ = 0;  // engine thread only: the last round that ran a slice of its start
    // Engine thread only: a chunk read from a step whose decoder pass runs beside the next step
    // (batch_step): its frames, published with their samples at the stream's next service(), and
    // what its publication needs then.
    std::vector<FrameCodes> owed_frames_;
    bool owed_ends_ = false;       // the stream ends with that chunk
    bool owed_excused_ = false;    // it waited for text or its reader before that chunk
    int32_t owed_step_frames_ = 0;
    size_t text_seen_ = 0;                 // engine thread only
    // Scheduling (engine thread only; scheduler.h): the stream's real-time listener, whether it
    // waited for text or for its reader since its last chunk (a gap then is not the engine's),
    // and its place in the current round.
    PlayClock clock_;
    bool excused_ = false;
    ScheduleKey key_;

private:
    std::atomic<bool> gen_done_{false};
    std::atomic<int64_t> stalls_{0};
    bool was_empty_ = false;  // consumer thread only
    mutable std::mutex mutex_;
    std::condition_variable cv_;
    StreamMetrics metrics_;
    std::string error_;
    std::vector<FrameCodes> codes_;
    // Telemetry, engine thread -> reader (SPSC). 256 events: minutes of chunks for a reader
    // that polls now and then; beyond that they are dropped and counted.
    SpscRing<StreamEvent> events_{256};  // engine thread -> the stream's one consumer
    std::atomic<uint64_t> events_dropped_{0};
    int64_t frames_emitted_ = 0;  // engine thread only
};

}  // namespace

struct Engine::Impl {
    EngineOptions options;
    std::shared_ptr<const SpeechModel> model;
    std::thread thread;
    moodycamel::ConcurrentQueue<std::shared_ptr<StreamImpl>> intake;
    std::atomic<bool> stop{false};
    std::atomic<int64_t> admitted{0};  // queued + active streams (the concurrency limit)
    std::atomic<int64_t> queued{0};    // submitted, not yet taken from the intake (EngineLoad)
    std::atomic<double> rtf{0.0};      // recent real-time factor of the rounds (EngineLoad::rtf)
    std::atomic<uint64_t> fault_stream{0};  // test seam: this stream's next chunk fails (engine_debug.h)
    std::atomic<bool> fault_fatal{false};   // test seam: the backend is lost at the next round
    std::atomic<int64_t> chunk_delay_us{0};  // test seam: a slow backend (engine_chunk_delay_set)
    std::atomic<bool> trace_on{false};       // test seam: the service order (engine_trace_start)
    std::mutex trace_mutex;
    std::vector<EngineTraceEntry> trace;     // under trace_mutex
    size_t trace_capacity = 0;               // under trace_mutex
    std::string label;                      // the engine's name in log lines
    int batch_max = 0;                      // streams one batched LM step takes (0: the backend does not batch)
    uint64_t round = 0;                     // engine rounds so far (StreamImpl::served_round_)
    std::atomic<bool> failed{false};        // the backend failed for good (see Engine::healthy)
    std::string failure;                    // why; written once before `failed` is set
    const Clock::time_point t0 = Clock::now();  // the engine clock's zero (PlayClock times)
    CapacityMeter capacity_meter;           // engine thread only
    PrefillMeter prefill_meter;             // engine thread only: seconds per prompt row (sliced starts)
    std::atomic<double> capacity{0.0};      // capacity_meter's value, for submit (admission)
    // This round's figures (engine thread only), added to the stats at its end.
    int64_t round_batch = 0;
    EngineStats::ThreadTime round_time;     // this round's share of EngineStats::thread_time
    std::vector<float> owed_pcm;            // owed_publish_all's samples

    // Adds the wall time of its scope to one part of round_time. Engine thread.
    struct PartClock {
        const Impl& impl;
        double& part;
        const double start_s;
        PartClock(const Impl& i, double& p) : impl(i), part(p), start_s(i.now_s()) {}
        ~PartClock() { part += impl.now_s() - start_s; }
    };

    std::mutex wake_mutex;
    std::condition_variable wake_cv;
    bool wake_flag = false;

    mutable std::mutex stats_mutex;
    EngineStats stats;

    double now_s() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }

    void wake() {
        {
            std::lock_guard<std::mutex> lock(wake_mutex);
            wake_flag = true;
        }
        wake_cv.notify_one();
    }

    // Engine thread only. The utterance is dropped here, not when the last Stream reference goes
    // away on some consumer thread: its generator state (GPU KV caches on CUDA) belongs to this
    // thread and goes back to the model's pool for the next stream.
    // The slot and the statistics are released *before* the stream reports itself done, so a
    // reader that sees generation_done() can submit again at once and reads final stats.
    void finish(StreamImpl& s, StopReason reason, const std::string& error) {
        s.utterance_.reset();
        const int64_t samples = s.metrics().samples;
        admitted.fetch_sub(1);
        {
            std::lock_guard<std::mutex> lock(stats_mutex);
            stats.active_streams = admitted.load();
            if (s.clock_.underruns > 0) ++stats.streams_lagged;
            if (reason == StopReason::STOP_CANCELLED) ++stats.cancelled;
            else if (reason == StopReason::STOP_ERROR) ++stats.errors;
            else ++stats.completed;
            stats.audio_seconds += samples / double(SAMPLE_RATE);
        }
        s.finish(reason, error);
    }

    // One chunk for one stream; returns true when it made progress.
    bool service(StreamImpl& s, std::vector<float>& pcm, std::vector<FrameCodes>& frames, bool& finished) {
        finished = false;
        if (s.cancelled_.load()) {
            finish(s, StopReason::STOP_CANCELLED, "");
            finished = true;
            return true;
        }
        // The last chunk's audio first, when its decoder pass ran beside a step (its frames were
        // counted in the round that made them).
        // (Usually published already, while the next step ran: owed_publish_all.)
        const bool owed = !s.owed_frames_.empty();
        if (owed && owed_publish(s, pcm)) {
            finish(s, s.utterance_->stop_reason(), "");
            finished = true;
            return true;
        }
        std::string text;
        bool got_text = false;
        while (s.text_queue_.try_dequeue(text)) {
            s.utterance_->text_append(text);
            got_text = true;
        }
        if (s.text_closed_.load() && !s.text_close_applied_) {
            while (s.text_queue_.try_dequeue(text)) s.utterance_->text_append(text);
            s.utterance_->text_close();
            s.text_close_applied_ = true;
            got_text = true;
        }
        if (s.waiting_for_text_ && !got_text) {
            s.excused_ = true;
            return owed;
        }
        const int k = chunk_size(s);
        if (!s.room_for(k)) {  // reader is behind: backpressure
            s.excused_ = true;
            return owed;
        }
        if (fault_stream.load(std::memory_order_relaxed) == s.id()) {
            fault_stream.store(0);
            model->backend_fault_raise();
        }
        pcm.clear();
        frames.clear();
        const bool was_waiting = s.waiting_for_text_;
        const int step_frames = s.batched_frames_;  // 0: made here, alone
        const UtteranceStatus status = s.utterance_->chunk(k, &pcm, &frames);
        s.batched_frames_ = 0;  // a batched step's frames are read
        if (s.cancelled_.load()) {
            // Cancelled while the chunk was being made: its audio is not published, so a barge-in
            // (Stream::discard) has nothing new to drop and a plain cancel ends at the last chunk
            // published before it.
            finish(s, StopReason::STOP_CANCELLED, "");
            finished = true;
            return true;
        }
        s.waiting_for_text_ = status == UtteranceStatus::UTTERANCE_WAITING_FOR_TEXT && frames.empty();
        // Ended with this chunk's frames (or with none): the stream ends now, not a round later,
        // so its listener hears the end and its slot is free as soon as its last audio is out.
        const bool ends = status == UtteranceStatus::UTTERANCE_DONE || s.utterance_->done();
        if (!frames.empty() && s.utterance_->audio_owed() > 0) {
            // Its decoder pass runs beside the next step: the chunk (and an end with it) is
            // published at the stream's next service(), in the next round.
            QTTS_ASSERT(s.utterance_->audio_owed() == int(frames.size()) && pcm.empty());
            s.owed_frames_ = frames;
            s.owed_ends_ = ends;
            s.owed_excused_ = s.excused_ || was_waiting;
            s.owed_step_frames_ = step_frames;
            s.excused_ = false;
            std::lock_guard<std::mutex> lock(stats_mutex);
            ++stats.batch_overlapped_chunks;
            return true;
        }
        if (!frames.empty()) {
            chunk_publish(s, pcm, frames, s.excused_ || was_waiting, step_frames, ends);
            s.excused_ = false;
        }
        if (s.waiting_for_text_ && !was_waiting) s.event_emit(StreamEventKind::STREAM_EVENT_WAITING);
        if (ends) {
            finish(s, s.utterance_->stop_reason(), "");
            finished = true;
        }
        return owed || !frames.empty() || finished;
    }

    // The chunk whose samples a decoder pass beside a step made (its codes were read a round
    // earlier) to the stream's reader; true when the stream ends with it (the caller finishes
    // it). Engine thread.
    bool owed_publish(StreamImpl& s, std::vector<float>& pcm) {
        QTTS_ASSERT(!s.owed_frames_.empty());
        pcm.clear();
        s.utterance_->audio_take(&pcm);
        chunk_publish(s, pcm, s.owed_frames_, s.owed_excused_, s.owed_step_frames_, s.owed_ends_);
        s.owed_frames_.clear();
        return s.owed_ends_;
    }

    // Run by SpeechModel::batch_run while its step is on the device: every chunk owed by the pass
    // that ran beside it goes to its reader now, not after the step (the LM stream does not idle
    // through the publishing, and the listeners get their audio a step sooner). A cancelled
    // stream is left to service(). Streams that end with their chunk (or whose publishing
    // failed) go into `ending`, for the caller to finish once the step is back (a finished
    // stream's state is reset, which waits for the device); none is a member of the step (an
    // ended utterance has no next chunk; a member's failure fails the step). The time counts as
    // service time, not the step's (`step_part`). Engine thread.
    void owed_publish_all(std::list<std::shared_ptr<StreamImpl>>& active, const std::vector<StreamImpl*>& members,
                          std::vector<std::pair<StreamImpl*, std::string>>& ending, double& step_part) {
        const double start_s = now_s();
        const auto member = [&members](const StreamImpl* s) {
            return std::find(members.begin(), members.end(), s) != members.end();
        };
        for (auto& s : active) {
            if (s->owed_frames_.empty() || s->cancelled_.load()) continue;
            try {
                if (!owed_publish(*s, owed_pcm)) continue;
                QTTS_ASSERT(!member(s.get()));
                ending.emplace_back(s.get(), std::string());
            } catch (const std::exception& e) {
                if (member(s.get())) throw;  // the step fails with it (batch_failed ends its members)
                QTTS_LOG_WARN("stream {} failed: {}", s->id(), e.what());
                ending.emplace_back(s.get(), e.what());
            }
        }
        const double spent = now_s() - start_s;
        round_time.service_s += spent;
        step_part -= spent;
    }

    // Finishes the streams that owed_publish_all found ending (with their error, if publishing
    // failed) and drops them from `active`. Engine thread.
    void owed_finish(std::list<std::shared_ptr<StreamImpl>>& active,
                     const std::vector<std::pair<StreamImpl*, std::string>>& ending) {
        std::vector<StreamImpl*> gone;
        for (const auto& [s, error] : ending) {
            if (error.empty()) finish(*s, s->utterance_->stop_reason(), "");
            else finish(*s, StopReason::STOP_ERROR, error);
            gone.push_back(s);
        }
        streams_remove(active, gone);
    }

    // A chunk's audio to the stream's reader: the listener's clock (an underrun when it came late,
    // unless `excused`), the ring, the CHUNK event and the test seams. Engine thread.
    void chunk_publish(StreamImpl& s, const std::vector<float>& pcm, const std::vector<FrameCodes>& frames,
                       bool excused, int32_t step_frames, bool ends) {
        const double gap = play_clock_publish(s.clock_, now_s(), int64_t(pcm.size()), excused);
        if (gap > 0.0) {
            // Into the stats before the chunk is published: a reader that sees the stream end
            // (finish() may come in this call) reads its underruns counted, not a round later.
            std::lock_guard<std::mutex> lock(stats_mutex);
            ++stats.underruns;
            stats.underrun_seconds += gap;
        }
        s.publish(pcm, frames);
        s.event_emit(StreamEventKind::STREAM_EVENT_CHUNK, int32_t(frames.size()));
        seams_after_chunk(s, int32_t(frames.size()), step_frames, ends);
    }

    // The frames of the stream's next chunk: those of the batched step that made it, else one
    // frame for a first chunk and the steady size after it.
    int chunk_size(const StreamImpl& s) const {
        if (s.batched_frames_ > 0) return s.batched_frames_;
        return s.utterance_->frames() == 0 ? options.first_chunk_frames : options.chunk_frames;
    }

    // Nothing to make for the stream now: it waits for text (and none came), or its reader is
    // behind (the ring has no room for its next chunk). Engine thread.
    bool held(StreamImpl& s) const {
        const bool text_pending = s.text_queue_.size_approx() > 0 || (s.text_closed_.load() && !s.text_close_applied_);
        if (s.waiting_for_text_ && !text_pending) return true;
        return !s.room_for(chunk_size(s));
    }

    // The round's order (scheduler.h): first chunks, then by earliest deadline (the stream whose
    // listener runs dry first), then held streams; a stable sort keeps ties in arrival order. The
    // passes of the round, and the batched step's choice of streams, follow it. Engine thread.
    void schedule(std::list<std::shared_ptr<StreamImpl>>& active) {
        for (auto& s : active) {
            s->key_.first_chunk = s->utterance_->frames() == 0;
            s->key_.held = held(*s);
            s->key_.deadline_s = play_clock_deadline(s->clock_);
        }
        active.sort([](const std::shared_ptr<StreamImpl>& a, const std::shared_ptr<StreamImpl>& b) {
            return schedule_before(a->key_, b->key_);
        });
    }

    // Test seams after a chunk that made audio (engine_debug.h); nothing when they are off.
    void seams_after_chunk(const StreamImpl& s, int32_t frames, int32_t step_frames, bool ends) {
        if (trace_on.load(std::memory_order_relaxed)) {
            std::lock_guard<std::mutex> lock(trace_mutex);
            if (trace.size() < trace_capacity)
                trace.push_back(EngineTraceEntry{round, s.id(), frames, step_frames > 0, ends, step_frames});
        }
        if (const int64_t us = chunk_delay_us.load(std::memory_order_relaxed); us > 0)
            std::this_thread::sleep_for(std::chrono::microseconds(us));
    }

    // Batched LM steps (CUDA, cpu-fast), two per round. First the newcomers: their first segments start
    // together (their prompt prefills in shared passes, SpeechModel::batch_start), then their
    // first chunks are made in one step, so that a round with several new requests pays one
    // prefill pass and one frame step for all of them instead of one each. The steady streams
    // whose readers have room join that step (a one-frame chunk ahead of their steady one): a
    // frame step costs about the same for a few more rows, so the step that a newcomer needs
    // anyway makes a frame for every stream instead of one for it alone (docs/engine.md, "Streams
    // due together share one LM step"). Then the streams whose next chunk is a steady one and can be made now.
    // service() then reads (and, where the batched decoder pass did not, decodes) each stream's
    // frames as usual. A lone newcomer with no steady stream to join it, or a lone steady
    // stream, takes its own, faster, single-stream path in service(). Streams waiting for text,
    // for their reader, or between sentences are left to service(). The list is in the round's
    // order, so when more streams could join than one step takes, the most urgent ones do.
    // Engine thread.
    void first_batch_step(std::list<std::shared_ptr<StreamImpl>>& active) {
        const int k = options.first_chunk_frames;
        const auto newcomer = [this, k](const StreamImpl& s) {
            return !s.cancelled_.load() && !s.waiting_for_text_ && s.utterance_->frames() == 0 &&
                   !s.utterance_->start_pending() && s.served_round_ != round && s.room_for(k);
        };
        // A steady stream with room for this chunk and its steady one after it (so it still
        // joins this round's steady step).
        const auto joiner = [this, k](const StreamImpl& s) {
            return !s.cancelled_.load() && !s.waiting_for_text_ && s.utterance_->frames() > 0 &&
                   s.served_round_ != round && s.room_for(k + options.chunk_frames);
        };
        const auto newcomers = std::count_if(active.begin(), active.end(), [&](const auto& s) { return newcomer(*s); });
        if (newcomers == 0) return;
        if (newcomers == 1 && std::none_of(active.begin(), active.end(), [&](const auto& s) { return joiner(*s); }))
            return;  // one newcomer alone: its own path in service()
        if (newcomers >= 2) {
            const PartClock clock(*this, round_time.starts_s);
            first_batch_start(active, newcomer);
            // Requests that arrived during those prefills (a burst: the clients of streams that
            // ended together resubmit over a few hundred microseconds) start now as well and
            // share the first step, instead of a first step of their own in the round's second
            // phase.
            if (!failed.load() && intake_drain(active) > 0) first_batch_start(active, newcomer);
        }
        if (failed.load()) return;
        std::vector<ChunkGenerator*> generators;
        std::vector<StreamImpl*> members;
        // first_candidate() starts a newcomer that no batched start took (one alone, with steady
        // streams to join it): its prefill is start time too.
        std::optional<PartClock> start_clock(std::in_place, *this, round_time.starts_s);
        for (auto it = active.begin(); it != active.end() && int(generators.size()) < batch_max;) {
            StreamImpl& s = **it;
            if (!newcomer(s)) {
                ++it;
                continue;
            }
            try {
                if (ChunkGenerator* g = s.utterance_->first_candidate(k)) {
                    generators.push_back(g);
                    members.push_back(&s);
                }
                ++it;
            } catch (const std::exception& e) {  // its prefill failed: that stream ends, as in service()
                QTTS_LOG_WARN("stream {} failed: {}", s.id(), e.what());
                finish(s, StopReason::STOP_ERROR, e.what());
                it = active.erase(it);
                if (!model->backend_recover()) {
                    backend_lost(active, e.what());
                    return;
                }
            }
        }
        start_clock.reset();
        if (!generators.empty())
            for (auto& s : active) {
                if (int(generators.size()) == batch_max) break;
                if (!joiner(*s)) continue;
                if (ChunkGenerator* g = s->utterance_->batch_candidate(k)) {
                    generators.push_back(g);
                    members.push_back(s.get());
                    s->joined_round_ = round;
                }
            }
        // One candidate alone makes its chunk in service() with its own graph (prefill done).
        const PartClock clock(*this, round_time.first_steps_s);
        if (generators.size() >= 2) batch_run(active, generators, members, k, round_time.first_steps_s);
    }

    // The newcomers' first segment starts, run together (at most one batch of them, in the
    // round's order). One left alone starts in first_candidate() as before. A start refused for
    // its own request ends that stream with the reason; a failed device step ends them all, as a
    // failed batched step does. Engine thread.
    template <typename Newcomer>
    void first_batch_start(std::list<std::shared_ptr<StreamImpl>>& active, const Newcomer& newcomer) {
        std::vector<GenerationStart> starts;
        std::vector<StreamImpl*> members;
        for (auto it = active.begin(); it != active.end() && int(starts.size()) < batch_max;) {
            StreamImpl& s = **it;
            try {
                if (newcomer(s))
                    if (std::optional<GenerationStart> start = s.utterance_->first_request()) {
                        starts.push_back(std::move(*start));
                        members.push_back(&s);
                    }
                ++it;
            } catch (const std::exception& e) {  // its prompt could not be built
                finish(s, StopReason::STOP_ERROR, e.what());
                it = active.erase(it);
            }
        }
        if (starts.size() < 2) return;
        try {
            model->batch_start(starts);
        } catch (const std::exception& e) {
            batch_failed(active, members, "start", e);
            return;
        }
        std::vector<StreamImpl*> refused;
        int64_t started = 0;
        for (size_t i = 0; i < starts.size(); ++i) {
            if (!starts[i].error.empty()) {
                QTTS_LOG_WARN("stream {} failed: {}", members[i]->id(), starts[i].error);
                finish(*members[i], StopReason::STOP_ERROR, starts[i].error);
                refused.push_back(members[i]);
                continue;
            }
            members[i]->utterance_->first_started();
            ++started;
        }
        streams_remove(active, refused);
        std::lock_guard<std::mutex> lock(stats_mutex);
        if (started >= 2) stats.batch_started += started;
    }

    // Sliced starts (EngineOptions::prefill_slice; docs/engine.md, "Sliced starts"): while other
    // streams play, a segment start whose prompt is longer than the round's slice runs that many
    // prompt rows per round, here, before the round's steps, instead of stalling every other
    // stream for its whole prefill; when no other stream has audio to play, the rest of it runs at
    // once. The slice is prefill_slice rows, more where the playing streams' buffered audio covers
    // them (prefill_slice_by_deadline; scheduler.h, prefill_slice_rows). One slice per stream and
    // round. Shorter prompts start as before. A start refused for its own request ends that
    // stream; a backend failure is handled as in service(). Returns true when it ran a slice
    // (progress: the round is not an idle one). Engine thread.
    bool prefill_slices(std::list<std::shared_ptr<StreamImpl>>& active) {
        if (options.prefill_slice == 0) return false;
        bool ran = false;
        const Margins margins = margins_of(active);
        for (auto it = active.begin(); it != active.end();) {
            StreamImpl& s = **it;
            Utterance& u = *s.utterance_;
            // Reference frames (in-context cloning) a steady chunk's worth a round, grown with
            // the rows.
            const int rows = slice_rows(margins, s);
            const int ref_frames =
                rows == 0 ? 0 : int(std::max<int64_t>(1, int64_t(options.chunk_frames) * rows / options.prefill_slice));
            u.start_slice_set(rows, ref_frames);
            if (s.cancelled_.load() || s.sliced_round_ == round || !u.start_pending()) {
                ++it;
                continue;
            }
            s.sliced_round_ = round;
            try {
                const PartClock clock(*this, round_time.starts_s);
                if (fault_stream.load(std::memory_order_relaxed) == s.id()) {
                    fault_stream.store(0);
                    model->backend_fault_raise();
                }
                const double slice_start_s = now_s();
                const int rows_run = u.start_advance();  // prompt rows (0 for reference frames)
                prefill_meter.slice_add(rows_run, now_s() - slice_start_s);
                ran = true;
                std::lock_guard<std::mutex> lock(stats_mutex);
                ++stats.prefill_slices;
                if (!u.start_pending()) ++stats.sliced_starts;
                ++it;
            } catch (const std::exception& e) {
                QTTS_LOG_WARN("stream {} failed: {}", s.id(), e.what());
                finish(s, StopReason::STOP_ERROR, e.what());
                it = active.erase(it);
                ran = true;
                if (!model->backend_recover()) {
                    backend_lost(active, e.what());
                    return true;
                }
            }
        }
        return ran;
    }

    // The playing streams (audio made, not ended) as sliced starts see them: how many, and the
    // two smallest margins (seconds until the listener has played all that was published) among
    // those that can be served; a held one (waiting for text, or its reader behind) has its audio
    // in hand and does not count. Engine thread.
    struct Margins {
        int64_t players = 0;
        const StreamImpl* first = nullptr;  // the stream with the smallest margin
        double first_s = std::numeric_limits<double>::infinity();
        double second_s = std::numeric_limits<double>::infinity();
    };
    static bool playing(const StreamImpl& s) { return s.utterance_->frames() > 0 && !s.utterance_->done(); }
    Margins margins_of(std::list<std::shared_ptr<StreamImpl>>& active) {
        Margins m;
        const double now = now_s();
        for (auto& x : active) {
            if (!playing(*x)) continue;
            ++m.players;
            if (held(*x)) continue;
            const double margin = play_clock_deadline(x->clock_) - now;
            if (margin < m.first_s) {
                m.second_s = m.first_s;
                m.first_s = margin;
                m.first = x.get();
            } else {
                m.second_s = std::min(m.second_s, margin);
            }
        }
        return m;
    }

    // The rows stream s's start may prefill this round (Utterance::start_slice_set): 0 (whole)
    // when no other stream is playing, else prefill_slice, grown by the other playing streams'
    // smallest margin when prefill_slice_by_deadline. Engine thread.
    int slice_rows(const Margins& m, const StreamImpl& s) const {
        if (m.players - (playing(s) ? 1 : 0) == 0) return 0;
        if (!options.prefill_slice_by_deadline) return options.prefill_slice;
        const double slack_s = m.first == &s ? m.second_s : m.first_s;
        return prefill_slice_rows(options.prefill_slice, PREFILL_SLICE_MAX, slack_s, prefill_meter.row_s());
    }

    // The steady step: every stream whose next chunk is a steady one and can be made now, in the
    // round's (deadline) order, the steady streams that joined the newcomers' first step among
    // them. When there is one (a step runs anyway: batched, or one stream's own), the streams that
    // had their first chunk earlier in this round join it while it has room, so that their second
    // chunk comes in the same round: requests that reached the engine a round after the others of
    // their wave (a closed loop's clients do not all resubmit within one round's intake) fall into
    // step with them instead of staying a round apart for their whole life, with a partial step
    // at each end (docs/performance.md, "Twentieth session"); and their listeners have 5 frames
    // after their first round instead of 1. A round of newcomers alone gets no step for them: it
    // would make the requests arriving meanwhile wait for it. service_pass serves the members it
    // served earlier in this round a second time (second_round_). Engine thread.
    void batch_step(std::list<std::shared_ptr<StreamImpl>>& active) {
        const int k = options.chunk_frames;
        std::vector<ChunkGenerator*> generators;
        std::vector<StreamImpl*> members;
        std::vector<StreamImpl*> seconds;  // the members served earlier in this round
        for (const bool newcomers : {false, true}) {
            if (newcomers && generators.empty()) break;  // no step anyway: none is made for them
            for (auto& s : active) {
                if (int(generators.size()) == batch_max) break;
                if (s->cancelled_.load() || s->waiting_for_text_ || s->utterance_->frames() == 0) continue;
                const bool served = s->served_round_ == round;
                if ((served && s->joined_round_ != round) != newcomers) continue;  // first chunk this round
                if (!s->room_for(k)) continue;
                if (ChunkGenerator* g = s->utterance_->batch_candidate(k)) {
                    generators.push_back(g);
                    members.push_back(s.get());
                    if (served) seconds.push_back(s.get());
                }
            }
        }
        const PartClock clock(*this, round_time.steps_s);
        if (generators.size() < 2) {  // one stream alone takes its own path in service()
            for (StreamImpl* s : seconds) s->second_round_ = round;  // a joiner of the first step: again
            return;
        }
        // A step of streams that all end within the chunk (their frame limits: capped requests,
        // the text-length budget) makes only as many frames as the longest of them keeps: a wave
        // of capped streams ending together would otherwise pay a whole chunk's frames for its
        // last one or two.
        int frames = 0;
        for (const ChunkGenerator* g : generators) {
            const int left = g->frames_left();
            frames = std::max(frames, left < 0 ? k : std::min(k, left));
        }
        QTTS_ASSERT(frames >= 1);  // batch_ready: every candidate has a frame left
        // The step's decoder pass may run beside the next round's step when every member's
        // listener has audio enough for its chunk to come a round later (scheduler.h) and some
        // member goes on after it (else no step follows for the pass to run beside); the backend
        // decides whether the step allows it (whole chunks).
        const double now = now_s();
        const bool goes_on = std::any_of(generators.begin(), generators.end(), [frames](const ChunkGenerator* g) {
            return g->frames_left() < 0 || g->frames_left() > frames;
        });
        const bool defer = goes_on && std::all_of(members.begin(), members.end(), [now](const StreamImpl* s) {
            return play_clock_can_wait(s->clock_, now);
        });
        if (batch_run(active, generators, members, frames, round_time.steps_s, defer))
            for (StreamImpl* s : seconds) s->second_round_ = round;
    }

    // One batched step of `frames` frames for `members` (their generators), then the stats; while
    // it runs, the chunks owed by the pass beside it are published (owed_publish_all; its time
    // leaves `step_part`, the round_time part that the caller's clock counts the step in). A
    // failed step ends its streams with the error (their device state is unknown; returns false);
    // the others go on if the device still works. Engine thread.
    bool batch_run(std::list<std::shared_ptr<StreamImpl>>& active, const std::vector<ChunkGenerator*>& generators,
                   const std::vector<StreamImpl*>& members, int frames, double& step_part, bool defer_audio = false) {
        int decoded = 0;  // chunks the batched decoder pass made audio for
        std::vector<std::pair<StreamImpl*, std::string>> ending;  // published their last chunk meanwhile
        const auto meanwhile = [&] { owed_publish_all(active, members, ending, step_part); };
        try {
            decoded = model->batch_run(generators, frames, defer_audio, meanwhile);
        } catch (const std::exception& e) {
            owed_finish(active, ending);
            batch_failed(active, members, "step", e);
            return false;
        }
        owed_finish(active, ending);
        for (StreamImpl* s : members) s->batched_frames_ = frames;
        round_batch = std::max(round_batch, int64_t(generators.size()));
        std::lock_guard<std::mutex> lock(stats_mutex);
        if (stats.batch_histogram.size() <= generators.size()) stats.batch_histogram.resize(generators.size() + 1, 0);
        ++stats.batch_histogram[generators.size()];
        stats.batch_decoded_chunks += decoded;
        return true;
    }

    // A batched device call (`what`: "step", "start") for `members` failed: they end with its error
    // (their device state is unknown); the others go on if the backend still works. Engine thread.
    void batch_failed(std::list<std::shared_ptr<StreamImpl>>& active, const std::vector<StreamImpl*>& members,
                      const char* what, const std::exception& e) {
        QTTS_LOG_WARN("a batched {} of {} streams failed: {}", what, members.size(), e.what());
        for (StreamImpl* s : members) finish(*s, StopReason::STOP_ERROR, e.what());
        streams_remove(active, members);
        if (!model->backend_recover()) backend_lost(active, e.what());
    }

    // Takes `gone` (streams already finished) out of `active`. Engine thread.
    static void streams_remove(std::list<std::shared_ptr<StreamImpl>>& active, const std::vector<StreamImpl*>& gone) {
        active.remove_if([&gone](const std::shared_ptr<StreamImpl>& s) {
            return std::find(gone.begin(), gone.end(), s.get()) != gone.end();
        });
    }

    // Takes the streams submitted since the last call into `active` (each gets its utterance and
    // its STARTED event; one whose utterance cannot be made ends with the error). Returns how
    // many joined. Engine thread.
    int intake_drain(std::list<std::shared_ptr<StreamImpl>>& active) {
        int joined = 0;
        std::shared_ptr<StreamImpl> incoming;
        while (intake.try_dequeue(incoming)) {
            queued.fetch_sub(1);
            if (failed.load()) {  // submitted while the backend was being lost
                finish(*incoming, StopReason::STOP_ERROR, failure);
                continue;
            }
            try {
                incoming->utterance_ = std::make_unique<Utterance>(model, incoming->prepared_);
                incoming->event_emit(StreamEventKind::STREAM_EVENT_STARTED);
                active.push_back(incoming);
                ++joined;
            } catch (const std::exception& e) {
                finish(*incoming, StopReason::STOP_ERROR, e.what());
                if (!model->backend_recover()) backend_lost(active, e.what());
            }
        }
        return joined;
    }

    // The backend cannot work any more (a sticky device error after `what`): every other admitted
    // stream ends with an error now, and submit() refuses new ones. Engine thread.
    void backend_lost(std::list<std::shared_ptr<StreamImpl>>& active, const std::string& what) {
        failure = "the " + model->backend_name() + " backend failed and serves no more streams: " + what;
        failed.store(true);
        QTTS_LOG_ERROR("engine {} is out of service: {}", label, failure);
        for (auto& s : active)
            if (!s->generation_done()) finish(*s, StopReason::STOP_ERROR, failure);
        std::shared_ptr<StreamImpl> left;
        while (intake.try_dequeue(left)) {
            queued.fetch_sub(1);
            finish(*left, StopReason::STOP_ERROR, failure);
        }
    }

    // Engine::submit and engine_submit_debug, on the caller's thread: prepare() is the one
    // validation point; what it accepted is queued for the engine thread as it is.
    std::shared_ptr<Stream> submit(const SpeechRequest& request, const SpeechRequestDebug& debug) {
        if (failed.load()) fail(ErrorCode::ERROR_CUDA, "{}", failure);
        PreparedSpeech prepared = model->prepare(request, debug);  // throws on a bad request
        // The slot is taken first, so concurrent submits see each other in the count.
        const int64_t before = admitted.fetch_add(1);
        if (before >= options.max_streams) {
            admitted.fetch_sub(1);
            refusal_count(false);
            fail(ErrorCode::ERROR_BUSY, "the engine is at its limit of {} concurrent streams; retry later",
                 options.max_streams);
        }
        const double measured = capacity.load(std::memory_order_relaxed);
        if (options.admission && !admission_allows(before, measured, options.admission_headroom)) {
            admitted.fetch_sub(1);
            refusal_count(true);
            fail(ErrorCode::ERROR_BUSY,
                 "the engine is at its real-time capacity: {} streams admitted, and it sustains about {:.1f} streams at "
                 "real time (measured; admission headroom {}); retry later",
                 before, measured, options.admission_headroom);
        }
        const size_t ring = size_t(std::max(1.0, options.ring_seconds) * SAMPLE_RATE) +
                            size_t(std::max(options.chunk_frames, options.first_chunk_frames)) * SAMPLES_PER_FRAME;
        auto stream = std::make_shared<StreamImpl>(g_stream_id_next.fetch_add(1), std::move(prepared), ring, [this] { wake(); });
        // Incremental text: the request's own text (checked by prepare) is the first piece.
        if (request.incremental) stream->text_first(request.text);
        {
            std::lock_guard<std::mutex> lock(stats_mutex);
            ++stats.requests;
            stats.active_streams = admitted.load();
        }
        queued.fetch_add(1);
        intake.enqueue(stream);
        wake();
        return stream;
    }

    void refusal_count(bool capacity_refusal) {
        std::lock_guard<std::mutex> lock(stats_mutex);
        ++(capacity_refusal ? stats.refused_capacity : stats.refused_limit);
    }

    void run() {
        const double run_start_s = now_s();  // EngineStats::thread_time counts from here
        std::list<std::shared_ptr<StreamImpl>> active;
        std::vector<float> pcm;
        std::vector<FrameCodes> frames;
        while (!stop.load()) {
            if (fault_fatal.exchange(false) && !failed.load()) {
                try {
                    model->backend_fault_raise();
                } catch (const std::exception& e) {
                    backend_lost(active, e.what());
                    active.clear();
                }
            }
            const double work_start_s = now_s();  // a newcomer's prompt prefill is engine work too
            intake_drain(active);
            bool progressed = false;
            const Clock::time_point round_start = Clock::now();
            int64_t round_frames = 0;   // frames made this round, all streams
            int64_t round_streams = 0;  // streams that made frames this round
            ++round;
            round_batch = 0;
            round_time = {};
            // A round: first chunks first (time to first audio does not wait for the others'
            // chunks; CUDA: two newcomers or more start together, and their first chunks are
            // made in one batched step that the steady streams join), then
            // the first chunks of requests that arrived meanwhile (they have no audio yet; the
            // steady streams have theirs buffered), then the batched LM step of the streams due
            // together, joined by the round's newcomers when it runs (CUDA), then every other
            // stream's chunk; each pass in deadline order (schedule).
            schedule(active);
            // First chunks, and the chunks that steady streams made in the newcomers' first step.
            const auto first_chunk = [this](const StreamImpl& s) {
                return s.utterance_->frames() == 0 || s.joined_round_ == round;
            };
            const auto every = [](const StreamImpl&) { return true; };
            for (int phase = 0; phase < 2 && !failed.load(); ++phase) {
                if (phase == 1 && intake_drain(active) == 0) break;
                progressed |= prefill_slices(active);
                if (!failed.load() && batch_max >= 2) first_batch_step(active);
                if (!failed.load()) service_pass(active, first_chunk, pcm, frames, progressed, round_frames, round_streams);
            }
            if (!failed.load() && batch_max >= 2) batch_step(active);
            if (!failed.load()) service_pass(active, every, pcm, frames, progressed, round_frames, round_streams);
            if (failed.load()) active.clear();
            rtf_update(active.empty(), round_start, round_frames, round_streams);
            round_finish(active, work_start_s, round_frames, run_start_s);
            if (!progressed) {
                const double idle_s = now_s();
                std::unique_lock<std::mutex> lock(wake_mutex);
                wake_cv.wait_for(lock, std::chrono::milliseconds(20), [&] { return wake_flag || stop.load(); });
                wake_flag = false;
                lock.unlock();
                std::lock_guard<std::mutex> stats_lock(stats_mutex);
                stats.thread_time.idle_s += now_s() - idle_s;
                stats.thread_time.total_s = now_s() - run_start_s;
            }
        }
        for (auto& s : active) finish(*s, StopReason::STOP_CANCELLED, "engine stopped");
        std::shared_ptr<StreamImpl> left;
        while (intake.try_dequeue(left)) {
            queued.fetch_sub(1);
            finish(*left, StopReason::STOP_CANCELLED, "engine stopped");
        }
        // GPU objects are torn down on the thread that owns them (run() only returns from ~Engine).
        model.reset();
    }

    // One chunk for each active stream that `wanted` selects (and that this round has not served
    // yet); finished streams leave the list. Engine thread.
    template <typename Wanted>
    void service_pass(std::list<std::shared_ptr<StreamImpl>>& active, Wanted wanted, std::vector<float>& pcm,
                      std::vector<FrameCodes>& frames, bool& progressed, int64_t& round_frames,
                      int64_t& round_streams) {
        const PartClock clock(*this, round_time.service_s);
        for (auto it = active.begin(); it != active.end();) {
            // Served once a round, except a stream whose second chunk the steady step made after
            // its first chunk this round (batch_step).
            const bool again = (*it)->served_round_ == round;
            if ((again && (*it)->second_round_ != round) || !wanted(**it)) {
                ++it;
                continue;
            }
            (*it)->served_round_ = round;
            (*it)->second_round_ = 0;
            bool finished = false;
            frames.clear();  // service() may return before it makes any
            try {
                progressed |= service(**it, pcm, frames, finished);
                if (!frames.empty()) {
                    round_frames += int64_t(frames.size());
                    if (!again) ++round_streams;
                }
            } catch (const std::exception& e) {
                QTTS_LOG_WARN("stream {} failed: {}", (*it)->id(), e.what());
                finish(**it, StopReason::STOP_ERROR, e.what());
                finished = true;
                if (!model->backend_recover()) backend_lost(active, e.what());
            }
            if (failed.load()) return;  // backend_lost ended every stream
            it = finished ? active.erase(it) : std::next(it);
        }
    }

    // After a round: the capacity measurement, the scheduling gauges and counters in the stats.
    // Engine thread.
    void round_finish(std::list<std::shared_ptr<StreamImpl>>& active, double work_start_s, int64_t round_frames,
                      double run_start_s) {
        const double now = now_s();
        if (round_frames > 0)
            capacity_meter.round_add(now - work_start_s, double(round_frames) * SAMPLES_PER_FRAME / SAMPLE_RATE);
        capacity.store(capacity_meter.capacity(), std::memory_order_relaxed);
        double lag_max = 0.0;
        double lag_sum = 0.0;
        int64_t playing = 0;
        int64_t waiting_first = 0;
        for (auto& s : active) {
            if (s->clock_.started) {
                const double lag = play_clock_lag(s->clock_, now, held(*s));
                lag_max = std::max(lag_max, lag);
                lag_sum += lag;
                ++playing;
            } else if (!s->waiting_for_text_) {
                ++waiting_first;
            }
        }
        std::lock_guard<std::mutex> lock(stats_mutex);
        stats.batch_size = round_batch;
        stats.queue_depth = std::max<int64_t>(0, queued.load()) + waiting_first;
        stats.lag_max_s = lag_max;
        stats.lag_mean_s = playing > 0 ? lag_sum / double(playing) : 0.0;
        stats.capacity = capacity_meter.capacity();
        EngineStats::ThreadTime& t = stats.thread_time;
        t.starts_s += round_time.starts_s;
        t.first_steps_s += round_time.first_steps_s;
        t.steps_s += round_time.steps_s;
        t.service_s += round_time.service_s;
        t.total_s = now - run_start_s;
    }

    // EngineLoad::rtf after one round: the round's wall time over the audio an average stream got
    // from it. A serial engine's round grows with its streams, so this is what each of its
    // listeners sees. A round where nothing was made (every stream waiting for text, or for its
    // reader: ahead of real time) brings it down; 0 once no stream is left.
    void rtf_update(bool idle, Clock::time_point round_start, int64_t round_frames, int64_t round_streams) {
        const double previous = rtf.load(std::memory_order_relaxed);
        if (idle) {
            rtf.store(0.0, std::memory_order_relaxed);
            return;
        }
        if (round_frames == 0) {
            const double decayed = previous * (1.0 - kRtfSmoothing);
            rtf.store(decayed < 1e-3 ? 0.0 : decayed, std::memory_order_relaxed);
            return;
        }
        const double audio_ms_per_stream = double(round_frames) / double(round_streams) * SAMPLES_PER_FRAME * 1000.0 / SAMPLE_RATE;
        const double round_rtf = ms_since(round_start) / audio_ms_per_stream;
        rtf.store(previous == 0.0 ? round_rtf : previous + kRtfSmoothing * (round_rtf - previous), std::memory_order_relaxed);
    }
};

Engine::Engine(const EngineOptions& options) : impl_(std::make_unique<Impl>()) {
    impl_->options = options;
    if (options.max_streams < 0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "max_streams must be >= 1, or MAX_STREAMS_AUTO (0: as many as fit)");
    const bool streams_fit = options.max_streams == MAX_STREAMS_AUTO;
    if (!std::isfinite(options.admission_headroom) || options.admission_headroom < 0.05 || options.admission_headroom > 4.0)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "admission_headroom must be from 0.05 to 4, got {}", options.admission_headroom);
    if (options.prefill_slice < 0 || options.prefill_slice > PREFILL_SLICE_MAX)
        fail(ErrorCode::ERROR_INVALID_ARGUMENT, "prefill_slice must be 0 (off) to {} prompt rows, got {}",
             PREFILL_SLICE_MAX, options.prefill_slice);
    const std::string dir = options.model_dir.empty() ? default_model_dir() : options.model_dir;
    BackendOptions mo = options.backend;
    // CUDA: one generator state (KV caches, graphs) per admitted stream, all made at load, so a
    // new stream never allocates or captures on the engine thread while others are speaking.
    mo.states = streams_fit ? MAX_STREAMS_DEFAULT : options.max_streams;
    mo.states_fit = streams_fit;  // auto: as many states as the device memory holds (engine limit = that)
    // The engine alone picks chunk sizes (service()); the backend captures a graph for each.
    mo.chunk_sizes = {options.first_chunk_frames};
    if (options.chunk_frames != options.first_chunk_frames) mo.chunk_sizes.push_back(options.chunk_frames);
    backend_options_validate(mo);  // here, on the caller's thread, before the engine thread starts
    impl_->label = options.label;
    // The engine thread loads (and so owns) the model: GPU buffers and graphs are created there.
    std::promise<void> loaded;
    auto loaded_future = loaded.get_future();
    Impl* impl = impl_.get();
    impl_->thread = std::thread([impl, dir, mo, streams_fit, &loaded]() {
        try {
            impl->model = SpeechModel::load(dir, mo);
            if (streams_fit) impl->options.max_streams = impl->model->stream_slots();
            if (impl->label.empty()) impl->label = impl->model->backend_name();
            impl->batch_max = impl->model->batch_max();
            loaded.set_value();
        } catch (...) {
            loaded.set_exception(std::current_exception());
            return;
        }
        impl->run();
    });
    try {
        loaded_future.get();
    } catch (...) {
        impl_->thread.join();
        throw;
    }
    QTTS_LOG_INFO("engine ready: {} on {}{}", dir, impl_->model->backend_name(),
                  impl_->label == impl_->model->backend_name() ? std::string() : " (" + impl_->label + ")");
}

Engine::~Engine() {
    impl_->stop.store(true);
    impl_->wake();
    if (impl_->thread.joinable()) impl_->thread.join();
}

std::shared_ptr<Stream> Engine::submit(const SpeechRequest& request) { return impl_->submit(request, {}); }

EngineStats Engine::stats() const {
    std::lock_guard<std::mutex> lock(impl_->stats_mutex);
    EngineStats s = impl_->stats;
    s.active_streams = impl_->admitted.load();
    return s;
}

EngineLoad Engine::load() const {
    EngineLoad l;
    l.queued = std::max<int64_t>(0, impl_->queued.load());
    l.active = std::max<int64_t>(0, impl_->admitted.load() - l.queued);
    l.max_streams = impl_->options.max_streams;
    l.rtf = impl_->rtf.load(std::memory_order_relaxed);
    return l;
}

ModelInfo Engine::model_info() const {
    const SpeechModel& model = *impl_->model;
    const ModelConfig& config = model.checkpoint().config;
    ModelInfo info;
    info.dir = model.checkpoint().dir;
    info.type = model_type_name(config.type);
    info.size = config.size_tag;
    info.speakers = model.speakers();
    info.languages = model.languages();
    info.code_groups = config.talker.num_code_groups;
    return info;
}

std::vector<std::string> Engine::speakers() const { return impl_->model->speakers(); }
std::vector<std::string> Engine::languages() const { return impl_->model->languages(); }
std::string Engine::backend_name() const { return impl_->model->backend_name(); }
bool Engine::healthy() const { return !impl_->failed.load(); }
std::string Engine::failure() const { return impl_->failed.load() ? impl_->failure : std::string(); }

// The friend of Engine (engine/api/qtts.h) through which the seams of engine_debug.h reach it.
struct EngineDebug {
    static Engine::Impl& impl(Engine& engine) { return *engine.impl_; }
};

std::shared_ptr<Stream> engine_submit_debug(Engine& engine, const SpeechRequest& request, const SpeechRequestDebug& debug) {
    return EngineDebug::impl(engine).submit(request, debug);
}

void engine_fault_inject(Engine& engine, uint64_t stream_id) {
    auto& impl = EngineDebug::impl(engine);
    impl.fault_stream.store(stream_id);
    impl.wake();
}

void engine_fault_inject_fatal(Engine& engine) {
    auto& impl = EngineDebug::impl(engine);
    impl.fault_fatal.store(true);
    impl.wake();
}

void engine_chunk_delay_set(Engine& engine, std::chrono::microseconds delay) {
    EngineDebug::impl(engine).chunk_delay_us.store(std::max<int64_t>(0, delay.count()));
}

void engine_trace_start(Engine& engine, size_t capacity) {
    auto& impl = EngineDebug::impl(engine);
    {
        std::lock_guard<std::mutex> lock(impl.trace_mutex);
        impl.trace.clear();
        impl.trace.reserve(capacity);
        impl.trace_capacity = capacity;
    }
    impl.trace_on.store(true);
}

std::vector<EngineTraceEntry> engine_trace_take(Engine& engine) {
    auto& impl = EngineDebug::impl(engine);
    std::lock_guard<std::mutex> lock(impl.trace_mutex);
    std::vector<EngineTraceEntry> out;
    out.swap(impl.trace);
    impl.trace.reserve(impl.trace_capacity);
    return out;
}

}  // namespace qtts
