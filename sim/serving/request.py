"""The requests of a serving run as one table: lengths, progress and the times that make their
metrics, one array each, indexed by the order requests are sent (the scheduler works on index arrays).

Progress: `computed` of `target` tokens prefilled since the request's (re)admission, `generated`
output tokens. A prefill ends by sampling a token; each decode step writes the last sampled
token's K/V and samples the next, so a request of N output tokens takes one prefill and N - 1
decode steps. Preempted (recompute), it drops its K/V and later prefills prompt + generated again;
swapped (`swap`), it keeps its progress while its K/V waits on the host, and resumes where it was.
"""

from __future__ import annotations

import numpy as np

from sim.inputs.requests import RequestSet

NOT_YET = -2  # last_token_step of a request with no token yet


class RequestTable:
    def __init__(self, reqs: RequestSet, prefilled: bool = False):
        """`prefilled`: every request arrives with its prompt's K/V computed and its first token
        sampled elsewhere (a decode instance behind prefill instances, `sim.plan.disagg`): it
        decodes from its first step, and its first token counts as given at arrival."""
        n = len(reqs)
        self.prefilled = prefilled
        self.ids = np.asarray(reqs.ids, dtype=np.int64)
        self.prompt = np.asarray(reqs.prompt_tokens, dtype=np.int64)
        self.output = np.asarray(reqs.output_tokens, dtype=np.int64)
        self.arrival_s = np.full(n, np.nan)  # set when sent
        self.admitted_s = np.full(n, np.nan)  # first scheduled
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.last_token_s = np.full(n, np.nan)
        self.last_token_step = np.full(n, NOT_YET, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.computed = np.zeros(n, dtype=np.int64)
        self.target = self.prompt.copy()  # tokens the current (re)prefill computes
        if prefilled:
            self.computed = self.prompt.copy()
            self.generated[:] = 1
        self.preemptions = np.zeros(n, dtype=np.int64)  # recompute and swap
        self.swaps = np.zeros(n, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.ids)

    def preempt(self, i: int, swap: bool = False) -> None:
        """Recompute preemption: K/V dropped; the next admission prefills every known token. Swap:
        progress kept (its K/V comes back on admission)."""
        self.preemptions[i] += 1
        if swap:
            self.swaps[i] += 1
        else:
            self.recompute(i)

    def recompute(self, i: int) -> None:
        """K/V dropped: the next admission prefills prompt + generated tokens."""
        self.computed[i] = 0
        self.target[i] = self.prompt[i] + self.generated[i]
