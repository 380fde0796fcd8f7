#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing qtts needs, then the browser test's
# Node.js module (puppeteer-core, pinned in tests/web/package-lock.json) with `npm ci`.
# Idempotent and non-interactive. CUDA is not installed here: it comes from the machine
# (/usr/local/cuda); without it the build produces the CPU-only engine.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake pkg-config git ca-certificates
  catch2                      # Catch2 v2 unit tests
  nlohmann-json3-dev          # config.json / safetensors headers / API JSON
  libspdlog-dev libfmt-dev    # logging
  libopenblas-dev             # CPU matrix products
  libpcre2-dev                # Qwen2 pre-tokenizer regex (UTF + UCP)
  libutf8proc-dev             # NFC normalisation
  libsndfile1-dev libsoxr-dev # audio files and resampling
  libfftw3-dev                # mel front end
  portaudio19-dev             # live playback
  libopus-dev libopusenc-dev libogg-dev libopusfile-dev  # Opus streaming (+ decoding in tests)
  libboost-dev                # Beast/Asio for the HTTP/WebSocket server
  libconcurrentqueue-dev                                 # lock-free queue (engine submissions)
  curl netcat-openbsd         # network integration tests
  python3                     # the Python bindings' test (python/qtts.py: ctypes, standard library only)
  clang libclang-rt-14-dev    # libFuzzer + ASan/UBSan for the fuzz smoke run (tools/fuzz.sh)
  chromium nodejs npm         # the browser page's test: headless Chromium driven from Node (tests/web)
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${packages[@]}"; do
  # A Node.js that brings its own npm (NodeSource's nodejs) conflicts with Debian's npm package.
  if [ "$p" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
else
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# puppeteer-core for tests/web, exactly as the lock file pins it (it downloads no browser: the test
# drives the chromium package). Offline or without npm, the browser test is skipped and says why.
web=tests/web
# npm writes node_modules/.package-lock.json on every install: newer than the lock file means the
# modules were installed from this lock file, and `npm ci` (which starts from scratch) is not rerun.
if [ "$web/node_modules/.package-lock.json" -nt "$web/package-lock.json" ]; then
  echo "setup: $web/node_modules is up to date"
elif ! command -v npm >/dev/null 2>&1; then
  echo "setup: no npm; the browser page test (ctest test_web_page) will be skipped"
elif (cd "$web" && timeout 300 npm ci --no-audit --no-fund --loglevel=error); then
  echo "setup: installed $web/node_modules (npm ci)"
else
  echo "setup: npm ci in $web failed (offline?); the browser page test (ctest test_web_page) will be skipped"
fi
echo "setup: done"
