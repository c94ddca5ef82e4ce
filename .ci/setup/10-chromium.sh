#!/usr/bin/env bash
# Headless Chromium for the report's browser test (tests/report/test_browser.py): Debian's `chromium` package.
# Idempotent: does nothing when a chromium binary is already on PATH.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  echo "chromium present: $( (chromium --version || chromium-browser --version) 2>/dev/null | head -1)"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
chromium --version
