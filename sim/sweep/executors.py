"""Where a sweep's points run. An executor takes batches of tasks and yields each batch's results as
it finishes, in any order; the driver stores them. Nothing is shared but the tasks and results.

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

from . import points
from .points import Task

Results = list[tuple[str, dict]]


def _evaluate_batch(tasks: list[Task]) -> Results:
    return points.evaluate_batch(tasks)  # looked up at call time


# ---- local processes --------------------------------------------------------------------------

def _watch_parent(parent: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:  # the driver is gone (say SIGKILL): its results are nobody's
            os._exit(1)


def _worker_init(parent: int) -> None:
    # Ctrl-C goes to the whole process group; the driver alone handles it and stops the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()


class LocalExecutor:
    def __init__(self, workers: int):
        self.workers = max(1, workers)

    def start(self, batches: list[list[Task]]) -> Iterator[Results]:
        """Workers start here, before the caller's progress display starts its thread."""
        if self.workers == 1 or len(batches) <= 1:
            return (_evaluate_batch(b) for b in batches)
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        pool = ProcessPoolExecutor(min(self.workers, len(batches)), mp_context=ctx, initializer=_worker_init,
                                   initargs=(os.getpid(),))
        futures = [pool.submit(_evaluate_batch, b) for b in batches]
        return self._collect(pool, futures)

    @staticmethod
    def _collect(pool: ProcessPoolExecutor, futures) -> Iterator[Results]:
        finished = False
        try:
            for future in as_completed(futures):
                yield future.result()
            finished = True
        finally:
            if not finished:  # interrupted or failed: what is running now would be thrown away
                for f in futures:
                    f.cancel()
                for proc in list((getattr(pool, "_processes", None) or {}).values()):
                    proc.terminate()
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

    def start(self, batches: list[list[Task]]) -> Iterator[Results]:
        import ray

        started = False
        if not ray.is_initialized():
            options = {"address": self.address} if self.address else {"num_cpus": self.workers}
            ray.init(**options, include_dashboard=False, logging_level=logging.WARNING)
            started = True
        remote = ray.remote(num_cpus=1)(_evaluate_batch)
        refs = [remote.remote(b) for b in batches]
        return self._collect(ray, refs, started)

    @staticmethod
    def _collect(ray, refs, started: bool) -> Iterator[Results]:
        pending = list(refs)
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    yield ray.get(ref)
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)
            if started:
                ray.shutdown()
