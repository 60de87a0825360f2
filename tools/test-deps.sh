#!/usr/bin/env bash
# Everything the tests need: the package with its test extra (CPU torch pinned to the locally
# served 2.13.0), and Debian's Chromium for the HTML report test (headless, no display).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq chromium >/dev/null
fi
python3 -m pip install -q -e '.[test]'
