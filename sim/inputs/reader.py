"""Reading the files the tools take, one way for all of them (scenarios, traces, profiles, specs,
config.json files, CSVs read back, result-store entries): regular files only (a FIFO or a device is
refused before it is opened, so nothing blocks), a size cap checked before reading, strict UTF-8,
YAML without duplicate keys, JSON, and a check of the parsed tree (depth, size, finite numbers).
Every failure is a ConfigError naming the file (and the field where there is one); nothing else
escapes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .limits import MAX_DOCUMENT_BYTES, MAX_INPUT_BYTES, MAX_INPUT_DEPTH, MAX_INPUT_NODES

MiB = 2**20


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _not_regular(mode: int) -> str | None:
    """Why a file of this mode is not read (reading a FIFO, a device or a socket may block forever
    or never end), or None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a plain file")
    return f"cannot read file: not a regular file ({kind})"


def read_bytes(path: str | Path, cap: int = MAX_INPUT_BYTES) -> bytes:
    """The file's bytes, the one way every input is read: a regular file only (a symlink is
    followed; a FIFO, device, socket or folder is refused by os.stat before anything is opened,
    and the opened file is checked again, so none can block), at most `cap` bytes (refused by its
    size before reading, and by what a read returns if it grew)."""
    p = Path(path)
    source = str(p)
    try:
        why = _not_regular(os.stat(p).st_mode)
        if why:
            raise ConfigError(why, source=source)
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            why = _not_regular(st.st_mode)  # replaced between the stat and the open
            if why:
                raise ConfigError(why, source=source)
            if st.st_size > cap:
                raise ConfigError(f"larger than {cap / MiB:g} MiB, the most an input file may be", source=source)
            raw = fh.read(cap + 1)
    except FileNotFoundError:
        raise ConfigError("file not found", source=source) from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read file: {getattr(exc, 'strerror', None) or exc}", source=source) from None
    if len(raw) > cap:
        raise ConfigError(f"larger than {cap / MiB:g} MiB, the most an input file may be", source=source)
    return raw


def read_text(path: str | Path, cap: int = MAX_INPUT_BYTES) -> str:
    """The file's text (read_bytes: a regular file, at most `cap` bytes), UTF-8 (a leading
    byte-order mark dropped)."""
    raw = read_bytes(path, cap)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})", source=str(path)) from None


def file_sha256(path: str | Path, cap: int = MAX_DOCUMENT_BYTES) -> str:
    """sha256 hex of a file's bytes, read as every input is (read_bytes)."""
    return hashlib.sha256(read_bytes(path, cap)).hexdigest()


def check_csv_header(names: list[str] | None, source: str) -> None:
    """A CSV's header names each column once (a reader would keep one of the two silently)."""
    seen: set[str] = set()
    for name in names or []:
        if name in seen:
            raise ConfigError(f"header: column {name!r} given twice; expected each column once", source=source)
        seen.add(name)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 reads `64e9` and `6.4e10` (no dot, or no exponent sign) as strings; YAML 1.2 and people
# mean numbers. Added after the 1.1 resolvers, so only what those leave a string becomes a float.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def parse_yaml(text: str, source: str, *, check: bool = True) -> Any:
    """`check`: the parsed tree checked here (check_tree); a caller that checks the tree it builds
    from pieces (a scenario and its --set values) passes False."""
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise ConfigError(f"invalid YAML: {where}{problem}", source=source) from None
    except RecursionError:
        raise ConfigError(f"nested too deeply (at most {MAX_INPUT_DEPTH} levels)", source=source) from None
    except (MemoryError, ValueError, OverflowError, TypeError) as exc:
        raise ConfigError(f"invalid YAML: {type(exc).__name__}", source=source) from None
    if check:
        check_tree(data, source)
    return data


def parse_json(text: str, source: str) -> Any:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"invalid JSON at line {exc.lineno}: {exc.msg}", source=source) from None
    except RecursionError:
        raise ConfigError(f"nested too deeply (at most {MAX_INPUT_DEPTH} levels)", source=source) from None
    except (MemoryError, ValueError) as exc:
        raise ConfigError(f"invalid JSON: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
                          source=source) from None
    check_tree(data, source, finite=False)  # unused fields of a config.json may hold anything
    return data


def read_yaml(path: str | Path) -> Any:
    return parse_yaml(read_text(path, MAX_DOCUMENT_BYTES), str(path))


def read_json(path: str | Path) -> Any:
    return parse_json(read_text(path, MAX_DOCUMENT_BYTES), str(path))


def _field(path: tuple) -> str:
    shown = [str(p) for p in path[:6]]
    return ".".join(shown) + ("..." if len(path) > 6 else "") or "(top level)"


def check_tree(data: Any, source: str, *, finite: bool = True) -> None:
    """A parsed document is at most MAX_INPUT_DEPTH deep and MAX_INPUT_NODES values (a YAML alias
    counted each time it is used, so an alias bomb stops here), and (finite=True) holds no NaN or
    infinity anywhere."""
    stack: list[tuple[Any, tuple]] = [(data, ())]
    nodes = 0
    while stack:
        node, path = stack.pop()
        nodes += 1
        if nodes > MAX_INPUT_NODES:
            raise ConfigError(f"more than {MAX_INPUT_NODES:,} values (YAML aliases counted each time used)", source=source)
        if len(path) > MAX_INPUT_DEPTH:
            raise ConfigError(f"nested deeper than {MAX_INPUT_DEPTH} levels", source=source, field=_field(path))
        if isinstance(node, dict):
            stack.extend((v, (*path, k)) for k, v in node.items())
        elif isinstance(node, (list, tuple)):
            stack.extend((v, (*path, i)) for i, v in enumerate(node))
        elif finite and isinstance(node, float) and not math.isfinite(node):
            raise ConfigError(f"expected a finite number, got {node}", source=source, field=_field(path))
