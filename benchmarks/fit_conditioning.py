"""How well the tune split pins each constant of the datasheet fits (scripts/fit_datasheet.py): prints,
per GPU, fit and constant, the fitted value and its relative standard error from the Gauss-Newton
covariance at the solution - (J^T J)^-1 x 2 cost / (points - constants), J the solver's Jacobian of the
(soft-L1 weighted) log residuals - and flags those the data leave loose (> LOOSE) or that sit on a bound.
A loose constant, or two that trade off, lie along a flat direction of the error: the value carries
little meaning and can jump between refits (2026-12-05, when the tables' spikes were dropped: SGLang's
H200 bf16 MoE weight_hbm_efficiency 0.914 -> 0.701, which trades 1.000 with gather_hbm_efficiency, itself
at 50: the term is idle). The analysis is local: a constant it finds well pinned can still move when the
data change (the same day SGLang's H200 fp8 GEMM flop_efficiency went 0.675 -> 0.883 and is pinned to
within 1% now - the dropped points had pulled it).

    .venv/bin/python benchmarks/fit_conditioning.py [--framework vllm|sglang|trtllm] [--gpu h200-sxm] [--all]

Without --all only the loose and bounded constants are printed. Needs the `.[measured]` extra.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

LOOSE = 0.25  # a relative standard error above which a constant is reported as loosely fitted
TRADES = 0.98  # a |correlation| with another constant above which the two trade off (a flat direction)
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fit_datasheet.py"
# each model's constants in the order the fit script passes them (its docstrings and unpacking)
NAMES = {
    "_gemm_model": ["floor_s", "weight_hbm_efficiency", "flop_efficiency", "output_hbm_efficiency", "quant_row_s / half_tiles",
                    "quant_hbm_efficiency", "weight_reread", "half_tiles", "half_tiles_decode"],
    "_attention_model": ["floor_s", "hbm_efficiency", "fp8_hbm_efficiency", "half_ctas", "per_cta_s", "fp8_floor_s",
                         "fp8_per_cta_s", "per_cta_head_s"],
    "_prefill_model": ["floor_s", "flop_efficiency", "half_tokens", "half_tiles", "kv_write_s"],
    "_mla_model": ["floor_s", "hbm_efficiency", "fp8_hbm_efficiency", "flop_efficiency", "half_blocks"],
    "_mla_bmm_model": ["floor_s", "flop_efficiency", "hbm_efficiency"],
    "_moe_model": ["floor_s", "per_expert_s", "weight_hbm_efficiency", "flop_efficiency", "half_rows",
                   "gather_hbm_efficiency", "token_hbm_efficiency"],
    "_allreduce_model": ["latency_floor_s", "latency_busbw", "bandwidth_floor_s", "bandwidth_busbw"],
    "_gather_model": ["latency_floor_s", "latency_busbw", "bandwidth_floor_s", "bandwidth_busbw"],
    "_a2a_model": ["floor_s", "rate"],
}


def load_fit_script():
    spec = importlib.util.spec_from_file_location("fit_datasheet", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def conditioning(res) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each constant's standard error over its value, its largest |correlation| with another constant,
    and which one) from the Gauss-Newton covariance at the solution. The standard error shrinks with the
    number of points; the correlation does not: near 1, two constants trade off along a flat direction
    of the error, which a change of the table (or of the model) can slide along. A constant on a bound has
    nan (the covariance does not describe it) and is left out of the others' correlations."""
    jac, x = np.asarray(res.jac, dtype=float), np.asarray(res.x, dtype=float)
    free = (res.active_mask == 0) & (x != 0)
    dof = max(jac.shape[0] - int(free.sum()), 1)
    scaled = jac[:, free] * x[free]  # the Jacobian in relative units: d residual / d ln(constant)
    cov = np.full((len(x), len(x)), np.nan)  # relative covariance
    cov[np.ix_(free, free)] = np.linalg.pinv(scaled.T @ scaled, rcond=1e-12, hermitian=True) * (2.0 * res.cost / dof)
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = np.clip(cov / np.outer(sd, sd), -1.0, 1.0)
    rel = np.where(free, sd, np.nan)
    np.fill_diagonal(corr, 0.0)
    corr = np.where(np.isfinite(corr), np.abs(corr), 0.0)
    return rel, corr.max(axis=1), corr.argmax(axis=1)


def recorded_fits(fd, framework: str, gpu: str | None) -> list[tuple[str, str, object]]:
    """(GPU, model name, solver result) of every fit the script makes for `framework`."""
    calls, current = [], {"gpu": None}
    solver = fd.least_squares

    def recording(fun, x0, **kw):
        res = solver(fun, x0, **kw)
        calls.append((current["gpu"], fun, res))
        return res

    fd.least_squares = recording
    systems = [g for g in fd.SYSTEMS if gpu in (None, g)]
    for g in systems:
        current["gpu"] = g
        fd.SYSTEMS, saved = {g: fd.SYSTEMS[g]} if isinstance(fd.SYSTEMS, dict) else [g], fd.SYSTEMS
        try:
            fd.fit(framework)
        finally:
            fd.SYSTEMS = saved
    fd.least_squares = solver
    return [(g, _model_name(fun), res) for g, fun, res in calls]


def _model_name(fun) -> str:
    """The model a residual closure wraps (`_fit`'s lambda over `model`)."""
    for cell in getattr(fun, "__closure__", None) or ():
        inner = cell.cell_contents
        name = getattr(inner, "__name__", "")
        if name in NAMES:
            return name
        code = getattr(inner, "__code__", None)  # a lambda over a model (a fit with some constants tied)
        named = [n for n in (code.co_names if code else ()) if n in NAMES]
        if named:
            return named[0]
    return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--framework", default="vllm")
    ap.add_argument("--gpu", default=None, help="one catalog GPU the tables cover (default: all)")
    ap.add_argument("--all", action="store_true", help="print every constant, not only the loose and bounded ones")
    args = ap.parse_args()
    fd = load_fit_script()
    counts = {"loose": 0, "trades": 0, "on a bound": 0}
    total = 0
    for gpu, model, res in recorded_fits(fd, args.framework, args.gpu):
        names = NAMES.get(model, [])
        label = [names[i] if i < len(names) else f"p{i}" for i in range(len(res.x))]
        rel, corr, other = conditioning(res)
        for i, value in enumerate(res.x):
            total += 1
            states = (["on a bound"] if np.isnan(rel[i]) else []) + (["loose"] if rel[i] > LOOSE else []) + (
                [f"trades {corr[i]:.3f} with {label[other[i]]}"] if corr[i] > TRADES else [])
            for st in states:
                counts[st.split(" ")[0] if st.startswith("trades") else st] += 1
            if args.all or states:
                shown = "-" if np.isnan(rel[i]) else ("inf" if np.isinf(rel[i]) else f"{rel[i]:.0%}")
                print(f"{gpu:16s} {model:18s} {label[i]:26s} {value:12.4g}  rel. s.e. {shown:>6s}  {'; '.join(states)}")
    print(f"{args.framework}: {total} constants fitted; {counts['loose']} loose (relative s.e. > {LOOSE:.0%}), "
          f"{counts['trades']} trading off with another (|correlation| > {TRADES}), {counts['on a bound']} on a bound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
