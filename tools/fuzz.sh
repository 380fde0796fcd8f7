#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan + UBSan) in their own folder and
# runs each for a while, starting from the committed seed corpus. docs/fuzzing.md explains
# longer campaigns and what the runs found.
#
#   tools/fuzz.sh                       every target, QTTS_FUZZ_SECONDS (default 10) each
#   tools/fuzz.sh --seconds 300 fuzz_config fuzz_tokenizer
#   tools/fuzz.sh --smoke               the bounded run of tools/test.sh (a few seconds each)
#
# New inputs go to <build>/corpus/<target>, crashes to <build>/artifacts/<target>/, logs to
# <build>/logs/<target>.log. Exit status: 0 all clean, 1 a target found something, 77 when
# clang or libFuzzer is missing (nothing was run).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${QTTS_FUZZ_BUILD_DIR:-build-fuzz}"
JOBS="${QTTS_JOBS:-$(nproc)}"
SECONDS_EACH="${QTTS_FUZZ_SECONDS:-10}"
ALL_TARGETS=(fuzz_safetensors fuzz_config fuzz_tokenizer fuzz_audio_file fuzz_voice_file fuzz_speech_params
  fuzz_ws_message)
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_EACH="$2"; shift 2 ;;
    --smoke) SECONDS_EACH="${QTTS_FUZZ_SMOKE_SECONDS:-4}"; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    fuzz_*) targets+=("$1"); shift ;;
    *) echo "fuzz: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

CXX_FUZZ="${QTTS_FUZZ_CXX:-clang++}"
CC_FUZZ="${QTTS_FUZZ_CC:-clang}"
if ! command -v "$CXX_FUZZ" >/dev/null || ! command -v "$CC_FUZZ" >/dev/null; then
  echo "fuzz: $CXX_FUZZ / $CC_FUZZ not found (tools/setup.sh installs clang)" >&2
  exit 77
fi
probe_dir="$(mktemp -d)"
trap 'rm -rf "$probe_dir"' EXIT
printf '#include <cstddef>\n#include <cstdint>\nextern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }\n' \
  >"$probe_dir/probe.cpp"
if ! "$CXX_FUZZ" -fsanitize=fuzzer "$probe_dir/probe.cpp" -o "$probe_dir/probe" 2>"$probe_dir/err"; then
  echo "fuzz: $CXX_FUZZ cannot link libFuzzer ($(head -n1 "$probe_dir/err")); install libclang-rt-14-dev" >&2
  exit 77
fi

build_start=$(date +%s)
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_C_COMPILER="$CC_FUZZ" \
  -DQTTS_FUZZ=ON -DQTTS_BUILD_TESTS=OFF -DQTTS_CUDA=OFF >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS" --target "${targets[@]}"
echo "fuzz: built ${#targets[@]} target(s) in $(( $(date +%s) - build_start )) s"

# The tokenizer target falls back to the embedded demo model, written to the cache.
export QTTS_CACHE_DIR="${QTTS_CACHE_DIR:-$PWD/$BUILD_DIR/cache}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=()
printf '%-20s %8s %12s %8s  %s\n' target seconds execs corpus result
for t in "${targets[@]}"; do
  corpus="$BUILD_DIR/corpus/$t"
  artifacts="$BUILD_DIR/artifacts/$t"
  log="$BUILD_DIR/logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  start=$(date +%s)
  rc=0
  # -timeout: one input taking longer is a hang; -rss_limit_mb: more memory is a finding.
  "$BUILD_DIR/tests/fuzz/$t" "$corpus" "tests/fuzz/corpus/$t" -max_total_time="$SECONDS_EACH" -timeout=10 \
    -rss_limit_mb=2048 -max_len=16384 -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  result="ok"
  if [ "$rc" -ne 0 ]; then
    result="FAILED (rc $rc): see $log and $artifacts/"
    failed+=("$t")
  fi
  printf '%-20s %8s %12s %8s  %s\n' "$t" "$(( $(date +%s) - start ))" "${execs:-?}" \
    "$(find "$corpus" -type f | wc -l)" "$result"
done
if [ ${#failed[@]} -gt 0 ]; then
  for t in "${failed[@]}"; do
    echo "---- $t: end of $BUILD_DIR/logs/$t.log"
    tail -n 40 "$BUILD_DIR/logs/$t.log"
  done
  echo "fuzz: ${#failed[@]} target(s) found a problem: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all ${#targets[@]} target(s) clean"
