"""Sibling systems' fused-experts tables held against each other, slice by slice (not a test):

    .venv/bin/python benchmarks/sibling_tables.py [GPU_A GPU_B [FRAMEWORK]]     # default: b200 gb200 trtllm
    .venv/bin/python benchmarks/sibling_tables.py --four [FRAMEWORK]            # b200 gb200 b300 gb300

B200 and GB200 carry the same Blackwell die and HBM rate, so one engine's MoE tables for the two should
differ by a few percent everywhere. For every slice both time (weight format, routing, experts, top-k,
hidden, inter, tp, ep) it prints the median time ratio A / B over their common token counts, then the
slices furthest from the overall median - where one collector run stands apart from its sibling (found
2026-12-07: TensorRT-LLM's B200 table times DeepSeek-R1's NVFP4 EP4 slice ~1.8x slower than GB200's,
~500 against ~290 us at 32-512 tokens, while the two agree within a few percent over most slices).

With --four, Blackwell Ultra's B300 and GB300 join them (the same HBM rate; their tables agree with B200's
and GB200's over most slices too): for every slice all four time, each system's median ratio to the
median of the four, and per system the share of slices it sits >= 1.3x from that consensus. Two of the four
rarely stand apart together (1.6-3.9% of slices), so the consensus names the outlier where two siblings
cannot. Found 2026-12-07 (TensorRT-LLM 1.3.0rc20 tables): each system stands apart in 2-7% of the bf16 and
fp8 slices, either way; in NVFP4 B200 stands apart in 11% of its 1,554 slices, every one of them slower
(DeepSeek-R1's and Qwen3-235B's EP4 slices among them), the other three in 2-4%. kvtier reads each table as
measured but for such points: since 2026-12-07 a point >= 1.3x from its die twin's (B200 / GB200, B300 / GB300) and
from the four's median takes the twin's time (`kernel_tables.twin_checked_moe`). This benchmark reads the tables
as the package holds them, before that check. Needs the `.[measured]` extra; these are operator measurements from
NVIDIA's harness, nothing here is timed.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from sim.inputs.kernel_tables import moe_curves, raw_moe_table

SHOWN = 15
FOUR = ("b200", "gb200", "b300", "gb300")
APART = 1.3  # a slice stands apart where its median ratio to the consensus is this far either way
KEY = ["quant", "routing", "experts", "top_k", "hidden", "inter", "tp", "ep"]


def raw_slices(gpu: str, framework: str) -> dict[tuple, tuple[np.ndarray, np.ndarray]]:
    """(quant, routing, experts, top-k, hidden, inter, tp, ep) -> (tokens, seconds) of a GPU's fused-experts table
    as read, before kvtier's die-twin check (`kernel_tables.raw_moe_table`)."""
    table = raw_moe_table(gpu, framework)
    if table is None:
        raise SystemExit(f"no {framework} fused-experts table for {gpu} (the .[measured] extra installed?)")
    return moe_curves(table)


def slice_ratios(gpu_a: str, gpu_b: str, framework: str) -> pd.DataFrame:
    """One row per MoE slice both tables time: its key, the common token counts, and the median, min and
    max of time(A) / time(B) over them."""
    a, b = (raw_slices(g, framework) for g in (gpu_a, gpu_b))
    rows = []
    for key in sorted(set(a) & set(b)):
        (ta, sa), (tb, sb) = a[key], b[key]
        common = np.intersect1d(ta, tb)
        if not len(common):
            continue
        ratio = np.array([sa[ta == t][0] / sb[tb == t][0] for t in common])
        rows.append((*key, len(common), float(np.median(ratio)), float(ratio.min()), float(ratio.max())))
    return pd.DataFrame(rows, columns=[*KEY, "tokens", "median", "min", "max"])


def consensus_ratios(gpus: tuple[str, ...], framework: str) -> pd.DataFrame:
    """One row per MoE slice every one of `gpus` times: its key, the common token counts, and for each GPU the
    median over them of its time / the median of the GPUs' times at that count."""
    slices = [raw_slices(g, framework) for g in gpus]
    rows = []
    for key in sorted(set.intersection(*(set(s) for s in slices))):
        common = slices[0][key][0]
        for s in slices[1:]:
            common = np.intersect1d(common, s[key][0])
        if not len(common):
            continue
        times = np.array([[s[key][1][s[key][0] == t][0] for t in common] for s in slices])  # gpu x token
        ratio = np.median(times / np.median(times, axis=0), axis=1)
        rows.append((*key, len(common), *ratio))
    return pd.DataFrame(rows, columns=[*KEY, "tokens", *gpus])


def _pairs(argv: list[str]) -> None:
    gpu_a, gpu_b, framework = (argv + ["b200", "gb200", "trtllm"][len(argv):])[:3]
    table = slice_ratios(gpu_a, gpu_b, framework)
    overall = float(np.median(table["median"]))
    print(f"{framework} fused experts, {gpu_a} / {gpu_b}: {len(table)} slices both time; "
          f"median of the slices' median ratios {overall:.3f}")
    print(table.groupby("quant")["median"].describe(percentiles=[0.1, 0.5, 0.9]).round(3).to_string())
    table["apart"] = np.abs(np.log(table["median"] / overall))
    print(f"\nthe {SHOWN} slices furthest from {overall:.3f}:")
    pd.set_option("display.width", 200)
    print(table.sort_values("apart", ascending=False).head(SHOWN).drop(columns="apart").round(3).to_string(index=False))


def _four(framework: str) -> None:
    table = consensus_ratios(FOUR, framework)
    gpus = list(FOUR)
    apart = np.abs(np.log(table[gpus])) >= np.log(APART)
    print(f"{framework} fused experts: {len(table)} slices all of {', '.join(FOUR)} time; each system's median "
          f"time over the median of the four, and the share of slices it sits >= {APART}x from it")
    for quant, rows in table.groupby("quant"):
        a = apart.loc[rows.index]
        shares = ", ".join(f"{g} {a[g].mean():.1%}" + (f" ({(rows[g][a[g]] > 1).mean():.0%} of them slower)"
                                                        if a[g].any() else "") for g in gpus)
        print(f"  {quant} ({len(rows)} slices): {shares}; two or more apart in {(a.sum(axis=1) >= 2).mean():.1%}")
    pd.set_option("display.width", 200)
    print(f"\nthe {SHOWN} slices with the system furthest from the consensus:")
    far = np.abs(np.log(table[gpus])).max(axis=1)
    print(table.loc[far.sort_values(ascending=False).index[:SHOWN]].round(3).to_string(index=False))


def main(argv: list[str]) -> None:
    if argv[:1] == ["--four"]:
        _four((argv[1:] + ["trtllm"])[0])
    else:
        _pairs(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
