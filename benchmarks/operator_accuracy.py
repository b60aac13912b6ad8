"""Operator-level accuracy (not a test): kvtier's datasheet model and the measured kernel tables
against AIConfigurator's held-out kernel measurements (sim/studies/operator_accuracy.py).

    .venv/bin/python benchmarks/operator_accuracy.py [--csv points.csv]

For every GPU the tables cover: per operator, the held-out points, then median, 95th-percentile and worst |error|
and the mean signed error (negative: predicted too fast) of each model; then the same per family
over all GPUs. The measured figures interpolate across held-out grid lines, never a table point
itself. Needs the `.[measured]` extra. These are operator measurements from NVIDIA's harness, not
this machine: nothing here is timed.
"""

from __future__ import annotations

import argparse

import pandas as pd

from sim.studies.operator_accuracy import covered_gpus, family_summary, held_out_points, summary


def _percent(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if c.startswith(("datasheet_", "tables_")):
            out[c] = (100 * out[c]).map(lambda v: f"{v:+.1f}%" if c.endswith("mean") else f"{v:.1f}%")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", help="also write every held-out point with both predictions here")
    args = ap.parse_args()
    points = pd.concat([held_out_points(g)[0] for g in covered_gpus()], ignore_index=True)
    pd.set_option("display.width", 200)
    print(_percent(summary(points)).to_string(index=False))
    print()
    print(_percent(family_summary(points)).to_string(index=False))
    if args.csv:
        points.to_csv(args.csv, index=False)
        print(f"wrote {args.csv} ({len(points)} points)")


if __name__ == "__main__":
    main()
