"""The public end-to-end measurements kvtier is held against (sim/catalog/e2e_measurements.yaml, or a
file of the same form): one measured figure a row, with the configuration it was measured in. Read as
every input is (sim/inputs/reader.py) and validated strictly: a problem is one line naming the file,
the row and the field."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.limits import MAX_BATCH, MAX_RATE_PER_S, MAX_REQUESTS, MAX_TOKENS
from sim.inputs.reader import read_yaml
from sim.inputs.scenario import KvDType, WeightDType, validation_error_line
from sim.inputs.strict import Strict

MAX_ROWS = 10_000
MAX_TEXT = 2_000
Family = Literal["batch-latency", "served-itl", "served-ttft", "offline-throughput"]
Metric = Literal["latency_ms", "itl_p50_ms", "ttft_p50_ms", "itl_mean_ms", "ttft_mean_ms", "output_tok_per_s",
                 "output_tok_per_s_per_gpu"]
# which metrics each family may report
FAMILY_METRICS = {
    "batch-latency": ("latency_ms",),
    "served-itl": ("itl_p50_ms", "itl_mean_ms"),
    "served-ttft": ("ttft_p50_ms", "ttft_mean_ms"),
    "offline-throughput": ("output_tok_per_s", "output_tok_per_s_per_gpu"),
}
# what a fixed-concurrency row's steady-state requests give (sim.studies.accuracy.steady_state_metric)
CONCURRENCY_METRICS = ("ttft_mean_ms", "ttft_p50_ms", "itl_mean_ms")
# the fields each workload needs
WORKLOAD_FIELDS = {
    "closed_batch": ("batch_size",),
    "poisson": ("rate_per_s", "requests", "max_num_seqs", "max_num_batched_tokens"),
    "concurrency": ("concurrency", "max_num_seqs", "max_num_batched_tokens"),
    "offline": ("requests", "max_num_seqs", "max_num_batched_tokens"),
}


def _text(min_length: int = 1):
    return Field(min_length=min_length, max_length=MAX_TEXT)


class Measurement(Strict):
    """One published figure and everything needed to simulate it (docs/accuracy.md)."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$", max_length=80)
    family: Family
    publisher: str = _text()
    source_url: str = Field(pattern=r"^https://\S+$", max_length=MAX_TEXT)
    source_date: str = _text()  # as read; "undated (...)" where the source gives none
    engine: str = _text()
    engine_version: str = _text()
    gpu: str = _text()  # a catalog GPU (kvsim gpus)
    gpus: int = Field(ge=1, le=64)
    model: str = _text()  # a catalog model (kvsim models)
    source_model: str = _text()  # as the source names it
    weight_dtype: WeightDType
    kv_dtype: KvDType
    tp: int = Field(ge=1, le=64)
    ep: int = Field(1, ge=1, le=64)
    attention_dp: int = Field(1, ge=1, le=64)
    workload: Literal["closed_batch", "poisson", "concurrency", "offline"]
    batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    concurrency: int | None = Field(None, ge=1, le=MAX_BATCH)
    rate_per_s: float | None = Field(None, gt=0, le=MAX_RATE_PER_S)
    requests: int | None = Field(None, ge=1, le=MAX_REQUESTS)
    isl: int = Field(ge=1, le=MAX_TOKENS)
    osl: int = Field(ge=2, le=MAX_TOKENS)
    lengths: Literal["fixed", "uniform"] = "fixed"  # uniform: prompts on 1..isl, outputs on 1..osl
    max_num_seqs: int | None = Field(None, ge=1, le=MAX_BATCH)  # both per attention rank
    max_num_batched_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    admission: Literal["engine", "no_evict"] = "engine"
    metric: Metric
    measured: float = Field(gt=0)
    notes: str = _text(0)

    @model_validator(mode="after")
    def _consistent(self):
        if self.metric not in FAMILY_METRICS[self.family]:
            raise ValueError(f"family {self.family} reports {' or '.join(FAMILY_METRICS[self.family])}, "
                             f"not {self.metric}")
        missing = [f for f in WORKLOAD_FIELDS[self.workload] if getattr(self, f) is None]
        if missing:
            raise ValueError(f"a {self.workload} workload needs {', '.join(missing)}")
        if self.gpus != self.tp:
            raise ValueError(f"gpus ({self.gpus}) must equal tp ({self.tp}): one tensor-parallel group")
        if self.family == "batch-latency" and self.workload != "closed_batch":
            raise ValueError("batch-latency rows are closed batches (workload closed_batch)")
        if self.workload == "concurrency" and self.metric not in CONCURRENCY_METRICS:
            raise ValueError(f"a concurrency row is measured over its steady-state requests: "
                             f"{', '.join(CONCURRENCY_METRICS)}, not {self.metric}")
        if self.lengths == "uniform" and self.workload == "closed_batch":
            raise ValueError("a closed batch has one prompt and one output length: lengths fixed")
        return self

    @property
    def parallel(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "attention_dp": self.attention_dp}


def default_path() -> Path:
    return Path(str(resources.files("sim").joinpath("catalog", "e2e_measurements.yaml")))


def load_measurements(path: str | Path | None = None) -> list[Measurement]:
    """Every row of the table, each checked: its fields, its GPU and model named as the catalog names
    them, and ids unique."""
    source = str(path or default_path())
    data = read_yaml(source)
    rows = data.get("measurements") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ConfigError("expected a mapping with a non-empty list `measurements`", source=source)
    if len(rows) > MAX_ROWS:
        raise ConfigError(f"more than {MAX_ROWS:,} measurements", source=source, field="measurements")
    out: list[Measurement] = []
    for i, row in enumerate(rows):
        out.append(_measurement(row, f"{source}: measurements.{i}"))
    ids = [m.id for m in out]
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise ConfigError(f"id {dup[0]!r} appears twice", source=source, field="measurements")
    return out


def _measurement(row, source: str) -> Measurement:
    if not isinstance(row, dict):
        raise ConfigError("expected a mapping", source=source)
    try:
        m = Measurement.model_validate(row, strict=True)
    except ValidationError as err:
        raise validation_error_line(err, source) from None
    for field, name, lookup in (("gpu", m.gpu, catalog.gpu), ("model", m.model, catalog.model)):
        try:
            canonical = lookup(name).name
        except ConfigError as err:
            raise ConfigError(err.message, source=source, field=field) from None
        if canonical != name:
            raise ConfigError(f"name it as the catalog does: {canonical!r}", source=source, field=field)
    problem = catalog.model(m.model).parallel_problem(m.tp, m.ep, m.attention_dp)
    if problem:
        raise ConfigError(problem[1], source=source, field=problem[0])
    return m
