"""The real tiered KV cache (T0 device, T1/T2 host, T3 dropped): three prefetch modes, async offload."""

from .cache import ATTENTION_MODES, PREFETCH_MODES, CacheOptions, TieredKVCache
from .runtime import Runtime
from .store import CacheGeometry

__all__ = ["ATTENTION_MODES", "PREFETCH_MODES", "CacheGeometry", "CacheOptions", "Runtime", "TieredKVCache"]
