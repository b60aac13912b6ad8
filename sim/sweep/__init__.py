"""Sweeps: many scenarios from one spec, each point cached under the hash of what determines it.

- `spec`: the sweep spec (schema, loading) and its expansion into validated points.
- `points`: a point's hash, its evaluation (full simulation or projection) and its stored result.
- `table`: the tidy table (one row per point: swept fields, then metrics), CSV and Parquet.
- `executors`: where points run - local processes or Ray tasks; both hand results back in batches.
- `run`: `run_sweep`, what `kvsim sweep` calls: compute what is missing, store it, write the table.
"""

from .run import SweepOutcome, run_sweep

__all__ = ["SweepOutcome", "run_sweep"]
