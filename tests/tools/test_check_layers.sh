#!/usr/bin/env bash
# Tests tools/check-layers.sh: it passes on a small tree whose includes point down, fails (and
# names the file and line) on one with an upward, a cross-backend and a relative include, and on
# a file built without CUDA that includes a CUDA header unguarded, and passes on the repository
# itself.
# usage: tests/tools/test_check_layers.sh REPOSITORY_ROOT
set -euo pipefail
repo="$1"
check="$repo/tools/check-layers.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

make_tree() {
    rm -rf "$tmp/tree" && mkdir -p "$tmp/tree" && cd "$tmp/tree" && git init -q .
    mkdir -p engine/api engine/text engine/runtime engine/cpu engine/cpu_fast engine/cuda kernels apps/x
    echo '#pragma once' >engine/api/qtts.h
    printf '#pragma once\n#include "engine/api/qtts.h"\n' >engine/text/tokenizer.h
    printf '#pragma once\n#include "engine/text/tokenizer.h"\n' >engine/runtime/engine.h
    printf '#include "engine/runtime/engine.h"\n#include <vector>\n' >apps/x/main.cpp
    echo '#pragma once' >engine/cpu/ops.h
    echo '#pragma once' >kernels/gemv.cuh
    printf '#include "kernels/gemv.cuh"\n' >engine/cuda/gpu.cpp
    printf '#include "engine/cpu/ops.h"\n' >engine/cpu_fast/matvec.cpp
    printf '#include "engine/cpu_fast/matvec.cpp"\n' >>engine/runtime/engine.h
}

expect() {  # expect STATUS PATTERN: runs the check on $tmp/tree
    local status=0 out
    out="$("$check" "$tmp/tree" 2>&1)" || status=$?
    if [[ "$status" != "$1" ]] || ! grep -q -- "$2" <<<"$out"; then
        echo "FAIL: wanted exit $1 and '$2', got exit $status:"
        echo "$out"
        exit 1
    fi
    echo "ok: exit $status, '$2'"
}

make_tree
expect 0 "every one points down"

make_tree
printf '#include "engine/runtime/engine.h"\n' >>engine/text/tokenizer.h
expect 1 'engine/text/tokenizer.h:3: text includes runtime'

make_tree
printf '#include "engine/cpu/ops.h"\n' >>engine/cuda/gpu.cpp
expect 1 'engine/cuda/gpu.cpp:2: cuda includes cpu'

# The fast CPU backend builds on the reference, never the other way round, and never on CUDA.
make_tree
printf '#include "engine/cpu_fast/matvec.cpp"\n' >>engine/cpu/ops.h
expect 1 'engine/cpu/ops.h:2: cpu includes cpu_fast'

make_tree
printf '#include "engine/cuda/gpu.cpp"\n' >>engine/cpu_fast/matvec.cpp
expect 1 'engine/cpu_fast/matvec.cpp:2: cpu_fast includes cuda'

make_tree
printf '#include "engine/cpu_fast/matvec.cpp"\n' >>engine/cuda/gpu.cpp
expect 1 'engine/cuda/gpu.cpp:2: cuda includes cpu_fast'

make_tree
printf '#include "tokenizer.h"\n' >engine/text/split.cpp
expect 1 'is relative'

make_tree
printf '#include "engine/api/qtts.h"\n' >kernels/gemv.cu
expect 1 'kernels includes api'

# A file built without CUDA (a test here) includes a CUDA header only under QTTS_HAVE_CUDA.
make_tree
mkdir -p tests/gpu
printf '#include <vector>\n#include <cuda_runtime_api.h>\n' >tests/gpu/test_x.cpp
expect 1 'tests/gpu/test_x.cpp:2: includes a CUDA header outside #ifdef QTTS_HAVE_CUDA'

make_tree
mkdir -p tests/gpu
printf '#include <vector>\n#ifdef QTTS_HAVE_CUDA\n#include "kernels/gemv.cuh"\n#endif\n' >tests/gpu/test_x.cpp
expect 0 'CUDA headers guarded in the 1 files'

# The repository itself.
"$check" "$repo"
