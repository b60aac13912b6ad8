#!/usr/bin/env bash
# hwprobe on one H200: GPU exactness + cuda tests, a quick calibration, and the validation grid
# (7B shapes; batch 1/8/32; context 2K/8K; full_hbm, tiered 50% layerwise_async pinned, paper prototype).
# Expected ~5-6 min; hard caps below keep it under the 10-min call limit, and every CSV is written
# after each scenario, so a timeout keeps what was measured.
#
# Prepare here, once (wheels the device image lacks; Python 3.12 there):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 simpy==4.1.2
#   (this file lives at scripts/gpu/h200_validate.sh so it travels with the working tree)
# Device call: run(command="bash scripts/gpu/h200_validate.sh", carry=[".whl"], timeout_s=590), then give_back.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD
W=/tmp/h200; mkdir -p $W/grid
OUT=${OUT:-$W/out}; mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
HW="python3 -m hwprobe.cli"
finish() {  # at most 8 files come back: log, exactness.json, 3 CSVs, one tarball of everything else
  tar czf "$OUT/h200-grid.tgz" -C /tmp h200 --exclude=h200/out 2>/dev/null
  for m in full tier paper; do cp $W/validate-$m.csv "$OUT/" 2>/dev/null; done; }
trap finish EXIT
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,pcie.link.gen.current,pcie.link.width.current --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

echo "== 1. exactness + cuda tests (~40 s)"
timeout 90 $HW exactness --device cuda --json > "$OUT/exactness.json"; echo "exactness rc=$?"
timeout 150 python3 -m pytest -q -m cuda -p no:cacheprovider tests/test_hwprobe_cache.py \
  tests/test_hwprobe_exactness.py tests/test_hwprobe_run.py; echo "cuda tests rc=$?"

echo "== 2. quick calibration (~2 min; CALIBRATE=0 skips, predictions then use datasheet defaults)"
PROFILE=()
if [ "${CALIBRATE:-1}" = 1 ] && timeout 170 $HW calibrate --quick --out $W/profile.yaml; then PROFILE=(--profile $W/profile.yaml); fi

echo "== 3. grid: 96 decode steps, re-tier every 32, prompt unprotected (it stands in for an already-written chain of thought)"
gen() { # name batch context kind semantics prefetch pinned
  cat > $W/grid/$1.yaml <<EOF
name: $1
model: {name: deepseek-r1-distill-qwen-7b, weight_dtype: bf16, kv_dtype: bf16}
hardware: {gpu: h200-sxm}
workload: {batch_size: $2, prompt_tokens: $3, reasoning_tokens: 96, seed: 0}
policy: {kind: $4, semantics: $5, prefetch: $6, pinned: $7, hbm_ratio: 0.5, evict_ratio: 0.1,
         compressed_ratio: 0.0, retier_interval: 32, sink_tokens: 4, recent_window: 128, protect_prompt: false}
EOF
  echo $W/grid/$1.yaml
}
declare -A FILES LIMIT=([full]=120 [tier]=150 [paper]=240)
for b in 1 8 32; do for ctx in 2048 8192; do   # cheapest first
  FILES[full]+=" $(gen full-b$b-c$ctx $b $ctx full_hbm global layerwise_async true)"
  FILES[tier]+=" $(gen tier-b$b-c$ctx $b $ctx tiered global layerwise_async true)"
  FILES[paper]+=" $(gen paper-b$b-c$ctx $b $ctx tiered paper_prototype sync_per_step false)"
done; done
for mode in full tier paper; do
  echo "-- $mode (cap ${LIMIT[$mode]} s)"; SECONDS=0
  COLUMNS=160 timeout ${LIMIT[$mode]} $HW validate --device cuda "${PROFILE[@]}" --out $W/validate-$mode.csv \
    --runs-dir $W/runs ${FILES[$mode]}
  echo "$mode rc=$? in ${SECONDS}s"
done
date -u
