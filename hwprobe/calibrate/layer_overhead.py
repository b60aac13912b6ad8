"""Per-layer fixed cost of a decode step, measured on hwprobe's own implementation.

The simulator costs a layer as max(FLOP / rate, bytes / rate) + `layer_overhead_s`: what a layer
pays however small it is (kernel launches, dispatch, the cache's bookkeeping). Rather than assume a
kernel count, time one decode step of one layer of the synthetic model (hwprobe/model/synthetic.py:
norms, fused QKV, the tiered cache's append and attention, output projection, gated MLP) at tiny
dimensions, where the arithmetic is negligible and what is left is that fixed cost.
"""

from __future__ import annotations

import itertools
from typing import Any

from .timing import MIN_WINDOW_S, time_window

HIDDEN = 64
HEADS = KV_HEADS = 1
HEAD_DIM = 64
INTERMEDIATE = 64
VOCAB = 64
BATCH = 1
CACHED_TOKENS = 8  # a handful: attention over them costs nothing next to its launches
LAYERS_TIMED = 4  # the timed calls cycle through this many layers, each with its own weights and K/V
SEED = 0
DTYPE = "bfloat16"  # the dtype decode runs in
METHOD = ("median time of one decode step of one synthetic-model layer (hwprobe/model/synthetic.py) "
          "through the tiered KV cache, at tiny dimensions where arithmetic is negligible")


def measure_layer_overhead(backend: Any, *, samples: int, min_window_s: float = MIN_WINDOW_S) -> dict:
    """{"layer_overhead_s", how it was measured, spread}: one layer call per timed call."""
    from sim.tiering.tiers import TierPolicy

    from ..cache import CacheGeometry, CacheOptions, Runtime, TieredKVCache
    from ..model import ModelShapes, SyntheticTransformer

    torch = backend.torch
    dtype = getattr(torch, DTYPE)
    shapes = ModelShapes(layers=LAYERS_TIMED, hidden=HIDDEN, heads=HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM,
                         intermediate=INTERMEDIATE, vocab=VOCAB)
    rt = Runtime(backend.tensor_device)
    model = SyntheticTransformer(shapes, rt.device, dtype, SEED)
    geom = CacheGeometry(LAYERS_TIMED, BATCH, KV_HEADS, HEAD_DIM)
    cache = TieredKVCache(rt, geom, TierPolicy(kind="full_hbm"), CacheOptions(), CACHED_TOKENS, [1] * BATCH, dtype)
    cache.fill_prompt_random(torch.Generator(device=rt.device).manual_seed(SEED))
    cache.begin_step()  # the step's token has its T0 slot; every timed call rewrites it
    x = model.embed(torch.zeros(BATCH, dtype=torch.long, device=rt.device))
    layers = itertools.cycle(range(LAYERS_TIMED))  # across windows too, however few calls each has
    timing = time_window(backend.window(lambda i: model.layer(next(layers), x, cache), events=True),
                         samples=samples, min_window_s=min_window_s)
    return {
        "layer_overhead_s": timing.median_s,
        "method": METHOD,
        "layers_timed": LAYERS_TIMED,
        "calls_per_sample": timing.reps,
        "shapes": {"hidden": HIDDEN, "heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM,
                   "intermediate": INTERMEDIATE, "batch": BATCH, "cached_tokens": CACHED_TOKENS, "dtype": DTYPE},
        "samples": timing.samples,
        "rel_spread": timing.rel_spread,
    }
