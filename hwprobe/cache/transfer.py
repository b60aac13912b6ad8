"""How many copies a block transfer takes, as sim/device/physics.py counts them.

A re-tier moves blocks [K tokens, L layers, X values] (X = one token's row in one layer, or its T2
scales). Coalesced (`layerwise_async`, `per_interval`), a block is one copy (`retier_copies`: one
for T1, two for T2 = payload + scales). The paper's prototype (`sync_per_step`) copies per layer,
full-precision K and V apart (`prefetch_copies_per_layer("sync_per_step")` per layer): its blocks
are laid out layer-major, [L, 2, K, X/2] or [L, K, X], so that every piece is one contiguous copy
on both sides of the link.
"""

from __future__ import annotations

import itertools

from sim.model.units import KV_TENSORS


def layer_major(block, kv_split: bool):
    """[K, L, X] -> contiguous [L, 2, K, X/2] (K and V apart) or [L, K, X]."""
    k, layers, x = block.shape
    if kv_split:
        return block.view(k, layers, KV_TENSORS, x // KV_TENSORS).permute(1, 2, 0, 3).contiguous()
    return block.transpose(0, 1).contiguous()


def token_major(block, kv_split: bool):
    """Inverse of `layer_major`: back to [K, L, X]."""
    if kv_split:
        layers, _, k, half = block.shape
        return block.permute(2, 0, 1, 3).reshape(k, layers, KV_TENSORS * half)
    return block.transpose(0, 1)


def arrange(block, prototype: bool, kv_split: bool):
    """The block as it travels: token-major and contiguous (one copy), or layer-major (pieces)."""
    return layer_major(block, kv_split) if prototype else block.contiguous()


def restore(block, prototype: bool, kv_split: bool):
    return token_major(block, kv_split) if prototype else block


def copy_block(dst, src, prototype: bool, kv_split: bool, non_blocking: bool) -> int:
    """Copy an arranged block; returns the number of copies issued."""
    if not prototype:
        dst.copy_(src, non_blocking=non_blocking)
        return 1
    pieces = list(itertools.product(*(range(n) for n in src.shape[: 2 if kv_split else 1])))
    for idx in pieces:
        dst[idx].copy_(src[idx], non_blocking=non_blocking)
    return len(pieces)
