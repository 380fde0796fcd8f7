#!/usr/bin/env bash
# Tests libqtts.so from outside the tree, as a user gets it: installs the build into a temporary
# prefix, checks that the library exports only qtts_* symbols, then builds tests/c_api/hello.c
# twice against the installed files (cc + pkg-config, and a CMake project with
# find_package(qtts)) and runs both; each speaks a sentence with the demo model through the C API.
# Then tests/c_api/features.c (pkg-config): request fields, the chunk callback, barge-in, counters.
# Exit 0: all held; 1: something failed; 77: skipped (no pkg-config or C compiler).
# usage: tests/tools/test_c_api_install.sh SOURCE_DIR BUILD_DIR CACHE_DIR
set -euo pipefail
src="$1"
build="$2"
# The demo model is written to the cache: the caller's QTTS_CACHE_DIR wins, like the other tests.
export QTTS_CACHE_DIR="${QTTS_CACHE_DIR:-$3}"
cc="${CC:-cc}"
command -v pkg-config >/dev/null || { echo "SKIP: pkg-config not found"; exit 77; }
command -v "$cc" >/dev/null || { echo "SKIP: no C compiler ($cc)"; exit 77; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log"
for f in lib/libqtts.so lib/libqtts.so.0 include/qtts/qtts_c.h lib/pkgconfig/qtts.pc \
         lib/cmake/qtts/qttsConfig.cmake lib/cmake/qtts/qttsConfigVersion.cmake; do
    [[ -e "$prefix/$f" ]] || { echo "FAILED: $f was not installed"; exit 1; }
done

soname="$(readelf -d "$prefix/lib/libqtts.so" | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p')"
[[ "$soname" == "libqtts.so.0" ]] || { echo "FAILED: SONAME is '$soname', not libqtts.so.0"; exit 1; }
# Only the C API leaves the library (the version node QTTS_0 is listed as an absolute symbol).
others="$(nm -D --defined-only "$prefix/lib/libqtts.so" | grep -v ' qtts_' | grep -v ' A QTTS_0$' || true)"
[[ -z "$others" ]] || { echo "FAILED: libqtts.so exports more than qtts_*:"; echo "$others" | head; exit 1; }

# The header alone compiles as C99 and as C++.
echo '#include <qtts/qtts_c.h>' >"$tmp/h.cpp"
"${CXX:-c++}" -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I"$prefix/include" "$tmp/h.cpp"

echo "== pkg-config + $cc"
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
flags="$(pkg-config --cflags --libs qtts)"
echo "pkg-config --cflags --libs qtts: $flags"
# shellcheck disable=SC2086  # the flags are words
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic "$src/tests/c_api/hello.c" -o "$tmp/hello-pc" $flags \
    -Wl,-rpath,"$(pkg-config --variable=libdir qtts)"
"$tmp/hello-pc"

echo "== request fields, chunk callback, barge-in, engine counters (tests/c_api/features.c)"
# shellcheck disable=SC2086
"$cc" -std=c99 -Wall -Wextra -Werror -pedantic "$src/tests/c_api/features.c" -o "$tmp/features" $flags -pthread \
    -Wl,-rpath,"$(pkg-config --variable=libdir qtts)"
"$tmp/features"

echo "== CMake find_package(qtts)"
cmake -S "$src/tests/c_api" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_BUILD_TYPE=Release >"$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/cmake-build" >"$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
"$tmp/cmake-build/qtts-c-hello"
echo "PASSED"
