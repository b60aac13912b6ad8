"""The committed accuracy bands (`sim/catalog/accuracy_bands.yaml`, written by `kvsim accuracy
--write-bands`; docs/accuracy.md): kvtier's median, worst and signed mean error against the public
end-to-end measurements, per mode, family and GPU - and the short phrase `kvsim run` and `kvsim plan`
print beside a headline figure. Read here, never recomputed."""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict

from .errors import ConfigError
from .kernel_tables import system_for, tables_available

BANDS_FILE = "accuracy_bands.yaml"
ALL = "all"  # the key of every family, or of every GPU
MODES = ("measured", "datasheet")
# the family of public measurements a headline figure belongs to (sim.studies.e2e_table.FAMILY_METRICS)
BATCH_LATENCY, SERVED_ITL, SERVED_TTFT, OFFLINE_THROUGHPUT = ("batch-latency", "served-itl", "served-ttft",
                                                             "offline-throughput")
NO_BAND = "(no public measurement of this family; kvsim accuracy)"


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

    def pick(self, mode: str, family: str, gpu: str) -> tuple[Band | None, str]:
        """The band of `family` in `mode` on `gpu` where the table has rows for that GPU, else over all
        GPUs: (band, the GPU or "all"); (None, "all") where the family has no row in that mode."""
        by_gpu = self.bands.get(mode, {}).get(family, {})
        if gpu in by_gpu:
            return by_gpu[gpu], gpu
        return by_gpu.get(ALL), ALL


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


def band_phrase(family: str, mode: str, gpu: str, bands: AccuracyBands | None = None) -> str:
    """"(7 public served-itl measurements on h100-sxm, measured mode: median 1.5%, worst 25% off;
    kvsim accuracy)": the band that applies to a figure of `family` from a run of `gpu` in `mode`."""
    band, scope = (bands or load_bands()).pick(mode, family, gpu)
    if band is None or band.rows == 0:
        return NO_BAND
    where = "all GPUs" if scope == ALL else scope
    count = f"{band.rows} public {family} measurement{'s' if band.rows != 1 else ''}"
    return (f"({count} on {where}, {mode} mode: median {_pct(band.median_abs_error)}, "
            f"worst {_pct(band.worst_abs_error)} off; kvsim accuracy)")


def run_band(family: str, gpu: str, sources: dict[str, str]) -> str:
    """" (…)": the band of a run's figure, read from its summary's GPU and sources, with a leading space."""
    return " " + band_phrase(family, mode_of(sources), gpu)
