"""What `kvsim ops` is asked: one operator from flags, or a CSV of them (one per row; empty cells
unset; columns it does not know are passed through to the output). Every problem is one line naming
the file, the row and the field."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from . import catalog
from .errors import ConfigError
from .moe_routing import BALANCED_ROUTING, MoeRouting
from .reader import read_text
from .scenario import KvDType, WeightDType, validation_error_line
from .strict import Strict

MAX_OP_ROWS = 100_000
MAX_DIM = 2**24
MAX_OP_BYTES = 2**40
OP_FIELDS = {
    "gemm": ("m", "n", "k"),
    "attention": ("batch", "kv_tokens", "heads", "kv_heads", "head_dim"),
    "prefill": ("batch", "kv_tokens", "heads", "kv_heads", "head_dim"),  # kv_tokens: each prompt's tokens
    "allreduce": ("bytes", "gpus"),
    "allgather": ("bytes", "gpus"),  # bytes: the whole gathered buffer (nccl-tests' size)
    "reducescatter": ("bytes", "gpus"),  # bytes: the whole buffer every GPU reduces
    "alltoall": ("tokens", "hidden", "top_k", "experts", "gpus"),  # DeepEP: tokens a rank, gpus the EP ranks
    "mlabmm": ("tokens", "heads"),  # absorbed MLA's BMM (DeepSeek-V3 widths), heads per GPU
    "elementwise": ("m", "width"),  # one elementwise pass (`kind`) over m rows of width elements (bf16, one GPU)
    "moe": ("tokens", "experts", "top_k", "hidden", "inter"),  # one GPU's fused routed experts (tp, ep: its split)
}
INTEGER_COLUMNS = {"m", "n", "k", "batch", "kv_tokens", "heads", "kv_heads", "head_dim", "window", "gpus", "tokens",
                   "hidden", "top_k", "experts", "width", "inter", "tp", "ep"}
COLUMNS = ("op", "gpu", "m", "n", "k", "dtype", "batch", "kv_tokens", "heads", "kv_heads", "head_dim", "kv_dtype",
           "window", "bytes", "gpus", "impl", "tokens", "hidden", "top_k", "experts", "phase", "kernel", "wire", "bmm",
           "kind", "width", "inter", "tp", "ep", "routing")


class OpQuery(Strict):
    op: Literal["gemm", "attention", "prefill", "allreduce", "allgather", "reducescatter", "alltoall", "mlabmm",
                "elementwise", "moe"]
    gpu: str = Field("h200-sxm", max_length=64)
    m: int | None = Field(None, ge=1, le=MAX_DIM)  # GEMM rows (tokens)
    n: int | None = Field(None, ge=1, le=MAX_DIM)  # output features per GPU
    k: int | None = Field(None, ge=1, le=MAX_DIM)  # input features (the reduction)
    dtype: WeightDType = "bf16"
    batch: int | None = Field(None, ge=1, le=MAX_DIM)
    kv_tokens: int | None = Field(None, ge=1, le=MAX_DIM)  # cached tokens each sequence attends
    heads: int | None = Field(None, ge=1, le=1024)  # per GPU
    kv_heads: int | None = Field(None, ge=1, le=1024)
    head_dim: int | None = Field(None, ge=1, le=4096)
    kv_dtype: KvDType = "bf16"
    window: int = Field(0, ge=0, le=MAX_DIM)  # attention, prefill: a sliding window of W tokens (0: none)
    bytes: float | None = Field(None, gt=0, le=MAX_OP_BYTES)
    gpus: int | None = Field(None, ge=1, le=1024)
    impl: Literal["custom", "nccl"] = "custom"
    tokens: int | None = Field(None, ge=1, le=MAX_DIM)  # alltoall: tokens a rank; mlabmm: tokens
    hidden: int | None = Field(None, ge=1, le=MAX_DIM)
    top_k: int | None = Field(None, ge=1, le=1024)
    experts: int | None = Field(None, ge=1, le=MAX_DIM)
    phase: Literal["dispatch", "combine"] = "dispatch"  # alltoall
    kernel: Literal["ll", "ht"] = "ll"  # alltoall: DeepEP's low-latency or high-throughput kernels
    wire: Literal["bf16", "fp8", "default"] = "bf16"  # alltoall: what crosses (default: vLLM's tables)
    bmm: Literal["pre", "post"] = "pre"  # mlabmm: q_nope x W_UK (pre) or the latent output x W_UV (post)
    # elementwise: which pass (sim/device/elementwise.py) over m rows of `width` elements a row
    kind: Literal["rmsnorm", "add_rmsnorm", "rope", "silu_mul", "add"] = "rmsnorm"
    width: int | None = Field(None, ge=1, le=MAX_DIM)
    # moe: one expert's full intermediate width, split tp ways (moe tp), the experts split whole ep ways, and the
    # tables' routing (sim/inputs/moe_routing.py); the weights in `dtype` (int8: no fused-experts format)
    inter: int | None = Field(None, ge=1, le=MAX_DIM)
    tp: int = Field(1, ge=1, le=1024)
    ep: int = Field(1, ge=1, le=1024)
    routing: MoeRouting = BALANCED_ROUTING

    @model_validator(mode="after")
    def _complete(self):
        missing = [f for f in OP_FIELDS[self.op] if getattr(self, f) is None]
        if missing:
            raise ValueError(f"{self.op} needs {', '.join(OP_FIELDS[self.op])}; missing {', '.join(missing)}")
        if self.op == "mlabmm" and self.dtype not in ("bf16", "fp8"):
            raise ValueError(f"mlabmm runs in bf16 or fp8; got dtype {self.dtype}")
        if self.op == "moe":
            self._check_moe()
        return self

    def _check_moe(self) -> None:
        if self.dtype == "int8":
            raise ValueError("moe: no fused-experts format for int8 weights (bf16, fp16, fp8, int4, nvfp4, mxfp4)")
        if self.tp > 1 and self.ep > 1:
            raise ValueError(f"moe: split the experts by tp or by ep, not both (tp {self.tp}, ep {self.ep})")
        if self.top_k > self.experts or self.experts % self.ep:
            raise ValueError(f"moe: top_k ({self.top_k}) must be <= experts ({self.experts}), and ep ({self.ep}) "
                             "must divide the experts")
        if self.inter % self.tp:
            raise ValueError(f"moe: tp ({self.tp}) must divide inter ({self.inter})")


def op_query(values: dict, source: str) -> OpQuery:
    """One query from flag values (None: not given); the GPU checked against the catalog."""
    needs = OP_FIELDS.get(values.get("op"), ())
    missing = [f for f in needs if values.get(f) is None]
    if missing:
        raise ConfigError(f"{values['op']} needs {', '.join(needs)}; missing {', '.join(missing)}", source=source,
                          field=missing[0])
    if values.get("op") in ("attention", "prefill") and values["heads"] % max(values["kv_heads"], 1):
        raise ConfigError(f"heads ({values['heads']}) must be a multiple of kv_heads", source=source, field="kv_heads")
    try:
        q = OpQuery.model_validate({k: v for k, v in values.items() if v is not None})
    except ValidationError as err:
        raise validation_error_line(err, source) from None
    try:
        catalog.gpu(q.gpu)
    except ConfigError as err:
        raise ConfigError(err.message, source=source, field="gpu") from None
    return q


def read_op_csv(path: str | Path) -> tuple[list[OpQuery], list[dict[str, str]]]:
    """The queries of a CSV and each row as read (its other columns pass through)."""
    source = str(path)
    reader = csv.DictReader(io.StringIO(read_text(path)))
    header = reader.fieldnames or []
    if len(set(header)) != len(header):
        dup = sorted({c for c in header if header.count(c) > 1})
        raise ConfigError(f"header: column {dup[0]!r} appears twice", source=source)
    if "op" not in header:
        raise ConfigError(f"header: expected an 'op' column and the operator's fields ({', '.join(COLUMNS)})", source=source)
    queries, rows = [], []
    try:
        for row in reader:
            line = reader.line_num
            if len(queries) >= MAX_OP_ROWS:
                raise ConfigError(f"line {line}: more than {MAX_OP_ROWS:,} operators", source=source)
            if None in row:
                raise ConfigError(f"line {line}: more cells than the header has columns", source=source)
            values = {c: _cell(row[c], c, line, source) for c in COLUMNS if c in row and (row[c] or "").strip()}
            queries.append(op_query(values, f"{source}: line {line}"))
            rows.append(dict(row))
    except csv.Error as exc:
        raise ConfigError(f"line {reader.line_num}: invalid CSV: {exc}", source=source) from None
    if not queries:
        raise ConfigError("no operators (a header and at least one row expected)", source=source)
    return queries, rows


def _cell(raw: str, column: str, line: int, source: str):
    text = raw.strip()
    if column in INTEGER_COLUMNS:
        try:
            return int(text)
        except ValueError:
            raise ConfigError(f"line {line}: {column}: expected an integer, got {text!r}", source=source) from None
    if column == "bytes":
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"line {line}: bytes: expected a number, got {text!r}", source=source) from None
    return text
