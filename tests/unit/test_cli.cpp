// The qtts command line as users run it: the real binary (build/qtts) with the embedded demo
// model, its exit status, its messages and the files it leaves behind.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "audio_io/wav_writer.h"
#include "engine/api/qtts.h"
#include "engine/common/device.h"
#include "test_support.h"

namespace {

namespace fs = std::filesystem;

struct Run {
    int exit_code = -1;
    std::string out;
    std::string err;
};

std::string qtts_exe() {
    const std::string exe = std::string(QTTS_BINARY_DIR) + "/qtts";
    // CTest runs after the whole build; a missing binary is a broken build, not a reason to skip.
    REQUIRE(fs::exists(exe));
    return exe;
}

std::string file_read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

// Runs `qtts ARGS` through the shell (so ARGS may redirect stdin), with a time limit.
Run qtts_run(const std::string& args) {
    const std::string err_path = qtts_test::temp_dir() + "/stderr.txt";
    const std::string cmd = "timeout 120 " + qtts_exe() + " " + args + " 2>" + err_path;
    Run r;
    FILE* p = popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.err = file_read(err_path);
    return r;
}

std::string temp_path(const std::string& name) {
    const std::string path = qtts_test::temp_dir() + "/" + name;
    fs::remove(path);
    return path;
}

// A refusal: exit status 1, the reason on stderr, and no output file left behind.
void check_refused(const Run& r, const std::string& reason, const std::string& out_file) {
    INFO(r.err);
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains(reason));
    CHECK_FALSE(fs::exists(out_file));
}

}  // namespace

TEST_CASE("qtts say with empty or blank standard input fails and writes no file", "[cli]") {
    const std::string wav = temp_path("stdin.wav");
    // An empty input and a whitespace-only one.
    const std::string blank = qtts_test::temp_dir() + "/blank.txt";
    std::ofstream(blank) << " \n\t\n\n   ";
    for (const std::string& source : {std::string("/dev/null"), blank}) {
        INFO(source);
        fs::remove(wav);
        check_refused(qtts_run("say - -o " + wav + " < " + source), "no text on standard input", wav);
    }
    // The request is checked before standard input is read: a bad speaker is reported first.
    check_refused(qtts_run("say - --speaker nobody -o " + wav + " </dev/null"), "unknown speaker 'nobody'", wav);
    // As `say ""` and `say "   "` do.
    for (const char* text : {"\"\"", "\"   \""}) {
        check_refused(qtts_run(std::string("say ") + text + " -o " + wav), "no text given", wav);
    }
}

TEST_CASE("qtts say reads text from standard input when it has some", "[cli]") {
    const std::string wav = temp_path("stdin-text.wav");
    const std::string input = qtts_test::temp_dir() + "/input.txt";
    std::ofstream(input) << "\n  \nHello there.\nSecond line.\n";
    const Run r = qtts_run("say - -o " + wav + " --seed 1 --max-frames 3 < " + input);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    REQUIRE(fs::exists(wav));
    CHECK(fs::file_size(wav) > 44);  // a header and samples
}

TEST_CASE("qtts say takes seeds 0..2^64-1 and refuses negative ones", "[cli]") {
    const std::string wav = temp_path("seed.wav");
    for (const char* seed : {"0", "18446744073709551615"}) {
        INFO(seed);
        const Run r = qtts_run(std::string("say \"Hi.\" --max-frames 2 -o ") + wav + " --seed " + seed);
        INFO(r.err);
        CHECK(r.exit_code == 0);
    }
    fs::remove(wav);
    for (const char* seed : {"-1", "18446744073709551616", "x"}) {
        INFO(seed);
        check_refused(qtts_run(std::string("say \"Hi.\" --max-frames 2 -o ") + wav + " --seed " + seed),
                      "from 0 to 18446744073709551615 (2^64-1)", wav);
    }
}

TEST_CASE("qtts say accepts a dialect with its speaker and refuses it with another", "[cli]") {
    const std::string wav = temp_path("dialect.wav");
    const Run ok = qtts_run("say \"\xE4\xBD\xA0\xE5\xA5\xBD\" --speaker eric --language sichuan_dialect --max-frames 2 -o " + wav);
    INFO(ok.err);
    CHECK(ok.exit_code == 0);
    CHECK(fs::exists(wav));
    fs::remove(wav);
    check_refused(qtts_run("say \"\xE4\xBD\xA0\xE5\xA5\xBD\" --speaker ryan --language beijing_dialect --max-frames 2 -o " + wav),
                  "dialect spoken only by speaker dylan", wav);
}

TEST_CASE("qtts info and tokenize use the embedded demo model without --model", "[cli]") {
    const Run info = qtts_run("info");
    INFO(info.err);
    REQUIRE(info.exit_code == 0);
    CHECK_THAT(info.out, Catch::Contains("custom_voice"));
    CHECK_THAT(info.err, Catch::Contains("embedded demo model"));
    // Every language it lists is one `say` accepts; dialects say whose they are.
    CHECK_THAT(info.out, Catch::Contains("sichuan_dialect (speaker eric only)"));
    CHECK_THAT(info.out, Catch::Contains("beijing_dialect (speaker dylan only)"));
    CHECK_THAT(qtts_run("info --help").out, Catch::Contains("default: the embedded demo model"));

    const Run plain = qtts_run("tokenize --json \"a<|im_end|>\"");
    INFO(plain.err);
    REQUIRE(plain.exit_code == 0);
    const auto plain_ids = nlohmann::json::parse(plain.out).at("ids").get<std::vector<int>>();
    CHECK(plain_ids.size() == std::string("a<|im_end|>").size());  // byte-level demo vocabulary
    CHECK(std::find(plain_ids.begin(), plain_ids.end(), 151645) == plain_ids.end());
    const Run raw = qtts_run("tokenize --json --raw-tokens \"a<|im_end|>\"");
    REQUIRE(raw.exit_code == 0);
    const auto raw_ids = nlohmann::json::parse(raw.out).at("ids").get<std::vector<int>>();
    REQUIRE(raw_ids.size() == 2);
    CHECK(raw_ids[1] == 151645);
}

TEST_CASE("qtts say --raw-tokens is accepted and documented; --max-frames 0 is documented as no cap", "[cli]") {
    const Run help = qtts_run("say --help");
    CHECK(help.exit_code == 0);
    CHECK_THAT(help.out, Catch::Contains("--raw-tokens"));
    CHECK_THAT(help.out, Catch::Contains("0 (the default) = no cap"));
    const std::string wav = temp_path("raw.wav");
    const Run r = qtts_run("say \"Hi<|im_end|>\" --raw-tokens --max-frames 2 -o " + wav);
    INFO(r.err);
    CHECK(r.exit_code == 0);
    fs::remove(wav);
    check_refused(qtts_run("say \"Hi.\" --max-frames -1 -o " + wav), "0 (no cap)", wav);
}

TEST_CASE("qtts make-model without --out says what is missing", "[cli]") {
    const Run r = qtts_run("make-model --preset tiny-customvoice");
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.err, Catch::Contains("missing --out DIR"));
    const Run p = qtts_run("make-model --out " + qtts_test::temp_dir() + "/m");
    CHECK(p.exit_code == 1);
    CHECK_THAT(p.err, Catch::Contains("missing --preset"));
    CHECK_THAT(p.err, Catch::Contains("tiny-customvoice"));
}

TEST_CASE("qtts say --ref-audio and voice create --audio are checked before the model loads", "[cli]") {
    // The model folder does not exist: an error about it would mean the model was loaded first.
    const std::string missing_model = qtts_test::temp_dir() + "/no-such-model";
    const std::string wav = temp_path("ref.wav");
    const std::string not_audio = qtts_test::temp_dir() + "/not-audio.wav";
    std::ofstream(not_audio) << "this is not a sound file";
    const std::string cases[] = {qtts_test::temp_dir() + "/missing.wav", not_audio, qtts_test::temp_dir()};
    for (const std::string& ref : cases) {
        INFO(ref);
        const Run r = qtts_run("say \"Hi.\" --model " + missing_model + " --ref-audio " + ref +
                               " --x-vector-only -o " + wav);
        check_refused(r, "--ref-audio", wav);
        CHECK_THAT(r.err, !Catch::Contains("no-such-model"));
        // qtts voice create checks its --audio the same way, before the model.
        const std::string voice = temp_path("v.qv");
        const Run v = qtts_run("voice create --model " + missing_model + " --audio " + ref + " --x-vector-only -o " + voice);
        check_refused(v, ref == not_audio ? "not-audio.wav" : ref, voice);
        CHECK_THAT(v.err, !Catch::Contains("no-such-model"));
    }
}

TEST_CASE("a reference clip past voice cloning's 30 s is refused by its length, before it is decoded or the model loads",
          "[cli]") {
    const std::string missing_model = qtts_test::temp_dir() + "/no-such-model";
    const std::string ref = temp_path("ref-31s.wav"), wav = temp_path("long-ref.wav"), voice = temp_path("long.qv");
    std::vector<float> clip(size_t(31) * 8000);
    for (size_t i = 0; i < clip.size(); ++i) clip[i] = 0.3f * float(std::sin(0.3 * double(i)));
    qtts::wav_write_file(ref, clip, 8000);
    const Run r = qtts_run("say \"Hi.\" --model " + missing_model + " --ref-audio " + ref + " --x-vector-only -o " + wav);
    check_refused(r, "31.0 s long; at most 30.0 s are accepted", wav);
    CHECK_THAT(r.err, Catch::Contains("--ref-audio") && !Catch::Contains("no-such-model"));
    const Run v = qtts_run("voice create --model " + missing_model + " --audio " + ref + " --x-vector-only -o " + voice);
    check_refused(v, "31.0 s long; at most 30.0 s are accepted", voice);
    CHECK_THAT(v.err, !Catch::Contains("no-such-model"));
}

TEST_CASE("a plain say warns about nothing; without a GPU it says at info level why the CPU is used", "[cli]") {
    const std::string wav = temp_path("cpu.wav");
    const Run r = qtts_run("say \"Hi.\" --max-frames 2 -o " + wav);
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.err, !Catch::Contains("[warning]"));
    CHECK_THAT(r.err, !Catch::Contains("insufficient"));
    if (qtts::cuda_device_count() == 0) {
        CHECK_THAT(r.err, Catch::Contains("[info] no usable GPU"));
        CHECK_THAT(r.err, Catch::Contains("falling back to the fast CPU backend"));
    }
}

TEST_CASE("qtts say: cpu-fast runs in either format; a bad backend, format or thread count is a clear error",
          "[cli][cpu_fast]") {
    for (const char* format : {"bf16", "int8"}) {
        const Run r = qtts_run(std::string("say \"Hi.\" --max-frames 2 --backend cpu-fast --threads 2 --cpu-format ") +
                               format + " -o " + temp_path("fast.wav"));
        INFO(r.err);
        CHECK(r.exit_code == 0);
        CHECK_THAT(r.err, Catch::Contains(std::string("cpu-fast: ") + format + " weights"));
    }
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--backend cpu-turbo", "use auto, cpu, cpu-fast or cuda"},
        {"--backend cpu-fast --cpu-format fp4", "use bf16 or int8"},
        {"--backend cpu-fast --threads -2", "threads must be"},
    };
    for (const auto& [flags, message] : cases) {
        const Run r = qtts_run("say \"Hi.\" --max-frames 2 " + flags + " -o " + temp_path("bad.wav"));
        INFO(flags << ": " << r.err);
        CHECK(r.exit_code == 1);
        CHECK_THAT(r.err, Catch::Contains(message));
    }
}

TEST_CASE("say and bench-serve take --max-context and --gpu-memory-limit; bad values are clear errors", "[cli]") {
    // Accepted (the CPU backend has no context to size: the options are checked and passed on).
    const Run ok = qtts_run("say \"Hi.\" --max-frames 2 --backend cpu --max-context 512 --gpu-memory-limit 6G -o " +
                            temp_path("context.wav"));
    INFO(ok.err);
    CHECK(ok.exit_code == 0);
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"say \"Hi.\" --max-context 0 -o " + temp_path("bad.wav"), "--max-context must be 1..1048576 positions, got 0"},
        {"say \"Hi.\" --max-context many -o " + temp_path("bad.wav"), "option --max-context expects an integer"},
        {"say \"Hi.\" --gpu-memory-limit 6Q -o " + temp_path("bad.wav"), "--gpu-memory-limit"},
        {"bench-serve --max-context -3", "--max-context must be 1..1048576 positions, got -3"},
        {"bench-serve --gpu-memory-limit lots", "--gpu-memory-limit"},
    };
    for (const auto& [command, message] : cases) {
        const Run r = qtts_run(command);
        INFO(command << ": " << r.err);
        CHECK(r.exit_code != 0);
        CHECK_THAT(r.err, Catch::Contains(message));
    }
}

TEST_CASE("qtts serve refuses bad engine lists before it listens, naming the problem", "[cli]") {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--engines ''", "the engine list is empty"},
        {"--engines cpu,,cpu", "entry 2 is empty"},
        {"--engines cuda", "name the device, e.g. cuda:0"},
        {"--devices 0,0", "CUDA device 0 is listed twice"},
        {"--devices 1,cuda:70", "device index 70 is out of range 0..63"},
        {"--devices cpu", "--devices takes CUDA device indices"},
        {"--engines cpu --devices 0", "give one of them"},
        {"--engines cpu,cpu --backend cpu", "leave out --backend and --device"},
        {"--devices 0 --device 1", "leave out --backend and --device"},
    };
    for (const auto& [flags, reason] : cases) {
        const Run r = qtts_run("serve --port 0 " + flags);
        INFO(flags << "\n" << r.err);
        CHECK(r.exit_code == 1);
        CHECK_THAT(r.err, Catch::Contains(reason));
        CHECK_THAT(r.out, !Catch::Contains("qtts serve: http://"));  // refused before listening
    }
    const Run help = qtts_run("serve --help");
    CHECK_THAT(help.out, Catch::Contains("--engines LIST") && Catch::Contains("--devices LIST"));
}

TEST_CASE("qtts bench-serve refuses bad options before it loads a model, naming the problem", "[cli][bench]") {
    // The model folder does not exist: an error about it would mean the model was loaded first.
    const std::string model = qtts_test::temp_dir() + "/no-such-model";
    const std::string json = temp_path("refused.json");
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"--concurrency 1,x", "--concurrency: 'x' is not a size in 1..1000"},
        {"--concurrency 0", "--concurrency: '0' is not a size"},
        {"--concurrency ''", "--concurrency: no sizes given"},
        {"--concurrency 1,4a", "--concurrency: '4a' is not a size in 1..1000"},  // not read as 4
        {"--concurrency 1,,4", "--concurrency: '' is not a size in 1..1000"},
        {"--requests 0", "--requests must be 1..1000000"},
        {"--frames -1", "--frames must be 0..100000"},
        {"--frames 8,x", "--frames must be 0..100000 (or a list of such), got 'x'"},
        {"--sentences 0", "--sentences must be 1..16"},
        {"--sentences 17", "--sentences must be 1..16"},
        {"--prefill-slice -1", "prefill_slice must be 0 (off) to 4096 prompt rows, got -1"},
        {"--backend gpu", "--backend expects auto, cpu, cpu-fast or cuda, got 'gpu'"},
        {"--threads -1", "--threads must be 0..1024"},
        {"--backend cpu-fast --cpu-format fp4", "use bf16 or int8"},
        {"--max-streams 0", "--max-streams must be 1..4096"},
        {"--timeout-s 0", "--timeout-s must be a number from 0.1"},
        {"--rate 5", "--rate is for paced runs (add --paced)"},
        {"--paced --rate 0 --duration 1", "--rate must be above 0"},
        {"--paced --rate -3 --duration 1", "--rate must be above 0"},
        {"--paced --rate nan --duration 1", "--rate must be above 0"},
        {"--paced --rate 2 --duration 0", "--duration must be above 0"},
        {"--paced --rate 2 --duration -1", "--duration must be above 0"},
        {"--paced --rate 2", "--paced needs --rate R (requests per second) and --duration S"},
        {"--paced --rate 2 --duration 1 --arrivals burst", "--arrivals expects poisson or fixed, got 'burst'"},
        {"--paced --rate 2 --duration 1 --period-ms 0", "--period-ms must be a number from 1"},
        {"--paced --rate 2 --duration 1 --prebuffer-ms -5", "--prebuffer-ms must be a number from 0"},
        {"--paced --rate 2 --duration 1 --concurrency 4", "--concurrency is for closed-loop runs"},
        {"--paced --rate 2 --duration 1 --trace", "--trace is for closed-loop runs"},
        {"--concurrenc 4", "unknown option --concurrenc"},
    };
    for (const auto& [flags, reason] : cases) {
        const Run r = qtts_run("bench-serve --model " + model + " --json " + json + " " + flags);
        INFO(flags << "\n" << r.err);
        check_refused(r, reason, json);
        CHECK_THAT(r.err, !Catch::Contains("no-such-model"));
    }
    const Run help = qtts_run("bench-serve --help");
    CHECK(help.exit_code == 0);
    CHECK_THAT(help.out, Catch::Contains("--concurrency LIST") && Catch::Contains("--prebuffer-ms"));
}

TEST_CASE("qtts bench-serve closed loop on the demo model: every request counted, timed and as long as asked",
          "[cli][bench]") {
    const std::string json = temp_path("serve.json");
    const int frames = 4, requests = 2;
    const Run r = qtts_run("bench-serve -q --backend cpu --concurrency 1,2 --requests " + std::to_string(requests) +
                           " --frames " + std::to_string(frames) + " --trace --json " + json);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("TTFA p50/p95/p99 (ms)") && Catch::Contains("audio-s/s"));
    const auto j = nlohmann::json::parse(file_read(json));
    CHECK(j.at("mode") == "closed");
    CHECK(j.at("backend") == "cpu");
    CHECK(j.at("device") == "cpu, " + std::to_string(std::thread::hardware_concurrency()) + " hardware threads");
    CHECK(j.at("frames") == frames);
    CHECK(j.at("sentences") == 1);
    CHECK(j.at("prefill_slice") == qtts::PREFILL_SLICE_DEFAULT);
    CHECK(j.at("max_streams") == 2);  // the largest level
    CHECK(j.at("gpu_memory").is_null());
    CHECK(j.at("warm_up_ttfa_ms").get<double>() > 0.0);
    const auto& levels = j.at("levels");
    REQUIRE(levels.size() == 2);
    for (size_t i = 0; i < levels.size(); ++i) {
        const auto& l = levels[i];
        INFO(l.dump(2));
        CHECK(l.at("concurrency") == int(i) + 1);
        CHECK(l.at("requests") == requests);
        CHECK(l.at("completed") == requests);
        CHECK(l.at("errors") == 0);
        CHECK(l.at("timeouts") == 0);
        CHECK(l.at("refused_busy") == 0);
        // Fixed seeds and a frame cap: every request is cut at exactly `frames` frames of 80 ms.
        CHECK(l.at("stop_reasons").at("max_frames") == requests);
        CHECK(l.at("audio_s").get<double>() == Approx(requests * frames * 0.08));
        const double ttfa50 = l.at("ttfa_ms_p50"), ttfa95 = l.at("ttfa_ms_p95"), ttfa99 = l.at("ttfa_ms_p99");
        CHECK(ttfa50 > 0.0);
        CHECK(ttfa50 <= ttfa95);
        CHECK(ttfa95 <= ttfa99);
        // The engine's side of it (its stream made -> first audio published) is within the
        // client's (submit() called -> first samples read); the engine stamps it just after it
        // hands the samples over, hence the slack.
        const double gen50 = l.at("ttfa_gen_ms_p50"), gen95 = l.at("ttfa_gen_ms_p95");
        CHECK(gen50 > 0.0);
        CHECK(gen50 <= gen95);
        CHECK(gen50 <= ttfa50 + 1.0);
        // First audio comes before the last; a whole level takes at least one request's time.
        CHECK(ttfa50 <= l.at("e2e_ms_p50").get<double>());
        CHECK(l.at("e2e_ms_p50").get<double>() <= l.at("e2e_ms_p95").get<double>());
        CHECK(l.at("wall_s").get<double>() * 1e3 >= l.at("e2e_ms_p50").get<double>());
        CHECK(l.at("rtf_mean").get<double>() > 0.0);
        CHECK(l.at("rtf_max").get<double>() >= l.at("rtf_mean").get<double>());
        // Each request's longest wait for audio after its first: within the request's own time
        // (0 when both of its chunks were there at its first read).
        CHECK(l.at("gap_ms_p50").get<double>() >= 0.0);
        CHECK(l.at("gap_ms_p50").get<double>() <= l.at("gap_ms_max").get<double>());
        CHECK(l.at("gap_ms_max").get<double>() <= l.at("e2e_ms_p95").get<double>());
        // The fp32 reference starts every prompt whole.
        CHECK(l.at("prefill_slices") == 0);
        CHECK(l.at("sliced_starts") == 0);
        const double wall = l.at("wall_s");
        CHECK(l.at("requests_per_s").get<double>() == Approx(requests / wall));
        CHECK(l.at("audio_s_per_wall_s").get<double>() == Approx(requests * frames * 0.08 / wall));
        CHECK(l.at("batch_histogram").is_object());
        // The engine thread over the level: its chunks in per-stream passes (CPU: nothing batched),
        // parts within the level's share of the thread, which is within the level's wall time.
        const auto& t = l.at("engine_thread_s");
        const double total = t.at("total");
        CHECK(t.at("service").get<double>() > 0.0);
        CHECK(t.at("steps").get<double>() == 0.0);
        CHECK(t.at("starts").get<double>() == 0.0);
        double parts = 0.0;
        for (const char* part : {"starts", "first_steps", "steps", "service", "idle"}) parts += t.at(part).get<double>();
        CHECK(parts <= total + 1e-6);
        CHECK(total <= wall + 0.5);  // the snapshots may each trail the level by a round or an idle wait
        // --trace: the level's chunks in the order made, each stream's first one first-chunk sized
        // and its chunks adding up to the request's frames; rounds never go back; CPU: none batched.
        const auto& trace = l.at("trace");
        REQUIRE(trace.is_array());
        // The stream ends with its last chunk (not with an empty call a round later).
        std::map<uint64_t, std::vector<int>> chunks;  // stream -> its chunks' frames, in order
        std::map<uint64_t, std::vector<bool>> ended;
        uint64_t last_round = 0;
        for (const auto& e : trace) {
            REQUIRE(e.size() == 6);
            CHECK(e[0].get<uint64_t>() >= last_round);
            last_round = e[0].get<uint64_t>();
            chunks[e[1].get<uint64_t>()].push_back(e[2].get<int>());
            CHECK_FALSE(e[3].get<bool>());
            CHECK(e[5].get<int>() == 0);  // the frames of the batched step that made it: none
            ended[e[1].get<uint64_t>()].push_back(e[4].get<bool>());
        }
        CHECK(chunks.size() == size_t(requests));
        for (const auto& [stream, sizes] : chunks) {
            CHECK(sizes.front() == qtts::FIRST_CHUNK_FRAMES_DEFAULT);
            CHECK(std::accumulate(sizes.begin(), sizes.end(), 0) == frames);
            const std::vector<bool>& e = ended[stream];
            CHECK(std::count(e.begin(), e.end(), true) == 1);
            CHECK(e.back());
        }
    }
    CHECK_THAT(r.out, Catch::Contains("engine thread: "));
}

TEST_CASE("qtts bench-serve paced players on the demo model: arrivals, admissions and playback accounted",
          "[cli][bench]") {
    const std::string json = temp_path("paced.json");
    const int frames = 3;
    // Fixed arrivals at 0, 100, 200 ms: three requests. A prebuffer longer than any stream makes
    // every player start only once its stream ended, so none can run dry.
    const Run r = qtts_run("bench-serve -q --backend cpu --paced --rate 10 --duration 0.25 --arrivals fixed --frames " +
                           std::to_string(frames) + " --prebuffer-ms 10000 --json " + json);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("underruns"));
    const auto j = nlohmann::json::parse(file_read(json));
    CHECK(j.at("mode") == "paced");
    const auto& p = j.at("paced");
    INFO(p.dump(2));
    CHECK(p.at("requests") == 3);
    CHECK(p.at("admitted").get<int>() + p.at("refused_busy").get<int>() == 3);
    CHECK(p.at("completed") == p.at("admitted"));
    CHECK(p.at("errors") == 0);
    CHECK(p.at("timeouts") == 0);
    CHECK(p.at("underruns") == 0);
    CHECK(p.at("streams_with_underrun") == 0);
    // Three listeners at most, and the engine never held more streams than were admitted.
    CHECK(p.at("peak_listeners").get<int>() >= 1);
    CHECK(p.at("peak_listeners").get<int>() <= 3);
    CHECK(p.at("peak_engine_streams").get<int>() <= p.at("admitted").get<int>());
    CHECK(p.at("audio_s").get<double>() == Approx(p.at("completed").get<int>() * frames * 0.08));
    REQUIRE(p.at("streams").size() == p.at("completed").get<size_t>());
    for (const auto& s : p.at("streams")) {
        const double ttfa = s.at("ttfa_ms"), start = s.at("play_start_ms"), e2e = s.at("e2e_ms");
        CHECK(ttfa > 0.0);
        // The player starts after its stream's last sample arrived, which comes after the first.
        CHECK(start >= e2e);
        CHECK(e2e >= ttfa - 1.0);  // 1 ms: ttfa is the engine's clock plus submit(), e2e the pacer's
        CHECK(s.at("audio_s").get<double>() == Approx(frames * 0.08));
    }
}

TEST_CASE("qtts bench-serve mixed lengths and long prompts: --frames cycles, --sentences, --prefill-slice",
          "[cli][bench]") {
    // Two clients on cpu-fast, requests of 2 and 40 frames in turn, each text four sentences (a
    // prompt of hundreds of rows with the demo tokenizer): a short request's client comes back
    // while the long one plays, so its start runs in slices of 8 rows.
    const std::string json = temp_path("serve-mixed.json");
    const Run r = qtts_run("bench-serve -q --backend cpu-fast --concurrency 2 --requests 6 --frames 2,40 --sentences 4 "
                           "--prefill-slice 8 --json " + json);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK_THAT(r.out, Catch::Contains("frames per request by turn: 2,40"));
    const auto j = nlohmann::json::parse(file_read(json));
    CHECK(j.at("frames") == 2);
    CHECK(j.at("frames_cycle") == std::vector<int>{2, 40});
    CHECK(j.at("sentences") == 4);
    CHECK(j.at("prefill_slice") == 8);
    const auto& l = j.at("levels").at(0);
    INFO(l.dump(2));
    CHECK(l.at("completed") == 6);
    CHECK(l.at("stop_reasons").at("max_frames") == 6);
    CHECK(l.at("audio_s").get<double>() == Approx(3 * (2 + 40) * 0.08));  // requests 1..6 after the warm-up (0)
    CHECK(l.at("sliced_starts").get<int64_t>() >= 1);
    CHECK(l.at("prefill_slices").get<int64_t>() > l.at("sliced_starts").get<int64_t>());
}

TEST_CASE("qtts bench-serve counts refusals when clients outnumber the engine's streams", "[cli][bench]") {
    const std::string json = temp_path("busy.json");
    const int frames = 6, requests = 6;
    // Three clients start together on a one-stream engine: while one request runs (~100 ms),
    // the others' submits are refused with ERROR_BUSY; a refused request still counts toward N.
    const Run r = qtts_run("bench-serve -q --backend cpu --concurrency 3 --max-streams 1 --requests " +
                           std::to_string(requests) + " --frames " + std::to_string(frames) + " --json " + json);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);  // refusals are a measured outcome, not a failure
    const auto l = nlohmann::json::parse(file_read(json)).at("levels").at(0);
    INFO(l.dump(2));
    CHECK(l.at("completed").get<int>() + l.at("refused_busy").get<int>() == requests);
    CHECK(l.at("completed").get<int>() >= 1);
    CHECK(l.at("refused_busy").get<int>() >= 1);
    CHECK(l.at("errors") == 0);
    CHECK(l.at("audio_s").get<double>() == Approx(l.at("completed").get<int>() * frames * 0.08));
}
