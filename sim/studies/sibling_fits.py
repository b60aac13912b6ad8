"""How well one GPU's fitted datasheet constants carry over to another (`catalog.fitted_kernels_for`).

GPUs no kernel table measures take a sibling's fit (gpus.yaml `fit_sibling`: RTX 4090 takes L40S's,
RTX 5090 and 5080 the RTX PRO 6000's, GH200 H200's). Nothing measures those GPUs, so the carry-over
is scored where both GPUs of a pair have tables: the target's held-out points
(`operator_accuracy.held_out_points`) predicted with its own fit, with the other GPU's, and with the
flat defaults a GPU without tables or sibling gets. Same-die pairs (H100 and H200) say what a sibling
of the same silicon costs in accuracy; cross-architecture pairs what a wrong sibling would.
"""

from __future__ import annotations

import pandas as pd

from sim.inputs.catalog import NO_FIT

from .operator_accuracy import FAMILY, held_out_points

# (target, the GPU whose fit it takes, how they are related)
PAIRS = (
    ("h200-sxm", "h100-sxm", "same die (GH100), other memory: as GH200 takes H200's"),
    ("h100-sxm", "h200-sxm", "same die (GH100), other memory"),
    ("rtx-pro-6000-server", "l40s", "client-class SM one generation apart (sm_120 vs sm_89)"),
    ("l40s", "rtx-pro-6000-server", "client-class SM one generation apart (sm_89 vs sm_120)"),
    ("b200", "h200-sxm", "other architecture (sm_100 vs sm_90)"),
    ("a100-80gb-sxm", "h100-sxm", "other architecture (sm_80 vs sm_90)"),
)


def transfer_points(target: str, sibling: str) -> pd.DataFrame:
    """The target's held-out points with three datasheet predictions: `own_err` (its own fit),
    `sibling_err` (the sibling's) and `flat_err` (no fit), each predicted / measured - 1."""
    own, _ = held_out_points(target)
    errs = {"own_err": own["datasheet_err"]}
    for col, fit_from in (("sibling_err", sibling), ("flat_err", NO_FIT)):
        errs[col] = held_out_points(target, fit_from=fit_from)[0]["datasheet_err"]
    return own[["gpu", "op", "shape", "measured_s"]].assign(**errs)


def transfer_summary(pairs=PAIRS) -> pd.DataFrame:
    """Per pair and operator family: points and the median |error| with each of the three fits."""
    rows = []
    for target, sibling, relation in pairs:
        p = transfer_points(target, sibling)
        fam = p["op"].str.extract(FAMILY)[0]
        for family, q in p.groupby(fam, sort=False):
            rows.append({"target": target, "fit of": sibling, "relation": relation, "family": family,
                         "points": len(q), **{c.removesuffix("_err"): float(q[c].abs().median())
                                              for c in ("own_err", "sibling_err", "flat_err")}})
    return pd.DataFrame(rows)
