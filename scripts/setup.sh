#!/usr/bin/env bash
# Installs ftkit and everything its tests need on a fresh machine (idempotent).
# - Where no NVIDIA GPU is present, the CPU build of torch is installed first, so that the
#   project's torch range does not pull a multi-GB CUDA build.
# - zsh and fish are installed (Debian/Ubuntu, as root) so the completion scripts can be checked.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v nvidia-smi >/dev/null 2>&1; then
  "$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0"
fi
"$PY" -m pip install -q --disable-pip-version-check -e ".[test]"
if { ! command -v zsh >/dev/null || ! command -v fish >/dev/null; } && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zsh fish >/dev/null
fi
# chromium (Debian's package): the browser tests load the HTML reports in headless Chromium
# (tests/report/test_html_browser.py); they skip only where it is absent and cannot be installed.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi
echo "ftkit installed: $(ftkit --version)" >&2
