"""Where tasks run (`sim.runner.tasks`). An executor takes batches of tasks and yields
(batch number, the batch's results in its order) as each batch finishes, in any order; the driver
stores them. Nothing is shared but the tasks and results.

- `LocalExecutor`: processes on this machine (fork where available), or this process for one worker.
- `RayExecutor`: Ray tasks, one per batch, on a local Ray instance or an existing cluster.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed

from sim.inputs.errors import ConfigError

from . import tasks
from .heap import keep_freed_memory

Results = tuple[int, list]


def _run_batch(batch: list) -> list:
    keep_freed_memory()  # in a Ray worker; local workers inherit it from the driver
    return tasks.run_batch(batch)  # looked up at call time


# ---- local processes --------------------------------------------------------------------------

def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:  # the driver is gone (say SIGKILL): its results are nobody's
            os._exit(1)


def _worker_init(parent: int) -> None:
    # Ctrl-C (and a SIGTERM sent to the process group) reaches every process; the driver alone
    # handles it (sim.cli.guard: SIGTERM is an interrupt) and ends the workers with SIGKILL.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


class LocalExecutor:
    def __init__(self, workers: int | None = None):
        self.workers = max(1, workers or os.cpu_count() or 1)

    def start(self, batches: list[list]) -> Iterator[Results]:
        """Workers start here, before the caller's progress display refreshes."""
        keep_freed_memory()
        if self.workers == 1 or len(batches) <= 1:
            return ((i, _run_batch(b)) for i, b in enumerate(batches))
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        pool = ProcessPoolExecutor(min(self.workers, len(batches)), mp_context=ctx, initializer=_worker_init,
                                   initargs=(os.getpid(),))
        futures = {pool.submit(_run_batch, b): i for i, b in enumerate(batches)}
        return self._collect(pool, futures)

    @staticmethod
    def _collect(pool: ProcessPoolExecutor, futures: dict) -> Iterator[Results]:
        finished = False
        try:
            for future in as_completed(futures):
                yield futures[future], future.result()
            finished = True
        finally:
            if not finished:  # interrupted or failed: what is running now would be thrown away
                for f in futures:
                    f.cancel()
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.kill()  # they ignore SIGINT and SIGTERM (_worker_init)
            pool.shutdown(wait=True, cancel_futures=True)


# ---- Ray --------------------------------------------------------------------------------------

class RayExecutor:
    """Batches as Ray tasks. Without an address, a local Ray instance (`workers` CPUs, default all)
    is started and stopped again; with one (`auto`, `ray://host:10001`, `host:6379`), an existing
    cluster is used, whose nodes need this same kvtier installed. A Ray already initialised in this
    process is used as it is and left running."""

    def __init__(self, address: str | None = None, workers: int | None = None):
        self.address = address
        self.workers = workers

    def start(self, batches: list[list]) -> Iterator[Results]:
        import ray

        started = False
        if not ray.is_initialized():
            options = {"address": self.address} if self.address else {"num_cpus": self.workers}
            try:
                ray.init(**options, include_dashboard=False, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError) as err:
                text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise ConfigError(f"cannot start or join Ray ({text})",
                                  field="--address" if self.address else "--executor") from None
            started = True
        remote = ray.remote(num_cpus=1)(_run_batch)
        refs = {remote.remote(b): i for i, b in enumerate(batches)}
        return self._collect(ray, refs, started)

    @staticmethod
    def _collect(ray, refs: dict, started: bool) -> Iterator[Results]:
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield refs[ref], ray.get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started:
                ray.shutdown()
