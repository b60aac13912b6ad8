"""`sparse_fetch` access (policy.access) for sparse-attention models (DeepSeek-V3.2's top-k): a step
fetches from the host only the host-resident rows its indexer selected, per layer, on demand.

A sparse layer attends the top-k tokens the indexer picks from every cached token; the indexer keys
stay in HBM, the latents tier per token (T0 on the GPU, T1/T2 on the host). With sparse_fetch the
T1/T2 latents a layer needs are copied after that layer's indexer has chosen them - on the critical
path, not prefetched ahead - so a layer takes pre-attention + its fetch + the rest
(`physics.StepCost.on_demand`). What crosses the link per sparse layer, over the batch:

  selected rows on the host  m = min(tokens, B x k) x (T1 + T2) / tokens
      (the indexer's choice taken as independent of the tier: a share (T1 + T2) / tokens of what
      it picks sits on the host - a policy that keeps the indexer's favourites in HBM does better)
  new rows                   m x (1 - reuse)
      (`reuse`: the share of this step's host-resident picks already on the GPU from the previous
      step's fetch; 0 by default, fetching every pick - no published step-to-step overlap of the
      indexer's choices was at hand, see docs/models.md)
  copies and bytes           `rows`: one copy of one latent row per new row - small copies pay the
      link's per-copy latency each, which is what collapses the link's rate (a profile's measured
      copy curve prices them at their real size; zartbot/gfd measures 3.2 GB/s for 8,192 scattered
      4 KB cudaMemcpy calls); `blocks` of b tokens (the host cache paged in blocks): each
      sequence's host blocks holding a new row, the expected distinct blocks (n / b) x (1 - (1 -
      m_seq / n)^b) with n host rows a sequence, each copied whole (b rows); `gather`: the new rows
      coalesced into one copy per layer (a host-side gather into a staging buffer, as gfd does, or a
      GPU zero-copy gather) - the gather's own time taken as hidden, so this is the bound a gather
      approaches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.model.layers import SPARSE
from sim.model.spec import ModelSpec


@dataclass(frozen=True)
class SparseFetch:
    """How a sparse_fetch step moves its picks: `reuse` (0..1) of them already on the GPU from the
    previous step; `copy` rows (one copy each), blocks (of `block_tokens` rows) or gather (one copy)."""

    reuse: float = 0.0
    copy: str = "rows"
    block_tokens: int = 64


def selected_host_rows(model: ModelSpec, batch: float, t0: float, t1: float, t2: float) -> float:
    """Top-k picks over the batch that sit in T1/T2 (module docstring)."""
    tokens = t0 + t1 + t2
    if tokens <= 0 or t1 + t2 <= 0:
        return 0.0
    return min(tokens, batch * model.sparse.index_topk) * (t1 + t2) / tokens


def fetch_layer(model: ModelSpec, fetch: SparseFetch, batch: float, t0: float, t1: float, t2: float,
                kv_bytes_per_token_layer: float, t2_bytes_per_token_layer: float) -> tuple[float, int, float]:
    """(bytes, copies, T2 rows moved) one sparse layer's fetch takes, for tier counts summed over the
    batch; the rows moved are T1 and T2 in their proportion, each at its own bytes (T2 compressed)."""
    host = t1 + t2
    new = selected_host_rows(model, batch, t0, t1, t2) * (1.0 - fetch.reuse)
    if new <= 0:
        return 0.0, 0, 0.0
    b = fetch.block_tokens
    if fetch.copy == "rows":
        rows, copies = new, math.ceil(new)
    elif fetch.copy == "gather":
        rows, copies = new, 1
    else:
        # each sequence's host blocks hit: (n / b) (1 - (1 - m_seq / n)^b), n host rows a sequence
        blocks = host / b * (1.0 - (1.0 - min(new / host, 1.0)) ** b)
        rows, copies = min(blocks * b, host), math.ceil(blocks)
    row_bytes = (t1 * kv_bytes_per_token_layer + t2 * t2_bytes_per_token_layer) / host
    return rows * row_bytes, copies, rows * t2 / host


def staging_bytes(model: ModelSpec, fetch: SparseFetch, buffers: int, batch, t0, t1, t2, staged_bytes_per_token_layer: float):
    """HBM a sparse_fetch step holds for its fetched rows (scalars or arrays over steps): `buffers`
    layers' worth of new rows in flight, plus - where `reuse` > 0 - the picks kept from the previous
    step in every sparse layer (reuse x host picks x sparse layers), each row at one tiered layer's bytes."""
    tokens = np.asarray(t0 + t1 + t2, dtype=float)
    host = np.asarray(t1 + t2, dtype=float)
    picks = np.where(tokens > 0, np.minimum(tokens, np.asarray(batch, dtype=float) * model.sparse.index_topk)
                     * host / np.maximum(tokens, 1.0), 0.0)
    new = picks * (1.0 - fetch.reuse)
    if fetch.copy == "blocks":  # whole blocks (`fetch_layer`): host x (1 - (1 - new / host)^b) rows
        frac = np.where(host > 0, np.minimum(new / np.maximum(host, 1.0), 1.0), 0.0)
        new = host * (1.0 - (1.0 - frac) ** fetch.block_tokens)
    kept = fetch.reuse * picks * model.kind_counts.get(SPARSE, 0)
    out = (buffers * new + kept) * staged_bytes_per_token_layer
    return out if np.ndim(out) else float(out)


def mean_layer_share(model: ModelSpec) -> float:
    """Sparse layers / L: the engines' mean layer carries that share of one sparse layer's fetch."""
    return model.kind_counts.get(SPARSE, 0) / model.num_layers
