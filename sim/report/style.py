"""Shared look of the report's figures: one colour per policy everywhere, one base layout."""

from __future__ import annotations

from sim.model.units import PERCENT  # noqa: F401 - re-exported for the figures

FIGURE_HEIGHT_PX = 460
FALLBACK_COLOR = "#7f7f7f"

# Colour per policy key; tiered rows go from dark (little HBM) to light (mostly HBM).
POLICY_COLORS = {
    "full_hbm": "#222222",
    "evict_only": "#d62728",
    "tiered_25": "#08519c",
    "tiered_50": "#3182bd",
    "tiered_75": "#6baed6",
    "tiered_auto": "#31a354",  # hbm_ratio auto (the MoE section)
}

# Timeline rows (per-run view) and tiers (occupancy).
ACTIVITY_COLORS = {"compute": "#2ca02c", "h2d": "#1f77b4", "d2h": "#ff7f0e", "stall": "#d62728"}
TIER_COLORS = {"T0 HBM": "#2ca02c", "T1 host": "#1f77b4", "T2 host, compressed": "#9467bd", "T3 evicted": "#bbbbbb"}

BASE_LAYOUT = {
    "template": "plotly_white",
    "height": FIGURE_HEIGHT_PX,
    "margin": {"l": 70, "r": 30, "t": 60, "b": 60},
    "legend": {"orientation": "v", "x": 1.01, "y": 1, "font": {"size": 11}},
    "title": {"font": {"size": 15}},
    "hovermode": "closest",
}


def policy_color(key: str) -> str:
    return POLICY_COLORS.get(key, FALLBACK_COLOR)
