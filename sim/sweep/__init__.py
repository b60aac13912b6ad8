"""Sweeps: many scenarios from one spec, each point cached under the hash of what determines it; the
same machinery runs the report's projection grid and `kvsim plan`'s candidates.

- `tasks`: what executors run (a task knows its kind, inputs and evaluation) and `run_tasks`, the
  driver: look up, compute what is missing, store each result as it arrives.
- `store`: results on disk under the hash of (kind, inputs, simulator version).
- `executors`: where tasks run - local processes or Ray tasks; both hand results back in batches.
- `options`: --executor, --address, --workers, --cache as the commands take them, checked up front.
- `spec`: the sweep spec (schema, loading) and its expansion into validated points.
- `points`: a sweep point's inputs, key and evaluation (full simulation, fast level or projection).
- `table`: the tidy table (one row per point: swept fields, then metrics), CSV and Parquet.
- `run`: `run_sweep`, what `kvsim sweep` calls: run the points, write the table.
"""

from .run import SweepOutcome, run_sweep

__all__ = ["SweepOutcome", "run_sweep"]
