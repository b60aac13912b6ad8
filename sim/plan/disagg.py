"""Disaggregated prefill/decode: x prefill instances and y decode instances of one GPU kind, each
request's prompt K/V moved from its prefill instance to its decode instance over the interconnect.

- A prefill instance serves prompts only: the candidate's scenario with one output token, at rate / x
  (requests spread round-robin). Its TTFT plus the K/V transfer is the request's TTFT.
- The transfer: the prompt's K/V for the whole model (all layers; each tensor-parallel rank sends its
  shard, min(tp_p, tp_d) streams in parallel) at the fabric's per-GPU rate plus one latency
  (`kv_transfer_s`; catalog interconnects.yaml `kv_transfer`: the GPU's NVLink within a node of
  NODE_GPUS, InfiniBand beyond it).
- A decode instance serves requests that arrive prefilled (`simulate_serving(prefilled=True)`): they
  decode from their first step, holding their prompt's K/V, at rate / y, tiered as the policy says.
  Its TPOT - the wait for admission included - is the request's.
- The pools are simulated apart, each a steady-state probe: the decode pool's arrivals are taken as
  a Poisson stream (the prefill pool's output is a superposition of x streams, smoothed by the
  transfer), each pool's dealt round-robin over its instances (`candidates.replica_arrivals`), and a
  request's TTFT target less the longest transfer is the prefill probe's target.

Costs are per GPU-hour as for any layout (x tp_p + y tp_d GPUs). Ranking puts an aggregated layout
ahead of a disaggregated one at the same $/hour, so aggregated stays the answer where it wins.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.limits import NODE_GPUS
from sim.inputs.requests import build_requests
from sim.inputs.scenario import Scenario

# NODE_GPUS (sim/inputs/limits.py): GPUs that share one NVLink domain (an HGX board); more spread the pools over nodes


@dataclass(frozen=True)
class Split:
    """x prefill instances of tp_p GPUs and y decode instances of tp_d GPUs."""

    prefill: int
    tp_p: int
    decode: int
    tp_d: int

    @property
    def gpus(self) -> int:
        return self.prefill * self.tp_p + self.decode * self.tp_d

    @property
    def label(self) -> str:
        return f"{self.prefill}P(TP{self.tp_p}) + {self.decode}D(TP{self.tp_d})"


def splits(tps: list[int], count: int) -> list[Split]:
    """Every split of `count` GPUs into x >= 1 prefill instances of tp_p and y >= 1 decode instances
    of tp_d, each tp one that holds the model (`tps`)."""
    out = []
    for tp_p in tps:
        for tp_d in tps:
            for x in range(1, count // tp_p + 1):
                rest = count - x * tp_p
                if rest >= tp_d and rest % tp_d == 0:
                    out.append(Split(x, tp_p, rest // tp_d, tp_d))
    return out


@dataclass(frozen=True)
class Fabric:
    name: str
    bytes_per_s: float  # per GPU, one direction
    latency_s: float
    source: str


def fabric(gpu: str, count: int) -> Fabric:
    """The fabric a request's K/V crosses between the pools: the GPU's NVLink (or PCIe) within a node
    of NODE_GPUS, InfiniBand between nodes (catalog interconnects.yaml `kv_transfer`)."""
    data = catalog.kv_transfer()
    if count > NODE_GPUS:
        e = data["between_nodes"]
        return Fabric(e["name"], float(e["bytes_per_s"]), float(e["latency_s"]), e["source"])
    ic = catalog.interconnect(catalog.gpu(gpu).interconnect)
    e = data["within_node"]
    return Fabric(ic.name, ic.bus_bytes_per_s, float(e["latency_s"]), f"{ic.name}: {ic.source.strip()} {e['source']}")


def kv_transfer_s(kv_bytes_per_token: float, prompt_tokens: float, split: Split, fab: Fabric) -> float:
    """One request's prompt K/V from a prefill to a decode instance: latency + prompt x the whole
    model's KV bytes per token / (min(tp_p, tp_d) streams x the per-GPU rate)."""
    return fab.latency_s + prompt_tokens * kv_bytes_per_token / (min(split.tp_p, split.tp_d) * fab.bytes_per_s)


def model_kv_bytes_per_token(base: Scenario) -> float:
    """The whole model's K/V per token (every layer and KV head, unsharded): what a request moves."""
    from sim.decode.context import build_context

    return build_context(base.model_copy(update={"parallel": base.parallel.model_copy(update={"tp": 1, "pp": 1})})).kv_bytes_per_token


def longest_transfer_s(base: Scenario, split: Split, gpu: str) -> float:
    prompts = build_requests(base.workload).prompt_tokens
    return kv_transfer_s(model_kv_bytes_per_token(base), float(prompts.max()), split, fabric(gpu, split.gpus))


# ---- probes and the screen of a disaggregated candidate ------------------------------------------
def pool_candidates(cand):
    """(one prefill instance, one decode instance) of a disaggregated `cand`, each as an aggregated
    candidate: the prefill instance full_hbm on its own GPUs, the decode instance as `cand` runs it."""
    from .candidates import Candidate

    tp_p = cand.prefill[1]
    return (Candidate(cand.gpu, tp_p, "full_hbm", max_num_seqs=cand.max_num_seqs, token_budget=cand.token_budget),
            Candidate(cand.gpu, cand.tp_size, cand.policy, max_num_seqs=cand.max_num_seqs, token_budget=cand.token_budget))


def pool_scenarios(base: Scenario, cand, spec, rate: float):
    """(make_prefill(n), make_decode(n)) for one configuration at `rate`: a prefill instance at rate / x
    (one output token, full_hbm: its K/V leaves for the decode pool), a decode instance at rate / y,
    each dealt its pool's share round-robin (`candidates.replica_arrivals`)."""
    from .candidates import candidate_scenario

    x = cand.prefill[0]
    pre, dec = pool_candidates(cand)

    def make_prefill(n: int) -> Scenario:
        sc = candidate_scenario(base, pre, rate / x, spec, requests=n, spread=x)
        return sc.model_copy(update={"workload": sc.workload.model_copy(update={"reasoning_tokens": 1})})

    return make_prefill, (lambda n: candidate_scenario(base, dec, rate / cand.replicas, spec, requests=n,
                                                       spread=cand.replicas))


def split_of(cand) -> Split:
    return Split(cand.prefill[0], cand.prefill[1], cand.replicas, cand.tp_size)


def disagg_probe(base: Scenario, cand, spec, rate: float, hint_s: float):
    """Both pools at `rate`: the prefill probe against the TTFT target less the longest transfer, the
    decode probe against the TPOT target; one Probe whose parts are the two (sim.plan.probe.Probe)."""
    from sim.serving.steady import Percentile

    from .probe import Probe, steady_probe

    transfer = longest_transfer_s(base, split_of(cand), cand.gpu)
    make_prefill, make_decode = pool_scenarios(base, cand, spec, rate)
    x, y = cand.prefill[0], cand.replicas
    ttft = None if spec.ttft_s is None else spec.ttft_s - transfer
    if ttft is not None and ttft <= 0:
        raise ConfigError(f"the K/V transfer alone ({transfer * 1e3:,.1f} ms) exceeds the TTFT target")
    pre = steady_probe(make_prefill, rate / x, ttft, None, max(hint_s / 50, 0.05), spec.requests)
    dec = steady_probe(make_decode, rate / y, None, spec.tpot_s, hint_s, spec.requests, prefilled=True)
    stats = dict(dec.stats)
    for key in ("ttft_p50", "ttft_p90", "ttft_p99"):  # a request's TTFT: its prefill, then its K/V's transfer
        p = pre.stats.get(key)
        stats[key] = Percentile(*(None if v is None else v + transfer for v in (p.value_s, p.lo_s, p.hi_s))) if p \
            else Percentile(None)
    failed = next((p for p in (pre, dec) if not p.passed), None)
    out = Probe(rate, (failed or dec).summary, requests=pre.requests + dec.requests, measured=min(pre.measured, dec.measured),
                window_s=min(pre.window_s, dec.window_s), duration_s=max(pre.duration_s, dec.duration_s),
                runs=pre.runs + dec.runs, end=next((p.end for p in (pre, dec) if p.end != "measured"), "measured"),
                stats=stats if pre.stats and dec.stats else {}, e2e_mean_s=dec.e2e_mean_s,
                misses=[(k, f"prefill pool: {t}") for k, t in pre.misses] + [(k, f"decode pool: {t}") for k, t in dec.misses])
    out.parts = [("prefill", pre), ("decode", dec)]
    out.pool_failed = None if failed is None else ("prefill" if failed is pre else "decode")
    if pre.goodput_share is not None and dec.goodput_share is not None:
        out.goodput_share = min(pre.goodput_share, dec.goodput_share)
    return out


def screen_disagg(base: Scenario, cand, spec, curves: dict) -> tuple[object, float, str]:
    """(the decode instance's curve, the configuration's estimated max rate, what binds): the smaller
    of x prefill instances' and y decode instances' rates (`screen.prefill_rate`, `screen.curve`)."""
    from .candidates import Candidate, candidate_scenario
    from .screen import curve, prefill_rate

    x, tp_p = cand.prefill
    if "kv_transfer" not in curves:  # the same for every split: the whole model's K/V and the longest prompt
        curves["kv_transfer"] = (model_kv_bytes_per_token(base), float(build_requests(base.workload).prompt_tokens.max()))
    per_token, prompt = curves["kv_transfer"]
    transfer = kv_transfer_s(per_token, prompt, split_of(cand), fabric(cand.gpu, cand.count))
    key_p = ("prefill", cand.gpu, tp_p, transfer, cand.max_num_seqs, cand.token_budget)
    key_d = ("decode", cand.gpu, cand.tp_size, cand.policy, cand.max_num_seqs, cand.token_budget)
    if key_p not in curves:
        sc = candidate_scenario(base, Candidate(cand.gpu, tp_p, "full_hbm", max_num_seqs=cand.max_num_seqs,
                                                token_budget=cand.token_budget), spec.rate / x, spec)
        ttft = None if spec.ttft_s is None else spec.ttft_s - transfer
        curves[key_p] = (0.0, 0.0, "interconnect (K/V transfer)") if ttft is not None and ttft <= 0 else prefill_rate(sc, ttft)
    if key_d not in curves:
        dec = Candidate(cand.gpu, cand.tp_size, cand.policy, max_num_seqs=cand.max_num_seqs, token_budget=cand.token_budget)
        curves[key_d] = curve(candidate_scenario(base, dec, spec.rate / cand.replicas, spec), decode_only=True)
    pre_rate, _, pre_binds = curves[key_p]
    dec = curves[key_d]
    dec_rate, dec_binds = dec.max_rate(None, spec.tpot_s)
    if x * pre_rate <= cand.replicas * dec_rate:
        return dec, x * pre_rate, f"prefill pool: {pre_binds}"
    return dec, cand.replicas * dec_rate, f"decode pool: {dec_binds}"
