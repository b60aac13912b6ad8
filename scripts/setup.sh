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
.venv/bin/pip install --quiet --disable-pip-version-check -e ".[hwprobe,test]"
