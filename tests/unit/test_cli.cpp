// The qtts command line as users run it: the real binary (build/qtts) with the embedded demo
// model, its exit status, its messages and the files it leaves behind.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
