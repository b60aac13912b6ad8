"""CSV text as every tool writes it: a text cell a spreadsheet would run as a formula is neutralised.

OWASP's advice for CSV export: a cell beginning with `=`, `+`, `-`, `@`, a tab or a carriage return
is prefixed with a single quote, so a spreadsheet shows it as text instead of evaluating it (a swept
name `=HYPERLINK(...)` stays a name). Only text is touched: numbers never are, and neither is text
that reads as a plain number (`-1.5` is a negative number, not a formula) or a lone `-` (a table's
"none", which no spreadsheet evaluates). A text cell that already begins with quotes before such a
character gets one more, so `restore` (what the readers of these files apply) gives back exactly the
text that was written.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
QUOTE = "'"
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def _risky(text: str) -> bool:
    """Text a spreadsheet could evaluate, or such text after leading quotes (which `restore` would
    take for neutralise's)."""
    body = text.lstrip(QUOTE)
    return body.startswith(FORMULA_STARTS) and body != "-" and not _PLAIN_NUMBER.fullmatch(body)


def neutralise(value: Any) -> Any:
    """A text cell as it is written: quoted where a spreadsheet would run it; anything else unchanged."""
    return QUOTE + value if isinstance(value, str) and _risky(value) else value


def restore(value: Any) -> Any:
    """A cell read back: `neutralise` undone."""
    if isinstance(value, str) and value.startswith(QUOTE) and _risky(value[1:]):
        return value[1:]
    return value


def csv_text(frame: pd.DataFrame) -> str:
    """`frame.to_csv(index=False)` with every text cell and column name neutralised; a frame without
    text that needs it is written exactly as pandas writes it."""
    text_columns = [c for c in frame.columns if frame[c].dtype == object or pd.api.types.is_string_dtype(frame[c])]
    risky = [c for c in text_columns if frame[c].map(lambda v: isinstance(v, str) and _risky(v)).any()]
    names = [neutralise(c) if isinstance(c, str) else c for c in frame.columns]
    if not risky and names == list(frame.columns):
        return frame.to_csv(index=False)
    out = frame.copy()
    for c in risky:
        out[c] = out[c].map(neutralise)
    out.columns = names
    return out.to_csv(index=False)
