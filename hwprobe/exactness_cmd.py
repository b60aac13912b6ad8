"""`hwprobe exactness`: the paper's Proposition 1, demonstrated on one token set.

A small synthetic model decodes greedily; at every layer of every step the same q/k/v go to a tiered
cache and to a reference cache holding every token in device memory, and their attention outputs are
compared. T1 offload changes nothing (bitwise, when the same kernel sees the same key set in token
order; within dtype rounding when T0 and the staged tokens are merged by one softmax, or when the
host attends T1 where it lives and its partial result is merged by log-sum-exp); int8 T2
changes values by at most half a quantisation step per element; T3 eviction changes the output, and
greedy decoding under heavy eviction diverges from the full cache.
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass

import numpy as np
import typer

from sim.inputs.errors import EXIT_BAD_INPUT
from sim.tiering.tiers import T2, TierPolicy

from .cache import CacheGeometry, CacheOptions, Runtime, TieredKVCache
from .model import ModelShapes, SyntheticTransformer

SHAPES = ModelShapes(layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=128, vocab=64)
PROMPT_TOKENS = 16
DECODE_STEPS = 64
SEED = 0
RETIER_INTERVAL = 8
SINK_TOKENS = 2
RECENT_WINDOW = 8
T2_GROUP = 8
HBM_RATIO = 0.5
HEAVY_EVICT_RATIO = 0.5  # half of every re-tier's candidates dropped: divergence is certain, not luck
MERGED_TOL_ULPS = 16  # split softmax reorders sums: allow this many ulps of the output's magnitude
SPLIT_HOST_FRACTION = 0.5  # access split: half of each layer's T1 slots staged, half attended on the host
DTYPES = {"cpu": "float32", "cuda": "bfloat16"}
CPU_THREADS = 1  # tensors this small run faster on one thread than with OpenMP synchronisation


def _policy(**kw) -> TierPolicy:
    base = dict(hbm_ratio=HBM_RATIO, evict_ratio=0.0, compressed_ratio=0.0, retier_interval=RETIER_INTERVAL,
                sink_tokens=SINK_TOKENS, recent_window=RECENT_WINDOW)
    return TierPolicy(**{**base, **kw})


T1_ONLY = _policy()
T2_ALL = _policy(compressed_ratio=1.0 - HBM_RATIO)
T3_HEAVY = _policy(evict_ratio=HEAVY_EVICT_RATIO, hbm_ratio=1.0 - HEAVY_EVICT_RATIO)
FULL = TierPolicy(kind="full_hbm")


class _Shadow:
    """Feeds the same q/k/v to a tiered cache (whose output the model follows) and a full
    reference cache, recording the largest difference of their attention outputs."""

    def __init__(self, tiered, reference):
        self.tiered, self.reference = tiered, reference
        self.max_abs_diff = 0.0
        self.max_abs_ref = 0.0

    @property
    def step(self):  # the model reads step and n for its RoPE positions
        return self.tiered.step

    @property
    def n(self):
        return self.tiered.n

    def write_prompt(self, layer, k, v):
        self.tiered.write_prompt(layer, k, v)
        self.reference.write_prompt(layer, k, v)

    def begin_step(self):
        self.tiered.begin_step()
        self.reference.begin_step()

    def layer_start(self, layer):
        self.tiered.layer_start(layer)
        self.reference.layer_start(layer)

    def attend(self, layer, q, k, v):
        out = self.tiered.attend(layer, q, k, v)
        ref = self.reference.attend(layer, q, k, v)
        self.max_abs_diff = max(self.max_abs_diff, (out.float() - ref.float()).abs().max().item())
        self.max_abs_ref = max(self.max_abs_ref, ref.float().abs().max().item())
        return out

    def end_step(self):
        self.reference.end_step()
        return self.tiered.end_step()


@dataclass
class Setup:
    rt: Runtime
    model: SyntheticTransformer
    prompt: object
    dtype: object


def make_setup(device: str = "cpu", shapes: ModelShapes = SHAPES) -> Setup:
    import torch

    rt = Runtime(device)
    if not rt.is_cuda:
        torch.set_num_threads(CPU_THREADS)
    dtype = getattr(torch, DTYPES[rt.device.type])
    model = SyntheticTransformer(shapes, rt.device, dtype, SEED)
    gen = torch.Generator(device=rt.device).manual_seed(SEED)
    prompt = torch.randint(0, shapes.vocab, (1, PROMPT_TOKENS), generator=gen, device=rt.device)
    return Setup(rt, model, prompt, dtype)


def new_cache(setup: Setup, policy: TierPolicy, attention: str, steps: int = DECODE_STEPS, **opts):
    s = setup.model.shapes
    geom = CacheGeometry(s.layers, setup.prompt.shape[0], s.kv_heads, s.head_dim)
    options = CacheOptions(attention=attention, group_size=T2_GROUP, **opts)
    return TieredKVCache(setup.rt, geom, policy, options, PROMPT_TOKENS, [steps] * setup.prompt.shape[0], setup.dtype)


def greedy(setup: Setup, cache, steps: int = DECODE_STEPS) -> list[int]:
    """Greedy tokens of row 0, prefill included (the first token comes from the prompt)."""
    tokens = setup.model.prefill(setup.prompt, cache).argmax(-1)
    out = [int(tokens[0])]
    for _ in range(steps):
        cache.begin_step()
        tokens = setup.model.decode_step(tokens, cache).argmax(-1)
        cache.end_step()
        out.append(int(tokens[0]))
    return out


def compare(setup: Setup, policy: TierPolicy, attention: str, **opts):
    """(shadow, tiered cache) after a full greedy run following the tiered cache."""
    shadow = _Shadow(new_cache(setup, policy, attention, **opts), new_cache(setup, FULL, attention))
    shadow.tokens = greedy(setup, shadow)  # the tiered cache's greedy tokens (the model follows it)
    shadow.tiered.drain()  # the last re-tier's offload lands: T2 is read from the host store below
    return shadow, shadow.tiered


def t2_kv_error(tiered, reference) -> tuple[float, float, int]:
    """(max |dequantised T2 - original|, max allowed = half a step, tokens in T2), all layers."""
    import torch

    from .cache.quant import dequantize_int8, max_error_bound

    st, ref = tiered.stores, reference.stores
    worst, bound, count = 0.0, 0.0, 0
    for b in range(tiered.geom.batch):
        pos = np.flatnonzero(tiered.tier[b, : tiered.n[b]] == T2)
        if not len(pos):
            continue
        count += len(pos)
        slots = torch.as_tensor(tiered.slot[b, pos])
        q, s = st.t2q[:, slots, b], st.t2s[:, slots, b]
        got = dequantize_int8(q, s, torch.float32)
        orig = ref.t0_gather(torch.full((len(pos),), b, device=ref.t0.device),
                             torch.as_tensor(reference.slot[b, pos], device=ref.t0.device)).transpose(0, 1).float().cpu()
        err = (got - orig).abs().reshape(*q.shape[:-1], s.shape[-1], -1)
        allowed = max_error_bound(s).unsqueeze(-1)
        worst = max(worst, err.max().item())
        bound = max(bound, allowed.max().item())
        if not bool((err <= allowed * (1 + torch.finfo(torch.float32).eps) + torch.finfo(torch.float32).tiny).all()):
            bound = -1.0  # an element broke its own group's bound
    return worst, bound, count


def first_divergent_step(a: list[int], b: list[int]) -> int | None:
    """The decode step (0-based) whose greedy token first differs; `greedy` lists the prefill's
    token first, so list index i is the output of decode step i - 1."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i - 1
    return None


def run_exactness(device: str = "cpu") -> dict:
    import torch

    setup = make_setup(device)
    eps = torch.finfo(setup.dtype).eps
    ordered, _ = compare(setup, T1_ONLY, "ordered")
    merged, _ = compare(setup, T1_ONLY, "merged")
    tol = MERGED_TOL_ULPS * eps * max(1.0, merged.max_abs_ref)
    t2, t2_cache = compare(setup, T2_ALL, "ordered")
    kv_err, kv_bound, t2_tokens = t2_kv_error(t2_cache, t2.reference)
    t3, t3_cache = compare(setup, T3_HEAVY, "ordered")
    host, host_cache = compare(setup, T1_ONLY, "merged", access="host_attention")
    split, split_cache = compare(setup, T1_ONLY, "merged", access="split", host_fraction=SPLIT_HOST_FRACTION)
    host_cache.close()  # their host attention workers
    split_cache.close()
    full_tokens = greedy(setup, new_cache(setup, FULL, "ordered"))
    tiered_tokens = greedy(setup, new_cache(setup, T1_ONLY, "ordered"))
    merged_tokens = greedy(setup, new_cache(setup, T1_ONLY, "merged"))
    evict_tokens = greedy(setup, new_cache(setup, T3_HEAVY, "ordered"))
    return {
        "device": setup.rt.device.type,
        "dtype": str(setup.dtype).removeprefix("torch."),
        "model": asdict(setup.model.shapes),
        "prompt_tokens": PROMPT_TOKENS, "decode_steps": DECODE_STEPS, "retier_interval": RETIER_INTERVAL,
        "t1_offload": {"attention": "ordered (same kernel, same key set in token order)",
                       "max_abs_diff": ordered.max_abs_diff, "exact": ordered.max_abs_diff == 0.0},
        "t1_offload_merged": {"attention": "merged (T0 in place + staged, one softmax over both)",
                              "max_abs_diff": merged.max_abs_diff, "tolerance": tol,
                              "within_tolerance": merged.max_abs_diff <= tol},
        "t1_host_attention": {"attention": "T0 on the device, T1 attended on the host, merged by log-sum-exp",
                              "max_abs_diff": host.max_abs_diff, "tolerance": tol,
                              "within_tolerance": host.max_abs_diff <= tol},
        "t1_split": {"attention": "T0 + a staged share of T1 on the device, the rest on the host, merged by "
                                  "log-sum-exp", "host_fraction": SPLIT_HOST_FRACTION,
                     "max_abs_diff": split.max_abs_diff, "tolerance": tol, "within_tolerance": split.max_abs_diff <= tol},
        "t2_int8": {"max_abs_diff": t2.max_abs_diff, "tokens_in_t2": t2_tokens, "kv_max_abs_err": kv_err,
                    "kv_err_bound": kv_bound, "within_bound": kv_bound >= 0 and kv_err <= kv_bound},
        "t3_evict": {"max_abs_diff": t3.max_abs_diff, "evicted_tokens": int(t3_cache.evicted_tokens),
                     "evict_ratio": HEAVY_EVICT_RATIO},
        "greedy": {
            "steps": DECODE_STEPS,
            "full_vs_t1_identical": full_tokens == tiered_tokens,
            "full_vs_t1_merged_identical": full_tokens == merged_tokens,
            "full_vs_host_attention_identical": full_tokens == host.tokens,
            "full_vs_split_identical": full_tokens == split.tokens,
            "full_vs_evicted_identical": full_tokens == evict_tokens,
            "first_divergent_step": first_divergent_step(full_tokens, evict_tokens),
        },
    }


def _print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Proposition 1 on {r['device']} ({r['dtype']}), {r['decode_steps']} greedy steps, "
                    f"re-tier every {r['retier_interval']}")
    t.add_column("check")
    t.add_column("max |tiered - all in HBM|", justify="right")
    t.add_column("verdict")
    t1, m, t2, t3, g = r["t1_offload"], r["t1_offload_merged"], r["t2_int8"], r["t3_evict"], r["greedy"]
    t.add_row("T1 offload, same kernel", f"{t1['max_abs_diff']:.3g}", "bitwise equal" if t1["exact"] else "DIFFERS")
    t.add_row("T1 offload, merged softmax", f"{m['max_abs_diff']:.3g}",
              f"{'within' if m['within_tolerance'] else 'OUTSIDE'} tolerance {m['tolerance']:.2g}")
    for key, label in (("t1_host_attention", "T1 on the host, merged by LSE"),
                       ("t1_split", f"T1 split ({r['t1_split']['host_fraction']:.0%} on the host)")):
        h = r[key]
        t.add_row(label, f"{h['max_abs_diff']:.3g}",
                  f"{'within' if h['within_tolerance'] else 'OUTSIDE'} tolerance {h['tolerance']:.2g}")
    t.add_row(f"T2 int8 ({t2['tokens_in_t2']} tokens)", f"{t2['max_abs_diff']:.3g}",
              f"KV error {t2['kv_max_abs_err']:.3g} <= half step {t2['kv_err_bound']:.3g}: {t2['within_bound']}")
    t.add_row(f"T3 eviction ({t3['evicted_tokens']} tokens)", f"{t3['max_abs_diff']:.3g}", "changes the output")
    div = g["first_divergent_step"]
    t.add_row("greedy tokens, T1 vs full", "-", "identical" if g["full_vs_t1_identical"] else "DIFFER")
    t.add_row("greedy tokens, T1 on the host / split vs full", "-",
              "identical" if g["full_vs_host_attention_identical"] and g["full_vs_split_identical"] else "DIFFER")
    t.add_row(f"greedy tokens, evict {t3['evict_ratio']:.0%} vs full", "-",
              "identical" if div is None else f"diverge at step {div}")
    Console().print(t)


def register(app: typer.Typer) -> None:
    @app.command()
    def exactness(
        device: str = typer.Option("cpu", "--device", help="cpu or cuda"),
        as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
    ) -> None:
        """Show that T1 offload is exact and that only T2 quantisation and T3 eviction change attention."""
        if device not in ("cpu", "cuda"):
            print(f"hwprobe exactness: --device: expected cpu or cuda, got {device!r}", file=sys.stderr)
            raise typer.Exit(EXIT_BAD_INPUT)
        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                print("hwprobe exactness: no CUDA device available; use --device cpu", file=sys.stderr)
                raise typer.Exit(EXIT_BAD_INPUT)
        result = run_exactness(device)
        if as_json:
            from sim.outputs.run_folder import to_json

            print(to_json(result))
        else:
            _print_table(result)
