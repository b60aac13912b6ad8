#!/usr/bin/env bash
# Set up (idempotent) and run the main job: the default projection on built-in datasheet hardware.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/kvsim run scenarios/h200-7b-batch.yaml --out runs/h200-7b-batch "$@"
