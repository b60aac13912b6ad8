"""Behaviour is pinned: every shipped scenario, the paper check's runs and one small case per engine
path produce exactly the committed summary.json, steps.csv and projection figures. A change meant to
move a number regenerates them (`python -m tests.golden_cases`, see its docstring)."""

from __future__ import annotations

import pytest

from tests.golden_cases import CASES, check


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_outputs_match_golden_files(case):
    assert check(case) == []
