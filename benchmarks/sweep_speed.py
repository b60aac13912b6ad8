"""Sweep speed benchmark (not a test): points per second of `kvsim sweep` on local cores.

    .venv/bin/python benchmarks/sweep_speed.py [POINTS] [--level fast|projection] [--workers N]

Writes a spec of POINTS distinct points (default 2,000) - 7B and 8B, bf16 and int4, six GPUs,
policies, batches 1-64 and reasoning lengths 512-4,096 - into a temporary folder, runs it from
empty, and prints wall seconds and points per second. Nothing is stored between runs.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time
from pathlib import Path

import yaml

from sim.sweep.run import run_sweep

REPO = Path(__file__).resolve().parents[1]


def spec(points: int, level: str) -> dict:
    gpus = ["rtx-5080", "rtx-4090", "l40s", "a100-80gb-sxm", "h100-sxm", "h200-sxm"]
    fixed = 2 * 2 * len(gpus) * 5  # models x dtypes x GPUs x policies
    per_axis = max(1, math.ceil(math.sqrt(points / fixed)))
    return {
        "name": f"bench-{points}", "base": str(REPO / "scenarios" / "h200-7b-batch.yaml"), "level": level,
        "max_batch": False,
        "axes": [
            {"grid": {"model.name": ["deepseek-r1-distill-qwen-7b", "llama-3.1-8b"], "model.weight_dtype": ["bf16", "int4"],
                      "hardware.gpu": gpus}},
            {"zip": {"policy.kind": ["full_hbm", "evict_only", "tiered", "tiered", "tiered"],
                     "policy.hbm_ratio": [1.0, 0.9, 0.25, 0.5, 0.75], "policy.evict_ratio": [0.0, 0.1, 0.1, 0.1, 0.1],
                     "policy.compressed_ratio": [0.0, 0.0, 0.0, 0.0, 0.0]}},
            {"grid": {"workload.batch_size": [1 + (63 * i) // max(1, per_axis - 1) for i in range(per_axis)],
                      "workload.reasoning_tokens": [512 + (3584 * i) // max(1, per_axis - 1) for i in range(per_axis)]}},
        ],
        "keep": ["fits", "throughput_tok_per_s", "tpot_p50_s", "hbm_peak_bytes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("points", type=int, nargs="?", default=2000)
    ap.add_argument("--level", default="fast", choices=["fast", "projection", "full"])
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spec.yaml"
        path.write_text(yaml.safe_dump(spec(args.points, args.level)))
        t0 = time.perf_counter()
        outcome = run_sweep(path, Path(tmp) / "out", workers=args.workers, progress=False)
        wall = time.perf_counter() - t0
    print(f"{outcome.points} points ({outcome.unique} distinct) at level {args.level} on {args.workers} local "
          f"workers: {wall:.1f} s wall, {outcome.unique / wall:.1f} points/s")


if __name__ == "__main__":
    main()
