"""What a serving run measured, as tables and summary figures (`vllm bench serve`'s definitions).
Nothing here simulates: it reads the engine's `ServingTrace`."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.outputs.schema import (
    LATENCY_STATS,
    REQUEST_COLUMNS,
    SERVING_TIMELINE_COLUMNS,
    SWAP_REQUEST_COLUMNS,
    SWAP_TIMELINE_COLUMNS,
)

from .engine import ServingTrace


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """np.percentile(values repeated weights times, q) (linear interpolation) without the repeat:
    the sorted expanded array's element k is the value whose cumulative weight first exceeds k."""
    order = np.argsort(values, kind="stable")
    v, cum = np.asarray(values, dtype=float)[order], np.cumsum(np.asarray(weights)[order])
    pos = q / 100 * (cum[-1] - 1)
    lo, hi = int(np.floor(pos)), int(np.ceil(pos))
    at = lambda k: v[np.searchsorted(cum, k, side="right")]  # noqa: E731
    return float(at(lo) + (at(hi) - at(lo)) * (pos - lo))


def latency_fields(name: str, values, weights=None) -> dict:
    """{name}_mean_s, _p50_s, _p90_s, _p99_s of `values` (each counted `weights` times); None if empty."""
    v = np.asarray(values, dtype=float)
    w = np.ones(len(v), dtype=np.int64) if weights is None else np.asarray(weights)
    keep = w > 0
    v, w = v[keep], w[keep]
    if not len(v):
        return {f"{name}_{stat}_s": None for stat, _ in LATENCY_STATS}
    out = {}
    for stat, q in LATENCY_STATS:
        out[f"{name}_{stat}_s"] = float(np.average(v, weights=w)) if q is None else weighted_percentile(v, w, q)
    return out


def request_table(trace: ServingTrace) -> pd.DataFrame:
    """One row per request (id order): tpot_s = (e2e - ttft) / (output - 1), empty for one-token requests."""
    t = trace.table
    df = pd.DataFrame({"id": t.ids, "arrival_s": t.arrival_s, "first_token_s": t.first_token_s,
                       "finish_s": t.finish_s, "preemptions": t.preemptions, "prompt_tokens": t.prompt,
                       "output_tokens": t.output})
    df["ttft_s"] = df["first_token_s"] - df["arrival_s"]
    df["e2e_s"] = df["finish_s"] - df["arrival_s"]
    more = df["output_tokens"] > 1
    df["tpot_s"] = np.where(more, (df["e2e_s"] - df["ttft_s"]) / (df["output_tokens"] - 1).clip(lower=1), np.nan)
    df["queue_s"] = t.admitted_s - t.arrival_s
    df["swaps"] = t.swaps
    return df.sort_values("id", kind="stable").reset_index(drop=True)[request_columns(trace.swap_mode)]


def _with(columns: list[str], extra: dict[str, list[str]] | None) -> list[str]:
    """`columns` with each list of `extra` after the column it is keyed by."""
    return [c for col in columns for c in (col, *(extra or {}).get(col, ()))]


def request_columns(swap: bool) -> list[str]:
    """requests.csv's columns: with swap preemption, SWAP_REQUEST_COLUMNS too."""
    return _with(REQUEST_COLUMNS, SWAP_REQUEST_COLUMNS if swap else None)


def timeline_columns(swap: bool) -> list[str]:
    """timeline.csv's columns: with swap preemption, SWAP_TIMELINE_COLUMNS too."""
    return _with(SERVING_TIMELINE_COLUMNS, SWAP_TIMELINE_COLUMNS if swap else None)


def timeline_table(trace: ServingTrace) -> pd.DataFrame:
    cols = timeline_columns(trace.swap_mode)
    return pd.DataFrame({c: [getattr(row, c) for row in trace.steps] for c in cols}, columns=cols)


def thin_timeline(timeline: pd.DataFrame, every: int) -> pd.DataFrame:
    """Every `every`-th row and the last (`sim.record_every`); the swap byte columns of a kept row
    sum the rows since the previous kept one, so each column still sums to the run's total."""
    n = len(timeline)
    if every <= 1 or not n:
        return timeline
    rows = np.arange(n)
    kept = np.flatnonzero((rows % every == 0) | (rows == n - 1))
    out = timeline.iloc[kept].reset_index(drop=True)
    interval = np.searchsorted(kept, rows)  # each row's kept row: the first at or after it
    for col in SWAP_TIMELINE_COLUMNS["host_bytes"]:
        if col in out:
            out[col] = np.bincount(interval, weights=timeline[col].to_numpy(dtype=float), minlength=len(kept))
    return out


def swap_figures(trace: ServingTrace) -> dict:
    """The summary's swap figures (schema `_ServingSwap`) of a run that swaps; an empty dict for recompute."""
    if not trace.swap_mode:
        return {}
    return dict(swaps=trace.swaps, swap_ins=trace.swap_ins, swap_fallbacks=trace.swap_fallbacks,
                swap_out_bytes=trace.swap_out_bytes, swap_in_bytes=trace.swap_in_bytes)


def time_average(t_s: np.ndarray, value: np.ndarray, end_s: float) -> float:
    """Mean over [0, end_s] of a step function holding each value from its t_s to the next (0 before the first)."""
    if end_s <= 0 or not len(t_s):
        return 0.0
    until = np.append(t_s[1:], end_s)
    return float(np.sum(value * (until - t_s)) / end_s)


def serving_figures(trace: ServingTrace, requests: pd.DataFrame, timeline: pd.DataFrame, slo) -> dict:
    """The summary's timing figures (ServingSummary fields)."""
    duration = trace.end_s
    out_tokens = int(requests["output_tokens"].sum())
    in_tokens = int(requests["prompt_tokens"].sum())
    figs = dict(
        duration_s=duration, steps=int((timeline["step_s"] > 0).sum()),
        request_throughput_per_s=len(requests) / duration if duration > 0 else None,
        output_throughput_tok_per_s=out_tokens / duration if duration > 0 else None,
        total_token_throughput_tok_per_s=(in_tokens + out_tokens) / duration if duration > 0 else None,
        hbm_peak_bytes=float(timeline["hbm_bytes"].max()), host_peak_bytes=float(timeline["host_bytes"].max()),
        queue_mean_s=float(requests["queue_s"].mean()),
        preemptions=trace.preemptions, preempted_requests=int((requests["preemptions"] > 0).sum()),
        mean_concurrency=trace.in_system_area_s / duration if duration > 0 else None,
        mean_running=time_average(timeline["t_s"].to_numpy(), timeline["running"].to_numpy(), duration),
        max_running=int(timeline["running"].max()),
    )
    figs |= latency_fields("ttft", requests["ttft_s"])
    figs |= latency_fields("tpot", requests["tpot_s"].dropna())
    other = np.concatenate(trace.itl_other_s) if trace.itl_other_s else np.zeros(0)
    figs |= latency_fields("itl", np.concatenate([trace.itl_step_s, other]),
                           np.concatenate([np.asarray(trace.itl_step_tokens, dtype=np.int64),
                                           np.ones(len(other), dtype=np.int64)]))
    figs |= latency_fields("e2e", requests["e2e_s"])
    if slo is not None:
        good = np.ones(len(requests), dtype=bool)
        if slo.ttft_s is not None:
            good &= requests["ttft_s"].to_numpy() <= slo.ttft_s
        if slo.tpot_s is not None:  # a one-token request has no TPOT: it meets the target (as vLLM)
            good &= requests["tpot_s"].fillna(0.0).to_numpy() <= slo.tpot_s
        figs |= dict(goodput_req_per_s=int(good.sum()) / duration if duration > 0 else None,
                     slo_ttft_s=slo.ttft_s, slo_tpot_s=slo.tpot_s)
    return figs
