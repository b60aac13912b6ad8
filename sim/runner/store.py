"""Results on disk under the hash of what determined them, so a rerun finds them.

A task's result is a pure function of its inputs (resolved scenarios, profile contents, files a
scenario names) and the simulator version, so the sha256 of their canonical JSON names it: a rerun
finds it, and executors on other machines need no shared state. Each result is one small JSON file,
`<root>/<key[:2]>/<key>.json`, written atomically by the process that drives the run. One store may
hold results of every kind (sweep points, projection cells, plan candidates): the kind is part of the hash.

An entry is used only once it is verified (`ResultStore.lookup`): read as every input is (a regular
file, size-capped: a FIFO or a link to a device is never opened for reading), valid JSON of the
StoredResult schema, its recorded kind and inputs hashing to the key it is stored under (an entry
copied or moved under another key is not used), its checksum matching its content (an edited
result is not used), and its result of the shape its task produces (`accepts`). Anything else is
damaged: computed again, counted, and overwritten. This protects against damage and mix-ups, not
against someone who rewrites an entry and its checksum on purpose: a store shared on a cluster
should be writable only by the people who use it (docs/sweeps.md, "Trust").
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim import __version__
from sim.inputs.errors import ConfigError
from sim.inputs.limits import MAX_STORE_ENTRY_BYTES
from sim.inputs.reader import file_sha256, parse_json, read_text
from sim.outputs.atomic import write_text_atomic
from sim.outputs.schema import Document


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def digest(data: Any) -> str:
    """sha256 hex of `data`'s canonical JSON."""
    return hashlib.sha256(canonical_json(data).encode()).hexdigest()


def result_key(kind: str, inputs: dict[str, Any]) -> str:
    """sha256 hex of (kind, inputs, simulator version)."""
    return digest({"kind": kind, "inputs": inputs, "simulator": __version__})


def file_digests(scenario, cache: dict[str, str] | None = None) -> dict[str, str]:
    """sha256 of files a scenario names by path (a Hugging Face config.json): their contents, not
    their paths, determine the result. Validation has read them already."""
    hf = scenario.model.hf_config
    if hf is None:
        return {}
    cache = {} if cache is None else cache
    if hf not in cache:
        cache[hf] = file_sha256(hf)
    return {"model.hf_config": cache[hf]}


def finite(v: Any) -> Any:
    """NaN and infinities as None (JSON has neither), in nested dicts and lists."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [finite(x) for x in v]
    return v


INT64 = 2**63  # a stored integer a table (pandas, Parquet) can hold
NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))
OPTIONAL_TEXT = (str, type(None))


def has_fields(record: Any, types: dict[str, tuple[type, ...] | type]) -> bool:
    """`record` is a mapping with exactly the keys of `types`, each value of its type(s) (a shape
    check for `Task.accepts`; booleans count as booleans, not numbers; an integer fits int64)."""
    if not isinstance(record, dict) or set(record) != set(types):
        return False
    for name, kinds in types.items():
        value = record[name]
        kinds = kinds if isinstance(kinds, tuple) else (kinds,)
        if isinstance(value, bool) and bool not in kinds:
            return False
        if not isinstance(value, kinds):
            return False
        if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
            return False
    return True


class StoredResult(Document):
    """`<root>/<key[:2]>/<key>.json`: one result, what determined it and a checksum over both."""

    key: str
    kind: str  # sweep point | projection cell | plan candidate
    simulator: str
    inputs: dict[str, Any]
    result: Any
    checksum: str  # sha256 of the canonical JSON of every field above (content_checksum)


def content_checksum(key: str, kind: str, simulator: str, inputs: dict[str, Any], result: Any) -> str:
    return digest({"key": key, "kind": kind, "simulator": simulator, "inputs": inputs, "result": result})


class Entry(enum.Enum):
    """What a store holds under a key: a verified result, nothing, or something it will not use."""

    FOUND = "found"
    MISSING = "missing"
    DAMAGED = "damaged"


def _verified(doc: StoredResult, key: str, kind: str, accepts: Callable[[Any], bool] | None) -> bool:
    """The entry is the result of this key: recorded kind and inputs hash to it, content matches
    its checksum, the result has the task's shape."""
    if (doc.key, doc.kind, doc.simulator) != (key, kind, __version__):
        return False
    try:
        if result_key(doc.kind, doc.inputs) != key:
            return False
        if content_checksum(doc.key, doc.kind, doc.simulator, doc.inputs, doc.result) != doc.checksum:
            return False
    except (TypeError, ValueError):  # not JSON data (cannot come from json.loads; defensive)
        return False
    try:
        return accepts is None or bool(accepts(doc.result))
    except Exception:  # noqa: BLE001 - a shape check that trips over a damaged result: damaged
        return False


class ResultStore:
    """A folder of stored results (created on the first write); `option` names it in errors."""

    def __init__(self, root: str | Path, option: str = "--cache"):
        self.root, self.option = Path(root), option

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def lookup(self, key: str, kind: str, accepts: Callable[[Any], bool] | None = None) -> tuple[Entry, Any]:
        """(Entry.FOUND, result) for a verified entry (see the module's docstring); (MISSING, None)
        where there is none; (DAMAGED, None) where there is one this store will not use."""
        path = self.path(key)
        if not os.path.lexists(path):
            return Entry.MISSING, None
        try:
            data = parse_json(read_text(path, MAX_STORE_ENTRY_BYTES), str(path))
            doc = StoredResult.model_validate(data, strict=True)
        except (ConfigError, ValidationError, RecursionError, MemoryError):
            return Entry.DAMAGED, None
        return (Entry.FOUND, doc.result) if _verified(doc, key, kind, accepts) else (Entry.DAMAGED, None)

    def write(self, key: str, kind: str, inputs: dict[str, Any], result: Any) -> Any:
        """Store `result` (over whatever the key held); returns it as a reader will get it back
        (JSON's values: lists for tuples, None for NaN), so a run that computed it and one that read
        it use the same values."""
        record = json.loads(json.dumps({"inputs": inputs, "result": finite(result)}, allow_nan=False))
        checksum = content_checksum(key, kind, __version__, record["inputs"], record["result"])
        doc = StoredResult(key=key, kind=kind, simulator=__version__, inputs=record["inputs"], result=record["result"],
                           checksum=checksum)
        text = json.dumps(doc.model_dump(), separators=(",", ":"), allow_nan=False)
        try:
            write_text_atomic(self.path(key), text + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path(key)}: {exc.strerror or exc}", field=self.option) from None
        return record["result"]
