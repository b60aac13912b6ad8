#!/usr/bin/env bash
# Set up (idempotent) and run the main job: the default 7B-70B projection report on built-in
# datasheet hardware (no GPU needed), written to reports/projection.html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvsim report --out reports/projection.html "$@"
