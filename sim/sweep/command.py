"""`kvsim sweep`: checks its options, runs the sweep, says what it wrote (all on stderr)."""

from __future__ import annotations

import sys
from pathlib import Path

from sim.inputs.errors import ConfigError

EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT


def sweep_command(spec: Path, out: Path | None, *, executor: str, address: str | None, workers: int | None,
                  batch: int | None, progress: bool, allow_large: bool = False) -> int:
    """Exit code: 0 done, 130 interrupted (finished points kept). Bad input raises ConfigError."""
    from sim.runner.options import Execution, check_folder
    from sim.runner.tasks import damaged_line

    from .run import SweepInterrupted, run_sweep

    Execution(executor, address, workers).check()
    if batch is not None and batch < 1:
        raise ConfigError(f"expected at least 1, got {batch}", field="--batch")
    out_dir = out or Path("runs") / f"sweep-{spec.stem}"
    check_folder(out_dir, "--out")
    try:
        res = run_sweep(spec, out_dir, executor=executor, workers=workers, address=address, batch=batch,
                        progress=progress and sys.stderr.isatty(), allow_large=allow_large)
    except SweepInterrupted as err:
        print(f"kvsim: {err} ({out_dir})", file=sys.stderr)
        return EXIT_INTERRUPTED
    if res.damaged:
        print(f"kvsim: {damaged_line(res.damaged)} in {out_dir / 'points'}", file=sys.stderr)
    dupes = f", {res.points - res.unique} repeated" if res.points > res.unique else ""
    print(f"sweep: {res.points} points ({res.computed} computed, {res.stored_before} stored already{dupes}) "
          f"in {res.seconds:.1f} s; wrote {res.csv} and {res.parquet}", file=sys.stderr)
    return 0
