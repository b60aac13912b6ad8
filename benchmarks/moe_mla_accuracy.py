"""MLA decode and prefill and MoE operators (not a test): kvtier's datasheet model and the measured kernel
tables against AIConfigurator's held-out MLA and MoE measurements (sim/studies/moe_mla_accuracy.py).

    .venv/bin/python benchmarks/moe_mla_accuracy.py [--gpu h200-sxm] [--by-op] [--models] [--csv points.csv]

For every GPU the tables cover: per family (MLA decode, MLA prefill; MoE by routing), the held-out points, the
datasheet model's median / 90th-percentile / worst |error|, its mean signed error and the share of
points where it is optimistic (predicted faster than measured), the same kernel at the balanced
benchmark's own routing, and the measured tables across the held-out gap; then where it is
optimistic, by size; then DeepSeek-R1 as kvtier runs it on 8 GPUs. --by-op splits by KV dtype /
weight format, --models lists every catalog model's shape at TP1, TP8 and EP8. Error = predicted /
measured - 1. Needs the `.[measured]` extra. These are NVIDIA's harness measurements, not this
machine's: nothing here is timed.
"""

from __future__ import annotations

import argparse

import pandas as pd

from sim.studies.moe_mla_accuracy import (
    covered_gpus,
    deepseek_summary,
    held_out_points,
    kvtier_summary,
    sign_pattern,
    summary,
)

SIGNED = ("_mean", "_signed")  # columns printed with their sign


def _percent(df: pd.DataFrame) -> pd.DataFrame:
    out = df.copy()
    for c in out.columns:
        if c.startswith(("datasheet_", "tables_", "routed_")) or c == "optimistic":
            fmt = "{:+.1f}%" if c.endswith(SIGNED) else "{:.1f}%"
            out[c] = (100 * out[c]).map(lambda v, f=fmt: "-" if pd.isna(v) else f.format(v))
    return out


def _print(title: str, df: pd.DataFrame) -> None:
    print(title)
    print(_percent(df).to_string(index=False))
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", action="append", help="only this catalog GPU (repeatable; default: every one covered)")
    ap.add_argument("--by-op", action="store_true", help="also per KV dtype / MoE weight format and routing")
    ap.add_argument("--models", action="store_true", help="also every catalog model's shape at TP1, TP8 and EP8")
    ap.add_argument("--csv", help="also write every held-out point with both predictions here")
    args = ap.parse_args()
    points = pd.concat([held_out_points(g)[0] for g in (args.gpu or covered_gpus())], ignore_index=True)
    pd.set_option("display.width", 250)
    pd.set_option("display.max_rows", 1000)
    _print("Per family (every held-out point; MoE every shape of the table)", summary(points))
    if args.by_op:
        _print("Per KV dtype / weight format and routing", summary(points, ("gpu", "op")))
    _print("Where the datasheet model is optimistic (median signed error; share of points too fast)",
           sign_pattern(points))
    _print("DeepSeek-R1 on 8 GPUs: MLA decode at TP8 (16 heads per GPU), fp8 experts at TP8 and EP8",
           deepseek_summary(points))
    if args.models:
        _print("Catalog models' shapes at TP1, TP8, EP8", kvtier_summary(points, ("TP1", "TP8", "EP8")))
    if args.csv:
        points.to_csv(args.csv, index=False)
        print(f"wrote {args.csv} ({len(points)} points)")


if __name__ == "__main__":
    main()
