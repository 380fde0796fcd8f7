#!/usr/bin/env bash
# The test command: installs the packages (tools/setup.sh), checks the layers
# (tools/check-layers.sh), builds, and runs every test except
# those labelled `gpu` (pass -L gpu through QTTS_CTEST_ARGS on a GPU machine). Golden tests read
# ../shared/reference and are reported as skipped when it is absent. Then a bounded fuzz smoke
# run (tools/fuzz.sh --smoke: every libFuzzer target a few seconds from its seed corpus; skipped,
# saying why, without clang/libFuzzer; QTTS_FUZZ_SMOKE=0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
# Includes point down the layers (docs/architecture.md); seconds, so it fails before the build.
bash tools/check-layers.sh
bash tools/build.sh
BUILD_DIR="${QTTS_BUILD_DIR:-build}"
# The embedded default model is cached per run so tests never touch the user's cache.
export QTTS_CACHE_DIR="${QTTS_CACHE_DIR:-$PWD/$BUILD_DIR/cache}"

# The fuzz smoke run goes first, so that ctest's summary is the last thing printed.
fuzz_rc=0
if [ "${QTTS_FUZZ_SMOKE:-1}" = "0" ]; then
  echo "fuzz smoke: SKIPPED (QTTS_FUZZ_SMOKE=0)"
else
  bash tools/fuzz.sh --smoke || fuzz_rc=$?
  if [ "$fuzz_rc" -eq 77 ]; then
    echo "fuzz smoke: SKIPPED (clang or libFuzzer missing; see the message above)"
    fuzz_rc=0
  elif [ "$fuzz_rc" -ne 0 ]; then
    echo "fuzz smoke: FAILED (exit $fuzz_rc); the tests run anyway, the command fails at the end"
  fi
fi

ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${QTTS_JOBS:-$(nproc)}" ${QTTS_CTEST_ARGS:--LE gpu}
exit "$fuzz_rc"
