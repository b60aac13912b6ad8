"""The real tiered KV cache (T0 device, T1/T2 host, T3 dropped): three prefetch modes, async offload,
and host-side exact attention over T1/T2 (access host_attention / split)."""

from .cache import ATTENTION_MODES, PREFETCH_MODES, CacheOptions, TieredKVCache
from .runtime import Runtime
from .store import CacheGeometry

__all__ = ["ATTENTION_MODES", "PREFETCH_MODES", "CacheGeometry", "CacheOptions", "Runtime", "TieredKVCache"]
