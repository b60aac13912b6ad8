"""`kvsim sweep`: checks its options, runs the sweep, says what it wrote (all on stderr)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import ConfigError

EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT


def sweep_command(spec: Path, out: Path | None, *, executor: str, address: str | None, workers: int | None,
                  batch: int | None, progress: bool) -> int:
    """Exit code: 0 done, 130 interrupted (finished points kept). Bad input raises ConfigError."""
    from .run import SweepInterrupted, run_sweep

    if executor not in ("local", "ray"):
        raise ConfigError(f"expected local or ray, got {executor!r}", field="--executor")
    if address is not None and executor != "ray":
        raise ConfigError("only with --executor ray", field="--address")
    for name, value in (("--workers", workers), ("--batch", batch)):
        if value is not None and value < 1:
            raise ConfigError(f"expected at least 1, got {value}", field=name)
    if executor == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise ConfigError("Ray is not installed: pip install -e '.[sweep]'", field="--executor") from None
    out_dir = out or Path("runs") / f"sweep-{spec.stem}"
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} exists and is not a folder", field="--out")
    try:
        res = run_sweep(spec, out_dir, executor=executor, workers=workers, address=address, batch=batch,
                        progress=progress and sys.stderr.isatty())
    except SweepInterrupted as err:
        print(f"kvsim: {err} ({out_dir})", file=sys.stderr)
        return EXIT_INTERRUPTED
    dupes = f", {res.points - res.unique} repeated" if res.points > res.unique else ""
    print(f"sweep: {res.points} points ({res.computed} computed, {res.stored_before} stored already{dupes}) "
          f"in {res.seconds:.1f} s; wrote {res.csv} and {res.parquet}", file=sys.stderr)
    return 0
