"""Results on disk under the hash of what determined them, so a rerun finds them.

A task's result is a pure function of its inputs (resolved scenarios, profile contents, files a
scenario names) and the simulator version, so the sha256 of their canonical JSON names it: a rerun
finds it, and executors on other machines need no shared state. Each result is one small JSON file,
`<root>/<key[:2]>/<key>.json`, written atomically by the process that drives the run; a file that is
missing or unreadable is computed again. One store may hold results of every kind (sweep points,
projection cells, plan candidates): the kind is part of the hash.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from sim import __version__
from sim.inputs.errors import ConfigError
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
        cache[hf] = hashlib.sha256(Path(hf).read_bytes()).hexdigest()
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


class StoredResult(Document):
    """`<root>/<key[:2]>/<key>.json`: one result and what determined it."""

    key: str
    kind: str  # sweep point | projection cell | plan candidate
    simulator: str
    inputs: dict[str, Any]
    result: Any


class ResultStore:
    """A folder of stored results (created on the first write); `option` names it in errors."""

    def __init__(self, root: str | Path, option: str = "--cache"):
        self.root, self.option = Path(root), option

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def read(self, key: str, kind: str) -> tuple[bool, Any]:
        """(found, result); not found where the file is missing, unreadable or of another key."""
        try:
            doc = StoredResult.model_validate_json(self.path(key).read_bytes())
        except (OSError, ValidationError, ValueError):
            return False, None
        return (True, doc.result) if (doc.key, doc.kind) == (key, kind) else (False, None)

    def write(self, key: str, kind: str, inputs: dict[str, Any], result: Any) -> Any:
        """Store `result`; returns it as a reader will get it back (JSON's values: lists for tuples,
        None for NaN), so a run that computed it and one that read it use the same values."""
        doc = StoredResult(key=key, kind=kind, simulator=__version__, inputs=inputs, result=finite(result))
        text = json.dumps(doc.model_dump(), separators=(",", ":"), allow_nan=False)
        try:
            write_text_atomic(self.path(key), text + "\n")
        except OSError as exc:
            raise ConfigError(f"cannot write {self.path(key)}: {exc.strerror or exc}", field=self.option) from None
        return json.loads(text)["result"]
