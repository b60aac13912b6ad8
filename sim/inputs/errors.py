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
        """One line whatever the parts hold: newlines as spaces, any other character that is not
        printable (a line separator, a terminal escape in a file name) escaped."""
        parts = [p for p in (self.source, self.field) if p]
        parts.append(self.message)
        text = ": ".join(parts).replace("\n", " ")
        return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


EXIT_BAD_INPUT = 2
