#!/usr/bin/env bash
# Everything the tests need: the package with its test extra (CPU torch pinned to the locally
# served 2.13.0), and Debian's Chromium for the HTML report test (headless, no display).
# Each step says what it does first: the install takes minutes on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
    echo "test-deps: installing Debian's chromium (apt; for the HTML report test)..." >&2
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
echo "test-deps: installing tracestory with its test extra (pip; CPU torch 2.13.0, matplotlib, pandas, dask, ...)..." >&2
python3 -m pip install -q -e '.[test]'
echo "test-deps: done" >&2
