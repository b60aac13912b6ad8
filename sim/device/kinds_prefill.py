"""Prefill attention of a model with GQA layer kinds (full, sliding window, chunked; sim/model/layers.py)
from the measured context-attention table, kind by kind: what `physics.measured_prefill_attention_s` asks
for gpt-oss (full and window-128 layers at head dim 64) and Llama 4 (full and chunked layers).

A step's chunks come as `seqs` prompts of the equivalent length n (`physics.equivalent_prompt_tokens`):
- full layers: the table's call at (seqs, n), as a dense model's;
- window layers: the same call on the table's rows of that window (every engine's tables time windows
  of 128 at head dims 64 to 192, gpt-oss's among them): a window's FLOP grow with n x W, not n^2, so no
  other slice stands in, and without that window's rows the step keeps the datasheet formula. Chunks
  behind a computed prefix attend at most W keys a new token, so a window layer is asked at the length
  whose whole prompts attend min(their window pairs, new tokens x W) (`layers.window_prompt_tokens`);
- chunked layers: each prompt's floor(n / C) whole chunks as prompts of C, and its rest r as a prompt of
  r - exact for whole prompts, as `layers.chunk_pairs` counts the pairs; chunks behind a prefix attend at
  most C keys a new token, so at most new tokens x C pairs, asked as the whole chunks and rest that attend
  as many.
"""

from __future__ import annotations

import math

from sim.model.layers import (
    CHUNKED,
    FULL,
    WINDOW,
    capped_pairs,
    causal_prompt_tokens,
    chunk_pairs,
    window_pairs,
    window_prompt_tokens,
)
from sim.model.spec import ModelSpec

from .measured_kernels import MeasuredKernels

GQA_KINDS = frozenset({FULL, WINDOW, CHUNKED})


def measured_kinds_prefill_s(model: ModelSpec, kernels: MeasuredKernels, prompt_tokens: float, seqs: int,
                             kv_dtype: str, new_tokens: float = 0.0) -> float | None:
    """The mean layer's prefill attention over `seqs` prompts of `prompt_tokens` (equivalent) tokens,
    `new_tokens` new tokens in all (0: every one), sum over kinds of layers x call / L; None (the datasheet formula)
    for a model with a kind other than full, window or chunked, or a window the table does not time."""
    if not kinds_measured(model, kernels, kv_dtype):
        return None
    counts, shape = model.kind_counts, (model.num_heads, model.num_kv_heads, model.head_dim, kv_dtype)

    def call(batch: float, tokens: float, window: int = 0) -> float:
        if batch <= 0 or tokens < 1:  # no whole chunk, or no rest
            return 0.0
        return kernels.context_attention_one_s(batch, tokens, *shape, window=window)

    total = 0.0
    for kind, layers in counts.items():
        if kind == FULL:
            t = call(seqs, prompt_tokens)
        elif kind == WINDOW:
            t = call(seqs, _window_length(prompt_tokens, seqs, new_tokens, model.sliding_window), model.sliding_window)
        else:
            whole, rest = _chunked_prompts(prompt_tokens, seqs, new_tokens, model.attention_chunk)
            t = call(seqs * whole, model.attention_chunk) + call(seqs, rest)
        total += layers * t
    return total / model.num_layers


def _window_length(prompt_tokens: float, seqs: int, new_tokens: float, window: int) -> float:
    """The prompt length a window layer's call is asked at: whole prompts of `prompt_tokens`, or fewer where
    the step's `new_tokens` (chunks behind a prefix) attend fewer pairs, W each at most."""
    return window_prompt_tokens(capped_pairs(window_pairs(prompt_tokens, window), seqs, new_tokens, window), window)


def _chunked_prompts(prompt_tokens: float, seqs: int, new_tokens: float, chunk: int) -> tuple[int, float]:
    """(whole chunks, rest) a chunked layer's call takes a prompt as: the equivalent prompt's floor(n / C)
    and n - that x C, or, where the step's new tokens attend fewer pairs (C each at most), the whole
    chunks and rest that attend as many."""
    whole, uncapped = math.floor(prompt_tokens / chunk), chunk_pairs(prompt_tokens, chunk)
    pairs = capped_pairs(uncapped, seqs, new_tokens, chunk)
    if pairs >= uncapped:
        return whole, prompt_tokens - whole * chunk
    per_chunk = chunk * (chunk + 1) / 2
    whole = math.floor(pairs / per_chunk)
    return whole, causal_prompt_tokens(pairs - whole * per_chunk)


def kinds_measured(model: ModelSpec, kernels: MeasuredKernels, kv_dtype: str) -> bool:
    """Whether the table times every kind of the model's layers: full, chunked, and window layers where it
    has rows of that window."""
    counts = model.kind_counts
    return set(counts) <= GQA_KINDS and (WINDOW not in counts or kernels.has_context_slice(
        model.num_heads, model.num_kv_heads, model.head_dim, kv_dtype, model.sliding_window))


def kinds_prefill_said(model: ModelSpec) -> str:
    """How `measured_kinds_prefill_s` takes each kind of the model's layers (its sources line)."""
    said = {FULL: "full layers at the chunks' equivalent prompt length",
            WINDOW: f"window layers on the table's rows of window {model.sliding_window}",
            CHUNKED: f"chunked layers as whole chunks of {model.attention_chunk} and the rest"}
    return "kind by kind: " + ", ".join(f"{n} {said[kind]}" for kind, n in model.kind_counts.items())
