"""Fit a decoder layer's elementwise passes per GPU on Microsoft Vidur's operator profiles (issue #20
item 3) and write them to sim/catalog/fitted_elementwise.yaml.

    .venv/bin/python scripts/fit_elementwise.py [--check]

The data: sim/catalog/vidur_elementwise_ops.csv (MIT; Llama-2-7B and -70B on H100 and A100, TP 1 and 4,
1-4,096 tokens: each pass timed apart, one GPU of the group). The shape (`sim/device/elementwise.py`),
per pass: max(floor + width x per-element cost, rows x bytes a row / (HBM x efficiency)), bf16, the
widths and bytes one GPU's (RMSNorm and the add over the hidden size, rope over the rotated query and
key heads, SiLU-and-mul over the MLP's intermediate / tp). Each pass is fitted on the TUNE model's rows
(least squares on log time) and scored on the HELD model's, whose widths it never saw; the file states
both errors of a layer of Vidur's five passes. `--check` fits and compares with the committed file
instead of writing it (exit 1 if it differs). Needs scipy (the `.[measured]` extra brings it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from scipy.optimize import least_squares

from sim.device.elementwise import (
    ADD,
    FITTED,
    RMSNORM,
    ROPE,
    SILU_MUL,
    VIDUR_PASSES,
    Elementwise,
    PassFit,
    row_bytes,
)
from sim.inputs import catalog
from sim.outputs.atomic import write_text_atomic
from sim.studies.elementwise_accuracy import GPUS, HELD_OUT, MS, OPS_MS, TUNE, profiles, vidur_layer_s, widths

OUT = Path(__file__).resolve().parents[1] / "sim" / "catalog" / "fitted_elementwise.yaml"
COLUMNS = {RMSNORM: ("input_layernorm_ms", "post_attention_layernorm_ms"), ROPE: ("attn_rope_ms",),
           SILU_MUL: ("mlp_act_ms",), ADD: ("add_ms",)}
START, LOW, HIGH = [2.0, 0.3, 0.5], [0.0, 0.0, 0.01], [100.0, 10.0, 2.0]  # floor us, ns an element, HBM share
SOURCE = ("Microsoft Vidur's operator profiles (github.com/microsoft/vidur, MIT; data/profiling/compute/<gpu>/"
          "meta-llama/<model>/mlp.csv medians, sim/catalog/vidur_elementwise_ops.csv)")


def fit_gpu(tune: pd.DataFrame, hbm: float) -> dict[str, PassFit]:
    """Each pass's constants, least squares on log time over the tune rows (both norms' columns for RMSNorm)."""
    w = widths(tune)
    fits = {}
    for kind in FITTED:
        cols = COLUMNS[kind]
        rows = np.tile(tune["num_tokens"].to_numpy(float), len(cols))
        width = np.tile(w[kind].to_numpy(float), len(cols))
        measured = np.concatenate([tune[c].to_numpy(float) * MS for c in cols])
        nbytes = row_bytes(kind, width)

        def log_error(x, rows=rows, width=width, nbytes=nbytes, measured=measured):  # elementwise.pass_s over arrays
            t = np.maximum(x[0] * 1e-6 + x[1] * 1e-9 * width, rows * nbytes / (hbm * x[2]))
            return np.log(t / measured)

        x = least_squares(log_error, START, bounds=(LOW, HIGH)).x
        fits[kind] = PassFit(round(float(x[0]) * 1e-6, 9), round(float(x[1]) * 1e-9, 13), round(float(x[2]), 3))
    return fits


def _error(ew: Elementwise, part: pd.DataFrame, hbm: float) -> dict[str, float]:
    err = vidur_layer_s(ew, part, hbm) / (part[list(OPS_MS)].sum(axis=1).to_numpy() * MS) - 1
    return {"median": round(float(np.median(np.abs(err))), 3), "worst": round(float(np.max(np.abs(err))), 3)}


def fitted() -> dict:
    """The file's content: per catalog GPU its passes' constants and the layer's errors."""
    p = profiles()
    out = {"source": SOURCE, "licence": "MIT (Microsoft Vidur)",
           "shape": "per pass max(floor_s + width x s_per_element, rows x bytes a row / (HBM x hbm_efficiency)) "
                    "(sim/device/elementwise.py)",
           "tune": TUNE, "held_out": HELD_OUT, "gpus": {}}
    for vidur_gpu, gpu in GPUS.items():
        hbm = catalog.gpu(gpu).hbm_bytes_per_s
        g = p[p["gpu"] == vidur_gpu]
        fits = fit_gpu(g[g["model"] == TUNE], hbm)
        ew = Elementwise(fits, VIDUR_PASSES, "")
        out["gpus"][gpu] = {
            "passes": {k: {"floor_s": f.floor_s, "s_per_element": f.s_per_element, "hbm_efficiency": f.hbm_efficiency}
                       for k, f in fits.items()},
            "layer_error_tune": _error(ew, g[g["model"] == TUNE], hbm),
            "layer_error_held_out": _error(ew, g[g["model"] == HELD_OUT], hbm)}
    return out


HEADER = ("# Written by scripts/fit_elementwise.py - do not edit by hand. A decoder layer's elementwise passes per\n"
          "# GPU (sim/device/elementwise.py); a GPU not listed takes h100-sxm's constants against its own HBM.\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fit the elementwise passes on Vidur's profiles.")
    parser.add_argument("--check", action="store_true", help="compare with the committed file instead of writing")
    args = parser.parse_args(argv)
    text = HEADER + yaml.safe_dump(fitted(), sort_keys=False, width=120)
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print(f"{OUT.name}: {'matches the fit' if same else 'differs from the fit: run scripts/fit_elementwise.py'}")
        return 0 if same else 1
    write_text_atomic(OUT, text)
    print(f"wrote {OUT}")
    for gpu, g in yaml.safe_load(text)["gpus"].items():
        print(f"  {gpu}: layer |error| tune median {g['layer_error_tune']['median']:.1%}, held out median "
              f"{g['layer_error_held_out']['median']:.1%} worst {g['layer_error_held_out']['worst']:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
