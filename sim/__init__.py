"""kvtier simulator: a SimPy model of a tiered KV cache. Never imports torch."""

__version__ = "0.2.0"
