#!/usr/bin/env bash
# Configures and builds qtts into ./build (Release). CUDA is used when /usr/local/cuda has nvcc.
# Extra CMake arguments are passed through, e.g. tools/build.sh -DQTTS_CUDA=OFF
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${QTTS_BUILD_DIR:-build}"
JOBS="${QTTS_JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DQTTS_WERROR=ON "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
