"""How and where a command's tasks run, as `kvsim sweep`, `kvsim report` and `kvsim plan` take it:
`--executor local|ray`, `--address` (a Ray cluster), `--workers`, and - report and plan -
`--cache DIR` (a result store: a rerun computes only what it does not hold). Checked before any work,
each mistake one ConfigError line.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

from sim.inputs.errors import ConfigError

from .executors import LocalExecutor, RayExecutor
from .store import ResultStore

EXECUTORS = ("local", "ray")
# auto (RAY_ADDRESS or the cluster started on this machine), local (a new local instance),
# HOST:PORT (a head node's GCS) or ray://HOST:PORT (Ray Client)
ADDRESS = re.compile(r"auto|local|(ray://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}")
CONNECT_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Execution:
    executor: str = "local"
    address: str | None = None
    workers: int | None = None  # local processes, or CPUs of a local Ray instance (default: all cores)
    cache: Path | None = None

    def check(self) -> "Execution":
        """Raise ConfigError on a bad option; a HOST:PORT address must answer."""
        if self.executor not in EXECUTORS:
            raise ConfigError(f"expected local or ray, got {self.executor!r}", field="--executor")
        if self.address is not None and self.executor != "ray":
            raise ConfigError("only with --executor ray", field="--address")
        if self.workers is not None and self.workers < 1:
            raise ConfigError(f"expected at least 1, got {self.workers}", field="--workers")
        if self.cache is not None:
            check_folder(self.cache, "--cache")
        if self.executor == "ray":
            try:
                import ray  # noqa: F401
            except ImportError:
                raise ConfigError("Ray is not installed: pip install -e '.[sweep]'", field="--executor") from None
            if self.address is not None:
                check_address(self.address)
        return self

    def runner(self):
        return RayExecutor(self.address, self.workers) if self.executor == "ray" else LocalExecutor(self.workers)

    def store(self) -> ResultStore | None:
        return ResultStore(self.cache, "--cache") if self.cache is not None else None


def check_folder(path: Path, option: str) -> None:
    """A folder that exists, or one that can be made (created on the first write, not here)."""
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{path} exists and is not a folder", field=option)
        if not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{path}: not writable", field=option)
        return
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"cannot create {path}: {parent} is not a writable folder", field=option)


def check_address(address: str) -> None:
    if not ADDRESS.fullmatch(address):
        raise ConfigError(f"expected auto, HOST:PORT or ray://HOST:PORT, got {address!r}", field="--address")
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConfigError(f"no Ray cluster answers at {address}: {exc.strerror or exc}", field="--address") from None
