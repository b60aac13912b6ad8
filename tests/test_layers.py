"""The house rules of sim/ (issue #19): the import contract in `.importlinter` holds (packages in
layers, no cycle between siblings at any depth, no torch or hwprobe), every package says what it
holds and may import, and no function in sim/ is longer than a reader can hold."""

from __future__ import annotations

import ast
import contextlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import REPO

MAX_FUNCTION_LINES = 60


def test_import_contract_holds():
    from importlinter.cli import lint_imports

    out = io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out):
        code = lint_imports(config_filename=str(REPO / ".importlinter"), no_cache=True, no_logo=True)
    assert code == 0, out.getvalue()
    assert "3 kept, 0 broken" in out.getvalue()


def _packages() -> list[Path]:
    return sorted(p for p in (REPO / "sim").rglob("__init__.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("init", _packages(), ids=lambda p: str(p.parent.relative_to(REPO)))
def test_every_package_says_what_it_holds_and_reexports_nothing(init):
    tree = ast.parse(init.read_text())
    assert ast.get_docstring(tree), f"{init} has no docstring"
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))
               and not (isinstance(n, ast.ImportFrom) and n.module == "__future__")]
    assert not imports, f"{init} imports (a package's __init__ re-exports nothing)"


def _functions():
    for path in sorted((REPO / "sim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield path.relative_to(REPO), node


def test_no_function_in_sim_is_longer_than_a_reader_can_hold():
    long = [f"{path}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, node in _functions() if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, "functions over 60 lines:\n" + "\n".join(long)


def test_the_checks_see_a_broken_rule(tmp_path):
    """The contract is not vacuous: an upward import in a copy of the tree breaks it."""
    for package in ("sim", "hwprobe"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.yaml"))
    shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
    with (tmp_path / "sim" / "model" / "units.py").open("a") as f:
        f.write("\nfrom sim.decode import context  # an upward import\n")
    code = "from importlinter.cli import lint_imports; raise SystemExit(lint_imports(no_cache=True, no_logo=True))"
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert res.returncode == 1, res.stdout + res.stderr
    assert "sim.model.units -> sim.decode.context" in res.stdout
    assert "2 kept, 1 broken" in res.stdout or "1 kept, 2 broken" in res.stdout
