# Compiles the browser page (audio_io/server/web/index.html) into a C++ source, at build time:
#
#   cmake -DINPUT=index.html -DOUTPUT=web_page_data.cpp -P cmake/embed-web-page.cmake
#
# The generated file defines qtts::server::web_page() (audio_io/server/web_page.h): the page's
# bytes, its Content-Security-Policy and its ETag. The policy names the page's one inline
# <script> and one inline <style> by their SHA-256 (CSP level 2 hash sources), so the browser
# runs exactly the code that was compiled in and nothing injected beside it. A page with more
# or fewer inline blocks, or with attributes on them, stops the build with a message: the hash
# would not cover them.
cmake_minimum_required(VERSION 3.25)

if(NOT DEFINED INPUT OR NOT DEFINED OUTPUT)
  message(FATAL_ERROR "embed-web-page.cmake: pass -DINPUT=<html file> -DOUTPUT=<c++ file>")
endif()

# base64 of the bytes that a string of hex digits spells (CSP hash sources are base64).
function(hex_to_base64 hex out_var)
  set(alphabet "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
  string(LENGTH "${hex}" hex_len)
  set(result "")
  set(pos 0)
  while(pos LESS hex_len)
    string(SUBSTRING "${hex}" ${pos} 6 group)  # three bytes, fewer at the end
    string(LENGTH "${group}" group_len)
    set(padded "${group}")
    while(NOT padded MATCHES "^......$")
      string(APPEND padded "0")
    endwhile()
    math(EXPR bits "0x${padded}")
    math(EXPR chars "${group_len} / 2 + 1")  # 3 bytes -> 4 characters, 2 -> 3, 1 -> 2
    set(shift 18)
    foreach(i RANGE 1 4)
      if(i GREATER chars)
        string(APPEND result "=")
      else()
        math(EXPR index "(${bits} >> ${shift}) & 63")
        string(SUBSTRING "${alphabet}" ${index} 1 c)
        string(APPEND result "${c}")
      endif()
      math(EXPR shift "${shift} - 6")
    endforeach()
    math(EXPR pos "${pos} + 6")
  endwhile()
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

# The text between <tag> and </tag>, which must occur exactly once each and without attributes.
function(inline_block text tag out_var)
  set(open "<${tag}>")
  set(close "</${tag}>")
  string(FIND "${text}" "${open}" first)
  string(FIND "${text}" "${open}" last REVERSE)
  string(FIND "${text}" "${close}" end)
  string(FIND "${text}" "${close}" end_last REVERSE)
  string(REGEX MATCHALL "<${tag}[ \t\r\n>]" opens "${text}")
  list(LENGTH opens n_opens)
  if(first EQUAL -1 OR end EQUAL -1 OR NOT first EQUAL last OR NOT end EQUAL end_last OR NOT n_opens EQUAL 1
     OR end LESS first)
    message(FATAL_ERROR "${INPUT}: the page must hold exactly one inline ${open}...${close} block, written "
                        "without attributes (its SHA-256 goes into the Content-Security-Policy)")
  endif()
  string(LENGTH "${open}" open_len)
  math(EXPR begin "${first} + ${open_len}")
  math(EXPR len "${end} - ${begin}")
  string(SUBSTRING "${text}" ${begin} ${len} block)
  set(${out_var} "${block}" PARENT_SCOPE)
endfunction()

file(READ "${INPUT}" page_text)
file(READ "${INPUT}" page_hex HEX)
if(page_text MATCHES "\r")
  message(FATAL_ERROR "${INPUT}: carriage returns in the page; keep it in LF line endings (the CSP hashes "
                      "are taken over the exact bytes)")
endif()

inline_block("${page_text}" "script" script)
inline_block("${page_text}" "style" style)
string(SHA256 script_hex "${script}")
string(SHA256 style_hex "${style}")
hex_to_base64("${script_hex}" script_hash)
hex_to_base64("${style_hex}" style_hash)

# Where the page may reach: nothing by default; its own inline script (and the AudioWorklet
# module it builds from a blob: URL of its own text), its own inline style, this server's
# HTTP and WebSocket endpoints ('self' covers ws:/wss: to the same host in CSP level 3).
set(csp "default-src 'none'; script-src 'sha256-${script_hash}' blob:; style-src 'sha256-${style_hash}'; ")
string(APPEND csp "connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

string(SHA256 page_sha "${page_text}")
string(SUBSTRING "${page_sha}" 0 20 etag)

string(LENGTH "${page_hex}" hex_len)
math(EXPR page_bytes "${hex_len} / 2")
# 0xNN, with a line break every 16 bytes.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," page_array "${page_hex}")
string(REPEAT "0x..," 16 sixteen)  # (CMake's regular expressions have no {n})
string(REGEX REPLACE "(${sixteen})" "\\1\n    " page_array "${page_array}")

file(CONFIGURE OUTPUT "${OUTPUT}.tmp" @ONLY CONTENT [=[
// Generated at build time by cmake/embed-web-page.cmake from audio_io/server/web/index.html.
// Do not edit: edit the page and rebuild.
#include "audio_io/server/web_page.h"

namespace qtts::server {

namespace {

const unsigned char kPageBytes[@page_bytes@] = {
    @page_array@
};

}  // namespace

const WebPage& web_page() {
    static const WebPage page{
        std::string_view(reinterpret_cast<const char*>(kPageBytes), sizeof(kPageBytes)),
        "@csp@",
        "\"@etag@\"",
    };
    return page;
}

}  // namespace qtts::server
]=])
# Replace the output only when it changed, so an unchanged page recompiles nothing.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
