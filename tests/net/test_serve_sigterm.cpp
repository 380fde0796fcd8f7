// `qtts serve` as users run it: the real binary with the embedded default model, on loopback.
// Liveness answers while the model loads, readiness turns 200 once it is loaded, and SIGTERM
// drains: new work is refused, a stream that outlasts --drain-seconds is cut with its terminal
// event, the summary is logged and the process exits 0.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <fcntl.h>

#include <filesystem>
#include <regex>

#include "net_test_support.h"

using namespace net_test;
using json = nlohmann::json;

namespace {

// The child process, killed (SIGKILL) if a failed check leaves it running.
struct ServeProcess {
    pid_t pid = -1;
    std::string log_path;
    ~ServeProcess() {
        if (pid > 0) {
            ::kill(pid, SIGKILL);
            ::waitpid(pid, nullptr, 0);
        }
    }
    // Exit status, or -1 while it runs past the timeout.
    int wait_exit(std::chrono::milliseconds timeout) {
        const auto deadline = Clock::now() + timeout;
        while (Clock::now() < deadline) {
            int status = 0;
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            }
            std::this_thread::sleep_for(20ms);
        }
        return -1;
    }
};

ServeProcess serve_spawn(const std::vector<std::string>& args) {
    ServeProcess p;
    p.log_path = temp_path("serve.log");
    const std::string exe = std::string(QTTS_BINARY_DIR) + "/qtts";
    std::vector<std::string> argv_s = {exe, "serve"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    p.pid = ::fork();
    if (p.pid == 0) {
        const int fd = ::open(p.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        std::vector<char*> argv;
        for (auto& a : argv_s) argv.push_back(a.data());
        argv.push_back(nullptr);
        ::execv(exe.c_str(), argv.data());
        ::_exit(127);
    }
    return p;
}

// The port from "qtts serve: http://127.0.0.1:PORT" in the log (0 until it is there).
int serve_port(const std::string& log_path) {
    std::smatch m;
    const std::string log = file_read(log_path);
    static const std::regex re("http://127\\.0\\.0\\.1:([0-9]+)");
    return std::regex_search(log, m, re) ? std::stoi(m[1]) : 0;
}

}  // namespace

TEST_CASE("qtts serve: live while loading, ready when loaded; SIGTERM drains, cuts the overdue stream, exits 0", "[net]") {
    const std::string exe = std::string(QTTS_BINARY_DIR) + "/qtts";
    REQUIRE(std::filesystem::exists(exe));  // built with the tests (target qtts_cli)
    ServeProcess serve = serve_spawn({"--port", "0", "--drain-seconds", "8", "--max-audio-seconds", "1", "--log-level", "info"});
    REQUIRE(serve.pid > 0);
    int port = 0;
    REQUIRE(wait_until([&] { return (port = serve_port(serve.log_path)) > 0; }, 30000ms));
    INFO("log:\n" << file_read(serve.log_path));
    // Listening comes before the model: liveness answers at once, readiness once loaded.
    CHECK(curl_get(port, "/livez").status == 200);
    const HttpResult first_ready = curl_get(port, "/readyz");
    if (first_ready.status == 503) CHECK(json::parse(first_ready.body)["reason"] == "loading");
    REQUIRE(wait_until([&] { return curl_get(port, "/readyz").status == 200; }, 120000ms));

    // A stream that waits for text it never gets: still running at the drain deadline.
    WsClient waiting(port, 30000ms);
    REQUIRE(waiting.connected());
    REQUIRE(waiting.send_text(R"({"type":"start","format":"pcm"})"));
    REQUIRE(waiting.read_until_event({"started"}));

    REQUIRE(::kill(serve.pid, SIGTERM) == 0);
    REQUIRE(wait_until([&] { return curl_get(port, "/readyz").status == 503; }, 5000ms));
    const HttpResult ready = curl_get(port, "/readyz");
    if (ready.status == 503 && !ready.body.empty()) CHECK(json::parse(ready.body)["reason"] == "draining");
    CHECK(curl_get(port, "/livez").status == 200);
    const HttpResult refused = curl_post(port, "/v1/audio/speech", R"({"input":"Hello."})");
    CHECK(refused.status == 503);
    CHECK(refused.body.find("shutting down") != std::string::npos);

    // Cut at the deadline: one terminal error, then done, then a close frame.
    const WsUtterance cut = ws_utterance_read(waiting);
    REQUIRE(!cut.done.is_null());
    CHECK(cut.done["stop_reason"] == "shutdown");
    REQUIRE(cut.errors.size() == 1);
    CHECK(cut.errors[0]["error"]["code"] == "stopping");
    CHECK(!waiting.read());
    CHECK(waiting.close_reason().code == boost::beast::websocket::close_code::going_away);

    CHECK(serve.wait_exit(40000ms) == 0);
    const std::string log = file_read(serve.log_path);
    CHECK(log.find("0 of 1 running streams finished, 1 cut") != std::string::npos);
}
