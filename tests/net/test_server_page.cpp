// The browser page at GET / (audio_io/server/web/index.html, compiled in): served with its
// content type, Content-Security-Policy and caching headers, revalidated by ETag; other methods get
// 405 and unknown paths still 404. What the page does in a browser: tests/web (ctest test_web_page).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "audio_io/server/server.h"
#include "audio_io/server/web_page.h"
#include "net_test_support.h"

using namespace net_test;
using json = nlohmann::json;

namespace {

struct PageServer {
    FakeSpeechService service;
    qtts::ServerOptions options;
    std::unique_ptr<qtts::HttpServer> server;
    PageServer() : service(FakeConfig{}) {
        options.port = 0;
        options.io_threads = 2;
        server = std::make_unique<qtts::HttpServer>(service, options);
        server->start();
    }
    int port() const { return server->port(); }
};

// The value of a response header (case-insensitive name), or "" when absent.
std::string header_value(const std::string& headers, const std::string& name) {
    std::string lower_headers = headers;
    std::string lower_name = name + ":";
    for (auto& c : lower_headers) c = char(std::tolower(static_cast<unsigned char>(c)));
    for (auto& c : lower_name) c = char(std::tolower(static_cast<unsigned char>(c)));
    const size_t at = lower_headers.find("\n" + lower_name);
    if (at == std::string::npos) return "";
    size_t begin = at + 1 + lower_name.size();
    while (begin < headers.size() && headers[begin] == ' ') ++begin;
    const size_t end = headers.find_first_of("\r\n", begin);
    return headers.substr(begin, end - begin);
}

}  // namespace

TEST_CASE("GET / serves the compiled-in page with its type, policy and caching headers", "[net]") {
    PageServer s;
    const qtts::server::WebPage& page = qtts::server::web_page();
    REQUIRE(page.html.size() > 1000);

    for (const char* path : {"/", "/index.html", "/?voice=x"}) {
        INFO(path);
        const HttpResult r = curl_get(s.port(), path);
        REQUIRE(r.status == 200);
        CHECK(r.body == std::string(page.html));  // byte for byte what was compiled in
        CHECK(r.body.find("<title>qtts") != std::string::npos);
        CHECK(r.body.find("/v1/audio/stream") != std::string::npos);
        CHECK(header_value(r.headers, "Content-Type") == "text/html; charset=utf-8");
        CHECK(header_value(r.headers, "Cache-Control") == "no-cache");
        CHECK(header_value(r.headers, "ETag") == std::string(page.etag));
        CHECK(header_value(r.headers, "X-Content-Type-Options") == "nosniff");
        const std::string csp = header_value(r.headers, "Content-Security-Policy");
        CHECK(csp == std::string(page.content_security_policy));
        // Nothing by default; the page's own inline script and style by hash; back to this server only.
        CHECK(csp.rfind("default-src 'none';", 0) == 0);
        CHECK(csp.find("script-src 'sha256-") != std::string::npos);
        CHECK(csp.find("style-src 'sha256-") != std::string::npos);
        CHECK(csp.find("connect-src 'self'") != std::string::npos);
        CHECK(csp.find("unsafe-inline") == std::string::npos);
        CHECK(csp.find("http") == std::string::npos);  // no other origin named
    }
    // The page pulls in nothing from elsewhere.
    CHECK(std::string(page.html).find("http://") == std::string::npos);
    CHECK(std::string(page.html).find("https://") == std::string::npos);

    // Revalidation: the same ETag gets 304 without a body; another ETag gets the page.
    const std::string etag(page.etag);
    const HttpResult same = curl_request(s.port(), "GET", "/", nullptr, "-H 'If-None-Match: " + etag + "'");
    CHECK(same.status == 304);
    CHECK(same.body.empty());
    CHECK(header_value(same.headers, "ETag") == etag);
    const HttpResult other = curl_request(s.port(), "GET", "/", nullptr, "-H 'If-None-Match: \"0123\"'");
    CHECK(other.status == 200);
    CHECK(other.body == std::string(page.html));

    // API answers keep their own caching rule.
    CHECK(header_value(curl_get(s.port(), "/v1/audio/voices").headers, "Cache-Control") == "no-store");

    CHECK(s.server->metrics().requests("page", 200) == 4);
    CHECK(s.server->metrics().requests("page", 304) == 1);
}

TEST_CASE("the page path takes GET only; unknown paths still 404 with a JSON error", "[net]") {
    PageServer s;
    const std::string body = "{}";
    const HttpResult post = curl_request(s.port(), "POST", "/", &body);
    CHECK(post.status == 405);
    CHECK(header_value(post.headers, "Allow") == "GET");
    CHECK(json::parse(post.body)["error"]["type"] == "invalid_request_error");

    for (const char* path : {"/index.htm", "/index.html/", "/web/index.html", "/favicon.ico", "//"}) {
        INFO(path);
        const HttpResult r = curl_get(s.port(), path);
        CHECK(r.status == 404);
        CHECK(header_value(r.headers, "Content-Type") == "application/json");
        const json j = json::parse(r.body);
        CHECK(j["error"]["type"] == "not_found_error");
        CHECK(j["error"]["message"].get<std::string>().find("GET / (the browser page)") != std::string::npos);
    }
    CHECK(s.service.streams().empty());
}
