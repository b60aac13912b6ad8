"""T2 storage format: symmetric absmax int8 with one fp16 scale per group of `group` values.

Rows are a token's K and V of one layer flattened as (K/V, head, head_dim); groups lie inside one
head vector (the simulator sizes T2 with `min(group, head_dim)` the same way). The scale is rounded
*up* to fp16 (and kept at least the smallest normal fp16) so |x| / scale never exceeds INT8_MAX:
the error of every element is then at most half a quantisation step, scale / 2.
"""

from __future__ import annotations

INT8_MAX = 127


def effective_group(group_size: int, head_dim: int) -> int:
    return min(group_size, head_dim)


def quantize_int8(x, group: int):
    """x [..., R] -> (int8 [..., R], fp16 scales [..., R / group])."""
    import torch

    fp16 = torch.finfo(torch.float16)
    *lead, r = x.shape
    g = x.float().reshape(*lead, r // group, group)
    absmax = g.abs().amax(dim=-1, keepdim=True)
    # at least the smallest normal fp16, so one ulp step up below is exact (subnormals are coarser)
    want = torch.clamp(absmax / INT8_MAX, min=fp16.tiny)
    scale = want.to(torch.float16)
    up = (scale.float() * (1 + fp16.eps)).to(torch.float16)  # the next fp16 above a normal value
    scale = torch.where(scale.float() < want, up, scale)
    q = (g / scale.float()).round_().clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q.reshape(*lead, r), scale.squeeze(-1)


def dequantize_int8(q, scale, dtype):
    """Inverse of `quantize_int8`: int8 [..., R] and scales [..., R / group] -> dtype [..., R]."""
    *lead, r = q.shape
    groups = scale.shape[-1]
    x = q.reshape(*lead, groups, r // groups).float() * scale.float().unsqueeze(-1)
    return x.reshape(*lead, r).to(dtype)


HALF_STEP = 0.5  # round-to-nearest errs by at most half a quantisation step


def max_error_bound(scale):
    """Largest |x - dequantize(quantize(x))| the format allows in each group: half a step."""
    return scale.float() * HALF_STEP
