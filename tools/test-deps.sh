#!/usr/bin/env bash
# Everything the tests need: the package with its test extra (CPU torch pinned to the locally
# served 2.13.0), and Debian's Chromium for the HTML report test (headless, no display).
# Each step says what it does first: the install takes minutes on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
# The HTML report tests (tests/render/test_html.py, test_timeline_browser.py) fail, not skip,
# without it: install it here when apt can (as root, or through sudo), else say so and stop.
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    if ! command -v apt-get >/dev/null 2>&1 || { [ -n "$SUDO" ] && ! command -v sudo >/dev/null 2>&1; }; then
        echo "test-deps: chromium is not installed and cannot be installed here (needs apt-get, as root or" \
             "with sudo); install a Chromium named 'chromium' on PATH: the HTML report tests need it" >&2
        exit 1
    fi
    echo "test-deps: installing Debian's chromium (apt; headless, for the HTML report tests)..." >&2
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
echo "test-deps: $(chromium --version 2>/dev/null || echo 'chromium found but does not start')" >&2
echo "test-deps: installing tracestory with its test extra (pip; CPU torch 2.13.0, matplotlib, pandas, dask, ...)..." >&2
python3 -m pip install -q -e '.[test]'
echo "test-deps: done" >&2
