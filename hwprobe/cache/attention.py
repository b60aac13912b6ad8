"""Decode attention over the union of several key sets (T0 in place, staged T1/T2).

`union_softmax_attention` takes one shared max and one summed denominator over every part, so the
result is softmax attention over the union of the parts' keys: mathematically independent of how
the tokens are split, numerically equal up to summation order. When the parts are first gathered
into one key set in original token order (`ordered_union`), the kernel sees exactly the tensors a
cache holding everything in HBM would see, and the output is bitwise equal (Proposition 1).

It returns each token's attention probability averaged over query heads: the score the tier
policy accumulates.

When the host attends part of the keys (host_attention.py), each side computes a partial result with
its log-sum-exp (`partial_softmax_attention`) and `merge_partials` combines them: the same softmax
over the union, up to summation order.
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
    return _weighted_values(p.to(q.dtype), parts), p.mean(dim=(1, 2))


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


def partial_softmax_attention(q, parts, bias, scale: float):
    """Softmax attention over one share of the keys, with its log-sum-exp, to be merged with the
    other shares' (`merge_partials`): the same QK^T / PV per part as `union_softmax_attention`,
    float32 softmax. Returns (out [B, Hkv, G, d] in q's dtype, lse [B, Hkv, G] float32, p
    [B, Hkv, G, sum n_i] float32, per query head). A (row, head) with no key (all masked) gets out 0,
    lse -inf and p 0, so it carries no weight in the merge."""
    import torch

    qs = q * scale
    logits = [torch.matmul(qs, k.transpose(-1, -2)) for k, _ in parts]
    s = (logits[0] if len(logits) == 1 else torch.cat(logits, dim=-1)).float()
    if bias is not None:
        s = s + bias[:, None, None, :]
    m = s.amax(dim=-1, keepdim=True).nan_to_num(neginf=0.0)  # no key at all: any finite shift
    e = torch.exp(s - m)
    total = e.sum(dim=-1, keepdim=True)
    p = e / total.clamp_min(torch.finfo(torch.float32).tiny)
    lse = (m + total.log()).squeeze(-1)
    return _weighted_values(p.to(q.dtype), parts), lse, p


def merge_shares(lse_a, lse_b):
    """Each share's weight in the merged softmax, per (row, head): e^{m_a} / (e^{m_a} + e^{m_b}) and
    its complement, computed after subtracting the larger LSE (stable; both -inf gives 0 and 0)."""
    import torch

    m = torch.maximum(lse_a, lse_b).nan_to_num(neginf=0.0)
    a, b = torch.exp(lse_a - m), torch.exp(lse_b - m)
    total = (a + b).clamp_min(torch.finfo(torch.float32).tiny)
    return a / total, b / total


def merge_partials(out_a, lse_a, out_b, lse_b):
    """Two partial attentions over disjoint key sets -> attention over their union:
    o = (e^{m_a} o_a + e^{m_b} o_b) / (e^{m_a} + e^{m_b}), m the LSEs. Exact up to float rounding.
    Returns (out float32 [B, Hkv, G, d], share_a, share_b [B, Hkv, G])."""
    share_a, share_b = merge_shares(lse_a, lse_b)
    out = out_a.float() * share_a[..., None] + out_b.float() * share_b[..., None]
    return out, share_a, share_b


def _weighted_values(pv, parts):
    """sum over parts of probs[:, keys of the part] @ V of the part (keys in the order of `parts`)."""
    out, start = None, 0
    for k, v in parts:
        n = k.shape[-2]
        part = pv[..., start : start + n] @ v
        out = part if out is None else out + part
        start += n
    return out
