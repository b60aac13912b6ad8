"""The sweep's tidy table: one row per point in spec order, the swept fields (dotted paths) as
columns, then the kept metrics, then `point_hash` (the name of the point's stored result).

It is always assembled from the stored point files, so a resumed sweep, an uninterrupted one and
one run on Ray write the same bytes.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from sim.outputs.atomic import _umask, write_text_atomic
from sim.outputs.csv_text import csv_text

from .spec import SweepPlan

HASH_COLUMN = "point_hash"
CSV_NAME, PARQUET_NAME = "table.csv", "table.parquet"


def _field(scenario: BaseModel, path: str) -> Any:
    """The value at a dotted path of the point's scenario, as its JSON dump holds it - read from the
    model itself, so a field a dump leaves out at its default (`QuietDefaults`) still shows its value."""
    node: Any = scenario
    for part in path.split("."):
        node = getattr(node, part, None) if isinstance(node, BaseModel) else node.get(part) if isinstance(node, dict) else None
    return node.model_dump(mode="json") if isinstance(node, BaseModel) else node


def build_table(plan: SweepPlan, summaries: dict[str, dict]) -> pd.DataFrame:
    """`summaries`: point key -> stored summary, for every point of the plan."""
    rows = []
    for point in plan.points:
        summary = summaries[point.key]
        row = {c: _field(point.scenario, c) for c in plan.columns}
        row.update({m: summary.get(m) for m in plan.metrics})
        row[HASH_COLUMN] = point.key
        rows.append(row)
    df = pd.DataFrame(rows, columns=[*plan.columns, *plan.metrics, HASH_COLUMN])
    for col in df.columns:
        df[col] = _one_type(df[col])
    return df


def _one_type(col: pd.Series) -> pd.Series:
    """A column Parquet can hold: mappings, lists or a mix of kinds (say an integer length in some
    points, a length distribution in others) become JSON text, all of the column alike."""
    kinds = {type(v) for v in col if v is not None}
    if kinds <= {int, float} or len(kinds) <= 1 and not kinds & {dict, list}:
        return col
    return col.map(lambda v: None if v is None else json.dumps(v, sort_keys=True))


def write_table(df: pd.DataFrame, out_dir: Path) -> tuple[Path, Path]:
    """table.csv and table.parquet in out_dir, each written atomically."""
    csv_path, parquet_path = out_dir / CSV_NAME, out_dir / PARQUET_NAME
    write_text_atomic(csv_path, csv_text(df))
    fd, tmp = tempfile.mkstemp(prefix=f".{PARQUET_NAME}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False, engine="pyarrow")
        os.chmod(tmp, 0o666 & ~_umask())  # as write_text_atomic leaves a file
        os.replace(tmp, parquet_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return csv_path, parquet_path
