#!/usr/bin/env bash
# Configures and builds qtts into ./build (Release). CUDA is used when /usr/local/cuda has nvcc.
# Extra CMake arguments are passed through, e.g. tools/build.sh -DQTTS_CUDA=OFF
#
# CUDA architectures (docs/cuda.md, "Architectures"): a plain `cmake` builds the fat binary
# (sm_80/86/87/89/90 + compute_90 PTX, ~3.5x the kernel compile time of one architecture). This
# script builds for what the machine can run instead: `native` when it has an NVIDIA GPU, else
# sm_90 machine code (the GPU machine's H200) plus compute_80 PTX, so that both kernel paths, the
# Hopper one and the portable one, are compiled (and their warnings checked) on every build.
# QTTS_CUDA_ARCHS=... or -DQTTS_CUDA_ARCHS=... picks anything else (e.g. the fat default:
# QTTS_CUDA_ARCHS=fat).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${QTTS_BUILD_DIR:-build}"
JOBS="${QTTS_JOBS:-$(nproc)}"
archs="${QTTS_CUDA_ARCHS:-}"
if [ -z "$archs" ]; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        archs="native"
    else
        archs="90-real;80-virtual"
    fi
fi
arch_args=()
if [ "$archs" != "fat" ]; then arch_args=("-DQTTS_CUDA_ARCHS=$archs"); else arch_args=("-UQTTS_CUDA_ARCHS"); fi
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DQTTS_WERROR=ON "${arch_args[@]}" "$@" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"
