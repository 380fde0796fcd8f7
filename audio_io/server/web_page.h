// The browser page served at GET / (audio_io/server/web/index.html): type text, pick a voice and
// hear it as it is generated, over the WebSocket endpoint. The HTML is compiled into the binary at
// build time (cmake/embed-web-page.cmake generates the definition), so `qtts serve` needs no files
// beside it. docs/server.md, "The browser page".
#pragma once

#include <string_view>

namespace qtts::server {

struct WebPage {
    std::string_view html;                     // the page, byte for byte (UTF-8)
    std::string_view content_security_policy;  // allows the page's own inline script and style only
    std::string_view etag;                     // quoted; changes whenever the page does
};

// Thread safety: returns a reference to constant data; callable from any thread.
const WebPage& web_page();

}  // namespace qtts::server
