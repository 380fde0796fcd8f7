#!/usr/bin/env bash
# The whole CPU test suite under the sanitizers, in builds of their own (CUDA off, so it also
# proves that a machine without nvcc builds every test). Not part of the test command: the
# AddressSanitizer build alone takes ~40 minutes on two cores. Run it before landing engine,
# server or parser changes; docs/engine.md ("Sanitizers") has the last results.
#
#   tools/sanitize.sh            address: ASan + UBSan (+ LeakSanitizer), every test but gpu
#   tools/sanitize.sh thread     ThreadSanitizer on the multi-threaded pipeline, engine and server tests
#
# Extra ctest arguments go through QTTS_CTEST_ARGS (e.g. QTTS_CTEST_ARGS="-R test_engine"); in
# address mode they replace the three preloaded tests' run (below), which is left out then.
# Exit status: ctest's (0: every test passed with no sanitizer report; a report fails its test).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-address}"
JOBS="${QTTS_JOBS:-$(nproc)}"

case "$mode" in
  address)
    build=build-asan
    cmake -S . -B "$build" -DQTTS_CUDA=OFF -DQTTS_SANITIZE_ADDRESS=ON -DQTTS_SANITIZE_UNDEFINED=ON \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$build" -j "$JOBS"
    # halt_on_error: an undefined-behaviour report fails its test instead of scrolling past.
    export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
    export ASAN_OPTIONS="detect_leaks=1"
    export OPENBLAS_NUM_THREADS=1 QTTS_CACHE_DIR="$PWD/$build/cache"
    status=0
    # Programs the sanitizers did not build (python3, and the C programs the install tests compile
    # against libqtts.so) need the runtime preloaded, libstdc++ with it so that ASan can intercept
    # C++ throws; their own leaks (the interpreter's) are not ours.
    host_tests="^(test_python_bindings|test_c_api_install|test_assistant_example)$"
    # shellcheck disable=SC2086
    ctest --test-dir "$build" --output-on-failure -j "$JOBS" --timeout 1500 -LE gpu -E "$host_tests" \
      ${QTTS_CTEST_ARGS:-} || status=$?
    [ -n "${QTTS_CTEST_ARGS:-}" ] && exit "$status"
    LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so.6)" \
      ASAN_OPTIONS="detect_leaks=0:verify_asan_link_order=0" \
      ctest --test-dir "$build" --output-on-failure -j "$JOBS" --timeout 1500 -R "$host_tests" || status=$?
    exit "$status"
    ;;
  thread)
    build=build-tsan
    tests=(test_engine test_pipeline test_scheduler test_spsc_ring test_jitter_buffer test_audio_output
      test_server test_server_engine test_server_protocol test_serve_sigterm)
    targets=("${tests[@]}" qtts_cli)  # the server tests run the qtts program
    cmake -S . -B "$build" -DQTTS_CUDA=OFF -DQTTS_SANITIZE_THREAD=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
    cmake --build "$build" -j "$JOBS" --target "${targets[@]}"
    # One BLAS thread: OpenBLAS's uninstrumented workers hand work over through spin flags that
    # ThreadSanitizer reports as races inside sgemm (docs/engine.md).
    export OPENBLAS_NUM_THREADS=1 QTTS_CACHE_DIR="$PWD/$build/cache"
    # shellcheck disable=SC2086
    exec ctest --test-dir "$build" --output-on-failure -j "$JOBS" --timeout 1500 \
      -R "^($(IFS='|'; echo "${tests[*]}"))$" \
      ${QTTS_CTEST_ARGS:-}
    ;;
  *)
    echo "sanitize: unknown mode '$mode' (address or thread)" >&2
    exit 2
    ;;
esac
