"""Linear layers that stream the bytes the scenario's weight dtype implies, with torch's own kernels.

- bf16 / fp16 / float32: `F.linear`.
- int4 (weight-only, groups of `group` along K, asymmetric: a bf16 scale and zero per group, the
  "tinygemm" layout): `torch._weight_int4pack_mm` on CUDA (weights packed by
  `_convert_weight_to_int4pack`), the `_for_cpu` pair on the CPU. Dequantised value =
  (q - 8) * scale + zero, q in 0..15. Activations run in bf16.

int8 is not offered: torch's CUDA `_weight_int8pack_mm` is a one-thread-per-output reference
kernel, so its timing would say nothing about an int8 deployment. Such weights run in the
activation dtype and the run says so.
"""

from __future__ import annotations

QUANTISED_WEIGHTS = ("int4",)
INT4_LEVELS = 16
INT4_MID = 8  # tinygemm's zero point: w = (q - 8) * scale + zero
INNER_K_TILES = (8, 4, 2)  # tinygemm tiles along K, largest that divides it: K % (tiles * 16) == 0
K_TILE = 16


def int4_supported(out_features: int, in_features: int, group: int) -> str | None:
    """Why this shape cannot run as tinygemm int4, or None if it can."""
    if in_features % group:
        return f"in_features {in_features} is not a multiple of the group size {group}"
    if not any(in_features % (t * K_TILE) == 0 for t in INNER_K_TILES):
        return f"in_features {in_features} is not a multiple of {INNER_K_TILES[-1] * K_TILE}"
    if out_features % 8:
        return f"out_features {out_features} is not a multiple of 8"
    return None


def int4_quantise(w, group: int):
    """w [N, K] float -> q [N, K] int32 in 0..15, scale and zero [N, K / group, 1] (float32), so
    that (q - 8) * scale + zero approximates w group by group (min at q = 0, max at q = 15)."""
    import torch

    n, k = w.shape
    wg = w.float().view(n, k // group, group)
    lo, hi = wg.amin(dim=-1, keepdim=True), wg.amax(dim=-1, keepdim=True)
    scale = ((hi - lo) / (INT4_LEVELS - 1)).clamp(min=1e-8)
    q = torch.round((wg - lo) / scale).clamp(0, INT4_LEVELS - 1).to(torch.int32).view(n, k)
    return q, scale, lo + INT4_MID * scale


def int4_dequantise(q, scale, zero, group: int):
    """The float weight int4_quantise's output stands for."""
    n, k = q.shape
    return ((q.view(n, k // group, group).float() - INT4_MID) * scale + zero).view(n, k)


class Linear:
    """y = x @ W^T (+ bias). `weight` [N, K] in float; quantised here when `weight_dtype` is int4."""

    def __init__(self, weight, bias, weight_dtype: str, group: int, act_dtype):
        import torch

        self.torch, self.bias, self.act_dtype = torch, bias, act_dtype
        self.quantised = weight_dtype in QUANTISED_WEIGHTS
        self.out_features, self.in_features = weight.shape
        if not self.quantised:
            self.weight, self.tensors = weight, (weight,)
            return
        why = int4_supported(self.out_features, self.in_features, group)
        if why:
            raise ValueError(f"int4 weights: {why}")
        self.group = group
        self.cuda = weight.device.type == "cuda"
        self.packed, self.scales_zeros = self._quantise(weight)
        self.tensors = (self.packed, self.scales_zeros)

    def _quantise(self, w):
        torch = self.torch
        n, k = w.shape
        q, scale, zero = int4_quantise(w, self.group)
        scales_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)  # [K/g, N, 2]
        tiles = next(t for t in INNER_K_TILES if k % (t * K_TILE) == 0)
        if self.cuda:  # two nibbles per byte, even K index in the high nibble
            packed = torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), tiles)
        else:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, tiles)
        return packed, scales_zeros

    def __call__(self, x):
        if not self.quantised:
            return self.torch.nn.functional.linear(x, self.weight, self.bias)
        ops = self.torch.ops.aten
        flat = x.reshape(-1, self.in_features).to(self.torch.bfloat16).contiguous()
        mm = ops._weight_int4pack_mm if self.cuda else ops._weight_int4pack_mm_for_cpu
        y = mm(flat, self.packed, self.group, self.scales_zeros).view(*x.shape[:-1], self.out_features)
        y = y.to(self.act_dtype)
        return y + self.bias if self.bias is not None else y
