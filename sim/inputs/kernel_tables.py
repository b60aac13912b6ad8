"""Measured kernel tables from NVIDIA AIConfigurator's database (PyPI `aiconfigurator-core`,
Apache-2.0, the `.[measured]` extra): the one adapter that reads its per-system parquet files into
kvtier's units. Another source (a newer release, `hwprobe calibrate` output in the same schema) is
one more adapter producing `KernelTables`.

What each table means, as the package's own loader reads it (its Rust engine; the column meanings
were checked against the 0.12.0 engine to ~1e-16):
- `gemm/<fw>/<ver>/gemm_perf.parquet`: one call of `x[m, k] @ W[n, k]^T` - m tokens, n output
  features per GPU, k the reduction dimension; `latency` in ms; one row per (gemm_dtype, m, n, k),
  the kernel vLLM dispatched for it (first row wins on a duplicate, as in the loader).
- `attention/<fw>/<ver>/generation_attention_perf.parquet`: one layer's decode-attention call for
  `batch_size` sequences with query length 1, each attending `step` cached tokens (the collector
  passes seq_len = step; isl is always 1); heads per GPU (after TP); `num_key_value_heads` equal
  to `num_heads` means MHA; `window_size` 0 is full attention; ms.
- `comm/<fw>/<ver>/custom_allreduce_perf.parquet` (the engine's custom all-reduce, CUDA-graph
  rows only) and `comm/nccl/<misc.nccl_version>/nccl_perf.parquet` (op all_reduce, dtype half):
  `message_size` in ELEMENTS of 2 bytes, `num_gpus`, ms per call.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from .errors import ConfigError

PACKAGE = "aiconfigurator-core"
FRAMEWORK = "vllm"
MS_TO_S = 1e-3
ELEMENT_BYTES = 2  # all-reduce message sizes are counted in bf16/half elements
# kvtier catalog GPU -> AIConfigurator system (its systems/<name>.yaml and data/<name>/)
SYSTEMS = {"h100-sxm": "h100_sxm", "h200-sxm": "h200_sxm", "a100-80gb-sxm": "a100_sxm", "l40s": "l40s",
           "b200": "b200_sxm"}
GEMM_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}  # weight dtype -> measured GEMM dtype
KV_DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp8": "fp8"}
PROFILE_SOURCE = "hwprobe"  # KernelTables.framework of tables read from a `hwprobe calibrate` profile


@dataclass(frozen=True)
class KernelTables:
    """One system's measured kernels under one framework, in seconds and bytes."""

    system: str
    device: str  # the GPU as the tables name it ("NVIDIA H200")
    framework: str
    framework_version: str
    package_version: str
    gemm: pd.DataFrame  # dtype (kvtier weight dtype), m, n, k, latency_s
    decode_attention: pd.DataFrame  # kv_dtype, kv_heads (0: MHA), head_dim, window, heads, batch, kv_tokens, latency_s
    allreduce: dict[str, pd.DataFrame] = field(default_factory=dict)  # impl -> gpus, bytes, latency_s
    nccl_version: str | None = None

    def source(self, table: str) -> str:
        """Where a figure came from, for `sources` and `kvsim ops`."""
        if self.framework == PROFILE_SOURCE:
            return f"measured: hwprobe profile of {self.device} ({self.framework_version}) {table}"
        ver = self.nccl_version if table == "nccl all_reduce" else f"{self.framework} {self.framework_version}"
        return f"measured: {PACKAGE} {self.package_version} {self.system} ({self.device}) {ver} {table}"


def tables_available() -> bool:
    return importlib.util.find_spec("aiconfigurator_core") is not None


def system_for(gpu: str) -> str | None:
    """The AIConfigurator system measuring this catalog GPU, or None (RTX cards, GH200, custom GPUs)."""
    return SYSTEMS.get(gpu)


def load_tables(gpu: str) -> KernelTables:
    """The measured tables of a catalog GPU; a ConfigError naming what is missing otherwise."""
    system = system_for(gpu)
    if system is None:
        covered = ", ".join(SYSTEMS)
        raise ConfigError(f"no measured kernel tables for {gpu!r}; AIConfigurator's tables cover {covered} "
                          f"(the datasheet kernels apply)", field="hardware.kernels")
    if not tables_available():
        raise ConfigError(f"measured kernels need the {PACKAGE} package: pip install -e '.[measured]' "
                          f"(or use the datasheet kernels)", field="hardware.kernels")
    return _load(system)


@lru_cache(maxsize=8)
def _load(system: str) -> KernelTables:
    root = _package_root() / "systems"
    spec = yaml.safe_load((root / f"{system}.yaml").read_text())
    data = root / "data" / system
    ver = _query_version(root, system)
    gemm = _read(data / "gemm" / FRAMEWORK / ver / "gemm_perf.parquet")
    attn = _read(data / "attention" / FRAMEWORK / ver / "generation_attention_perf.parquet")
    nccl_version = str((spec.get("misc") or {}).get("nccl_version") or "")
    allreduce = {"custom": _custom_allreduce(data / "comm" / FRAMEWORK, ver)}
    nccl = data / "comm" / "nccl" / nccl_version / "nccl_perf.parquet"
    if nccl_version and nccl.is_file():
        allreduce["nccl"] = _nccl_allreduce(nccl)
    return KernelTables(system=system, device=str(gemm["device"].iloc[0]), framework=FRAMEWORK, framework_version=ver,
                        package_version=version(PACKAGE), gemm=_gemm(gemm), decode_attention=_decode_attention(attn),
                        allreduce={k: v for k, v in allreduce.items() if v is not None}, nccl_version=nccl_version or None)


def tables_from_profile(profile) -> KernelTables:
    """The kernels a `hwprobe calibrate` profile timed on the user's own device, as tables of the
    same schema: its decode GEMM points (m tokens, n outputs, k reduction; bf16 and fp8) and decode
    attention points (batch sequences of context_tokens each). It times no all-reduce."""
    by_dtype = {v: k for k, v in GEMM_DTYPES.items() if k != "fp16"} | {"bf16": "bf16", "fp8": "fp8"}
    gemm = pd.DataFrame([{"dtype": by_dtype[g.dtype], "m": g.m, "n": g.n, "k": g.k, "latency_s": g.time_s}
                         for g in profile.compute.gemm_points if g.dtype in by_dtype],
                        columns=["dtype", "m", "n", "k", "latency_s"])
    attn = pd.DataFrame([{"kv_dtype": a.dtype if a.dtype in KV_DTYPES else "bf16",
                          "kv_heads": 0 if a.num_kv_heads == a.num_heads else a.num_kv_heads, "head_dim": a.head_dim,
                          "window": 0, "heads": a.num_heads, "batch": a.batch, "kv_tokens": a.context_tokens,
                          "latency_s": a.time_s} for a in profile.compute.attention_points],
                        columns=["kv_dtype", "kv_heads", "head_dim", "window", "heads", "batch", "kv_tokens", "latency_s"])
    return KernelTables(system="profile", device=f"{profile.device} {profile.device_name}", framework=PROFILE_SOURCE,
                        framework_version=profile.created_utc, package_version="", gemm=gemm.drop_duplicates(
                            ["dtype", "m", "n", "k"], keep="first"), decode_attention=attn)


def _package_root() -> Path:
    spec = importlib.util.find_spec("aiconfigurator_core")  # located, not imported (its engine is compiled)
    return Path(next(iter(spec.submodule_search_locations)))


def _query_version(root: Path, system: str) -> str:
    """The version the package queries for this system (systems/query_versions.yaml 'current')."""
    q = yaml.safe_load((root / "query_versions.yaml").read_text())
    slot = (q.get("overrides", {}).get(system) or {}).get(FRAMEWORK) or q["defaults"][FRAMEWORK]
    return str(slot["current"])


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot read measured table {path}: {err}", field="hardware.kernels") from None


def _gemm(df: pd.DataFrame) -> pd.DataFrame:
    by_dtype = {v: k for k, v in GEMM_DTYPES.items() if k != "fp16"}
    df = df[df["gemm_dtype"].isin(by_dtype)].drop_duplicates(["gemm_dtype", "m", "n", "k"], keep="first")
    return pd.DataFrame({"dtype": df["gemm_dtype"].map(by_dtype).to_numpy(), "m": df["m"].to_numpy(),
                         "n": df["n"].to_numpy(), "k": df["k"].to_numpy(),
                         "latency_s": df["latency"].to_numpy() * MS_TO_S})


def _decode_attention(df: pd.DataFrame) -> pd.DataFrame:
    by_dtype = {v: k for k, v in KV_DTYPES.items() if k != "fp16"}
    df = df.assign(**{c: df[c] if c in df else d for c, d in (("window_size", 0), ("beam_width", 1), ("attn_dtype", "bfloat16"))})
    df = df[df["kv_cache_dtype"].isin(by_dtype) & (df["attn_dtype"] == "bfloat16") & (df["beam_width"] == 1)]
    # one kernel lane per slice, the one with most rows first (lanes never mix, as in the engine)
    lanes = df["kernel_source"].value_counts()
    df = df.assign(_lane=df["kernel_source"].map({k: i for i, k in enumerate(lanes.index)})).sort_values("_lane", kind="stable")
    kv_heads = df["num_key_value_heads"].where(df["num_key_value_heads"] != df["num_heads"], 0)
    out = pd.DataFrame({"kv_dtype": df["kv_cache_dtype"].map(by_dtype).to_numpy(), "kv_heads": kv_heads.to_numpy(),
                        "head_dim": df["head_dim"].to_numpy(), "window": df["window_size"].to_numpy(),
                        "heads": df["num_heads"].to_numpy(), "batch": df["batch_size"].to_numpy(),
                        "kv_tokens": df["step"].to_numpy(), "latency_s": df["latency"].to_numpy() * MS_TO_S})
    return out.drop_duplicates(["kv_dtype", "kv_heads", "head_dim", "window", "heads", "batch", "kv_tokens"], keep="first")


def _custom_allreduce(comm: Path, ver: str) -> pd.DataFrame | None:
    """The custom all-reduce of the queried version, else of the newest older one that has it (the
    package's own backward fill)."""
    older = sorted((p.name for p in comm.iterdir() if p.is_dir() and _version_key(p.name) <= _version_key(ver)),
                   key=_version_key, reverse=True) if comm.is_dir() else []
    path = next((comm / v / "custom_allreduce_perf.parquet" for v in older
                 if (comm / v / "custom_allreduce_perf.parquet").is_file()), None)
    if path is None:
        return None
    df = _read(path)
    graph = ~df["kernel_source"].astype(str).str.contains("eager")
    if "backend" in df:
        graph &= ~df["backend"].astype(str).str.contains("eager")
    return _allreduce(df[graph])


def _version_key(v: str) -> tuple:
    return tuple(int(x) if x.isdigit() else 0 for x in v.replace("rc", ".").replace("post", ".").split("."))


def _nccl_allreduce(path: Path) -> pd.DataFrame:
    df = _read(path)
    return _allreduce(df[(df["op_name"] == "all_reduce") & (df["nccl_dtype"] == "half")])


def _allreduce(df: pd.DataFrame) -> pd.DataFrame:
    df = df.drop_duplicates(["num_gpus", "message_size"], keep="first")
    return pd.DataFrame({"gpus": df["num_gpus"].to_numpy(), "bytes": df["message_size"].to_numpy() * ELEMENT_BYTES,
                         "latency_s": df["latency"].to_numpy() * MS_TO_S})


# ---- the held-out split ---------------------------------------------------------------------------
# Whole grid lines are held out, so the held-out points test interpolation across a gap (a held-out
# cell inside a kept line would only test the nearest-cell fill): every 4th value (from the 3rd) of
# GEMM n and k, of attention kv_tokens and batch, and of all-reduce message size.
HELD_OUT_EVERY, HELD_OUT_FROM = 4, 2


def _held_lines(values: pd.Series) -> pd.Series:
    axis = np.unique(values.to_numpy())
    held = axis[HELD_OUT_FROM::HELD_OUT_EVERY]
    return values.isin(held)


def split_tables(tables: KernelTables) -> tuple[KernelTables, KernelTables]:
    """(tune, held_out): the same tables with the held-out grid lines removed, and those lines alone."""
    g, a = tables.gemm, tables.decode_attention
    g_held = _held_lines(g["n"]) | _held_lines(g["k"])
    a_held = _held_lines(a["kv_tokens"]) | _held_lines(a["batch"])
    ar_held = {impl: t.groupby("gpus")["bytes"].transform(lambda s: _held_lines(s)).astype(bool)
               for impl, t in tables.allreduce.items()}

    def part(held: bool) -> KernelTables:
        return replace(tables, gemm=g[g_held == held], decode_attention=a[a_held == held],
                       allreduce={impl: t[ar_held[impl] == held] for impl, t in tables.allreduce.items()})

    return part(False), part(True)
