"""Progress on stderr while a report computes (stdout stays clean for scripts).

The bar refreshes only when work advances, never from a background thread: the projection forks
worker processes, and forking while another thread holds a lock is unsafe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ReportProgress:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                  console=Console(stderr=True), auto_refresh=False, disable=not enabled)

    @contextmanager
    def running(self) -> Iterator[ReportProgress]:
        with self._progress:
            yield self

    def step(self, description: str, total: int) -> Callable[[], None]:
        """Add a bar; the returned function advances it by one."""
        task = self._progress.add_task(description, total=total)
        self._progress.refresh()

        def advance() -> None:
            self._progress.advance(task)
            self._progress.refresh()

        return advance
