"""One error type for bad input: it prints as a single line naming the file and field."""

from __future__ import annotations


class ConfigError(Exception):
    """Bad user input. `str(err)` is one line: `file: field: what was expected`."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.message = message
        self.source = source
        self.field = field
        super().__init__(self.line())

    def line(self) -> str:
        parts = [p for p in (self.source, self.field) if p]
        parts.append(self.message)
        return ": ".join(parts).replace("\n", " ")


EXIT_BAD_INPUT = 2
