"""The rules every scenario section follows: frozen, extra keys forbidden, no NaN or infinities.
Loading validates strictly too (no YAML `true` as the integer 1, no "0.5" as a number): see
`scenario.scenario_from_dict`."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
