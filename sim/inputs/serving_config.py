"""The scenario's serving sections: `workload.arrivals`, `scheduler` and `slo` (pydantic, frozen,
extra keys forbidden, as the rest of the scenario). Absent arrivals: today's closed batch."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from .limits import (
    MAX_BATCH,
    MAX_BYTES,
    MAX_RATE_PER_S,
    MAX_REQUESTS,
    MAX_SECONDS,
    MAX_SEED,
    MAX_TEXT_CHARS,
    MAX_TOKENS,
)
from .quiet_defaults import QuietDefaults
from .strict import Strict

MAX_CV = 100.0  # coefficient of variation of gamma inter-arrival times (1: Poisson; vLLM's burstiness = 1 / cv^2)
MS_PER_S = 1000.0
# vLLM's defaults (vllm/config SchedulerConfig): max_num_seqs 256; max_num_batched_tokens 8192 with chunked prefill
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192


class PoissonArrivals(Strict):
    """Exponential inter-arrival times at `rate_per_s`; the first request at t = 0 (as `vllm bench serve`)."""

    kind: Literal["poisson"]
    rate_per_s: float = Field(gt=0.0, le=MAX_RATE_PER_S)
    requests: int = Field(ge=1, le=MAX_REQUESTS)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)  # default: workload.seed


class GammaArrivals(Strict):
    """Gamma inter-arrival times with mean 1 / rate_per_s and coefficient of variation `cv`
    (shape 1 / cv^2: cv 1 is Poisson, larger is burstier)."""

    kind: Literal["gamma"]
    rate_per_s: float = Field(gt=0.0, le=MAX_RATE_PER_S)
    cv: float = Field(gt=0.0, le=MAX_CV)
    requests: int = Field(ge=1, le=MAX_REQUESTS)
    seed: int | None = Field(None, ge=0, le=MAX_SEED)


class ClosedLoopArrivals(Strict):
    """`concurrency` clients, each sending its next request the moment its last one finishes
    (`vllm bench serve --max-concurrency`), `requests` in all; the first `concurrency` at t = 0."""

    kind: Literal["closed_loop"]
    concurrency: int = Field(ge=1, le=MAX_BATCH)
    requests: int = Field(ge=1, le=MAX_REQUESTS)


class TraceArrivals(Strict):
    """A CSV with the columns arrival_s, prompt_tokens, output_tokens (one request a row); a
    relative path is taken relative to the scenario file."""

    kind: Literal["trace"]
    path: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)


Arrivals = Annotated[Union[PoissonArrivals, GammaArrivals, ClosedLoopArrivals, TraceArrivals], Field(discriminator="kind")]
ARRIVAL_KINDS = ("poisson", "gamma", "closed_loop", "trace")  # the tags pydantic puts in an error's location


class SchedulerCfg(Strict, QuietDefaults):
    """Continuous batching as vLLM's scheduler does it: each step runs every running decode plus
    prefill chunks up to `max_num_batched_tokens`; FCFS admission while memory allows."""

    QUIET_DEFAULTS = {"preemption": "recompute", "swap_space_bytes": None,  # swap off: dumps as before it existed
                      "admission": "on_demand", "mixed_prefill": True, "schedule_conservativeness": 1.0}

    max_num_seqs: int = Field(DEFAULT_MAX_NUM_SEQS, ge=1, le=MAX_BATCH)
    max_num_batched_tokens: int = Field(DEFAULT_MAX_NUM_BATCHED_TOKENS, ge=1, le=MAX_TOKENS)
    chunked_prefill: bool = True  # off: a prompt is prefilled whole in one step or waits
    # what a preempted request's K/V becomes (vLLM's preemption_mode): dropped and prefilled again
    # (recompute), or copied to host memory and back (swap; `sim/serving/swap.py`)
    preemption: Literal["recompute", "swap"] = "recompute"
    # host bytes per GPU that swapped K/V may take (vLLM's --swap-space); None: all host memory the
    # running requests' T1/T2 and other swapped requests leave
    swap_space_bytes: float | None = Field(None, gt=0.0, le=MAX_BYTES)
    # what admission holds a request to: its K/V as it grows, preempting when the running ones
    # outgrow memory (on_demand: vLLM, SGLang), or KV blocks for its whole length - prompt + output -
    # reserved at admission, so nothing is ever preempted (no_evict: TensorRT-LLM's default capacity
    # policy GUARANTEED_NO_EVICT, tensorrt_llm/llmapi/llm_args.py SchedulerConfig), or on demand with
    # a decaying share of the running requests' remaining outputs kept free (reserve_ratio: SGLang's
    # new_token_ratio, `sim/serving/new_token_ratio.py`)
    admission: Literal["on_demand", "no_evict", "reserve_ratio"] = "on_demand"
    # prefill chunks share a step with the running decodes (vLLM, TensorRT-LLM); off: a step with a
    # prefill runs it alone and the decodes wait for the next (SGLang without --enable-mixed-chunk)
    mixed_prefill: bool = True
    # reserve_ratio's SGLang schedule_conservativeness as it takes effect (its flag, x 0.3 under DP attention):
    # the share of the running requests' remaining outputs admission keeps free starts at 0.7 x this
    schedule_conservativeness: float = Field(1.0, gt=0.0, le=10.0)

    @model_validator(mode="after")
    def _swap_space(self):
        if self.swap_space_bytes is not None and self.preemption != "swap":
            raise ValueError("swap_space_bytes applies to preemption: swap")
        return self


class SloCfg(Strict):
    """Targets for goodput (requests/s meeting every target given)."""

    ttft_ms: float | None = Field(None, gt=0.0, le=MAX_SECONDS * MS_PER_S)
    tpot_ms: float | None = Field(None, gt=0.0, le=MAX_SECONDS * MS_PER_S)

    @model_validator(mode="after")
    def _some_target(self):
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ValueError("give ttft_ms, tpot_ms or both")
        return self

    @property
    def ttft_s(self) -> float | None:
        return None if self.ttft_ms is None else self.ttft_ms / MS_PER_S

    @property
    def tpot_s(self) -> float | None:
        return None if self.tpot_ms is None else self.tpot_ms / MS_PER_S
