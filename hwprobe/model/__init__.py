"""Synthetic decoder-only transformer with a real model's shapes (random weights)."""

from .synthetic import ModelShapes, SyntheticTransformer

__all__ = ["ModelShapes", "SyntheticTransformer"]
