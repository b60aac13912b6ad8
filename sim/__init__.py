"""kvtier simulator: a SimPy model of a tiered KV cache. Never imports torch.

Packages, each importing only those below it (checked by import-linter, `.importlinter`):
cli > report > plan | sweep | studies > serving > decode > tiering | runner > outputs > device >
inputs > model. Datasheet catalogs are data, not code: `sim/catalog/*.yaml`.
"""

__version__ = "0.2.0"
