#!/usr/bin/env bash
# Idempotent set-up: a virtual environment in .venv with kvtier and its extras installed.
# torch==2.13.0 is pinned first because this project's machines carry that CPU build on disk;
# on a GPU machine with its own torch already in the venv, nothing is replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  .venv/bin/pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[hwprobe,test,sweep,measured]"
# Headless chromium for the report's browser test (tests/test_report_browser.py). Installed only as
# root with apt-get, quietly; never fatal: elsewhere a warning, and the test skips (fails under CI).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1; then
      echo "setup: warning: apt-get could not install chromium; the report's browser test cannot run" >&2
    fi
  else
    echo "setup: warning: chromium not found and not installable here (needs root and apt-get); the report's browser test cannot run" >&2
  fi
fi
