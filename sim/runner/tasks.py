"""Tasks and the driver that runs them: what a sweep, the report's projection and `kvsim plan` share.

A task is any picklable object with
    kind     a class attribute naming its results in a store (part of their hash),
    key      the sha256 of (kind, inputs(), simulator version): `store.result_key`,
    inputs() what determines its result, as JSON-ready data,
    run()    its result, as JSON-ready data (dicts, lists, numbers, strings, None),
    accepts(result)  whether a stored result has the shape run() gives (a store's entry that does
             not is damaged and computed again: `store.ResultStore.lookup`).
Its class is the evaluator: sweep points (`sim.sweep.points.PointTask`), projection cells
(`sim.studies.projection_grid.Cell`), plan candidates (`sim.plan.search.CandidateTask`). Executors run
batches of them anywhere; `run_tasks` looks each one up in a store first, hands the rest to an
executor and stores each result as it arrives, so a run killed half-way loses nothing finished.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from sim.outputs.atomic import signals_held, write_text_atomic

from .store import Entry, ResultStore


class Task(Protocol):
    kind: ClassVar[str]

    @property
    def key(self) -> str: ...

    def inputs(self) -> dict[str, Any]: ...

    def run(self) -> Any: ...

    def accepts(self, result: Any) -> bool: ...


def run_batch(tasks: Sequence[Task]) -> list[Any]:
    """A batch of tasks in one call: what a worker process or a Ray task runs."""
    return [t.run() for t in tasks]


class Interrupted(Exception):
    """Ctrl-C during a run with a store: what had finished is stored; the same command resumes."""

    def __init__(self, stored: int, total: int, noun: str = "results"):
        self.stored, self.total = stored, total
        super().__init__(f"interrupted: {stored} of {total} {noun} stored; run the same command to resume")


@dataclass(frozen=True)
class Computed:
    results: list[Any]  # one per task, in task order
    computed: int
    stored_before: int  # found in the store
    damaged: int = 0  # entries the store held but could not verify: computed again (store.Entry.DAMAGED)


def damaged_line(count: int) -> str:
    """What a command says on stderr when its store held `count` damaged entries (recomputed)."""
    return f"recomputed {count} damaged {'entry' if count == 1 else 'entries'}"


def run_tasks(tasks: Sequence[Task], executor, *, store: ResultStore | None = None,
              batch: int | Callable[[int], int] = 1, advance: Callable[[int], None] | None = None,
              found: Callable[[int], None] | None = None, meanwhile: Callable[[], None] | None = None,
              enough: Callable[[list[Any]], bool] | None = None) -> Computed:
    """Every task's result: read from `store` where it holds one, the rest computed by `executor`
    in batches of `batch` tasks (or batch(number missing)), handed out in task order, and stored as
    they arrive, in any order. `advance(n)`: n more tasks are computed; `found(n)`: n were read from
    the store (called once, before any is computed; default: advance). `meanwhile()`: other work
    for this process, done once the executor has the tasks (its workers started). `enough(results)`
    (None where not yet known), asked after each result: True stops the run there, the tasks still
    running are ended and theirs are left None. Without a store
    nothing is hashed or written, and Ctrl-C raises KeyboardInterrupt; with one, Interrupted.
    Tests can stop it part-way at a known point: `TEST_PAUSE` (`_test_pause`)."""
    pause_after, pause_marker = _test_pause()
    keys = [t.key for t in tasks] if store is not None else []
    results, todo, damaged = _stored(tasks, keys, store)
    stored_before = len(tasks) - len(todo)
    found = found or advance
    if found and stored_before:
        found(stored_before)
    size = max(1, batch(len(todo)) if callable(batch) else batch)
    batches = [todo[j:j + size] for j in range(0, len(todo), size)]
    if enough is not None and enough(results):  # the store held all it takes
        batches = []
    stream = executor.start([[tasks[i] for i in b] for b in batches]) if batches else iter([])
    done = stored_before
    try:
        if meanwhile is not None:
            meanwhile()
        for b, batch_results in stream:
            for i, result in zip(batches[b], batch_results):
                task = tasks[i]
                with signals_held():  # a stored result is counted (the interrupt's message says so)
                    results[i] = store.write(keys[i], task.kind, task.inputs(), result) if store is not None else result
                    done += 1
                if done - stored_before == pause_after:
                    _pause_for_test(done, pause_marker)
            if advance:
                advance(len(batch_results))
            if enough is not None and enough(results):
                break
    except KeyboardInterrupt:
        if store is None:
            raise
        raise Interrupted(done, len(tasks)) from None
    finally:
        if batches:
            stream.close()  # stops the workers where the run ends early
    return Computed(results, done - stored_before, stored_before, damaged)


TEST_PAUSE = "KVTIER_TEST_PAUSE_AFTER_TASKS"
TEST_PAUSE_LIMIT_S = 600  # an orphaned pause (its test gone) carries on after this long


def _test_pause() -> tuple[int | None, str | None]:
    """Test hook, inert unless KVTIER_TEST_PAUSE_AFTER_TASKS=N[:MARKER] is set (N >= 1): once the N-th
    result computed by a `run_tasks` call is stored, the driver writes the file MARKER (holding the
    number of results stored) and waits there for a signal (at most TEST_PAUSE_LIMIT_S, then carries
    on), so a test can interrupt or kill a run at a known point, with exactly N results stored and
    the rest not, however fast or loaded the machine is. Returns (N, MARKER or None); (None, None)
    when unset."""
    value = os.environ.get(TEST_PAUSE)
    if not value:
        return None, None
    count, _, marker = value.partition(":")
    return int(count), marker or None


def _pause_for_test(stored: int, marker: str | None) -> None:
    """The test hook's wait (`_test_pause`): outside `signals_held`, so SIGINT ends it as Ctrl-C."""
    if marker:
        write_text_atomic(marker, f"{stored}\n")
    time.sleep(TEST_PAUSE_LIMIT_S)


def _stored(tasks: Sequence[Task], keys: list[str], store: ResultStore | None) -> tuple[list[Any], list[int], int]:
    """(results found in the store, None elsewhere; the indices of the tasks still to compute; how
    many of those the store held damaged)."""
    results: list[Any] = [None] * len(tasks)
    todo = []
    damaged = 0
    for i, task in enumerate(tasks):
        entry, result = store.lookup(keys[i], task.kind, task.accepts) if store is not None else (Entry.MISSING, None)
        if entry is Entry.FOUND:
            results[i] = result
        else:
            todo.append(i)
            damaged += entry is Entry.DAMAGED
    return results, todo, damaged
