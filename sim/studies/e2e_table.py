"""The public end-to-end measurements kvtier is held against (sim/catalog/e2e_measurements.yaml, or a
file of the same form): one measured figure a row, with the configuration it was measured in. Read as
every input is (sim/inputs/reader.py) and validated strictly: a problem is one line naming the file,
the row and the field."""

from __future__ import annotations

from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from sim.device.bench_limits import BenchCheckpoint, trtllm_bench_limits
from sim.inputs import catalog
from sim.inputs.accuracy_bands import workload_shape
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import TRTLLM_MOE_BACKENDS
from sim.inputs.limits import MAX_BATCH, MAX_RATE_PER_S, MAX_REQUESTS, MAX_TOKENS
from sim.inputs.reader import read_yaml
from sim.inputs.scenario import KvDType, WeightDType, validation_error_line
from sim.inputs.strict import Strict
from sim.model.dtypes import WEIGHT_DTYPES
from sim.model.spec import ModelSpec

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
    weight_group_size: int | None = Field(None, ge=1, le=1024)  # None: the scenario's default (gpt-oss's MXFP4: 32)
    expert_weight_dtype: WeightDType | None = None  # the routed experts' own format (gpt-oss: mxfp4, the rest bf16)
    # the attention projections' own format and the output projection's (R1 NVFP4-v2: bf16, nvfp4; `ModelSpec`)
    attention_weight_dtype: WeightDType | None = None
    attention_output_weight_dtype: WeightDType | None = None
    kv_dtype: KvDType
    tp: int = Field(ge=1, le=64)
    ep: int = Field(1, ge=1, le=64)
    attention_dp: int = Field(1, ge=1, le=64)
    pp: int = Field(1, ge=1, le=8)  # pipeline stages, each a tensor-parallel group of tp GPUs
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
    # where max_num_seqs / max_num_batched_tokens come from: the row, or trtllm-bench's heuristic
    # (sim/device/bench_limits.py) for a trtllm-bench run that set neither
    batch_limits: Literal["row", "trtllm-bench"] = "row"
    bench_kv_dtype: KvDType | None = None  # the checkpoint's KV quantisation, as the heuristic sees it (default kv_dtype)
    chunked_prefill: bool = True  # False: a prompt is prefilled whole in one step (the engine's option off)
    # TensorRT-LLM's cuda_graph_config as the run's options set it (engine.cuda_graph_batch_sizes / _padding)
    cuda_graph_batch_sizes: list[int] | None = Field(None, min_length=1, max_length=64)
    cuda_graph_padding: bool = False
    moe_backend: Literal[TRTLLM_MOE_BACKENDS] | None = None  # TensorRT-LLM's moe_config.backend as the options set it
    admission: Literal["engine", "no_evict"] = "engine"
    metric: Metric
    measured: float = Field(gt=0)
    notes: str = _text(0)

    @model_validator(mode="after")
    def _consistent(self):
        if self.metric not in FAMILY_METRICS[self.family]:
            raise ValueError(f"family {self.family} reports {' or '.join(FAMILY_METRICS[self.family])}, "
                             f"not {self.metric}")
        limits = ("max_num_seqs", "max_num_batched_tokens")
        if self.batch_limits != "row" and any(getattr(self, f) is not None for f in limits):
            raise ValueError(f"batch_limits {self.batch_limits} sets max_num_seqs and max_num_batched_tokens: "
                             "give neither")
        needed = [f for f in WORKLOAD_FIELDS[self.workload] if self.batch_limits == "row" or f not in limits]
        missing = [f for f in needed if getattr(self, f) is None]
        if missing:
            article = "an" if self.workload[0] in "aeiou" else "a"
            raise ValueError(f"{article} {self.workload} workload needs {', '.join(missing)}")
        if self.gpus != self.tp * self.pp:
            raise ValueError(f"gpus ({self.gpus}) must equal tp x pp ({self.tp} x {self.pp}): one replica's "
                             "tensor-parallel groups, one a pipeline stage")
        if self.family == "batch-latency" and self.workload != "closed_batch":
            raise ValueError("batch-latency rows are closed batches (workload closed_batch)")
        if self.workload == "concurrency" and self.metric not in CONCURRENCY_METRICS:
            raise ValueError(f"a concurrency row is measured over its steady-state requests: "
                             f"{', '.join(CONCURRENCY_METRICS)}, not {self.metric}")
        if self.lengths == "uniform" and self.workload == "closed_batch":
            raise ValueError("a closed batch has one prompt and one output length: lengths fixed")
        return self

    @property
    def mean_lengths(self) -> tuple[float, float]:
        """The mean prompt and output lengths of the row's requests (uniform lengths: their midpoints)."""
        return (self.isl, self.osl) if self.lengths == "fixed" else ((1 + self.isl) / 2, (1 + self.osl) / 2)

    @property
    def shape(self) -> str:
        """The row's workload shape (`accuracy_bands.workload_shape`: decode-heavy, balanced, prefill-heavy)."""
        return workload_shape(*self.mean_lengths)

    @property
    def parallel(self) -> dict:
        return {"tp": self.tp, "ep": self.ep, "attention_dp": self.attention_dp, "pp": self.pp}

    def rank_limits(self) -> tuple[int, int, str]:
        """(max_num_seqs, max_num_batched_tokens) of each attention rank, and where they come from: the
        row's, or trtllm-bench's heuristic for the row's checkpoint, GPUs and lengths (`bench_limits`;
        TensorRT-LLM applies max_batch_size and max_num_tokens to each attention-DP rank). The heuristic
        reads the dataset's mean lengths, get_settings its longest prompt."""
        if self.batch_limits == "row":
            return self.max_num_seqs, self.max_num_batched_tokens, "the row's limits"
        gpu = catalog.gpu(self.gpu)
        isl, osl = self.mean_lengths
        model = replace(catalog.model(self.model), expert_weight_dtype=self.expert_weight_dtype,
                        attention_weight_dtype=self.attention_weight_dtype,
                        attention_output_weight_dtype=self.attention_output_weight_dtype)
        limits = trtllm_bench_limits(bench_checkpoint(model, self.weight_dtype, self.bench_kv_dtype or self.kv_dtype),
                                     self.tp, self.pp, gpu.memory_bytes, isl, osl, self.chunked_prefill, self.isl)
        return limits.max_batch_size, limits.max_num_tokens, limits.describe()


def bench_checkpoint(model: ModelSpec, weight_dtype: str, kv_dtype: str) -> BenchCheckpoint:
    """A catalog model's checkpoint as trtllm-bench's heuristic reads its config.json: a GQA model's KV heads
    and head size; an MLA model's config (DeepSeek-V3's) states num_key_value_heads = num_attention_heads
    and no head_dim, so hidden_size / heads. Parameters: the catalog's count (the checkpoint's also holds
    e.g. DeepSeek's multi-token-prediction layer, 2% more, which moves no catalog row's rounded limits), as
    the checkpoint's tensors count them (`checkpoint_elements`)."""
    if model.mla is not None:
        kv_heads, head_size = model.num_heads, model.hidden_size // model.num_heads
    else:
        kv_heads, head_size = model.num_kv_heads, model.head_dim
    params = checkpoint_elements(model, weight_dtype)
    # the checkpoint's quant algo: its experts' where it quantises them apart (gpt-oss's MXFP4)
    return BenchCheckpoint(kv_heads, head_size, model.num_layers, params, model.expert_format(weight_dtype), kv_dtype)


PACKED_FP4 = ("nvfp4", "mxfp4")  # weight formats whose checkpoints pack two values to a uint8 element


def checkpoint_elements(model: ModelSpec, weight_dtype: str) -> float:
    """The parameter count trtllm-bench reads (bench ModelConfig.get_param_count: the safetensors metadata's
    elements of every tensor, whatever their dtype). An FP4 checkpoint stores its quantised linear weights
    two to a uint8 element with one one-byte scale element per group (NVFP4: fp8 per 16, 0.5625 a weight;
    MXFP4: E8M0 per 32, 0.53125), so each counts its bytes; embeddings, LM head and norms stay bf16, one
    element each; where only the routed experts are FP4 (`ModelSpec.expert_weight_dtype`), only theirs are
    packed. Other formats: the catalog's count."""
    if weight_dtype not in PACKED_FP4:
        experts = model.expert_format(weight_dtype)
        if experts not in PACKED_FP4:
            return float(model.params)
        packed = model.moe_layers * model.num_experts * model.expert_params()
        return float(model.params) - packed * (1.0 - WEIGHT_DTYPES[experts].packed_bytes_per_element)
    per_weight = WEIGHT_DTYPES[weight_dtype].packed_bytes_per_element
    # every linear weight in bf16 against the checkpoint's: the quantised ones (not the attention it keeps bf16)
    plain = replace(model, expert_weight_dtype=None, attention_weight_dtype=None, attention_output_weight_dtype=None)
    quantised = (plain.weight_bytes("bf16") - model.weight_bytes(weight_dtype)) / (2.0 - per_weight)
    return float(model.params) - quantised * (1.0 - per_weight)


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
