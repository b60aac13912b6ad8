#!/usr/bin/env bash
# hwprobe on one H200, in value order under one global deadline (DEADLINE s, default 300):
#   1. exactness on the GPU (T1 offload bitwise exact?; EXACTNESS=0 skips)  cap  45 s
#   2. the cuda tests of the cache and calibration: stream/event hazards and  cap  45 s
#      exactness in every prefetch mode (skipped when DEVICE=cpu)
#   3. quick calibration -> profile.yaml (CALIBRATE=0 skips; on failure or  cap 100 s
#      timeout the predictions use the datasheet defaults, and the log says so)
#   4. the validation grid, ONE `hwprobe validate` call: 7B shapes, context 2K then 8K, batch 1/8/32,
#      and for each batch full_hbm, tiered 50% layerwise_async pinned, paper prototype in a row, so
#      any finished prefix already gives tiered-vs-full ratios. validate rewrites its CSVs after every
#      scenario, so a timeout keeps the finished rows; a failing scenario is logged and skipped.
#      Last, if time is left (EXTRA_70B=0 drops them): R1-Distill-Llama-70B with int4 weights, batch 8,
#      context 2K, full_hbm and tiered - the whole model on one H200, no layer subset.
#                                                                           the time left
# Each stage gets min(its cap, time left - RESERVE) through `timeout`; the log gives each rc and seconds.
#
# Prepare here, once (wheels the device image lacks; Python 3.12 there; pydantic needs
# typing-extensions >= 4.16, newer than the image may hold):
#   mkdir -p .git/info && echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 simpy==4.1.2 \
#     typing-extensions==4.16.0
#   (this file lives at scripts/gpu/h200_validate.sh so it travels with the working tree)
# Device call: run(command="bash scripts/gpu/h200_validate.sh", carry=[".whl"], timeout_s=330), then
# give_back unless rerunning at once. What comes back under $OUT (at most 8 files): log.txt,
# exactness.json, profile.yaml (if calibrated), validate.csv and validate.ratios.csv (tiered and paper
# throughput over full_hbm's, same shape; both rewritten after every scenario), validate.errors.csv (only
# when the whole grid finished) and work.tgz (generated scenarios + one run directory per scenario).
# Afterwards commit the profile and the CSVs under scenarios/hardware/measured/ (and the run directories:
# with them, `hwprobe validate --measured runs --profile profile.yaml grid/*.yaml` re-predicts the grid
# on any machine, so later model changes can be checked against this GPU without it).
#
# Dry run on a CPU (what tests/test_gpu_script.py does, in seconds):
#   DEVICE=cpu PYTHON=.venv/bin/python CALIBRATE=0 BATCHES="1 2" CONTEXTS=64 STEPS=24 RETIER=8 RECENT=8 \
#   MODEL_YAML="{hf_config: $PWD/scenarios/models/tiny-qwen2.json, weight_dtype: bf16, kv_dtype: bf16}" \
#   WORK=/tmp/h200-dry OUT=/tmp/h200-dry/out bash scripts/gpu/h200_validate.sh
# (the deadline test also sets RESERVE=1 KILL_AFTER=1 MIN_CAP=3 so that a short DEADLINE still leaves the
# grid a few seconds; on the GPU leave all three at their defaults, 8, 5 and 5 s)
set -uo pipefail
SECONDS=0
export PYTHONUNBUFFERED=1
DEVICE=${DEVICE:-cuda}
PYTHON=${PYTHON:-python3}
[ -n "${MODEL_YAML:-}" ] || MODEL_YAML='{name: deepseek-r1-distill-qwen-7b, weight_dtype: bf16, kv_dtype: bf16}'
BATCHES=${BATCHES:-1 8 32}
CONTEXTS=${CONTEXTS:-2048 8192}
STEPS=${STEPS:-64}       # reasoning (decode) tokens per sequence: re-tiers after steps 31 and 63
RETIER=${RETIER:-32}     # re-tier interval
RECENT=${RECENT:-128}    # recent window
CALIBRATE=${CALIBRATE:-1}  # 0 skips stage 2
EXACTNESS=${EXACTNESS:-1}  # 0 skips stage 1 (a rerun after a shot that already has it)
EXTRA_70B=${EXTRA_70B:-1}  # 0 drops the two 70B int4 scenarios at the end of the grid
DEADLINE=${DEADLINE:-300}  # seconds from the start for the whole script
RESERVE=${RESERVE:-8}      # kept back from every stage for the ones after it and the tarball
KILL_AFTER=${KILL_AFTER:-5}  # a stage that ignores SIGTERM is killed this long after its cap
MIN_CAP=${MIN_CAP:-5}      # a stage that would get less than this many seconds is not run
WORK=${WORK:-/tmp/h200}
OUT=${OUT:-$WORK/out}
SITE=${SITE:-/tmp/site}
WHEELS=${WHEELS:-.whl}     # wheels the device image lacks (a dry run points this elsewhere)

mkdir -p "$WORK" "$OUT" || exit 3
rm -rf "$WORK/grid" "$WORK/runs"
rm -f "$OUT/log.txt" "$OUT/exactness.json" "$OUT/profile.yaml" "$OUT/validate.csv" "$OUT/validate.errors.csv" \
  "$OUT/validate.ratios.csv" \
  "$OUT/work.tgz"
mkdir -p "$WORK/grid"
HW=("$PYTHON" -m hwprobe.cli)
declare -A RC

# stage NAME CAP CMD...: run CMD under timeout min(CAP, time left - RESERVE); messages go to stderr so
# the caller may redirect CMD's stdout. Returns CMD's rc (124 or 137: timed out; 125: not run, no time left).
stage() {
  local name=$1 cap=$2 avail t0 rc
  shift 2
  avail=$(( DEADLINE - SECONDS - RESERVE - KILL_AFTER ))
  (( avail < cap )) && cap=$avail
  if (( cap < MIN_CAP )); then
    echo "== $name: no time left ($(( DEADLINE - SECONDS )) s of ${DEADLINE} s), not run" >&2
    RC[$name]=no_time; echo "== $name rc=no_time in 0 s" >&2; return 125
  fi
  echo "== $name (cap ${cap} s; at ${SECONDS} s of ${DEADLINE} s)" >&2
  t0=$SECONDS
  timeout -k "$KILL_AFTER" "$cap" "$@"
  rc=$?
  RC[$name]=$rc
  echo "== $name rc=$rc in $(( SECONDS - t0 )) s$( (( rc == 124 || rc == 137 )) && echo ' (TIMED OUT)')" >&2
  return $rc
}

finish() {  # one tarball of the work dir (generated scenarios, run directories); the rest is in $OUT
  local parts=() p
  for p in grid runs; do [ -e "$WORK/$p" ] && parts+=("$p"); done
  (( ${#parts[@]} )) && tar czf "$OUT/work.tgz" -C "$WORK" "${parts[@]}"
  echo "== summary: $(for s in exactness calibrate grid cuda_tests; do printf '%s=%s ' "$s" "${RC[$s]:-not run}"; done)"
  echo "== done in ${SECONDS} s (deadline ${DEADLINE} s); files in $OUT:"; ls -l "$OUT"
  date -u
}

gen() {  # name batch context kind semantics prefetch pinned [model] -> path of the scenario YAML
  cat > "$WORK/grid/$1.yaml" <<EOF
name: $1
model: ${8:-$MODEL_YAML}
hardware: {gpu: h200-sxm}
workload: {batch_size: $2, prompt_tokens: $3, reasoning_tokens: $STEPS, seed: 0}
policy: {kind: $4, semantics: $5, prefetch: $6, pinned: $7, hbm_ratio: 0.5, evict_ratio: 0.1,
         compressed_ratio: 0.0, retier_interval: $RETIER, sink_tokens: 4, recent_window: $RECENT, protect_prompt: false}
EOF
  echo "$WORK/grid/$1.yaml"
}

main() {
  date -u
  echo "DEVICE=$DEVICE PYTHON=$PYTHON CALIBRATE=$CALIBRATE DEADLINE=$DEADLINE RESERVE=$RESERVE"
  echo "BATCHES='$BATCHES' CONTEXTS='$CONTEXTS' STEPS=$STEPS RETIER=$RETIER RECENT=$RECENT WORK=$WORK OUT=$OUT"
  echo "MODEL_YAML=$MODEL_YAML"
  local whls=("$WHEELS"/*.whl)
  if [ -e "${whls[0]}" ]; then
    echo "installing ${#whls[@]} wheels from $WHEELS into $SITE"
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
      "${whls[@]}" || { echo "wheel install failed"; return 3; }
    export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
  else
    echo "no $WHEELS/*.whl: using $PYTHON's own packages"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  fi
  [ "$DEVICE" = cpu ] || timeout 20 nvidia-smi --format=csv \
    --query-gpu=name,driver_version,memory.total,clocks.sm,pcie.link.gen.current,pcie.link.width.current

  # 1. exactness
  if [ "$EXACTNESS" = 1 ]; then
    stage exactness 45 "${HW[@]}" exactness --device "$DEVICE" --json > "$OUT/exactness.json"
    [ -s "$OUT/exactness.json" ] && "$PYTHON" -c "import json, sys; r = json.load(open(sys.argv[1]))
print('T1 offload exact:', r['t1_offload']['exact'], '| merged within tolerance:', r['t1_offload_merged']['within_tolerance'],
      '| T2 within bound:', r['t2_int8']['within_bound'], '| greedy T1 == full:', r['greedy']['full_vs_t1_identical'])" \
      "$OUT/exactness.json"
    [ -s "$OUT/exactness.json" ] || rm -f "$OUT/exactness.json"
  else
    RC[exactness]=skipped
    echo "== exactness: skipped (EXACTNESS=$EXACTNESS)"
  fi

  # 2. cuda tests (hazards and exactness of every prefetch mode, which the grid's numbers rely on)
  if [ "$DEVICE" = cpu ]; then
    RC[cuda_tests]=skipped
    echo "== cuda_tests: skipped (DEVICE=cpu)"
  else
    stage cuda_tests 45 "$PYTHON" -m pytest -q -m cuda -p no:cacheprovider tests/test_hwprobe_cache.py \
      tests/test_hwprobe_calibrate.py tests/test_hwprobe_qlinear.py
  fi

  # 3. quick calibration
  local profile=()
  if [ "$CALIBRATE" = 1 ]; then
    if stage calibrate 100 "${HW[@]}" calibrate --quick --device "$DEVICE" --out "$OUT/profile.yaml" \
        && [ -s "$OUT/profile.yaml" ]; then
      profile=(--profile "$OUT/profile.yaml")
      echo "predictions use the measured profile $OUT/profile.yaml"
    else
      rm -f "$OUT/profile.yaml"
      echo "calibration not run, failed or timed out: predictions fall back to the datasheet defaults (h200-sxm catalog)"
    fi
  else
    RC[calibrate]=skipped
    echo "== calibrate: skipped (CALIBRATE=$CALIBRATE): predictions use the datasheet defaults (h200-sxm catalog)"
  fi

  # 4. the grid, most valuable first: context by context, batch by batch, full / tier / paper in a row
  echo "-- grid: $STEPS decode steps, re-tier every $RETIER, prompt unprotected (it stands in for an" \
    "already-written chain of thought)"
  local files=() ctx b
  for ctx in $CONTEXTS; do for b in $BATCHES; do
    files+=("$(gen "full-b$b-c$ctx" "$b" "$ctx" full_hbm global layerwise_async true)")
    files+=("$(gen "tier-b$b-c$ctx" "$b" "$ctx" tiered global layerwise_async true)")
    files+=("$(gen "paper-b$b-c$ctx" "$b" "$ctx" tiered paper_prototype sync_per_step false)")
  done; done
  if [ "$EXTRA_70B" = 1 ]; then
    local m70='{name: deepseek-r1-distill-llama-70b, weight_dtype: int4, weight_group_size: 128, kv_dtype: bf16}'
    files+=("$(gen full-70b-int4-b8-c2048 8 2048 full_hbm global layerwise_async true "$m70")")
    files+=("$(gen tier-70b-int4-b8-c2048 8 2048 tiered global layerwise_async true "$m70")")
  fi
  echo "${#files[@]} scenarios: $(for f in "${files[@]}"; do basename "$f" .yaml; done | tr '\n' ' ')"
  local threads=()  # a CPU dry run on one thread: tiny shapes, and no OpenMP spinning on a busy machine
  [ "$DEVICE" = cpu ] && threads=(--threads 1)
  COLUMNS=160 stage grid "$DEADLINE" "${HW[@]}" validate --device "$DEVICE" ${profile[@]+"${profile[@]}"} ${threads[@]+"${threads[@]}"} \
    --out "$OUT/validate.csv" --runs-dir "$WORK/runs" "${files[@]}"
  if [ -s "$OUT/validate.csv" ]; then
    echo "validate.csv: $(tail -n +2 "$OUT/validate.csv" | cut -d, -f1 | uniq | wc -l) of ${#files[@]} scenarios" \
      "measured ($(( $(wc -l < "$OUT/validate.csv") - 1 )) rows)"
  else
    echo "validate.csv: none written"
  fi

  finish
  # exit 0 only when the whole grid ran clean and no other stage failed or timed out; a stage
  # skipped on request (EXACTNESS, CALIBRATE, DEVICE=cpu) is fine, one skipped for lack of time is not
  [ "${RC[grid]:-}" = 0 ] || return 1
  for s in exactness calibrate cuda_tests; do case ${RC[$s]:-} in 0|skipped) ;; *) return 1;; esac; done
}

main 2>&1 | tee "$OUT/log.txt"
exit "${PIPESTATUS[0]}"
