"""Fields added after outputs were first pinned dump only when set: a scenario that does not use
them dumps (resolved scenario, golden files, sweep point hashes) as it did before they existed."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, model_serializer


class QuietDefaults(BaseModel):
    """Leaves each field of `QUIET_DEFAULTS` out of dumps while it holds the value given there."""

    QUIET_DEFAULTS: ClassVar[dict[str, Any]] = {}

    @model_serializer(mode="wrap")
    def _quiet_defaults(self, handler):
        data = handler(self)
        for name, value in self.QUIET_DEFAULTS.items():
            if getattr(self, name) == value:
                data.pop(name, None)
        return data
