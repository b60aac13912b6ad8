"""Two systems' fused-experts tables held against each other, slice by slice (not a test):

    .venv/bin/python benchmarks/sibling_tables.py [GPU_A GPU_B [FRAMEWORK]]     # default: b200 gb200 trtllm

B200 and GB200 carry the same Blackwell die and HBM rate, so one engine's MoE tables for the two should
differ by a few percent everywhere. For every slice both time (weight format, routing, experts, top-k,
hidden, inter, tp, ep) it prints the median time ratio A / B over their common token counts, then the
slices furthest from the overall median - where one collector run stands apart from its sibling (found
2026-12-07: TensorRT-LLM's B200 table times DeepSeek-R1's NVFP4 EP4 slice ~1.8x slower than GB200's,
~500 against ~290 us at 32-512 tokens, while the two agree within a few percent over most slices). kvtier
reads each table as measured; nothing here changes what a run costs. Needs the `.[measured]` extra;
these are operator measurements from NVIDIA's harness, nothing here is timed.
"""

from __future__ import annotations

import sys

import numpy as np
import pandas as pd

from sim.device.measured_kernels import measured_kernels_for

SHOWN = 15


def slice_ratios(gpu_a: str, gpu_b: str, framework: str) -> pd.DataFrame:
    """One row per MoE slice both tables time: its key, the common token counts, and the median, min and
    max of time(A) / time(B) over them."""
    a, b = (measured_kernels_for(g, framework)._moe_slices for g in (gpu_a, gpu_b))
    rows = []
    for key in sorted(set(a) & set(b)):
        (ta, sa), (tb, sb) = a[key], b[key]
        common = np.intersect1d(ta, tb)
        if not len(common):
            continue
        ratio = np.array([sa[ta == t][0] / sb[tb == t][0] for t in common])
        rows.append((*key, len(common), float(np.median(ratio)), float(ratio.min()), float(ratio.max())))
    cols = ["quant", "routing", "experts", "top_k", "hidden", "inter", "tp", "ep", "tokens", "median", "min", "max"]
    return pd.DataFrame(rows, columns=cols)


def main(argv: list[str]) -> None:
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


if __name__ == "__main__":
    main(sys.argv[1:])
