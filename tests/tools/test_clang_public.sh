#!/usr/bin/env bash
# What users compile against qtts, through clang as well as the build's compiler: the public
# headers (engine/api/qtts.h, the C API's qtts_c.h as C and as C++) and the programs users start
# from (apps/embed/embed_pcm.cpp, apps/examples/assistant.c, tests/c_api/*.c), checked with
# `clang -fsyntax-only` and warnings as errors. Why: the build uses g++, which accepts what clang
# refuses (embed_pcm.cpp once declared its buffer with a qualified name in parentheses, a function
# declaration to clang), and an embedder's compiler is theirs to choose.
# Exit 0: all compiled; 1: something did not; 77: skipped (no clang / clang++).
# usage: tests/tools/test_clang_public.sh SOURCE_DIR
set -euo pipefail
src="$1"
cxx="$(command -v clang++ || command -v clang++-14 || true)"
cc="$(command -v clang || command -v clang-14 || true)"
[[ -n "$cxx" && -n "$cc" ]] || { echo "SKIP: clang / clang++ not found (apt-get install clang)"; exit 77; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# The C programs include <qtts/qtts_c.h>, the installed layout.
mkdir -p "$tmp/include/qtts"
ln -s "$src/engine/api/qtts_c.h" "$tmp/include/qtts/qtts_c.h"
# The headers alone, in files named after them (the output names a file by its path in the tree,
# or by that name).
echo '#include "engine/api/qtts.h"' >"$tmp/qtts.h-as-C++.cpp"
echo '#include <qtts/qtts_c.h>' >"$tmp/qtts_c.h-as-C++.cpp"

failed=0
check() {  # check COMPILER FLAGS... FILE
    local file="${*: -1}"
    file="${file#"$src"/}"
    file="${file#"$tmp"/}"
    if "$@" >"$tmp/out.txt" 2>&1; then
        echo "ok: $file"
    else
        echo "FAILED: $file"
        cat "$tmp/out.txt"
        failed=1
    fi
}
cxx_flags=(-std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$src" -I"$tmp/include")
check "$cxx" "${cxx_flags[@]}" "$tmp/qtts.h-as-C++.cpp"
check "$cxx" "${cxx_flags[@]}" "$tmp/qtts_c.h-as-C++.cpp"
check "$cxx" "${cxx_flags[@]}" "$src/apps/embed/embed_pcm.cpp"
check "$cc" -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$tmp/include" "$src/tests/c_api/hello.c"
check "$cc" -std=c99 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$tmp/include" "$src/tests/c_api/features.c"
check "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$tmp/include" "$src/apps/examples/assistant.c"
"$cxx" --version | head -n 1
[[ $failed == 0 ]] && echo "PASSED"
exit $failed
