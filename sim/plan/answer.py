"""The plan in the planner's words: one sentence first, the Pareto front per GPU count, the launch
commands. Pure text and arithmetic over the ranked rows (sim.plan.files.PLAN_COLUMNS)."""

from __future__ import annotations

import functools

from sim.inputs import catalog
from sim.inputs.scenario import Scenario
from sim.serving.fleet import LEAST_OUTSTANDING, ROUND_ROBIN

from .files import parse_prefill_label
from .launch import hf_model_id, launch_commands, with_flags, with_note, with_pipeline


def gpu_name(gpu: str) -> str:
    return catalog.gpu(gpu).name.upper().replace("-SXM", " SXM").replace("-PCIE", " PCIe")


def _ms(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v / 1e3:.2g} s" if v >= 1000 else f"{v:.3g} ms"


def engine_phrase(engine) -> str:
    """The engine a plan assumed (a scenario's `EngineCfg`, or None), as the answer names it."""
    if engine is None:
        return ("no engine: kvtier's flat HBM reserve, vLLM-style scheduler and vLLM's kernel tables "
                "(engine: in the scenario plans for one)")
    tables = "its own kernel tables" if engine.kernel_tables == "own" else f"{engine.kernel_tables}'s kernel tables"
    return f"engine {engine.name} {engine.version} (its KV memory rule, scheduler defaults, CUDA graphs; {tables})"


def answer_sentence(rows: list[dict], rate: float, fixed_requests: int | None = None, engine: str | None = None) -> str:
    """The plan's answer in one sentence (`_answer`), then "Assumed: `engine`." where given (`engine_phrase`)."""
    said = _answer(rows, rate, fixed_requests)
    return f"{said} Assumed: {engine}." if engine else said


def _answer(rows: list[dict], rate: float, fixed_requests: int | None = None) -> str:
    """"Cheapest: 8 x H200 SXM as TP4 x 2, full_hbm (exact); sustains 5.1 req/s ...": the best
    passing row, or what came closest when none passes. `fixed_requests` (--requests): every run
    that long, which the sentence says is no steady-state verdict."""
    best = next((r for r in rows if r["rank"] == 1), None)
    if best is None:
        tried = [r for r in rows if r["status"] == "fail"]
        if not tried:
            return (f"Nothing passes at {rate:g} req/s: no configuration was simulated (each was pruned or ruled out by "
                    f"the screen; see the rows).")
        near = min(tried, key=lambda r: r["usd_per_hour"])
        return (f"Nothing passes at {rate:g} req/s. Cheapest tried: {near['gpus']} x {gpu_name(near['gpu'])} as "
                f"{near['layout']}, {near['policy']}: {near['reason']}; binds: {near['binding']}.")
    capped = ">= " if best["max_rate_capped"] else ""
    run = (f"steady state: {best['verdict_requests']:,} requests, {best['verdict_duration_s']:,.0f} s simulated"
           if best["verdict_requests"] else "")
    if fixed_requests:  # a transient: with long outputs the queue may not have built up yet
        run = (f"{fixed_requests:,} requests a run (--requests): a fixed run length, not a steady-state verdict; "
               f"it may overstate what is sustained")
    per_m = f", ${best['usd_per_million_tokens']:.2f} per million output tokens" if best["usd_per_million_tokens"] else ""
    binds = best["binding"] if best["binding"] and best["binding"] != "-" else "nothing up to the search cap"
    return (f"Cheapest: {best['gpus']} x {gpu_name(best['gpu'])} as {best['layout']}, {best['policy']} ({best['output']}); "
            f"at {rate:g} req/s p99 TTFT {_ms(best['ttft_p99_ms'])} / TPOT {_ms(best['tpot_p99_ms'])} ({run}); "
            f"sustains {capped}{best['max_rate_per_s']:.3g} req/s; ${best['usd_per_hour']:.2f}/h{per_m}; binds: {binds}.")


def fewest_sentence(rows: list[dict], rate: float, whole: bool) -> str | None:
    """"Fewest GPUs: 2 x B200 as TP2, full_hbm (exact) ...": the smallest count with an exact pass, its
    best-ranked row (None where nothing exact passes). `whole`: every count's front was searched
    (--pareto or --top 0); otherwise a count smaller than it whose candidates were left unsimulated
    (cheaper ones passed) may hold one, and the sentence says so."""
    exact = [r for r in rows if r["status"] == "pass" and r["output"] == "exact"]
    if not exact:
        return None
    n = min(r["gpus"] for r in exact)
    r = min((r for r in exact if r["gpus"] == n), key=lambda r: r["rank"])
    said = (f"Fewest GPUs for {rate:g} req/s: {n} x {gpu_name(r['gpu'])} as {r['layout']}, {r['policy']} (exact); "
            f"sustains {'>= ' if r['max_rate_capped'] else ''}{r['max_rate_per_s']:.3g} req/s; ${r['usd_per_hour']:.2f}/h")
    fewer = sum(x["gpus"] < n and x["status"] == "unsearched" for x in rows)
    if fewer and not whole:
        them = f"{fewer} configurations of fewer GPUs were" if fewer > 1 else "1 configuration of fewer GPUs was"
        return said + f" - of those simulated: {them} not (cheaper ones passed; --pareto searches every count)."
    return said + "."


def budget_label(r: dict) -> str:
    """" (2048 tokens)" for a row or front point whose token budget was searched, else ""."""
    return f" ({int(r['max_num_batched_tokens'])} tokens)" if r.get("max_num_batched_tokens") else ""


def pareto(rows: list[dict], mean_output_tokens: float) -> dict[int, list[dict]]:
    """Per GPU count, the passing configurations no other of that count beats on both output
    tokens/s per GPU (at its max rate) and tokens/s per user (1 / its p99 TPOT at the rate asked),
    a lossy one never beating an exact one (`sim.plan.front.Point.beats`):
    {count: [{layout, gpu, policy, output, tokens_per_s_per_gpu, tokens_per_s_per_user, max_rate_per_s,
    max_num_batched_tokens (None: the scenario's)}]}."""
    from .front import Point

    points: dict[int, list[dict]] = {}
    for r in rows:
        if r["status"] != "pass" or not r["tpot_p99_ms"]:
            continue
        points.setdefault(r["gpus"], []).append(dict(
            gpu=r["gpu"], layout=r["layout"], policy=r["policy"], output=r["output"], max_rate_per_s=r["max_rate_per_s"],
            max_num_batched_tokens=r.get("max_num_batched_tokens"),
            tokens_per_s_per_gpu=r["max_rate_per_s"] * mean_output_tokens / r["gpus"],
            tokens_per_s_per_user=1e3 / r["tpot_p99_ms"]))
    front = {}
    for n, ps in sorted(points.items()):
        at = [Point(p["tokens_per_s_per_gpu"], p["tokens_per_s_per_user"], p["output"] == "exact") for p in ps]
        keep = [p for p, a in zip(ps, at) if not any(b.beats(a) for b in at)]
        front[n] = sorted(keep, key=lambda p: -p["tokens_per_s_per_gpu"])
    return front


# Disaggregated serving's flags, per engine and role: vLLM's NixlConnector (docs/features/
# nixl_connector_usage.md: --kv-transfer-config with kv_role kv_both on both instances, behind a P/D
# proxy such as examples/disaggregated's toy_proxy_server.py); SGLang's --disaggregation-mode with the
# NIXL transfer backend (docs/advanced_features/pd_disaggregation.md, behind its mini load balancer).
DISAGG_FLAGS = {"vllm": """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'""",
                "sglang": "--disaggregation-mode {role} --disaggregation-transfer-backend nixl"}
# TensorRT-LLM's disaggregated serving is no flag of trtllm-serve: `trtllm-serve disaggregated -c CONFIG`
# with a YAML of context_servers / generation_servers (tensorrt_llm/commands/serve.py `disaggregated`,
# tensorrt_llm/llmapi/disagg_utils.py); each instance's own command is said so, no config invented.
DISAGG_NOTES = {"trtllm": "disaggregated: each instance in a trtllm-serve disaggregated -c config "
                          "(context_servers / generation_servers), not written here"}


def _sglang_fraction(base: Scenario, best: dict, tp: int) -> float | None:
    """The mem_fraction_static a plan under `engine: sglang` ran with (sim/device/engine_rules.py), else None."""
    if base.engine is None or base.engine.name != "sglang":
        return None
    from sim.device.engine_rules import sglang_fraction
    from sim.inputs import catalog

    mla = catalog.resolve_model(base.model).mla is not None
    return sglang_fraction(base.engine, base.scheduler, catalog.gpu(best["gpu"]).memory_bytes, tp, mla)[0]


def launch_lines(best: dict, base: Scenario, host_peak_bytes_per_gpu: float | None = None,
                 balancer: str = ROUND_ROBIN) -> dict[str, str]:
    """The engine commands for the best row (sim.plan.launch): {"vllm": ..., "sglang": ...}, plus
    "trtllm" where the base scenario runs under `engine: tensorrt-llm` (with the
    free_gpu_memory_fraction the plan ran with), or for a disaggregated one each engine's prefill and
    decode instances ("vllm prefill", ...). The host KV pool is the row's host peak (plan.csv
    host_peak_bytes, one GPU's, as every simulated figure) x the GPUs of an instance; a mixture of
    experts' replicas launch one server each (`launch_commands` moe). `balancer`: the one the plan
    simulated (`balanced`)."""
    from sim.inputs.catalog import resolve_model

    model = hf_model_id(base.model.name or "") or (base.model.name or "MODEL")
    util = getattr(base.engine, "gpu_memory_utilization", None) or 0.9
    s, m = base.scheduler, base.model
    moe = resolve_model(base.model).is_moe
    seqs = best.get("max_num_seqs") or s.max_num_seqs
    budget = best.get("max_num_batched_tokens") or s.max_num_batched_tokens
    host_offload_bytes = host_peak_bytes_per_gpu * best["tp"] if host_peak_bytes_per_gpu else host_peak_bytes_per_gpu
    trtllm = base.engine is not None and base.engine.name == "tensorrt-llm"
    trtllm_fraction = base.engine.free_gpu_memory_fraction if trtllm else None

    def commands(tp: int, dp: int, policy: str, offload: float | None, mixed: bool = s.mixed_prefill) -> dict[str, str]:
        return launch_commands(model, tp, dp, seqs, budget, util, s.chunked_prefill,
                               policy, offload, m.weight_dtype, m.kv_dtype, best.get("experts"), moe,
                               _sglang_fraction(base, best, tp), trtllm_fraction, mixed_chunk=mixed)

    if not best.get("prefill"):
        one_server = 1 if moe or best.get("experts") else best["dp"]  # else a server per replica (`launch_commands`)
        lines = balanced(commands(best["tp"], best["dp"], best["policy"], host_offload_bytes), balancer, one_server)
        lines = with_swa_ratio(with_context_flags(lines, base, instance_scenarios(base, best)), base)
        return {e: with_pipeline(e, line, int(best.get("pp") or 1)) for e, line in lines.items()}
    x, tp_p = parse_prefill_label(best["prefill"])
    pre, dec = instance_scenarios(base, best)
    out = {}
    for role, cmds in (("prefill", with_context_flags(commands(tp_p, x, "full_hbm", None, False), base, pre)),
                       ("decode", with_context_flags(commands(best["tp"], best["dp"], best["policy"], host_offload_bytes,
                                                              False), base, dec))):  # an instance of one phase mixes none
        cmds = with_swa_ratio(cmds, base)
        for engine, line in cmds.items():
            out[f"{engine} {role}"] = (with_flags(line, DISAGG_FLAGS[engine].replace("{role}", role))
                                       if engine in DISAGG_FLAGS else with_note(line, DISAGG_NOTES[engine]))
    return out


# each engine's flag for the longest sequence it serves: vLLM arg_utils.py --max-model-len, SGLang
# server_args.py --context-length, trtllm-serve --max_seq_len
CONTEXT_FLAGS = {"vllm": "--max-model-len", "sglang": "--context-length", "trtllm": "--max_seq_len"}


def with_context_flags(lines: dict[str, str], base: Scenario, instance) -> dict[str, str]:
    """The engines' lines (keyed by engine, "vllm" ...) with the context the scenario declares
    (engine.max_model_len, a number) on every one, or vLLM's auto-fit on vLLM's where it is shorter than
    the model's (`vllm_max_model_len` of `instance()`, the scenario of one instance the lines launch)."""
    declared = base.engine.max_model_len if base.engine is not None else None
    if isinstance(declared, int):
        return {e: with_flags(line, f"{CONTEXT_FLAGS[e]} {declared}") for e, line in lines.items()}
    if base.engine is None or base.engine.name != "vllm":
        return lines
    context = vllm_max_model_len(instance())
    return {**lines, "vllm": with_flags(lines["vllm"], f"--max-model-len {context}")} if context is not None else lines


def with_swa_ratio(lines: dict[str, str], base: Scenario) -> dict[str, str]:
    """The engines' lines with SGLang's --swa-full-tokens-ratio where the scenario sets it
    (engine.swa_full_tokens_ratio, the window pool the plan ran with); else `lines` (SGLang's default 0.8)."""
    ratio = base.engine.swa_full_tokens_ratio if base.engine is not None else None
    if ratio is None or "sglang" not in lines:
        return lines
    return {**lines, "sglang": with_flags(lines["sglang"], f"--swa-full-tokens-ratio {ratio:g}")}


def vllm_max_model_len(instance: Scenario) -> int | None:
    """The --max-model-len vLLM's line states for one instance of a plan row under `engine: vllm`
    without a declared context: vLLM's auto-fit (the plan runs its candidates so, `candidate_scenario`)
    where shorter than the model's context - vLLM would not start at the model's own
    (`decode.context.with_context_rule`); None where it would."""
    from sim.decode.context import build_context

    ctx = build_context(instance)
    return ctx.max_model_len if ctx.max_model_len is not None and ctx.max_model_len < ctx.model.context_tokens else None


def instance_scenarios(base: Scenario, best: dict):
    """The scenario of one instance a plan row launches, as functions that build it only when asked
    (`with_context_flags` fits vLLM's context on it): aggregated, one replica's; disaggregated, (the
    prefill instance's, the decode instance's)."""
    from sim.plan.candidates import PlanSpec, candidate_scenario
    from sim.plan.disagg import pool_scenarios
    from sim.plan.search import row_candidate

    spec = PlanSpec(1.0, 1.0, None, requests=1)
    if not best.get("prefill"):
        return lambda: candidate_scenario(base, row_candidate(best), 1.0, spec)
    pools = functools.cache(lambda: pool_scenarios(base, row_candidate(best), spec, 1.0))  # (make_prefill, make_decode)
    return lambda: pools()[0](1), lambda: pools()[1](1)


# the engines' own data-parallel balancers against the one the plan simulated (sim/serving/fleet.py):
# vLLM's --data-parallel-size routes to the lowest 4 x waiting + running (vllm/v1/engine/core_client.py
# DPLBAsyncMPClient); SGLang's --dp-size deals round-robin unless --load-balance-method shortest_queue
# (python/sglang/srt/managers/data_parallel_controller.py LoadBalanceMethod)
VLLM_DP_NOTE = {ROUND_ROBIN: "vLLM's --data-parallel-size balancer routes by load (4 x waiting + running), not "
                             "round-robin as planned: kvsim plan --balancer vllm plans for it",
                LEAST_OUTSTANDING: "vLLM's --data-parallel-size balancer routes to the lowest 4 x waiting + running, "
                                   "near the least-outstanding one planned (kvsim plan --balancer vllm for its own)"}
SGLANG_SHORTEST_QUEUE = "--load-balance-method shortest_queue"


def balanced(commands: dict[str, str], balancer: str, dp: int) -> dict[str, str]:
    """The engines' lines with their data-parallel balancer set or said against `balancer`, where
    they run `dp` > 1 replicas as one server (--data-parallel-size / --dp-size)."""
    out = dict(commands)
    if dp <= 1:
        return out
    if "vllm" in out and balancer in VLLM_DP_NOTE:
        out["vllm"] = with_note(out["vllm"], VLLM_DP_NOTE[balancer])
    if "sglang" in out and balancer != ROUND_ROBIN:
        out["sglang"] = with_flags(out["sglang"], SGLANG_SHORTEST_QUEUE)  # the fewest queued requests: load-aware
    return out
