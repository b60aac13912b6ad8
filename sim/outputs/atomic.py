"""Atomic writes: a file, a set of files or a whole folder is written beside its target under a
temporary name, then renamed into place, so a reader (or an interrupted run) finds all or nothing."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str) -> None:
    """Readable like any file written with open() (mkstemp alone would leave it 0600)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def signals_held():
    """SIGINT and SIGTERM held off until the block ends (they are delivered then): a few renames
    that belong together are not cut in half. Outside the main thread: nothing held."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def write_files_atomic(files: dict[Path, str]) -> None:
    """Several files, each written to a temporary file beside it, then all renamed at once."""
    temps: dict[Path, str] = {}
    try:
        for path, text in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            temps[path] = tmp
            with os.fdopen(fd, "w") as fh:
                fh.write(text)
            os.chmod(tmp, 0o666 & ~_umask())
        with signals_held():
            for path, tmp in temps.items():
                os.replace(tmp, path)
    except BaseException:
        for tmp in temps.values():
            Path(tmp).unlink(missing_ok=True)
        raise


def write_dir_atomic(out: str | Path, files: dict[str, str]) -> Path:
    """A folder holding `files` (name -> text): written as a temporary folder beside `out` and
    renamed into place. An existing folder `out` keeps its other files; the named ones are replaced
    together (write_files_atomic)."""
    out = Path(out)
    if out.is_dir():
        write_files_atomic({out / name: text for name, text in files.items()})
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text)
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
