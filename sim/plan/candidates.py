"""What `kvsim plan` searches: the request (rate, SLO, search settings), its candidates and their scenarios.

A candidate is a GPU kind x a GPU count N x a layout (tensor parallelism tp dividing N, N / tp = k
data-parallel replicas behind a load balancer: round-robin by default, each replica simulated alone
at rate / k - every k-th arrival of the Poisson stream, Erlang-k gaps, gamma with CV 1 / sqrt(k),
`replica_arrivals`; least-outstanding (`PlanSpec.balancer`) the k replicas simulated together as a
fleet, `sim.serving.fleet`) x a
KV policy (full_hbm, evict_only, tiered at hbm_ratio 0.25/0.5 and auto - tiering only under memory
pressure - with the scenario's other policy fields; with --access each tiered one also
with host_attention or split access). Before anything is simulated a layout is pruned when the model
cannot be sharded over tp GPUs (`ModelSpec.tp_problem`) or one GPU's weight shard plus the runtime
reserve exceeds its memory. Cost is N x an assumed $/GPU-hour (sim/catalog/prices.yaml, `--price`
overrides).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources

import yaml

from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.limits import (
    MAX_ARRIVAL_S,
    MAX_RATE_FACTOR,
    MAX_RATE_PER_S,
    MAX_SECONDS,
    MAX_TOKENS,
    MAX_USD_PER_GPU_HOUR,
    NODE_GPUS,
)
from sim.inputs.scenario import Scenario, scenario_from_dict
from sim.model.units import GB
from sim.serving.fleet import ROUND_ROBIN, check_balancer

DEFAULT_COUNTS = (1, 2, 4, 8)
TIERED_RATIOS = (0.25, 0.5, 0.75)
# by default tiered at 25% and 50% HBM and auto; 75% sits between 50% and full_hbm (`--policies tiered` adds it)
DEFAULT_POLICIES = ("full_hbm", "evict_only", "tiered:0.25", "tiered:0.5", "tiered:auto")
ACCESS = ("prefetch", "host_attention", "split", "sparse_fetch")  # a tiered policy's /ACCESS suffix (prefetch: none)
SPARSE_ACCESS = "prefetch,sparse_fetch"  # a sparse-attention model's tiered policies, by default (`default_access`)
MAX_COUNT = 64
MAX_REQUESTS_PLAN = 100_000
MAX_SEQS = 65_536
NEAR_FULL = 0.95  # a peak within 5% of capacity counts as that resource binding
# A mixture of experts' layouts beside tensor parallelism (None): its experts split whole over the group
# ("ep": vLLM --enable-expert-parallel, SGLang --ep-size), and with attention data-parallel over the
# group as well ("ep+dpa": each GPU attends its own sequences; SGLang --enable-dp-attention).
EP, EP_DPA = "ep", "ep+dpa"
EXPERT_LAYOUTS = (None, EP, EP_DPA)



@dataclass(frozen=True)
class PlanSpec:
    """What a configuration must do: `rate` requests/s with p99 TTFT <= ttft_s and p99 TPOT <= tpot_s."""

    rate: float
    ttft_s: float | None
    tpot_s: float | None
    requests: int | None = None  # per simulation; None: steady-state probes size their own (sim.serving.steady)
    max_factor: float = 4.0  # the max-rate search stops at max_factor x rate
    tolerance: float = 0.1  # ... or when the bracket's upper end is within 10% of its lower
    top: int = 5  # stop once this many configurations pass (cheapest first); 0: search every one
    balancer: str = ROUND_ROBIN  # how data-parallel replicas share the arrivals (sim.serving.fleet.BALANCERS)


@dataclass(frozen=True)
class Candidate:
    gpu: str
    count: int  # GPUs in all
    policy: str
    tp: int | None = None  # GPUs per replica (default: all of them); disaggregated: per decode instance
    prefill: tuple[int, int] | None = None  # disaggregated: (prefill instances, GPUs each); None: aggregated
    max_num_seqs: int | None = None  # the scheduler's cap per instance; None: the scenario's
    experts: str | None = None  # a mixture of experts' layout (`EXPERT_LAYOUTS`); None: experts split by TP
    pp: int = 1  # pipeline stages per replica, each of tp GPUs (`pipeline_layouts`)
    token_budget: int | None = None  # its max_num_batched_tokens per step (--max-num-batched-tokens); None: the scenario's

    @property
    def tp_size(self) -> int:
        return self.tp or self.count

    @property
    def parallel(self) -> dict:
        """The scenario's `parallel:` of one replica (decode instance)."""
        tp = self.tp_size
        if self.experts == EP:
            return {"tp": tp, "ep": tp}
        if self.experts == EP_DPA:
            return {"tp": tp, "ep": tp, "attention_dp": tp}
        return {"tp": tp, "pp": self.pp} if self.pp > 1 else {"tp": tp}

    @property
    def group(self) -> int:
        """GPUs per replica (per decode instance): tp x pp."""
        return self.tp_size * self.pp

    @property
    def replicas(self) -> int:
        """Replicas; disaggregated: decode instances."""
        return (self.count - (self.prefill[0] * self.prefill[1] if self.prefill else 0)) // self.group

    @property
    def layout(self) -> str:
        """"TP4 x 2": two replicas of a 4-GPU tensor-parallel group; "TP8": one; "TP2 PP2 x 2": two
        replicas of two pipeline stages of two GPUs each; "1P(TP2) + 3D(TP2)":
        one prefill instance and three decode instances of two GPUs each."""
        if self.prefill:
            return f"{self.prefill[0]}P(TP{self.prefill[1]}) + {self.replicas}D(TP{self.tp_size})"
        tp = self.tp_size
        group = {EP: f"TP{tp}+EP{tp}", EP_DPA: f"DPA{tp}+EP{tp}"}.get(self.experts, f"TP{tp}")
        group += f" PP{self.pp}" if self.pp > 1 else ""
        return group + (f" x {self.replicas}" if self.replicas > 1 else "")


def lossy(policy: str, base: Scenario) -> bool:
    """A policy that deletes tokens (evict_only, or tiered with the scenario's evict_ratio > 0)
    changes what the model writes; every other keeps each token exact."""
    name = policy.partition("/")[0]
    return name == "evict_only" or (name.startswith("tiered") and base.policy.evict_ratio > 0)


# ---- inputs ----------------------------------------------------------------------------------
def parse_list(text: str | None, field: str) -> list[str]:
    items = [t.strip() for t in (text or "").split(",")]
    if not text or not all(items):
        raise ConfigError(f"expected a comma-separated list, got {text!r}", field=field)
    return items


def parse_gpus(text: str | None) -> list[str]:
    if text is None:
        return list(catalog.gpus())
    out = []
    for name in parse_list(text, "--gpus"):
        try:
            g = catalog.gpu(name).name
        except ConfigError as err:
            raise ConfigError(err.message, field="--gpus") from None
        if g not in out:
            out.append(g)
    return out


def parse_counts(text: str | None) -> list[int]:
    if text is None:
        return list(DEFAULT_COUNTS)
    out = []
    for item in parse_list(text, "--counts"):
        if not item.isdigit() or not 1 <= int(item) <= MAX_COUNT:
            raise ConfigError(f"expected GPU counts from 1 to {MAX_COUNT}, got {item!r}", field="--counts")
        if int(item) not in out:
            out.append(int(item))
    return sorted(out)


def _whole_numbers(text: str, field: str, most: int) -> list[int]:
    """A flag's comma-separated whole numbers from 1 to `most`, each once, sorted."""
    out = []
    for item in parse_list(text, field):
        if not item.isdigit() or not 1 <= int(item) <= most:
            raise ConfigError(f"expected whole numbers from 1 to {most:,}, got {item!r}", field=field)
        out += [int(item)] if int(item) not in out else []
    return sorted(out)


def parse_seqs(text: str | None) -> list[int | None]:
    """--max-num-seqs: caps on running sequences to search, or [None] (the scenario's)."""
    return [None] if text is None else _whole_numbers(text, "--max-num-seqs", MAX_SEQS)


def parse_budgets(text: str | None, seqs: list[int | None], base: Scenario) -> list[int | None]:
    """--max-num-batched-tokens: token budgets per step to search, or [None] (the scenario's). Each must be
    at least every max_num_seqs searched, as vLLM requires (vllm/config/scheduler.py: max_num_batched_tokens
    >= max_num_seqs): a step schedules one token of every running decode."""
    if text is None:
        return [None]
    out = _whole_numbers(text, "--max-num-batched-tokens", MAX_TOKENS)
    caps = max(s or base.scheduler.max_num_seqs for s in seqs)
    if out[0] < caps:
        raise ConfigError(f"{out[0]:,} is below max_num_seqs {caps:,}: a step must have a token for every running "
                          f"request (vLLM refuses max_num_batched_tokens < max_num_seqs)", field="--max-num-batched-tokens")
    return out


def default_access(base: Scenario) -> str | None:
    """--access when none is given: a sparse-attention model's tiered policies both prefetching their host
    tokens and fetching only the indexer's picks (sparse_fetch, the scenario's fetch_copy); else None."""
    from sim.inputs.catalog import resolve_model
    from sim.model.layers import SPARSE

    return SPARSE_ACCESS if SPARSE in resolve_model(base.model).kind_counts else None


def parse_policies(text: str | None, access: str | None = None) -> list[str]:
    """full_hbm, evict_only, tiered (the three default hbm_ratios and auto), tiered:RATIO (0 < RATIO <= 1) or
    tiered:auto (sim/tiering/pressure.py), a tiered one optionally as tiered:X/ACCESS (host_attention, split).
    `access` (--access, a list of ACCESS) gives every tiered policy without a suffix each strategy listed."""
    accesses = [None]
    if access is not None:
        accesses = []
        for a in parse_list(access, "--access"):
            if a not in ACCESS:
                raise ConfigError(f"expected {', '.join(ACCESS)}, got {a!r}", field="--access")
            accesses.append(None if a == "prefetch" else a)
    out: list[str] = []
    for item in parse_list(text, "--policies") if text is not None else DEFAULT_POLICIES:
        item, _, suffix = item.partition("/")
        if item in ("full_hbm", "evict_only"):
            if suffix:
                raise ConfigError(f"an access strategy applies to tiered policies, got {item}/{suffix}", field="--policies")
            out += [item] if item not in out else []
            continue
        if item == "tiered":
            names = [f"tiered:{r:g}" for r in TIERED_RATIOS] + ["tiered:auto"]
        elif item == "tiered:auto":
            names = [item]
        elif item.startswith("tiered:"):
            try:
                r = float(item.split(":", 1)[1])
            except ValueError:
                r = math.nan
            if not 0.0 < r <= 1.0:
                raise ConfigError(f"expected tiered:RATIO with 0 < RATIO <= 1 or tiered:auto, got {item!r}",
                                  field="--policies")
            names = [f"tiered:{r:g}"]
        else:
            raise ConfigError(f"expected full_hbm, evict_only, tiered, tiered:RATIO or tiered:auto, got {item!r}",
                              field="--policies")
        if suffix and suffix not in ACCESS:
            raise ConfigError(f"expected {item}/ACCESS with ACCESS one of {', '.join(ACCESS)}, got {suffix!r}",
                              field="--policies")
        for a in ([None if suffix == "prefetch" else suffix] if suffix else accesses):
            out += [n + (f"/{a}" if a else "") for n in names if n + (f"/{a}" if a else "") not in out]
    return out


def load_prices() -> dict[str, tuple[float, str]]:
    """{gpu: ($/GPU-hour, source)} from sim/catalog/prices.yaml."""
    data = yaml.safe_load(resources.files("sim").joinpath("catalog", "prices.yaml").read_text())
    return {catalog.gpu(e["gpu"]).name: (float(e["usd_per_gpu_hour"]), str(e["source"])) for e in data["prices"]}


def parse_prices(items: list[str]) -> dict[str, tuple[float, str]]:
    """The catalog's prices with `GPU=DOLLARS_PER_HOUR` overrides."""
    prices = load_prices()
    for item in items:
        name, sep, value = item.partition("=")
        try:
            usd = float(value.strip().lstrip("$"))
        except ValueError:
            usd = math.nan
        if not sep or not name.strip() or not math.isfinite(usd) or usd < 0:
            raise ConfigError(f"expected GPU=DOLLARS_PER_HOUR, e.g. h100-sxm=2.5, got {item!r}", field="--price")
        if usd > MAX_USD_PER_GPU_HOUR:
            raise ConfigError(f"expected at most {MAX_USD_PER_GPU_HOUR:,.0f} $ per GPU-hour, got {item!r}", field="--price")
        try:
            g = catalog.gpu(name).name
        except ConfigError as err:
            raise ConfigError(err.message, field="--price") from None
        prices[g] = (usd, f"--price {g}={usd:g}")
    return prices


def check_spec(spec: PlanSpec) -> None:
    """Every figure of the search within a range that means something; each refusal one line."""
    ms = lambda s: None if s is None else s * 1e3
    for field, value in (("--rate", spec.rate), ("--ttft-p99-ms", ms(spec.ttft_s)), ("--tpot-p99-ms", ms(spec.tpot_s))):
        if value is not None and (not math.isfinite(value) or value <= 0):
            raise ConfigError(f"expected a positive number, got {value:g}", field=field)
    for field, value in (("--ttft-p99-ms", ms(spec.ttft_s)), ("--tpot-p99-ms", ms(spec.tpot_s))):
        if value is not None and value > MAX_SECONDS * 1e3:
            raise ConfigError(f"expected at most {MAX_SECONDS * 1e3:,.0f} ms (an hour), got {value:g}", field=field)
    check_balancer(spec.balancer)
    if spec.ttft_s is None and spec.tpot_s is None:
        raise ConfigError("give --ttft-p99-ms, --tpot-p99-ms or both (or a scenario with slo:)", field="--ttft-p99-ms")
    if spec.requests is not None and not 1 <= spec.requests <= MAX_REQUESTS_PLAN:
        raise ConfigError(f"expected 1 to {MAX_REQUESTS_PLAN:,} requests, got {spec.requests}", field="--requests")
    if not (math.isfinite(spec.max_factor) and 1.0 <= spec.max_factor <= MAX_RATE_FACTOR):
        raise ConfigError(f"expected 1 to {MAX_RATE_FACTOR:g}, got {spec.max_factor:g}", field="--max-factor")
    if spec.rate * spec.max_factor > MAX_RATE_PER_S:
        raise ConfigError(f"expected at most {MAX_RATE_PER_S:g} req/s, --max-factor times it included (the search "
                          f"probes up to {spec.rate * spec.max_factor:g}), got {spec.rate:g}", field="--rate")
    if spec.requests is not None and spec.requests / spec.rate > MAX_ARRIVAL_S / 2:  # the last of the requests arrives about then
        raise ConfigError(f"expected at least {2 * spec.requests / MAX_ARRIVAL_S:.3g} req/s: {spec.requests:,} requests "
                          f"at {spec.rate:g} req/s would arrive over {spec.requests / spec.rate:.3g} s, beyond the "
                          f"horizon a run may span ({MAX_ARRIVAL_S:g} s)", field="--rate")


# ---- candidates --------------------------------------------------------------------------------
def replica_arrivals(rate: float, spread: int, requests: int, seed: int | None) -> dict:
    """The arrivals one of `spread` instances sees when a round-robin load balancer deals a Poisson
    stream out in turn: every spread-th arrival, so gaps are the sum of `spread` exponentials (Erlang,
    gamma with CV 1 / sqrt(spread)) at `rate` (its share); one instance sees the Poisson stream."""
    kind = {"kind": "poisson"} if spread <= 1 else {"kind": "gamma", "cv": 1.0 / math.sqrt(spread)}
    return {**kind, "rate_per_s": float(rate), "requests": requests, **({"seed": seed} if seed is not None else {})}


def candidate_scenario(base: Scenario, cand: Candidate, rate: float, spec: PlanSpec, requests: int | None = None,
                       spread: int | None = None) -> Scenario:
    """One replica of `cand` (tp = cand.tp_size) in the base scenario: `replica_arrivals` at `rate` (the
    replica's share) dealt over `spread` instances (default its replicas), `requests` of them (default
    spec.requests, else 1), step detail and the plan's SLO. Hardware overrides that belong to the base GPU (link, host, copy engines) are kept
    only for that GPU; a measured profile is not used."""
    data = base.model_dump(mode="json")
    hw = dict(data.get("hardware") or {})
    hw.pop("profile", None)
    if catalog.gpu(hw.get("gpu", base.hardware.gpu)).name != cand.gpu:
        for key in ("link", "host", "copy_engines"):
            hw.pop(key, None)
    hw["gpu"] = cand.gpu
    policy = dict(data.get("policy") or {})
    name, _, access = cand.policy.partition("/")
    if name.startswith("tiered:"):
        ratio = name.split(":", 1)[1]
        policy.update(kind="tiered", hbm_ratio=ratio if ratio == "auto" else float(ratio))
        if access:  # host access pipelines its prefetched part per layer
            policy.update(access=access, prefetch="layerwise_async")
    else:
        policy["kind"] = name
    work = dict(data["workload"])
    old = base.workload.arrivals
    seed = getattr(old, "seed", None)
    work["arrivals"] = replica_arrivals(rate, cand.replicas if spread is None else spread, requests or spec.requests or 1,
                                        seed)
    slo = {k: v * 1000.0 for k, v in (("ttft_ms", spec.ttft_s), ("tpot_ms", spec.tpot_s)) if v is not None}
    if cand.max_num_seqs:
        data["scheduler"] = {**(data.get("scheduler") or {}), "max_num_seqs": cand.max_num_seqs}
    if cand.token_budget:
        data["scheduler"] = {**(data.get("scheduler") or {}), "max_num_batched_tokens": cand.token_budget}
    if base.engine is not None and base.engine.name == "vllm" and base.engine.max_model_len is None:
        data["engine"] = {**data["engine"], "max_model_len": "auto"}  # vLLM's auto-fit: the launch line states it
    data.update(hardware=hw, policy=policy, workload=work, parallel=cand.parallel,
                sim={**(data.get("sim") or {}), "detail": "step"}, slo=slo)
    experts = f"-{cand.experts.replace('+', '-')}" if cand.experts else ""
    stages = f"-pp{cand.pp}" if cand.pp > 1 else ""
    data["name"] = f"plan-{cand.gpu}-x{cand.count}-tp{cand.tp_size}{stages}{experts}-{cand.policy.replace(':', '-').replace('/', '-')}"
    return scenario_from_dict(data, "plan")


def prune(base: Scenario, gpu: str, count: int, experts: str | None = None, pp: int = 1) -> str | None:
    """Why `count` x `gpu` (tp = count, the experts' layout `experts`; `pp` stages of them) cannot hold
    the model at all, or None."""
    from sim.decode.context import build_context
    from sim.inputs.catalog import resolve_model

    if count > NODE_GPUS:
        return f"cannot shard: tp {count} spans more than one {NODE_GPUS}-GPU node (not modelled)"
    cand = Candidate(gpu, count * pp, "full_hbm", count, experts=experts, pp=pp)
    problem = resolve_model(base.model).parallel_problem(*(cand.parallel.get(k, 1) for k in ("tp", "ep", "attention_dp")))
    if problem:
        return f"cannot shard: {problem[1]}"
    sc = candidate_scenario(base, cand, 1.0, PlanSpec(1.0, 1.0, None, requests=1))
    try:
        ctx = build_context(sc)
    except ConfigError as err:  # vLLM's KV budget holds no request of the workload's (`with_context_rule`)
        return f"does not fit: {err.message}"
    need = ctx.weights_bytes + ctx.hw.runtime_reserve_bytes
    if need > ctx.hw.memory_bytes:
        return (f"does not fit: weights {ctx.weights_bytes / GB:,.1f} GB + reserve {ctx.hw.runtime_reserve_bytes / GB:,.1f} GB "
                f"per GPU > {ctx.hw.memory_bytes / GB:,.1f} GB HBM")
    return None


def feasible_splits(base: Scenario, gpu: str, count: int) -> list[int] | str:
    """Every tensor-parallel size that divides `count`, fits one node (NODE_GPUS) and holds the model
    (each layout count / tp replicas of it), or why even the largest such group cannot hold it."""
    largest = max(tp for tp in range(1, min(count, NODE_GPUS) + 1) if count % tp == 0)
    why_all = prune(base, gpu, largest)
    if why_all:
        return why_all if largest == count else f"{why_all} (a group is at most one {NODE_GPUS}-GPU node)"
    return [tp for tp in range(1, largest + 1) if count % tp == 0 and (tp == largest or prune(base, gpu, tp) is None)]


def pipeline_layouts(base: Scenario, gpu: str, count: int) -> list[tuple[int, int]]:
    """(tp, pp) layouts with pipeline stages to search for `count` GPUs: only where the GPUs reach each
    other over PCIe alone, as vLLM's docs advise (docs/serving/parallelism_scaling.md: pipeline
    parallelism "is also preferable on GPUs without NVLink, such as L40S", tensor parallelism having
    the heavier communication); pp >= 2 stages of tp GPUs, tp x pp dividing `count` within one node,
    for a model whose layers split into stages (`ModelSpec.pipeline_problem`), where a stage holds its
    weights (`prune`), and where stages help capacity: one group of tp GPUs alone would give its
    weights at least PIPELINE_WEIGHT_SHARE of its HBM (or cannot hold them). A model that leaves most
    of a tp group's memory to K/V runs as replicas of it instead (a replica reads its weights once a
    step, a stage once per batch in flight)."""
    from sim.inputs.catalog import interconnect, resolve_model

    if interconnect(catalog.gpu(gpu).interconnect).nvlink or base.scheduler.preemption == "swap":
        return []
    spec = resolve_model(base.model)
    out = []
    for tp in (1, 2, 4, 8):
        if tp > min(count, NODE_GPUS) // 2 or spec.tp_problem(tp) or _weights_share(base, gpu, tp) < PIPELINE_WEIGHT_SHARE:
            continue
        for pp in (2, 4, 8):
            group = tp * pp
            if group > min(count, NODE_GPUS) or count % group or spec.pipeline_problem(pp):
                continue
            if prune(base, gpu, tp, pp=pp) is None:
                out.append((tp, pp))
    return sorted(out, key=lambda x: (x[1], x[0]))


PIPELINE_WEIGHT_SHARE = 0.5  # stages are tried where one tp group's weights take at least half its HBM


def _weights_share(base: Scenario, gpu: str, tp: int) -> float:
    """Weights per GPU of one `tp`-GPU group over its HBM (above 1: it cannot hold them)."""
    from sim.decode.context import build_context

    sc = candidate_scenario(base, Candidate(gpu, tp, "full_hbm", tp), 1.0, PlanSpec(1.0, 1.0, None, requests=1))
    try:
        ctx = build_context(sc)
    except ConfigError:  # vLLM's KV budget holds no request of the workload's: the group cannot serve it
        return float("inf")
    return ctx.weights_bytes / ctx.hw.memory_bytes


def expert_layouts(base: Scenario, gpu: str, tp: int) -> list[str | None]:
    """The experts' layouts of a `tp`-GPU group to search: tensor parallelism (None) always; for a
    mixture-of-experts model over two GPUs or more, also expert parallelism and expert parallelism
    with data-parallel attention, each where it shards and fits (`prune`)."""
    from sim.inputs.catalog import resolve_model

    if tp < 2 or not resolve_model(base.model).is_moe:
        return [None]
    return [None] + [e for e in (EP, EP_DPA) if prune(base, gpu, tp, e) is None]
