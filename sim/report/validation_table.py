"""Reading a `hwprobe validate` CSV: one row per (scenario, metric) with predicted, measured and
rel_error = (predicted - measured) / measured. Bad input fails with one line naming the file."""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

import pandas as pd

from sim.inputs.errors import ConfigError
from sim.inputs.reader import check_csv_header, read_text
from sim.model.units import GB, MS
from sim.outputs.csv_text import restore
from sim.outputs.schema import (
    D2H_BYTES,
    DEVICE_MEMORY_PEAK,
    H2D_BYTES,
    HOST_PEAK,
    THROUGHPUT,
    TPOT_P50,
    TRANSFER_SHARE,
    relative_error,
)

from .style import PERCENT

REQUIRED_COLUMNS = ("scenario", "metric", "predicted", "measured")
RATIO_METRIC = "throughput_vs_full_hbm"  # from the `.ratios.csv` validate writes beside its table
RATIO_COLUMNS = ("scenario", "predicted_ratio", "measured_ratio")
BANDS = (0.10, 0.25)  # relative-error bands drawn and counted: +-10 % and +-25 %

# metric -> (label, scale to the unit shown, unit); unknown metrics are shown as they are
METRIC_DISPLAY = {
    THROUGHPUT.key: ("decode throughput", 1.0, "tok/s"),
    TPOT_P50.key: ("step time p50", 1 / MS, "ms"),
    TRANSFER_SHARE.key: ("transfer share", PERCENT, "% of decode time"),
    DEVICE_MEMORY_PEAK.key: ("device memory peak", 1 / GB, "GB"),
    "hbm_peak_bytes": ("device memory peak", 1 / GB, "GB"),
    HOST_PEAK.key: ("host memory peak", 1 / GB, "GB"),
    H2D_BYTES.key: ("H2D traffic", 1 / GB, "GB"),
    D2H_BYTES.key: ("D2H traffic", 1 / GB, "GB"),
    RATIO_METRIC: ("throughput relative to full_hbm", 1.0, "ratio"),
}


def metric_display(metric: str) -> tuple[str, float, str]:
    return METRIC_DISPLAY.get(metric, (metric, 1.0, ""))


def _relative_error(predicted: float, measured: float) -> float:
    """sim.outputs.schema.relative_error for a float column: NaN where undefined."""
    err = relative_error(predicted, measured)
    return math.nan if err is None else err


def _numbers(frame: pd.DataFrame, column: str, source: str) -> pd.Series:
    raw = frame[column]
    values = pd.to_numeric(raw, errors="coerce")
    bad = (values.isna() & raw.notna() & (raw.astype(str).str.strip() != "")) | values.isin([math.inf, -math.inf])
    if bad.any():
        row = int(bad.to_numpy().argmax())
        raise ConfigError(f"expected a number, got {str(raw.iloc[row])[:40]!r} (data row {row + 1})",
                          source=source, field=column)
    return values.astype(float)


def _read_csv(path: Path) -> pd.DataFrame:
    """Every cell as text (as written: sim.outputs.csv_text's quoting undone), the file a regular one,
    size-capped and UTF-8 (sim/inputs/reader.py), each column named once; a parse failure a
    ConfigError naming the file. pandas' EmptyDataError is left to the caller."""
    text = read_text(path)
    try:
        header = next((row for row in csv.reader(io.StringIO(text)) if row), [])  # pandas skips blank lines too
        check_csv_header([restore(c) for c in header], str(path))
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, na_values=[""])
        frame.columns = [restore(c) for c in frame.columns]
        for c in frame.columns:  # text stays text (an all-empty column is not made float)
            frame[c] = frame[c].map(restore).astype(frame[c].dtype)
        return frame
    except pd.errors.EmptyDataError:
        raise
    except (pd.errors.ParserError, ValueError, csv.Error, MemoryError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"not a readable CSV ({first})", source=str(path)) from None


def load_validation(path: str | Path) -> pd.DataFrame:
    """The long table, with rel_error filled in where the file left it empty."""
    source = str(path)
    p = Path(path)
    try:
        frame = _read_csv(p)
    except pd.errors.EmptyDataError:
        raise ConfigError("empty file; expected the CSV that `hwprobe validate` writes", source=source) from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(f"missing column(s) {', '.join(missing)}; expected {', '.join(REQUIRED_COLUMNS)}, rel_error "
                          f"(the CSV `hwprobe validate` writes)", source=source)
    out = frame[list(REQUIRED_COLUMNS)].copy()
    out["scenario"] = out["scenario"].fillna("").astype(str)
    out["metric"] = out["metric"].fillna("").astype(str)
    out["predicted"] = _numbers(frame, "predicted", source)
    out["measured"] = _numbers(frame, "measured", source)
    given = _numbers(frame, "rel_error", source) if "rel_error" in frame.columns else pd.Series(math.nan, index=frame.index)
    computed = [_relative_error(p_, m_) for p_, m_ in zip(out["predicted"], out["measured"])]
    out["rel_error"] = given.where(given.notna(), computed)
    usable = out.dropna(subset=["predicted", "measured"])
    if usable.empty:
        raise ConfigError("no row has both a predicted and a measured value", source=source)
    return pd.concat([out, _ratio_rows(p.with_suffix(".ratios.csv"))], ignore_index=True)


def _ratio_rows(path: Path) -> pd.DataFrame:
    """The throughput ratios to full_hbm validate wrote beside the table, as rows of one more
    metric; none when the file is absent or holds none."""
    if not os.path.lexists(path):
        return pd.DataFrame(columns=[*REQUIRED_COLUMNS, "rel_error"])
    source = str(path)
    try:
        frame = _read_csv(path)
    except pd.errors.EmptyDataError as exc:
        raise ConfigError(f"not a readable CSV ({str(exc).splitlines()[0]})", source=source) from None
    missing = [c for c in RATIO_COLUMNS if c not in frame.columns]
    if missing:
        raise ConfigError(f"missing column(s) {', '.join(missing)} (the .ratios.csv `hwprobe validate` writes)",
                          source=source)
    pred, meas = _numbers(frame, "predicted_ratio", source), _numbers(frame, "measured_ratio", source)
    return pd.DataFrame({"scenario": frame["scenario"].astype(str), "metric": RATIO_METRIC, "predicted": pred,
                         "measured": meas, "rel_error": [_relative_error(a, b) for a, b in zip(pred, meas)]})
