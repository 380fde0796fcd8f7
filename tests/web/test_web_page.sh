#!/usr/bin/env bash
# ctest test_web_page: the browser page of `qtts serve` in a real headless Chromium
# (tests/web/test_page.mjs, driven by puppeteer-core). Skips (exit 77), saying what is missing,
# when there is no Chromium, no Node.js or no puppeteer-core in tests/web/node_modules; tools/setup.sh
# installs all three (the Debian packages chromium, nodejs, npm, then `npm ci` here).
#
# usage: tests/web/test_web_page.sh QTTS_BINARY     (QTTS_CHROMIUM=PATH picks another browser)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
qtts="${1:?usage: test_web_page.sh QTTS_BINARY}"

chromium="${QTTS_CHROMIUM:-$(command -v chromium || true)}"
if [ -z "$chromium" ] || [ ! -x "$chromium" ]; then
    echo "SKIPPED: no Chromium (the Debian package chromium; bash tools/setup.sh installs it)"
    exit 77
fi
if ! command -v node >/dev/null 2>&1; then
    echo "SKIPPED: no Node.js (the Debian packages nodejs and npm; bash tools/setup.sh installs them)"
    exit 77
fi
if [ ! -f "$here/node_modules/puppeteer-core/package.json" ]; then
    echo "SKIPPED: puppeteer-core is not installed in tests/web (run: cd tests/web && npm ci; bash tools/setup.sh does it)"
    exit 77
fi
exec node "$here/test_page.mjs" --qtts "$qtts" --chromium "$chromium"
