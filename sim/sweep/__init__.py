"""`kvsim sweep`: many scenarios from one spec, each point cached under the hash of what determines
it, on the task machinery of `sim.runner`.

- `spec`: the sweep spec (schema, loading) and its expansion into validated points.
- `points`: a sweep point's inputs, key and evaluation (full simulation, fast level or projection).
- `table`: the tidy table (one row per point: swept fields, then metrics), CSV and Parquet.
- `run`: `run_sweep`, what `kvsim sweep` calls: run the points, write the table.
- `command`: the command's options checked, the sweep run, what it wrote said on stderr.

Imports `sim.decode`, `sim.runner` and the layers below them.
"""
