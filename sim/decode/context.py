"""Everything one run needs, resolved once from a scenario (+ optional profile)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from sim.device.hardware import Hardware, resolve_hardware
from sim.device.memory import engine_memory, profile_run_activation_bytes
from sim.device.sparse_fetch import SparseFetch
from sim.inputs import catalog
from sim.inputs.profile import Profile
from sim.inputs.scenario import Scenario
from sim.model.dtypes import COMPRESSED_DTYPES
from sim.model.spec import ModelSpec
from sim.tiering.tiers import TierPolicy


@dataclass(frozen=True)
class RunContext:
    scenario: Scenario
    model: ModelSpec
    hw: Hardware
    policy: TierPolicy
    kv_bytes_per_token_layer: float
    t2_bytes_per_token_layer: float
    weights_bytes: float
    profile_path: str | None = None

    @property
    def num_layers(self) -> int:
        return self.model.num_layers

    @property
    def kv_bytes_per_token(self) -> float:
        return self.kv_bytes_per_token_layer * self.num_layers

    @property
    def t2_bytes_per_token(self) -> float:
        return self.t2_bytes_per_token_layer * self.num_layers

    @property
    def sparse_fetch(self) -> SparseFetch | None:
        """How a sparse_fetch step moves its picks (policy.sparse_reuse, fetch_copy, fetch_block_tokens);
        None with another access."""
        p = self.scenario.policy
        return SparseFetch(p.sparse_reuse, p.fetch_copy, p.fetch_block_tokens) if p.access == "sparse_fetch" else None

    # ---- layers by kind (sim/model/layers.py) ----------------------------------------------
    # Per-token figures above are the tiered layers' (full, MLA) over all L layers, the mean layer the
    # engines carry; a dense GQA model's are its layer's. Window and linear layers hold bounded
    # per-sequence bytes that stay in HBM.
    @property
    def tiered_layers(self) -> int:
        """Layers whose KV tiers per token (all of a dense GQA model's)."""
        return self.model.tiered_layers

    @property
    def staged_bytes_per_token_layer(self) -> float:
        """One token's KV in one tiered layer: what a staging buffer holds per staged token (a dense
        GQA model: `kv_bytes_per_token_layer` itself)."""
        if not self.model.layer_kinds:
            return self.kv_bytes_per_token_layer
        return self.kv_bytes_per_token / self.tiered_layers if self.tiered_layers else 0.0

    def bounded_bytes(self, tokens, sequences):
        """HBM of the window and linear layers for `sequences` sequences holding `tokens` in all
        (`ModelSpec.bounded_bytes`, this run's KV dtype); 0 for a model without them."""
        if not self.model.has_bounded_layers:
            return 0.0
        return self.model.bounded_bytes(tokens, sequences, self.scenario.model.kv_dtype)


def build_context(scenario: Scenario, profile: Profile | None = None, profile_path: str | None = None) -> RunContext:
    """Everything is per GPU: with tensor parallelism `model` is one GPU's shard, so weights, KV
    bytes per token, FLOP and memory are one GPU's, and the batch is the whole group's."""
    model = catalog.resolve_model(scenario.model).shard(*scenario.parallel.layout)
    m, p = scenario.model, scenario.policy
    policy = TierPolicy.from_config(p)
    stages = policy.tiering and (policy.auto or policy.hbm_ratio < 1.0 - policy.evict_ratio)  # T1/T2 may hold tokens
    hw = resolve_hardware(scenario.hardware, m.weight_dtype, p.pinned, profile,
                          staging=p.prefetch if stages else "none", with_host=p.host_access,
                          tp=scenario.parallel.tp)
    if scenario.engine is not None:
        hw = with_engine(hw, scenario, model)
    if model.attention_dp > 1:  # the experts' dispatch and combine cross the interconnect
        fabric = catalog.interconnect(hw.gpu.interconnect)
        hw = replace(hw, sources={**hw.sources, "alltoall": f"catalog {fabric.name}: {fabric.alltoall_source}"})
    t2_layer = model.compressed_bytes_per_token_layer(COMPRESSED_DTYPES[p.compressed_dtype], p.compressed_group_size)
    return RunContext(
        scenario=scenario, model=model, hw=hw, policy=policy,
        kv_bytes_per_token_layer=model.kv_bytes_per_token_layer(m.kv_dtype),
        t2_bytes_per_token_layer=t2_layer,
        weights_bytes=model.weight_bytes(m.weight_dtype, m.weight_group_size),
        profile_path=profile_path,
    )


def with_engine(hw: Hardware, scenario: Scenario, model: ModelSpec) -> Hardware:
    """`hw` under the scenario engine's memory rule (`inputs.scenario.EngineCfg`,
    `device.memory.engine_memory`): usable HBM, reserve and held activations, each sourced."""
    e, sc = scenario.engine, scenario.scheduler
    act = profile_run_activation_bytes(model, sc.max_num_batched_tokens, sc.max_num_seqs)
    usable, reserve, held = engine_memory(hw.memory_bytes, e.gpu_memory_utilization, e.non_torch_bytes, act)
    rule = f"engine {e.name} {e.version} (vllm/v1/worker/gpu_worker.py determine_available_memory)"
    sources = {**hw.sources,
               "memory_bytes": f"{rule}: gpu_memory_utilization {e.gpu_memory_utilization:g} x {hw.sources['memory_bytes']}",
               "runtime_reserve_bytes": f"{rule}: memory outside torch, engine.non_torch_bytes",
               "held_activation_bytes": f"{rule}: profiling pass of max_num_batched_tokens {sc.max_num_batched_tokens}"}
    return replace(hw, memory_bytes=usable, runtime_reserve_bytes=reserve, held_activation_bytes=held, sources=sources)
