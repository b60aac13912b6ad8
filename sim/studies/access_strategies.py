"""Which access strategy wins: for a model, GPU and reasoning length, the throughput of prefetch,
host_attention and split (and, for a sparse-attention model, sparse_fetch with a copy per picked row
and with the picks gathered into one copy a layer) - each tiered policy at its own max batch - against
full_hbm at its max batch, and what binds each (the host link, the host CPU, or neither). From the fast projection,
whose step closed form shares the host DRAM between the host attention and split's own prefetch
copies (`host_pipeline`); the table says how much that slows the host's attention at the last step."""

from __future__ import annotations

import pandas as pd

from sim.decode.capacity import batch_counts, max_batch
from sim.decode.context import build_context
from sim.decode.projection import project, step_time
from sim.device.physics import decode_step_cost
from sim.inputs.scenario import scenario_from_dict
from sim.outputs.schema import LINK_BOTTLENECK_UTILIZATION

ACCESS_STRATEGIES = ("prefetch", "host_attention", "split")
SPARSE_STRATEGIES = ("sparse_fetch/rows", "sparse_fetch/gather")  # sparse_fetch/FETCH_COPY
HOST_SATURATED_SHARE = 0.9  # the host CPU attends this share of a step: it sets the pace


def _scenario(model: str, weight_dtype: str, gpu: str, length: int, prompt: int, policy: dict, batch: int = 1,
              parallel: dict | None = None):
    return scenario_from_dict({
        "name": f"{model}-{gpu}-{length}", "model": {"name": model, "weight_dtype": weight_dtype}, "hardware": {"gpu": gpu},
        "workload": {"batch_size": batch, "prompt_tokens": prompt, "reasoning_tokens": length}, "policy": policy,
        "parallel": parallel or {"tp": 1},
    }, "access study")


def strategies(model: str) -> tuple[str, ...]:
    """The access strategies compared for `model`: prefetch, host_attention, split, and sparse_fetch's
    two copy modes for a sparse-attention model."""
    from sim.inputs.catalog import model as catalog_model
    from sim.model.layers import SPARSE

    return ACCESS_STRATEGIES + (SPARSE_STRATEGIES if SPARSE in catalog_model(model).kind_counts else ())


def _policy(access: str, hbm_ratio: float, evict_ratio: float) -> dict:
    name, _, copy = access.partition("/")
    return {"kind": "tiered", "hbm_ratio": hbm_ratio, "evict_ratio": evict_ratio, "access": name,
            **({"fetch_copy": copy} if copy else {})}


def host_at_end(sc) -> tuple[float, float]:
    """At the last decode step (the steady state at full length): the share of the step the host CPU
    spends attending, and how much longer its attention takes than with the DRAM to itself (1: no
    DMA beside it; >1: its own prefetch copies share the host DRAM, `host_pipeline`)."""
    ctx = build_context(sc)
    c = batch_counts(ctx, sc.workload.batch_size)
    t0, t1, t2 = (int(x) for x in c.attended[-1, :3])
    batch = int(c.active[-1])
    st = step_time(ctx, batch, t0, t1, t2)
    m, p = sc.model, sc.policy
    cost = decode_step_cost(ctx.model, ctx.hw, m.weight_dtype, m.weight_group_size, p.prefetch, batch, t0, t1, t2,
                            ctx.kv_bytes_per_token_layer, ctx.t2_bytes_per_token_layer, True, p.access, p.staging_buffers)
    if cost.host is None:
        return 0.0, 1.0
    times = cost.host_times(ctx.hw, cost.prefetch_copy_s(ctx.hw.h2d) if cost.stages else 0.0, p.staging_buffers)
    busy_s = sum(b - a for a, b in times.host)
    return busy_s / st.step_s, busy_s / (ctx.num_layers * cost.host.host_s)


def host_share_at_end(sc) -> float:
    """Share of the last decode step the host CPU spends attending (`host_at_end`)."""
    return host_at_end(sc)[0]


def binding_resource(h2d_utilization: float, host_share: float) -> str:
    """The busier of the host link and the host CPU where it is busy enough to set the pace, else
    the GPU; both where both are (split balances them)."""
    busy = [name for name, share, limit in (("host link", h2d_utilization, LINK_BOTTLENECK_UTILIZATION),
                                            ("host CPU", host_share, HOST_SATURATED_SHARE)) if share >= limit * 0.9]
    return " + ".join(busy) if busy else "GPU"


def access_table(model: str, weight_dtype: str, gpus: tuple[str, ...], length: int, prompt: int = 512,
                 hbm_ratio: float = 0.25, evict_ratio: float = 0.1, parallel: dict | None = None) -> pd.DataFrame:
    """One row per (GPU, strategy): max batch, throughput there, ratio to full_hbm at its own max
    batch, and the binding resource; `parallel` the scenario's (default one GPU)."""
    rows = []
    for gpu in gpus:
        full = _scenario(model, weight_dtype, gpu, length, prompt, {"kind": "full_hbm"}, parallel=parallel)
        full_b = max_batch(build_context(full))
        full_tput = project(full.model_copy(update={"workload": full.workload.model_copy(update={"batch_size": max(full_b, 1)})}),
                            with_max_batch=False).throughput_tok_per_s if full_b else None
        for access in strategies(model):
            pol = _policy(access, hbm_ratio, evict_ratio)
            sc1 = _scenario(model, weight_dtype, gpu, length, prompt, pol, parallel=parallel)
            b = max_batch(build_context(sc1))
            if b == 0:
                rows.append({"gpu": gpu, "access": access, "max_batch": 0, "throughput_tok_per_s": None,
                             "vs_full_hbm": None, "binds": "does not fit"})
                continue
            sc = _scenario(model, weight_dtype, gpu, length, prompt, pol, batch=b, parallel=parallel)
            p = project(sc, with_max_batch=False)
            host_share, dram_slowdown = host_at_end(sc)
            binds = binding_resource(p.h2d_utilization, host_share)
            rows.append({"gpu": gpu, "access": access, "max_batch": b, "full_hbm_max_batch": full_b,
                         "throughput_tok_per_s": p.throughput_tok_per_s,
                         "vs_full_hbm": p.throughput_tok_per_s / full_tput if full_tput else None,
                         "h2d_utilization": p.h2d_utilization, "host_share_last_step": host_share,
                         "host_dram_slowdown_last_step": dram_slowdown, "binds": binds})
    return pd.DataFrame(rows)


# The report's section: the default projection's largest and smallest models on the GPUs a capacity
# engineer compares most, at one mid-length reasoning chain.
STUDY_MODELS = (("7B bf16", "deepseek-r1-distill-qwen-7b", "bf16"), ("70B int4", "deepseek-r1-distill-llama-70b", "int4"))
STUDY_GPUS = ("h200-sxm", "h100-sxm", "l40s", "rtx-4090")
STUDY_LENGTH = 4096
STUDY_HBM_RATIO = 0.25


def access_study(models=STUDY_MODELS, gpus=STUDY_GPUS, length: int = STUDY_LENGTH) -> pd.DataFrame:
    """`access_table` for each (label, model, weights), one frame with a `model` column."""
    frames = [access_table(name, wd, gpus, length, hbm_ratio=STUDY_HBM_RATIO).assign(model=label)
              for label, name, wd in models]
    return pd.concat(frames, ignore_index=True)
