"""Decode attention over the union of several key sets (T0 in place, staged T1/T2).

`union_softmax_attention` takes one shared max and one summed denominator over every part, so the
result is softmax attention over the union of the parts' keys: mathematically independent of how
the tokens are split, numerically equal up to summation order. When the parts are first gathered
into one key set in original token order (`ordered_union`), the kernel sees exactly the tensors a
cache holding everything in HBM would see, and the output is bitwise equal (Proposition 1).

It returns each token's attention probability averaged over query heads: the score the tier
policy accumulates.
"""

from __future__ import annotations

NEG_INF = float("-inf")


def union_softmax_attention(q, parts, bias, scale: float):
    """q [B, Hkv, G, d] (G query heads per KV head); parts: (K, V) pairs, each [B, Hkv, n_i, d];
    bias [B, sum n_i] (0 = attend, -inf = empty slot) over the parts' keys in order, or None.
    Returns (out [B, Hkv, G, d], probabilities [B, sum n_i] averaged over the Hkv * G query heads).

    Few kernels on purpose (decode at small batch is launch-bound): one QK^T per part, one softmax
    (float32) over the concatenated logits, one PV per part."""
    import torch

    qs = q * scale
    logits = [torch.matmul(qs, k.transpose(-1, -2)) for k, _ in parts]
    s = logits[0] if len(logits) == 1 else torch.cat(logits, dim=-1)
    if bias is not None:
        s = s + bias[:, None, None, :]
    p = torch.softmax(s, dim=-1, dtype=torch.float32)
    pv = p.to(q.dtype)
    out, start = None, 0
    for k, v in parts:
        n = k.shape[-2]
        part = torch.matmul(pv[..., start : start + n], v)
        out = part if out is None else out + part
        start += n
    return out, p.mean(dim=(1, 2))


def ordered_union(parts, dsts, width: int):
    """Gather parts ((K, V) pairs) into one key set in original token order.

    dsts[i] [B, n_i] (int64, on the device) is where part i's slot lands in [0, width); empty
    slots point at `width`, a scratch column dropped afterwards. Returns (K, V, bias) over width.
    """
    import torch

    k0 = parts[0][0]
    b, hkv, _, d = k0.shape
    k_all = torch.zeros((b, hkv, width + 1, d), dtype=k0.dtype, device=k0.device)
    v_all = torch.zeros_like(k_all)
    bias = torch.full((b, width + 1), NEG_INF, dtype=torch.float32, device=k0.device)
    for (k, v), dst in zip(parts, dsts):
        idx = dst[:, None, :, None].expand(b, hkv, dst.shape[1], d)
        k_all.scatter_(2, idx, k)
        v_all.scatter_(2, idx, v)
        bias.scatter_(1, dst, torch.zeros(dst.shape, dtype=torch.float32, device=k0.device))
    bias[:, width] = NEG_INF
    return k_all[:, :, :width], v_all[:, :, :width], bias[:, :width]


def unorder_probs(probs, dsts):
    """Probabilities of the ordered union back in the parts' slot order ([B, width] -> [B, sum n_i])."""
    import torch

    padded = torch.cat([probs, torch.zeros_like(probs[:, :1])], dim=1)
    return padded.gather(1, torch.cat(dsts, dim=1))
