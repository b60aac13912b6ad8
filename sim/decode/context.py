"""Everything one run needs, resolved once from a scenario (+ optional profile)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from sim.device.engine_context import VLLM_CHECK, vllm_fitting_context, vllm_request_kv_bytes
from sim.device.engine_rules import (
    DECODE,
    engine_dense_dp,
    engine_host_s_per_sequence,
    engine_memory_rule,
    engine_whole_embedding,
    host_launch_s,
    launch_rule,
    trtllm_chunked_decode_on_mmha,
)
from sim.device.hardware import (
    DecodeKernel,
    Hardware,
    measured_kernels_line,
    mha_decode,
    resolve_hardware,
    window_decode,
)
from sim.device.kinds_prefill import GQA_KINDS, kinds_measured, kinds_prefill_said
from sim.device.memory import WindowPools, profile_run_activation_bytes, sglang_chunk_pools, window_pools_rule
from sim.device.moe_datasheet import datasheet_moe_source
from sim.device.moe_exchange import ALLTOALL, moe_exchange
from sim.device.moe_mla_costs import mla_prefill_measured, source_line
from sim.device.sparse_fetch import SparseFetch
from sim.inputs import catalog
from sim.inputs.context_checks import longest_request_tokens
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import FRAMEWORK
from sim.inputs.profile import Profile
from sim.inputs.scenario import Scenario
from sim.inputs.serving_config import SchedulerCfg
from sim.model.dtypes import COMPRESSED_DTYPES
from sim.model.layers import CHUNKED, LINEAR, MLA, SPARSE, WINDOW, chunk_attended
from sim.model.spec import ModelSpec
from sim.model.units import GiB
from sim.tiering.counts import unprotected_share_of_last
from sim.tiering.tier_plan import ACTIVE, ATT_T1, ATT_T2
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
    max_model_len: int | None = None  # the longest sequence the engine serves (`with_context_rule`); None: no rule
    window_pools: WindowPools | None = None  # the engine's own pool for window layers (`engine_window_pools`)

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

    def chunk_kept(self, tokens, prompt_tokens):
        """The share of a host-tier token's tiered bytes that its tiers hold, move and read, for sequences
        of `tokens` tokens (prompt `prompt_tokens`; scalars or arrays): all of its full and MLA layers',
        and its chunked layers' only where it lies in its sequence's current chunk - the only tokens their
        attention reads again (`layers.chunk_attended`), so the host keeps no chunked copy behind it. Which
        of a sequence's unprotected tokens sit in T1/T2 is taken as independent of position
        (`counts.unprotected_share_of_last`): 1 - q (1 - f), q the chunked layers' share of the tiered
        bytes (`ModelSpec.chunked_tier_share`). 1.0 without chunked layers."""
        q = self.model.chunked_tier_share
        if not q:
            return 1.0
        chunk = chunk_attended(np.asarray(tokens), self.model.attention_chunk)
        return 1.0 - q * (1.0 - unprotected_share_of_last(tokens, prompt_tokens, self.policy, chunk))

    def staged_tokens(self, t1, t2, tokens, prompt_tokens):
        """(T1, T2) tokens the mean layer stages - prefetches, or reads on the host - for sequences of
        `tokens` tokens (prompt `prompt_tokens`) holding t1 and t2 (scalars or arrays, one entry a
        sequence or a closed batch's equal sequences summed): each scaled by `chunk_kept`; t1, t2
        themselves without chunked layers."""
        if not self.model.chunked_tier_share:
            return t1, t2
        kept = self.chunk_kept(tokens, prompt_tokens)
        return t1 * kept, t2 * kept

    def closed_tokens(self, steps):
        """The tokens each running sequence of a closed batch holds at decode `steps`: prompt + step + 1."""
        return self.scenario.workload.prompt_tokens + np.asarray(steps) + 1

    def closed_kept(self, steps):
        """`chunk_kept` of a closed batch at decode `steps` (scalar or array; `closed_tokens`); 1.0 without
        chunked layers."""
        if not self.model.chunked_tier_share:
            return 1.0
        return self.chunk_kept(self.closed_tokens(steps), self.scenario.workload.prompt_tokens)

    def closed_chunk_tokens(self, att: np.ndarray, steps: np.ndarray):
        """The tokens a closed batch's chunked layers attend at decode `steps` (rows `att`, columns
        `tier_plan.ATT_*`): each of its running sequences its current chunk's, ((n - 1) mod C) + 1 of
        n = `closed_tokens` (`layers.chunk_attended`; exact, the sequences sharing one length). None
        without chunked layers."""
        if not self.model.chunked_tier_share:
            return None
        return att[:, ACTIVE] * chunk_attended(self.closed_tokens(steps), self.model.attention_chunk)

    def closed_staged_tokens(self, att: np.ndarray, steps: np.ndarray):
        """`staged_tokens` of a closed batch's rows `att` (columns `tier_plan.ATT_*`) at decode `steps`
        (`closed_kept`). None without chunked layers."""
        if not self.model.chunked_tier_share:
            return None
        kept = self.closed_kept(steps)
        return att[:, ATT_T1] * kept, att[:, ATT_T2] * kept

    @property
    def chunk_rule(self) -> tuple[float, int] | None:
        """(chunked layers' KV bytes a token, chunk C) where the run's engine frees a chunked layer's blocks
        before its current chunk: vLLM's ChunkedLocalAttentionManager, and without an engine (kvtier's default
        rules, vLLM's); None for a model without chunked layers, TensorRT-LLM (every token) and SGLang (its
        window pool, `window_pools`)."""
        e = self.scenario.engine
        if CHUNKED not in self.model.kind_counts or (e is not None and e.name != "vllm"):
            return None
        return self.model.kind_kv_bytes_per_token(CHUNKED, self.scenario.model.kv_dtype), self.model.attention_chunk

    def chunk_freed_bytes(self, t0, tokens, sequences):
        """T0 KV bytes `chunk_rule` frees for `sequences` sequences holding `tokens` in all, `t0` of them in T0
        (scalars or arrays over a closed batch's steps, whose running sequences share one length): the chunked
        layers' bytes of the T0 tokens past each sequence's current chunk (`layers.chunk_attended`), the
        larger of this step's and the step before's - the trace has no row for the prefill, whose last chunk
        the first decode step frees (a prompt of C tokens holds C until then); 0 without the rule."""
        rule = self.chunk_rule
        if rule is None:
            return 0.0
        per_token, chunk = rule
        seqs = np.asarray(sequences, dtype=float)
        each = np.divide(tokens, seqs, out=np.zeros(np.shape(seqs * tokens)), where=seqs > 0)
        before = np.where(each > 1, chunk_attended(each - 1, chunk), 0)
        current = seqs * np.maximum(chunk_attended(each, chunk), before)
        return per_token * (t0 - np.minimum(t0, current))


def build_context(scenario: Scenario, profile: Profile | None = None, profile_path: str | None = None) -> RunContext:
    """Everything is per GPU: with tensor parallelism `model` is one GPU's shard, so weights, KV
    bytes per token, FLOP and memory are one GPU's, and the batch is the whole group's; with pipeline
    parallelism it is the largest stage's shard (`ModelSpec.stage`)."""
    engine = scenario.engine.name if scenario.engine else None
    model = (catalog.resolve_model(scenario.model)
             .shard(*scenario.parallel.layout, engine_dense_dp(engine), engine_whole_embedding(engine))
             .stage(scenario.parallel.pp))
    m, p = scenario.model, scenario.policy
    policy = TierPolicy.from_config(p)
    stages = policy.tiering and (policy.auto or policy.hbm_ratio < 1.0 - policy.evict_ratio)  # T1/T2 may hold tokens
    hw = resolve_hardware(scenario.hardware, m.weight_dtype, p.pinned, profile,
                          staging=p.prefetch if stages else "none", with_host=p.host_access,
                          tp=scenario.parallel.tp,
                          framework=scenario.engine.kernel_framework if scenario.engine else FRAMEWORK,
                          engine=engine or "vllm")
    engine_sched = None
    if scenario.engine is not None:  # the scheduler the engine runs: its memory rule and its context rule
        engine_sched = scenario.engine.scheduler_for(scenario.scheduler, hw.memory_bytes, scenario.parallel.tp,
                                                     hw.gpu.name, scenario.parallel.attention_dp, model.context_tokens)
        hw = with_engine(hw, scenario, model, engine_sched)
    if (hw.kernels is not None and (hw.kernels.tables.context_attention is not None or mla_prefill_measured(model, hw))
            or (model.mla is not None and hw.prefill_attention_shape.mla is not None)
            or (WINDOW in model.kind_counts and hw.prefill_attention_shape.window is not None)):
        hw = replace(hw, sources={**hw.sources, "prefill_attention": prefill_attention_source(model, hw, m.kv_dtype)})
    if WINDOW in model.kind_counts and hw.kernels is None:
        hw = with_window_decode(hw, model, scenario.hardware.efficiency, profile)
    moe_mla = source_line(model, hw, m.weight_dtype, m.weight_group_size, m.kv_dtype,
                          scenario.engine.moe_backend if scenario.engine else None)
    if moe_mla:
        hw = replace(hw, sources={**hw.sources, "kernels_moe_mla": moe_mla})
    if routed := datasheet_moe_source(model, hw, m.weight_dtype, m.weight_group_size):
        hw = replace(hw, sources={**hw.sources, "routed_experts": routed})
    if mla_prefill_measured(model, hw):  # the kernels line says so
        hw = replace(hw, sources={**hw.sources, "kernels": measured_kernels_line(hw, hw.kernels, mla_prefill=True)})
    if model.attention_dp > 1:  # the experts' dispatch and combine cross the interconnect
        hw = with_moe_exchange(hw, scenario, model.expert_format(m.weight_dtype))
    t2_layer = model.compressed_bytes_per_token_layer(COMPRESSED_DTYPES[p.compressed_dtype], p.compressed_group_size)
    ctx = RunContext(
        scenario=scenario, model=model, hw=hw, policy=policy,
        kv_bytes_per_token_layer=model.kv_bytes_per_token_layer(m.kv_dtype),
        t2_bytes_per_token_layer=t2_layer,
        weights_bytes=model.weight_bytes(m.weight_dtype, m.weight_group_size),
        profile_path=profile_path,
    )
    if engine_sched is None:
        return with_kv_layout_source(ctx)
    ctx = with_chunked_decode_rule(with_context_rule(ctx, engine_sched))
    pools = engine_window_pools(ctx, engine_sched.max_num_batched_tokens)
    return with_kv_layout_source(replace(ctx, window_pools=pools))


def _past_window(pools: WindowPools) -> str:
    """TensorRT-LLM's reserve beyond the window, as `with_kv_layout_source` says it ("" for SGLang's pools)."""
    return f" and the temporary window, + a {pools.block_tokens}-token block past it" if pools.block_tokens else ""


def with_kv_layout_source(ctx: RunContext) -> RunContext:
    """`ctx` whose sources say how its engine holds a window or chunked model's KV (`kv_layout`): its window
    pools (`window_pools`) or vLLM's chunked-local rule (`chunk_rule`); unchanged for any other model."""
    counts, pools, e = ctx.model.kind_counts, ctx.window_pools, ctx.scenario.engine
    if pools is not None:
        kind, held = (CHUNKED, "chunk") if pools.tiered_per_token else (WINDOW, "window")
        name = {"sglang": "SGLang", "tensorrt-llm": "TensorRT-LLM"}.get(e.name, e.name)
        said = (f"{name}'s own pool for the {counts[kind]} {kind} layers, {pools.shares[1]:.3f} of the KV budget "
                f"(the full-attention layers' pool {pools.shares[0]:.3f}): a request holds min(tokens, "
                f"{pools.reach:,.0f}) of their tokens there (the {held}{_past_window(pools)}); the fuller pool binds")
    elif ctx.chunk_rule is not None:
        said = (f"vLLM's ChunkedLocalAttentionManager: the {counts[CHUNKED]} chunked layers hold each sequence's "
                f"current chunk, ((n - 1) mod {ctx.model.attention_chunk:,}) + 1 of its n tokens")
    else:
        return ctx
    return replace(ctx, hw=replace(ctx.hw, sources={**ctx.hw.sources, "kv_layout": said}))


def with_context_rule(ctx: RunContext, sc: SchedulerCfg) -> RunContext:
    """`ctx` with the longest sequence its engine serves (`RunContext.max_model_len`): engine.max_model_len,
    else the model's context (`ModelSpec.context_tokens`); under vLLM "auto" is the longest its KV budget
    holds one request of, and a context it cannot hold is refused as vLLM refuses to start
    (`device.engine_context`). A model without a context (a config.json with no
    max_position_embeddings) gets no rule. `sc`: the scheduler the engine runs (`EngineCfg.scheduler_for`)."""
    e, m = ctx.scenario.engine, ctx.scenario.model
    declared = e.declared_context(ctx.model.context_tokens)
    if declared is None:
        return ctx
    origin = e.context_origin(ctx.model.name)
    if e.name == "vllm":
        budget = ctx.hw.memory_bytes - ctx.weights_bytes - ctx.hw.held_activation_bytes - ctx.hw.runtime_reserve_bytes

        def need(tokens: int) -> float:
            return vllm_request_kv_bytes(ctx.model, m.kv_dtype, tokens, sc.max_num_batched_tokens)

        fit = vllm_fitting_context(need, budget, declared)
        if e.max_model_len == "auto":
            if fit == 0:
                raise ConfigError(f"vLLM cannot auto-fit max_model_len: not one token's KV fits the "
                                  f"{budget / GiB:.2f} GiB its budget leaves per GPU; raise gpu_memory_utilization",
                                  field="engine.max_model_len")
            longest = longest_request_tokens(ctx.scenario.workload)
            if fit < longest:
                raise ConfigError(f"vLLM's auto-fit max_model_len is {fit:,} tokens ({VLLM_CHECK}), shorter than the "
                                  f"longest request's {longest:,}, which it would refuse; raise gpu_memory_utilization "
                                  "or give the lengths a max", field="engine.max_model_len")
            declared, origin = fit, f"vLLM's auto-fit ({VLLM_CHECK})"
        elif fit < declared:
            raise ConfigError(f"vLLM would not start: one request of {declared:,} tokens ({origin}) needs "
                              f"{need(declared) / GiB:.2f} GiB of KV per GPU, more than the {budget / GiB:.2f} GiB its "
                              f"budget leaves ({VLLM_CHECK}); set engine.max_model_len to at most {fit:,} (or auto), "
                              "or raise gpu_memory_utilization", field="engine.max_model_len")
    sources = {**ctx.hw.sources, "max_model_len": f"{declared:,} tokens: {origin}"}
    return replace(ctx, max_model_len=declared, hw=replace(ctx.hw, sources=sources))


def engine_window_pools(ctx: RunContext, max_num_tokens: int) -> WindowPools | None:
    """The run's engine's window pools where its model has full-attention layers beside window layers
    (`device.memory.window_pools_rule`) or, under SGLang, chunked ones (`device.memory.sglang_chunk_pools`),
    and no linear or sparse ones; None otherwise. `max_num_tokens`: the group's token budget a step (an
    attention-data-parallel rank's is its share)."""
    e, kinds = ctx.scenario.engine, ctx.model.kind_counts
    if e is None or LINEAR in kinds or SPARSE in kinds or len(kinds) < 2:
        return None
    if WINDOW not in kinds:
        if CHUNKED not in kinds or e.name != "sglang":
            return None
        chunked = ctx.model.kind_kv_bytes_per_token(CHUNKED, ctx.scenario.model.kv_dtype)
        return sglang_chunk_pools(ctx.kv_bytes_per_token, chunked, ctx.model.attention_chunk, e.swa_full_tokens_ratio)
    per_token = ctx.model.kind_kv_bytes_per_token(WINDOW, ctx.scenario.model.kv_dtype)
    return window_pools_rule(e.name, ctx.kv_bytes_per_token, per_token, ctx.model.sliding_window,
                             ctx.max_model_len or ctx.model.context_tokens,
                             max_num_tokens // max(ctx.model.attention_dp, 1), e.swa_full_tokens_ratio)


def with_chunked_decode_rule(ctx: RunContext) -> RunContext:
    """`ctx` whose chunked layers decode one thread block per query head where its engine runs them so
    (`engine_rules.trtllm_chunked_decode_on_mmha`: TensorRT-LLM's MMHA below compute capability 10.x, once
    the longest sequence it serves, `RunContext.max_model_len`, reaches the chunk)."""
    e, model = ctx.scenario.engine, ctx.model
    if e is None or CHUNKED not in model.kind_counts or not trtllm_chunked_decode_on_mmha(
            e.name, ctx.hw.gpu.name, model.attention_chunk, ctx.max_model_len):
        return ctx
    why = (f"TensorRT-LLM on {ctx.hw.gpu.name}: XQA refuses a chunk (kernelUtils.cpp supportConfigCommon), so the "
           f"{model.kind_counts[CHUNKED]} chunked layers decode on MMHA, one block per query head streaming its KV "
           f"head's cache: {model.num_heads // model.num_kv_heads}x the reads, timed as MHA of {model.num_heads} heads")
    kernel, said = mmha_datasheet(ctx)
    hw = replace(ctx.hw, chunked_decode_per_query_head=True, mha_decode=kernel,
                 sources={**ctx.hw.sources, "chunked_decode": f"{why}{said}"})
    return replace(ctx, hw=hw)


def with_window_decode(hw: Hardware, model: ModelSpec, ov, profile: Profile | None) -> Hardware:
    """Datasheet `hw` whose window layers decode on their own kernel figures (`hardware.window_decode`: the fit
    on its engine's tables' window rows at the model's head dim), its source line saying which; the decode
    fit's over the window's tokens where none applies or a profile measures the decode-attention rate (one
    rate and floor, as a full layer's)."""
    if profile is not None and profile.compute.attention_hbm_bytes_per_s is not None:
        label = f"profile: {profile.device_name}"
        return replace(hw, sources={**hw.sources, "window_decode": f"{label}: the measured decode-attention rate and "
                                                                   f"floor over the window's tokens"})
    fig = window_decode(hw.gpu, ov, hw.fitted_framework, model.head_dim, hw.fit_from)
    return replace(hw, window_decode=fig.value, sources={**hw.sources, "window_decode": fig.source})


def mmha_datasheet(ctx: RunContext) -> tuple[DecodeKernel | None, str]:
    """(MMHA's datasheet figures, what the source line adds): with measured tables none (their MHA rows are
    MMHA's); else `hardware.mha_decode` of the engine's fitted tables."""
    if ctx.hw.kernels is not None:
        return None, " (the measured tables' MHA rows)"
    fig = mha_decode(ctx.hw.gpu, ctx.scenario.hardware.efficiency, ctx.hw.fitted_framework, ctx.hw.fit_from)
    return fig.value, f" ({fig.source})"


def with_moe_exchange(hw: Hardware, scenario: Scenario, experts_format: str) -> Hardware:
    """`hw` exchanging an attention-DP group's tokens with the experts as the scenario's engine does
    (vLLM's rules without `engine:`; `device.moe_exchange`), or by all-to-all where parallel.moe_comm
    says so; its source names the rule and what costs it. The wire follows the routed experts' format
    (`experts_format`, `ModelSpec.expert_format`)."""
    engine = scenario.engine.name if scenario.engine else "vllm"
    x = moe_exchange(engine, experts_format, scenario.parallel.moe_comm)
    if x.method == ALLTOALL and hw.kernels is not None and hw.kernels.a2a_slices():
        cost = hw.kernels.tables.source("moe_a2a DeepEP dispatch / combine")
    elif x.method == ALLTOALL and hw.alltoall_fits:
        cost = f"DeepEP's dispatch / combine fitted on measured tables ({catalog.fitted_kernels_file(hw.fitted_framework)})"
    elif x.method == ALLTOALL:
        fabric = catalog.interconnect(hw.gpu.interconnect)
        cost = f"catalog {fabric.name}: {fabric.alltoall_source}"
    elif hw.kernels is not None and hw.kernels.has_gather():
        cost = hw.kernels.tables.source("nccl all_gather / reduce_scatter")
    elif hw.gather_protocols:
        cost = f"NCCL's all_gather / reduce_scatter fitted on measured tables ({catalog.fitted_kernels_file(hw.fitted_framework)})"
    else:
        cost = f"the catalog fabric's ring ({hw.gpu.interconnect})"
    return replace(hw, moe_exchange=x, sources={**hw.sources, "moe_exchange": f"{x.source}; costed by {cost}"})


def prefill_attention_source(model: ModelSpec, hw: Hardware, kv_dtype: str) -> str:
    """Where this run's prefill attention comes from (`physics.measured_prefill_attention_s`, or an MLA
    model's or window layers' own datasheet fit)."""
    if mla_prefill_measured(model, hw):
        return (hw.kernels.mla_context_source() + ": TensorRT-LLM's MLA prefill kernel (not absorbed), each step's "
                "chunks as prompts of the length that attends as many pairs")
    if model.mla is not None and hw.prefill_attention_shape.mla is not None:
        return f"datasheet: physics.prefill_attention_s, {hw.prefill_attention_shape.mla_said}"
    tables = hw.kernels is not None and hw.kernels.has_context_attention()
    if model.layer_kinds and tables and kinds_measured(model, hw.kernels, kv_dtype):
        return hw.kernels.tables.source("context_attention") + ": " + kinds_prefill_said(model)
    own = (f", {hw.prefill_attention_shape.window_said}" if WINDOW in model.kind_counts
           and hw.prefill_attention_shape.window is not None else "")
    if model.layer_kinds and tables:
        why = (f"no rows of window {model.sliding_window} at KV {kv_dtype}" if set(model.kind_counts) <= GQA_KINDS
               else f"full, window and chunked layers only, not {model.describe_kinds()}")
        return f"datasheet: physics.prefill_attention_s (the context-attention table has {why}){own}"
    if model.layer_kinds:
        return f"datasheet: physics.prefill_attention_s{own}"
    busiest = ("; under attention data parallelism the busiest rank's ceil(chunks / ranks) of them"
               if model.attention_dp > 1 else "")
    return (hw.kernels.tables.source("context_attention") + ": each step's chunks as prompts of the length that "
            f"attends as many pairs{busiest}")


def with_engine(hw: Hardware, scenario: Scenario, model: ModelSpec, sc: SchedulerCfg) -> Hardware:
    """`hw` under the scenario engine's rules (`inputs.scenario.EngineCfg`, `device.engine_rules`), each
    sourced: usable HBM, reserve and held activations (its KV budget rule, for the scheduler it runs:
    `EngineCfg.scheduler_for`), and which steps replay a CUDA graph (`hw.launch`; host_layer_s /
    host_step_s are those of this run's decode batch - the closed batch's size, a serving run's
    smallest - until physics asks `engine_rules.host_launch_s` step by step)."""
    e, tp = scenario.engine, scenario.parallel.tp
    act = profile_run_activation_bytes(model, sc.max_num_batched_tokens, sc.max_num_seqs)
    weights = model.weight_bytes(scenario.model.weight_dtype, scenario.model.weight_group_size)
    mem = engine_memory_rule(e, sc, hw.memory_bytes, tp, model.kind_counts.get(MLA, 0) > 0, act, weights)
    rule, graphs = launch_rule(e, sc, hw.gpu.name, hw.memory_bytes, tp, hw.host_layer_s, hw.host_step_s,
                               model.attention_dp)
    per_sequence_s, loop_source = engine_host_s_per_sequence(e)
    rule = replace(rule, host_s_per_sequence=per_sequence_s)
    if scenario.workload.arrivals is None and per_sequence_s:  # the decode levels: `engine.DecodeSim.step`, `fast`
        loop_source += "; a closed batch's decode steps over its sequences still decoding"
    batch = scenario.workload.batch_size if scenario.workload.arrivals is None else 1
    layer_s, step_s = host_launch_s(rule, batch, DECODE)
    eager = {k: hw.sources[k] for k in ("host_layer_s", "host_step_s")}
    for key, text in eager.items():
        if text.startswith("default: 0"):  # no host figure: neither a CUDA profile nor the scenario gives one
            eager[key] = ("no host launch figure (a CUDA profile from hwprobe calibrate, or "
                          f"hardware.efficiency.{key}, gives one): 0 assumed")
    replayed = rule.cuda_graphs and 1 <= batch <= rule.graph_max_batch
    launch = (f"{mem.rule.split(' (')[0]}: decode batches <= {rule.graph_max_batch} replay a CUDA graph ({graphs}); "
              "mixed, prefill and larger decode steps are launched eagerly; ")
    now = f"this run's decode batch {batch}: " + ("graph replay, 0" if replayed else "eager, ")
    sources = {**hw.sources,
               "memory_bytes": f"{mem.rule}: {mem.usable} {hw.sources['memory_bytes']}",
               "runtime_reserve_bytes": f"{mem.rule}: memory outside torch, engine.non_torch_bytes",
               "held_activation_bytes": f"{mem.rule}: a forward pass of max_num_batched_tokens {sc.max_num_batched_tokens}"
                                        f" (max_num_seqs {sc.max_num_seqs} sampling)",
               **{k: launch + now + ("" if replayed else eager[k]) for k in eager}, "host_loop_s": loop_source}
    return replace(hw, memory_bytes=mem.usable_bytes, runtime_reserve_bytes=mem.reserve_bytes,
                   held_activation_bytes=mem.held_activation_bytes, host_layer_s=layer_s, host_step_s=step_s,
                   launch=rule, sources=sources)
