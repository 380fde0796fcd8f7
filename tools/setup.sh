#!/usr/bin/env bash
# Installs every Debian 12 package that building and testing qtts needs.
# Idempotent and non-interactive. CUDA is not installed here: it comes from the machine
# (/usr/local/cuda); without it the build produces the CPU-only engine.
set -euo pipefail

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
)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "setup: done"
