"""kvtier held against public measurements (`kvsim accuracy`, docs/accuracy.md).

End to end: every row of the measurement table (`sim.studies.e2e_table`) becomes the kvtier scenario
it describes - a closed batch for a batch latency, a served run (Poisson arrivals, a fixed number of
clients, or every request queued at t = 0) for the served and offline figures, policy full_hbm, the
row's model, GPU, dtypes and parallelism, under the row's engine (`engine_for`: its KV memory rule,
its CUDA-graph rule and its own measured kernel tables; TensorRT-LLM's Guaranteed No Evict as
scheduler admission no_evict) - and is run with each operator-cost mode: `measured` (the
kernel tables, `hardware.kernels: measured`, where they cover the GPU) and `datasheet`. The figure
the row reports is read from the summary; error = predicted / measured - 1.

Operator level: the held-out split of the kernel tables (`sim.studies.operator_accuracy`), per
operator family and GPU, for the datasheet model and the tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from sim.decode.simulate import simulate
from sim.inputs import catalog
from sim.inputs.accuracy_bands import DENSE_GQA
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import system_for, tables_available
from sim.inputs.scenario import Scenario, scenario_from_dict
from sim.runner.executors import LocalExecutor
from sim.runner.store import OPTIONAL_NUMBER, has_fields, result_key
from sim.runner.tasks import run_tasks
from sim.serving.run import simulate_serving

from .e2e_table import Measurement
from .elementwise_accuracy import points as elementwise_points
from .moe_mla_accuracy import held_out_points as moe_mla_points
from .operator_accuracy import FAMILY, covered_gpus, held_out_points, summary

MODES = ("measured", "datasheet")  # hardware.kernels of each mode
# a row's engine (the first phrase its free text holds) -> the kvtier engine whose rules it runs under and
# whose measured kernel tables cost it. AIConfigurator times TensorRT-LLM's PyTorch flow (its kernel_source
# 'torch_flow'); TensorRT-LLM 0.13's benchmarks and NIM's TensorRT-LLM profiles ran built TensorRT engines,
# whose kernels no table times, so those rows keep kvtier's default tables (vLLM's), and ran under its C++
# executor, not the PyTorch executor's Python loop: no host loop figure (engine_rules.TRTLLM_HOST_LOOP), 0.
ENGINES = (("TensorRT-LLM (PyTorch backend)", "tensorrt-llm", {"kernel_tables": "own"}),
           ("TensorRT-LLM", "tensorrt-llm", {"kernel_tables": "vllm", "host_s_per_sequence": 0.0}),
           ("SGLang", "sglang", {"kernel_tables": "own"}), ("vLLM", "vllm", {"kernel_tables": "own"}))
REQUESTS_PER_CLIENT = 8  # a fixed-concurrency row is simulated with 8 requests per client ...
MIN_CLIENT_REQUESTS = 40  # ... and at least 40
MS = 1e3
# the summary field each metric reads, and its factor to the row's unit
SERVED_METRICS = {"itl_p50_ms": ("itl_p50_s", MS), "ttft_p50_ms": ("ttft_p50_s", MS),
                  "itl_mean_ms": ("itl_mean_s", MS), "ttft_mean_ms": ("ttft_mean_s", MS),
                  "output_tok_per_s": ("output_throughput_tok_per_s", 1.0),
                  "output_tok_per_s_per_gpu": ("output_throughput_tok_per_s", 1.0)}
POINT_COLUMNS = ["id", "family", "gpu", "model", "engine", "metric", "shape", "mode", "measured", "predicted",
                 "error", "note"]


def mode_covers(mode: str, gpu: str) -> bool:
    """The measured mode runs where the kernel tables cover the GPU (and the package is installed)."""
    return mode == "datasheet" or (system_for(gpu) is not None and tables_available())


def engine_for(m: Measurement) -> dict | None:
    """The scenario `engine:` a row ran on (`ENGINES`), with the CUDA-graph and MoE-backend options the
    row's run set, or None (kvtier's defaults)."""
    engine = next(({"name": name, **options} for said, name, options in ENGINES if said in m.engine), None)
    if engine is not None and m.cuda_graph_batch_sizes is not None:
        engine["cuda_graph_batch_sizes"] = m.cuda_graph_batch_sizes
    if engine is not None and m.cuda_graph_padding:
        engine["cuda_graph_padding"] = True
    if engine is not None and m.moe_backend is not None:
        engine["moe_backend"] = m.moe_backend
    if engine is not None and m.batch_limits == "trtllm-bench":  # its max_seq_len: the dataset's longest request
        engine["max_model_len"] = m.isl + m.osl
    return engine


def _base(m: Measurement, mode: str) -> dict:
    model = {"name": m.model, "weight_dtype": m.weight_dtype, "kv_dtype": m.kv_dtype}
    if m.weight_group_size is not None:
        model["weight_group_size"] = m.weight_group_size
    for key in ("expert_weight_dtype", "attention_weight_dtype", "attention_output_weight_dtype"):
        if getattr(m, key) is not None:
            model[key] = getattr(m, key)
    data = {"name": m.id, "description": f"{m.publisher}: {m.source_model} on {m.gpus} x {m.gpu}", "model": model,
            "hardware": {"gpu": m.gpu, "kernels": mode}, "parallel": m.parallel, "policy": {"kind": "full_hbm"}}
    engine = engine_for(m)
    return {**data, "engine": engine} if engine else data


def _lengths(m: Measurement) -> tuple:
    """(prompt, output) lengths: the row's, or uniform on 1..isl and 1..osl."""
    if m.lengths == "fixed":
        return m.isl, m.osl
    return {"dist": "uniform", "min": 1, "max": m.isl}, {"dist": "uniform", "min": 1, "max": m.osl}


def _arrivals(m: Measurement) -> dict:
    """poisson: the row's rate and count; concurrency: its clients, REQUESTS_PER_CLIENT each (at least
    MIN_CLIENT_REQUESTS in all); offline: every request at t = 0 (as many clients as requests)."""
    if m.workload == "poisson":
        return {"kind": "poisson", "rate_per_s": m.rate_per_s, "requests": m.requests}
    if m.workload == "concurrency":
        return {"kind": "closed_loop", "concurrency": m.concurrency,
                "requests": max(REQUESTS_PER_CLIENT * m.concurrency, MIN_CLIENT_REQUESTS)}
    return {"kind": "closed_loop", "concurrency": m.requests, "requests": m.requests}


def scenario_for(m: Measurement, mode: str) -> Scenario:
    """The kvtier scenario a row describes, with operator costs from `mode`."""
    data = _base(m, mode)
    if m.workload == "closed_batch":  # the first token comes from the prefill: osl - 1 decode steps
        data["workload"] = {"batch_size": m.batch_size, "prompt_tokens": m.isl, "reasoning_tokens": m.osl - 1}
        data["sim"] = {"detail": "fast"}
        return scenario_from_dict(data, m.id)
    prompt, output = _lengths(m)
    data["workload"] = {"prompt_tokens": prompt, "reasoning_tokens": output, "arrivals": _arrivals(m)}
    seqs, tokens, _ = m.rank_limits()
    d = m.attention_dp  # the limits are each attention rank's; kvtier's scheduler is the group's
    # under pipeline parallelism TensorRT-LLM's capacity scheduler holds max_batch_size x pp requests
    # (_util.py create_py_executor_instance), each of the pp micro-batches in flight up to max_batch_size
    data["scheduler"] = {"max_num_seqs": seqs * d * m.pp, "max_num_batched_tokens": tokens * d}
    data["sim"] = {"detail": "step"}
    # the row's admission: the engine's own (kvtier's on demand without one or under vLLM, SGLang's
    # reserve_ratio), or Guaranteed No Evict (a request runs only with its whole length reserved)
    data["scheduler"].update(chunked_prefill=m.chunked_prefill,
                             **({} if m.admission == "engine" else {"admission": "no_evict"}))
    return scenario_from_dict(data, m.id)


@dataclass(frozen=True)
class Simulated:
    """One simulation of a row's configuration: a closed batch's summary, or a served run's summary
    and its requests; `max_num_seqs` as the scheduler ran it."""

    summary: Any
    requests: pd.DataFrame | None = None
    max_num_seqs: int | None = None


def simulate_row(m: Measurement, mode: str) -> Simulated:
    sc = scenario_for(m, mode)
    if m.workload == "closed_batch":
        return Simulated(simulate(sc, with_max_batch=False).summary)
    res = simulate_serving(sc)
    return Simulated(res.summary, res.requests, res.summary.max_num_seqs)


def read_metric(m: Measurement, sim: Simulated) -> tuple[float, str]:
    """(the row's metric from a simulation of its configuration, a note); NaN with the reason where
    there is none."""
    s = sim.summary
    if not s.fits:
        return math.nan, "does not fit" + (f": {s.does_not_fit}" if getattr(s, "does_not_fit", None) else "")
    if m.workload == "closed_batch":
        return (s.prefill_s + s.decode_s) * MS, f"prefill {s.prefill_s * MS:.1f} ms + decode {s.decode_s * MS:.1f} ms"
    note = f"mean running {s.mean_running:.0f}, max_num_seqs {sim.max_num_seqs}, {s.requests} requests"
    if m.batch_limits != "row":  # where the limits came from (trtllm-bench's heuristic)
        note += f"; {m.rank_limits()[2]}"
    if m.workload == "concurrency":
        value, window = steady_state_metric(sim.requests, m)
        return value, f"{note}; {window}"
    field, factor = SERVED_METRICS[m.metric]
    value = getattr(s, field)
    if value is None:
        return math.nan, f"no {field}"
    per_gpu = m.gpus if m.metric.endswith("_per_gpu") else 1
    return value * factor / per_gpu, note


def predict(m: Measurement, mode: str) -> tuple[float, str]:
    """(the row's metric as kvtier predicts it, a note)."""
    return read_metric(m, simulate_row(m, mode))


def steady_state_metric(requests: pd.DataFrame, m: Measurement) -> tuple[float, str]:
    """A fixed-concurrency row's figure over its steady state, as a benchmark client measures after
    warming up: the first `concurrency` arrivals (all at t = 0, their prefills queued behind each
    other) and the last `concurrency` (finishing while the load drains) are left out. Mean ITL over
    every gap of a request set of one output length is the mean of the requests' TPOT."""
    done = requests.dropna(subset=["finish_s"]).sort_values("arrival_s", kind="stable")
    c = m.concurrency
    steady = done.iloc[c:len(done) - c]
    column = {"ttft_mean_ms": "ttft_s", "ttft_p50_ms": "ttft_s", "itl_mean_ms": "tpot_s"}[m.metric]
    values = steady[column].dropna()
    if values.empty:
        return math.nan, "no steady-state requests"
    value = values.median() if m.metric.endswith("_p50_ms") else values.mean()
    return float(value) * MS, f"steady state: {len(values)} of {len(done)} requests"


# what a row reports and where it comes from, not what is simulated: rows equal but for these share a run
REPORTING_FIELDS = {"id", "family", "metric", "measured", "notes", "publisher", "source_url", "source_date",
                    "source_model", "engine", "engine_version"}


def config_key(m: Measurement) -> str:
    return result_key("accuracy-config", m.model_dump(mode="json", exclude=REPORTING_FIELDS))


@dataclass(frozen=True)
class ConfigTask:
    """The rows of one configuration in one mode, simulated once, as a task of the runner
    (`sim.runner.tasks`; run in a worker process): one result per row."""

    kind: ClassVar[str] = "accuracy-config"
    rows: tuple[Measurement, ...]
    mode: str

    @property
    def key(self) -> str:
        return result_key(self.kind, self.inputs())

    def inputs(self) -> dict[str, Any]:
        return {"rows": [m.model_dump(mode="json") for m in self.rows], "mode": self.mode}

    def run(self) -> list[dict[str, Any]]:
        try:
            sim = simulate_row(self.rows[0], self.mode)
            values = [read_metric(m, sim) for m in self.rows]
        except ConfigError as err:  # a configuration kvtier cannot simulate is a result, said in its note
            values = [(math.nan, err.message)] * len(self.rows)
        return [{"predicted": v if math.isfinite(v) else None, "note": note} for v, note in values]

    def accepts(self, result: Any) -> bool:
        return isinstance(result, list) and len(result) == len(self.rows) and all(
            has_fields(r, {"predicted": OPTIONAL_NUMBER, "note": str}) for r in result)


def simulations(rows: Iterable[Measurement], modes: Iterable[str] = MODES) -> list[ConfigTask]:
    """One task per configuration and mode, in row order; a mode that does not cover the GPU, none."""
    groups: dict[str, list[Measurement]] = {}
    for m in rows:
        groups.setdefault(config_key(m), []).append(m)
    return [ConfigTask(tuple(g), mode) for g in groups.values() for mode in modes if mode_covers(mode, g[0].gpu)]


def run(rows: Iterable[Measurement], modes: Iterable[str] = MODES, *, workers: int | None = 1,
        advance: Callable[[int], None] | None = None) -> pd.DataFrame:
    """One line per row and mode (POINT_COLUMNS), rows in table order; `workers` local processes
    (None: every core); `advance(n)`: n more simulations done (`simulations`)."""
    rows, modes = list(rows), list(modes)
    tasks = simulations(rows, modes)
    results = run_tasks(tasks, LocalExecutor(workers), advance=advance).results
    found = {(m.id, t.mode): r for t, res in zip(tasks, results) for m, r in zip(t.rows, res)}
    out = []
    for m in rows:
        for mode in modes:
            r = found.get((m.id, mode))
            if r is None:
                continue
            value = math.nan if r["predicted"] is None else r["predicted"]
            out.append({"id": m.id, "family": m.family, "gpu": m.gpu, "model": m.model, "engine": m.engine,
                        "metric": m.metric, "shape": m.shape, "mode": mode, "measured": m.measured, "predicted": value,
                        "error": value / m.measured - 1, "note": r["note"]})
    return pd.DataFrame(out, columns=POINT_COLUMNS)


def _stats(p: pd.DataFrame) -> dict:
    err = p["error"].dropna()
    if err.empty:
        return {"rows": 0, "median_abs_error": math.nan, "worst_abs_error": math.nan, "mean_error": math.nan,
                "worst_id": ""}
    worst = err.abs().idxmax()
    return {"rows": len(err), "median_abs_error": float(err.abs().median()), "worst_abs_error": float(err.abs().max()),
            "mean_error": float(err.mean()), "worst_id": str(p.loc[worst, "id"])}


def e2e_summary(points: pd.DataFrame) -> pd.DataFrame:
    """Per mode: median and worst |error| (and the signed mean; negative: predicted too low) over all
    rows, per family, per GPU, per engine (as each row names it: TensorRT-LLM's PyTorch flow apart from
    its older TensorRT-engine flow and NIM), per model (a dense 70B and gpt-oss's sliding-window
    experts miss differently) and per workload shape (`accuracy_bands.workload_shape`)."""
    out = []
    for mode, p in points.groupby("mode", sort=False):
        out.append({"mode": mode, "by": "all", "key": "all", **_stats(p)})
        for by in ("family", "gpu", "engine", "model", "shape"):
            for key, q in p.groupby(by, sort=True):
                out.append({"mode": mode, "by": by, "key": key, **_stats(q)})
    return pd.DataFrame(out)


BAND_DIGITS = 4  # the bands file's precision: 0.01% of error
BAND_FIELDS = ("rows", "median_abs_error", "worst_abs_error", "mean_error")
BANDS_HEADER = """\
# kvtier's error against the public end-to-end measurements (sim/catalog/e2e_measurements.yaml):
# per mode (measured kernel tables / datasheet), family and GPU ("all": every family, every GPU),
# the median and worst |error| and the signed mean (error = predicted / measured - 1; negative:
# kvtier predicts too low), over `rows` rows; by_model the same per model, by_shape per workload shape
# (decode-heavy: mean output >= 4x mean prompt; prefill-heavy: prompt >= 4x output; balanced between).
# `kvsim run` and `kvsim plan` print these beside their headline figures; the report carries the table
# (docs/accuracy.md).
#
# GENERATED by `kvsim accuracy --write-bands`: do not edit by hand. Regenerate it whenever the physics
# or the measurement table changes; tests/test_accuracy.py fails while it is stale.
"""


def _band(p: pd.DataFrame) -> dict | None:
    s = _stats(p)
    if s["rows"] == 0:
        return None
    return {k: s[k] if k == "rows" else round(s[k], BAND_DIGITS) for k in BAND_FIELDS}


def bands(points: pd.DataFrame, by: str = "gpu") -> dict:
    """mode -> family ("all" first) -> `by` ("gpu": "all" first, then each GPU the family has rows for;
    "model": each model it has rows for, then DENSE_GQA over the dense GQA models' rows; "shape": each
    workload shape it has rows of) -> {rows, median_abs_error, worst_abs_error, mean_error}, rounded to
    BAND_DIGITS."""
    out: dict = {}
    for mode in [m for m in MODES if m in set(points["mode"])]:
        p = points[points["mode"] == mode]
        families = [("all", p)] + [(f, q) for f, q in p.groupby("family", sort=True)]
        out[mode] = {}
        for family, q in families:
            keyed = {k: _band(r) for k, r in q.groupby(by, sort=True)}
            if by == "gpu":
                keyed = {"all": _band(q), **keyed}
            elif by == "model":
                keyed[DENSE_GQA] = _band(q[q["model"].map(lambda name: catalog.model(name).dense_gqa)])
            out[mode][family] = {k: b for k, b in keyed.items() if b is not None}
    return out


def bands_text(points: pd.DataFrame, computed_at: dict) -> str:
    """sim/catalog/accuracy_bands.yaml: the header, when and from what it was computed, the bands."""
    import yaml

    head = yaml.safe_dump({"computed_at": computed_at}, sort_keys=False, default_flow_style=False, width=120)
    body = yaml.safe_dump({"bands": bands(points), "by_model": bands(points, "model"),
                           "by_shape": bands(points, "shape")}, sort_keys=False, default_flow_style=None, width=120)
    return BANDS_HEADER + head + body


def operator_table(gpus: Iterable[str] | None = None) -> pd.DataFrame:
    """Per GPU and operator family (gemm, decode attention, prefill attention, all-reduce, all-gather,
    reduce-scatter, DeepEP's all-to-all, and the MLA decode, MLA BMMs and MoE experts of
    `moe_mla_accuracy`, every routing its tables time, and a layer's elementwise passes against Vidur's
    profiles (`elementwise_accuracy`: datasheet only), then per family over every GPU: held-out points,
    median, 95th-percentile and worst |error| of the datasheet model and of the tables."""
    gpus = list(covered_gpus() if gpus is None else gpus)
    if not gpus or not tables_available():
        return pd.DataFrame()
    dense = pd.concat([held_out_points(g)[0] for g in gpus], ignore_index=True)
    dense["op"] = dense["op"].str.extract(FAMILY)[0].to_numpy()
    moe_mla = pd.concat([moe_mla_points(g)[0] for g in gpus], ignore_index=True)
    moe_mla["op"] = np.where(moe_mla["family"].str.startswith("moe"), "moe experts", moe_mla["family"])
    cols = ["gpu", "op", "datasheet_err", "tables_err"]
    elementwise = elementwise_points()
    points = pd.concat([dense[cols], moe_mla[cols], elementwise[elementwise["gpu"].isin(gpus)][cols]], ignore_index=True)
    family = points["op"].to_numpy()
    per_gpu = summary(points.assign(op=family))
    overall = summary(points.assign(gpu="all", op=family))
    keep = ["gpu", "op", "points", "datasheet_median", "datasheet_p95", "datasheet_worst", "tables_median", "tables_p95",
            "tables_worst"]
    out = pd.concat([per_gpu, overall], ignore_index=True)[keep]
    return out.rename(columns={"op": "family"}).replace({np.nan: None})
