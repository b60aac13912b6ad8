"""SGLang's admission estimate (scheduler admission `reserve_ratio`): how much of the running requests'
remaining outputs it keeps free for them when it admits a new one, as a ratio that decays while decoding
goes well and jumps back after a retraction. Read from sgl-project/sglang (stored copies):

- python/sglang/srt/managers/schedule_policy.py `PrefillAdder`: a waiting request is admitted only while
  its prompt + min(max_new_tokens, CLIP) tokens fit what the pool has free less the offset - every running
  request's min(max_new_tokens - generated, CLIP) x new_token_ratio, plus what this round admitted in
  full (prompt + clipped max_new_tokens) (`_get_running_request_total_token_offset`, `add_one_req`,
  `rem_total_tokens`); CLIP = SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION, 4096;
- the ratio (environ.py, the scheduler's new-token-ratio state): starts at min(SGLANG_INIT_NEW_TOKEN_RATIO
  0.7 x schedule_conservativeness, 1) - the flag 1.0 by default, x 0.3 under DP attention (server_args.py
  `_handle_data_parallelism`) -, falls by (init - min) / SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS (600) each
  decode batch down to min = init x SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR (0.14); after a retraction
  (schedule_batch.py `retract_decode`) it is min(1, (decoded tokens + SGLANG_RETRACT_DECODE_STEPS (20) x
  requests) / (max_new_tokens + 1)) over the requests that stay; an idle server resets it to init.

A benchmark's max_new_tokens is the request's output length (bench_serving sets it so, with ignore_eos),
which is what kvtier passes. Tokens are counted at the full K/V bytes per token, as SGLang's pool counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

INIT_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO (x schedule_conservativeness)
MIN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
RETRACT_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS
CLIP_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION


@dataclass
class NewTokenRatio:
    """The ratio's state: `current`, moved by `decode_step`, `retracted` and `idle`, for SGLang's
    effective `conservativeness` (its schedule_conservativeness, x 0.3 under DP attention)."""

    conservativeness: float = 1.0
    current: float = field(init=False)

    def __post_init__(self):
        self.current = self.init

    @property
    def init(self) -> float:
        return min(INIT_RATIO * self.conservativeness, 1.0)

    @property
    def floor(self) -> float:
        return min(self.init * MIN_RATIO_FACTOR, 1.0)

    def decode_step(self) -> None:
        """A decode batch ran without a retraction: one step of the decay, not below the floor."""
        self.current = max(self.current - (self.init - self.floor) / DECAY_STEPS, self.floor)

    def retracted(self, generated: np.ndarray, max_new_tokens: np.ndarray) -> None:
        """Requests were retracted (preempted); the ones that stay decoded `generated` of their
        `max_new_tokens`: the ratio becomes what they have shown, with RETRACT_STEPS steps of slack."""
        self.current = min(1.0, (float(np.sum(generated)) + RETRACT_STEPS * len(generated))
                           / (float(np.sum(max_new_tokens)) + 1.0))

    def idle(self) -> None:
        self.current = self.init


def clipped_remaining(max_new_tokens: np.ndarray, generated: np.ndarray) -> np.ndarray:
    """Each request's output tokens still to come, at most CLIP_NEW_TOKENS (what the estimate counts)."""
    return np.minimum(np.maximum(np.asarray(max_new_tokens) - np.asarray(generated), 0), CLIP_NEW_TOKENS)
