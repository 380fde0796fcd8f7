#!/usr/bin/env bash
# The test command: installs the packages (tools/setup.sh), builds, and runs every test except
# those labelled `gpu` (pass -L gpu through QTTS_CTEST_ARGS on a GPU machine). Golden tests read
# ../shared/reference and are reported as skipped when it is absent.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
bash tools/build.sh
BUILD_DIR="${QTTS_BUILD_DIR:-build}"
# The embedded default model is cached per run so tests never touch the user's cache.
export QTTS_CACHE_DIR="${QTTS_CACHE_DIR:-$PWD/$BUILD_DIR/cache}"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "${QTTS_JOBS:-$(nproc)}" ${QTTS_CTEST_ARGS:--LE gpu}
