"""The committed accuracy bands (`sim/catalog/accuracy_bands.yaml`, written by `kvsim accuracy
--write-bands`; docs/accuracy.md): kvtier's median, worst and signed mean error against the public
end-to-end measurements, per mode, family and GPU, and per mode, family and model - and the short phrase
`kvsim run` and `kvsim plan` print beside a headline figure: the run's model's band where the table holds
MODEL_MIN_ROWS of its rows in that family (a dense 70B and gpt-oss's sliding-window experts miss
differently), else for a dense GQA model every dense GQA model's, else its GPU's, else every GPU's -
and beside it the band of the rows of the run's workload shape (`workload_shape`: decode-heavy, balanced
or prefill-heavy) where the family has MODEL_MIN_ROWS of them. Read here, never recomputed."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, model_validator

from . import catalog
from .errors import ConfigError
from .kernel_tables import system_for, tables_available

BANDS_FILE = "accuracy_bands.yaml"
ALL = "all"  # the key of every family, or of every GPU
MODES = ("measured", "datasheet")
# the family of public measurements a headline figure belongs to (sim.studies.e2e_table.FAMILY_METRICS)
BATCH_LATENCY, SERVED_ITL, SERVED_TTFT, OFFLINE_THROUGHPUT = ("batch-latency", "served-itl", "served-ttft",
                                                             "offline-throughput")
NO_BAND = "(no public measurement of this family; kvsim accuracy)"
MODEL_MIN_ROWS = 3  # a model's own band needs this many of its rows in the family, else the GPU's applies
DENSE_GQA = "dense GQA models"  # by_model's band over every dense GQA model's rows (`ModelSpec.dense_gqa`)
# a workload's shape by its mean lengths (`workload_shape`), and how the bands' text says it
SHAPE_RATIO = 4.0
DECODE_HEAVY, BALANCED, PREFILL_HEAVY = "decode-heavy", "balanced", "prefill-heavy"
SHAPE_WORDS = {DECODE_HEAVY: "output >= 4x prompt", BALANCED: "prompt and output within 4x",
               PREFILL_HEAVY: "prompt >= 4x output"}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Band(_Frozen):
    """|error| over `rows` rows (error = predicted / measured - 1): median and worst; the signed mean
    (negative: kvtier predicts too low)."""

    rows: int
    median_abs_error: float
    worst_abs_error: float
    mean_error: float


class ComputedAt(_Frozen):
    commit: str  # the kvtier commit the study ran at ("+ uncommitted changes" where the tree was dirty)
    date: str  # UTC date of the computation
    kvtier_version: str
    table: str  # the measurement table it read


class AccuracyBands(_Frozen):
    computed_at: ComputedAt
    bands: dict[str, dict[str, dict[str, Band]]]  # mode -> family (or "all") -> GPU (or "all") -> band
    by_model: dict[str, dict[str, dict[str, Band]]] = {}  # mode -> family (or "all") -> catalog model -> band
    by_shape: dict[str, dict[str, dict[str, Band]]] = {}  # mode -> family (or "all") -> workload shape -> band

    @model_validator(mode="after")
    def _known_shapes(self):
        unknown = sorted({s for by_family in self.by_shape.values() for by in by_family.values() for s in by}
                         - set(SHAPE_WORDS))
        if unknown:
            raise ValueError(f"by_shape: expected shapes among {', '.join(SHAPE_WORDS)}, got {unknown[0]!r}")
        return self

    def pick(self, mode: str, family: str, gpu: str) -> tuple[Band | None, str]:
        """The band of `family` in `mode` on `gpu` where the table has rows for that GPU, else over all
        GPUs: (band, the GPU or "all"); (None, "all") where the family has no row in that mode."""
        by_gpu = self.bands.get(mode, {}).get(family, {})
        if gpu in by_gpu:
            return by_gpu[gpu], gpu
        return by_gpu.get(ALL), ALL

    def pick_model(self, mode: str, family: str, model: str | None) -> tuple[Band | None, str]:
        """(band, whose rows) of `family` in `mode`: `model`'s own (an alias as the catalog names it: a
        DeepSeek-R1 distill of Llama-70B is llama-3.1-70b) where the table holds MODEL_MIN_ROWS of them,
        else - for a dense GQA model - every dense GQA model's (Qwen3-32B's are Llama's kind of
        error, not gpt-oss's); (None, "") otherwise."""
        by_model = self.by_model.get(mode, {}).get(family, {})
        spec = catalog_model(model)
        keys = [] if spec is None else [spec.name, *([DENSE_GQA] if spec.dense_gqa else [])]
        for key in keys:
            band = by_model.get(key)
            if band is not None and band.rows >= MODEL_MIN_ROWS:
                return band, key
        return None, ""

    def pick_shape(self, mode: str, family: str, shape: str | None) -> Band | None:
        """The band of `family`'s rows of workload `shape` (every model's, every GPU's) in `mode` where the
        table holds MODEL_MIN_ROWS of them; None otherwise."""
        band = self.by_shape.get(mode, {}).get(family, {}).get(shape or "")
        return band if band is not None and band.rows >= MODEL_MIN_ROWS else None


def workload_shape(prompt_tokens: float, output_tokens: float) -> str:
    """A workload's shape by its mean prompt and output lengths: decode-heavy where the output is at least
    SHAPE_RATIO times the prompt (a reasoning model's long chains of thought: 1k/8k, 128/2048), prefill-heavy
    where the prompt is that many times the output (8k/1k, 2048/128), balanced between (1k/1k). kvtier
    misses the three differently (docs/accuracy.md), so each has its own band."""
    if output_tokens >= SHAPE_RATIO * prompt_tokens:
        return DECODE_HEAVY
    if prompt_tokens >= SHAPE_RATIO * output_tokens:
        return PREFILL_HEAVY
    return BALANCED


def catalog_model(model: str | None):
    """The catalog's model of a name or alias; None for none, or for a model it does not hold (a config file)."""
    if not model:
        return None
    try:
        return catalog.model(model)
    except ConfigError:
        return None


def default_path() -> Path:
    return Path(str(resources.files("sim").joinpath("catalog", BANDS_FILE)))


@lru_cache(maxsize=4)
def load_bands(path: Path | None = None) -> AccuracyBands:
    """The bands file (default: the committed one), parsed once per process."""
    path = path or default_path()
    try:
        return AccuracyBands.model_validate(yaml.safe_load(path.read_text()))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the accuracy bands ({exc}); run `kvsim accuracy --write-bands`",
                          source=str(path)) from None


def mode_of(sources: dict[str, str]) -> str:
    """The operator-cost mode a run used, from its summary's `sources`: `kernels` names the measured
    tables when it ran with them (sim.device.hardware.with_measured_kernels), else datasheet."""
    return "measured" if str(sources.get("kernels", "")).startswith("measured") else "datasheet"


def planned_mode(kernels: str, gpu: str) -> str:
    """The mode a run of `gpu` without a profile takes for `hardware.kernels` (the rule of
    sim.device.hardware.resolve_hardware): measured when asked, or on auto where the tables cover it."""
    covered = system_for(gpu) is not None and tables_available()
    return "measured" if kernels == "measured" or (kernels == "auto" and covered) else "datasheet"


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.1 else f"{100 * x:.0f}%"


def band_phrase(family: str, mode: str, gpu: str, bands: AccuracyBands | None = None, model: str | None = None,
                shape: str | None = None) -> str:
    """"(7 public served-itl measurements on h100-sxm, measured mode: median 1.5%, worst 25% off;
    kvsim accuracy)": the band that applies to a figure of `family` from a run of `model` on `gpu` in
    `mode` - "of llama-3.1-70b" where the model's own rows make one, "of dense GQA models" where a dense
    model's kind does (`AccuracyBands.pick_model`) - and, for a run of workload `shape` (`workload_shape`),
    the band of that shape's rows where there are enough (`AccuracyBands.pick_shape`)."""
    bands = bands or load_bands()
    band, whose = bands.pick_model(mode, family, model)
    if band is not None:
        where = f"of {whose}"
    else:
        band, scope = bands.pick(mode, family, gpu)
        if band is None or band.rows == 0:
            return NO_BAND
        where = "on all GPUs" if scope == ALL else f"on {scope}"
    count = f"{band.rows} public {family} measurement{'s' if band.rows != 1 else ''}"
    by_shape = bands.pick_shape(mode, family, shape)
    of_shape = "" if by_shape is None else (
        f"; {shape} workloads ({SHAPE_WORDS[shape]}): median {_pct(by_shape.median_abs_error)}, "
        f"worst {_pct(by_shape.worst_abs_error)} over {by_shape.rows} rows of every model and GPU")
    return (f"({count} {where}, {mode} mode: median {_pct(band.median_abs_error)}, "
            f"worst {_pct(band.worst_abs_error)} off{of_shape}; kvsim accuracy)")


def run_band(family: str, gpu: str, sources: dict[str, str], model: str | None = None,
             shape: str | None = None) -> str:
    """" (…)": the band of a run's figure, read from its summary's model, GPU, sources and workload shape,
    with a leading space."""
    return " " + band_phrase(family, mode_of(sources), gpu, model=model, shape=shape)
