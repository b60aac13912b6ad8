"""Fixed costs of a decode step by prefetch mode: per layer and per step, on hwprobe's own loop.

A layer call through the tiered cache does more host work in some modes than others (ring fills,
staging, events), and at small batch that work, not the arithmetic, can set the step time. So for
each way T1/T2 reach attention ("none": nothing staged, as full_hbm; and the three prefetch modes)
time whole decode steps (begin_step, embedding, layers, LM head, argmax, end_step) of a synthetic
model at tiny dimensions, at two depths: per layer = slope, per step = intercept. The tiered modes
hold a few T1 tokens per layer (one re-tier has run before the timed steps; none runs inside them).
Timed as `hwprobe run` times steps: events on the compute stream on a GPU (an asynchronous device:
these are the host's enqueue times, the device being idle at these sizes), the wall clock on the CPU.
"""

from __future__ import annotations

from typing import Any

from .timing import MIN_WINDOW_S, time_window

MODES = ("none", "layerwise_async", "sync_per_step", "per_interval")
HIDDEN = HEAD_DIM = INTERMEDIATE = VOCAB = 64
BATCH = 1
PROMPT = 16
DEPTHS = (2, 6)  # layers of the two timed models
RETIER_INTERVAL = 256  # warm-up steps before the first re-tier; at most this many - 1 timed steps
SEED = 0
DTYPE = "bfloat16"
METHOD = ("decode steps of the synthetic model at tiny dimensions through the real cache, timed at "
          f"{DEPTHS[0]} and {DEPTHS[1]} layers: per layer = slope, per step = intercept")


class _Loop:
    """One tiny model and cache, warmed past the first re-tier; `step()` runs one decode step."""

    def __init__(self, rt, mode: str, layers: int, retier_interval: int):
        from sim.tiering.tiers import TierPolicy

        from ..cache import CacheGeometry, CacheOptions, TieredKVCache
        from ..model import ModelShapes, SyntheticTransformer

        torch = rt.torch
        dtype = getattr(torch, DTYPE)
        self.mode = mode
        shapes = ModelShapes(layers=layers, hidden=HIDDEN, heads=1, kv_heads=1, head_dim=HEAD_DIM,
                             intermediate=INTERMEDIATE, vocab=VOCAB)
        self.model = SyntheticTransformer(shapes, rt.device, dtype, SEED)
        if mode == "none":
            policy, options = TierPolicy(kind="full_hbm"), CacheOptions()
        else:
            policy = TierPolicy(hbm_ratio=0.5, evict_ratio=0.0, compressed_ratio=0.0, retier_interval=retier_interval,
                                sink_tokens=1, recent_window=2)
            options = CacheOptions(prefetch=mode, pinned=mode != "sync_per_step")  # the prototype is pageable
        self.cache = TieredKVCache(rt, CacheGeometry(layers, BATCH, 1, HEAD_DIM), policy, options, PROMPT,
                                   [2 * retier_interval] * BATCH, dtype)
        self.cache.fill_prompt_random(torch.Generator(device=rt.device).manual_seed(SEED))
        self.tokens = torch.zeros(BATCH, dtype=torch.long, device=rt.device)
        self.last_timed = 2 * retier_interval - 2  # the step before the second re-tier
        for _ in range(retier_interval if mode != "none" else 1):
            self.step()

    def step(self) -> None:
        c, m = self.cache, self.model
        if c.step + 1 > self.last_timed:
            raise RuntimeError("step overhead: more timed steps than the tiny run holds")
        c.begin_step()
        x = m.embed(self.tokens)
        for i in range(m.shapes.layers):
            x = m.layer(i, x, c)
        self.tokens = m.head(x).argmax(dim=-1)
        c.end_step()
        c.take_counters()


def _step_timing(rt, clock, loop: _Loop, samples: int, min_window_s: float):
    def window(reps: int) -> float:
        rt.synchronize()
        start = clock.mark()
        for _ in range(reps):
            loop.step()
        end = clock.mark()
        rt.synchronize()
        return clock.elapsed_s(start, end)

    return time_window(window, samples=samples, min_window_s=min_window_s)


def fit_depths(n1: int, t1: float, n2: int, t2: float) -> tuple[float, float]:
    """(per layer, per step) from step times t1, t2 at n1 < n2 layers: the line through both points,
    each part clipped at zero (noise can make the deeper model time faster, or the slope overshoot)."""
    layer_s = max(0.0, (t2 - t1) / (n2 - n1))
    return layer_s, max(0.0, t1 - n1 * layer_s)


def measure_step_overheads(backend: Any, *, samples: int, min_window_s: float = MIN_WINDOW_S,
                           retier_interval: int = RETIER_INTERVAL, clock: Any = None) -> dict:
    """{"by_prefetch": {mode: {"layer_s", "step_s", "step_s_at_depths", "rel_spread"}}, method, ...}.

    `clock` marks the timed windows: `mark()` and `elapsed_s(a, b)`, by default the runtime's own
    (see the module's docstring). Tests pass a fake one, so the fit meets timings with a known answer."""
    from ..cache import Runtime

    rt = Runtime(backend.tensor_device)
    clock = rt if clock is None else clock
    out = {}
    for mode in MODES:
        timings = [_step_timing(rt, clock, _Loop(rt, mode, n, retier_interval), samples, min_window_s) for n in DEPTHS]
        (n1, t1), (n2, t2) = [(n, t.median_s) for n, t in zip(DEPTHS, timings)]
        layer_s, step_s = fit_depths(n1, t1, n2, t2)
        out[mode] = {"layer_s": layer_s, "step_s": step_s, "step_s_at_depths": [t1, t2],
                     "rel_spread": max(t.rel_spread for t in timings)}
    return {"by_prefetch": out, "method": METHOD, "depths": list(DEPTHS), "batch": BATCH, "dtype": DTYPE,
            "shapes": {"hidden": HIDDEN, "head_dim": HEAD_DIM, "intermediate": INTERMEDIATE, "vocab": VOCAB,
                       "prompt": PROMPT}}
