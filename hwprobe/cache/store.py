"""The physical tensors of the three resident tiers.

- T0: device, [L, 2 (K/V), B, Hkv, cap0, d]: one layer's K (or V) is a [B, Hkv, n, d] view whose
  batch and head strides merge, so attention reads it in place without a copy.
- T1: host (pinned on CUDA), [L, cap1, B, R] with R = 2 * Hkv * d: token-major, so the live prefix
  of one layer, [l, :high_water], is one contiguous block and one copy.
- T2: host, int8 [L, cap2, B, R] plus fp16 scales [L, cap2, B, R / group], same layout.
Rows move between tiers as [K, L, R] blocks (K (row, slot) pairs, all layers).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.model.dtypes import SCALE_BYTES
from sim.model.units import KV_TENSORS

from .peaks import TierPeaks


@dataclass(frozen=True)
class CacheGeometry:
    layers: int
    batch: int
    kv_heads: int
    head_dim: int

    @property
    def row_elems(self) -> int:
        """One token's K and V in one layer: 2 * Hkv * d values."""
        return KV_TENSORS * self.kv_heads * self.head_dim


class TierStores:
    def __init__(self, rt, geom: CacheGeometry, caps: TierPeaks, dtype, group: int, pinned: bool):
        import torch

        self.rt, self.geom, self.dtype, self.group = rt, geom, dtype, group
        L, B, hkv, d, r = geom.layers, geom.batch, geom.kv_heads, geom.head_dim, geom.row_elems
        self.groups = r // group
        self.t0 = rt.device_zeros((L, KV_TENSORS, B, hkv, caps.t0, d), dtype)
        self.t1 = rt.host_zeros((L, caps.t1, B, r), dtype, pinned)
        self.t2q = rt.host_zeros((L, caps.t2, B, r), torch.int8, pinned)
        self.t2s = rt.host_zeros((L, caps.t2, B, self.groups), torch.float16, pinned)
        self.itemsize = torch.empty((), dtype=dtype).element_size()

    # ---- sizes ----------------------------------------------------------------------------
    @property
    def full_row_bytes(self) -> int:
        """One token, one layer, full precision."""
        return self.geom.row_elems * self.itemsize

    @property
    def t2_row_bytes(self) -> int:
        """One token, one layer, int8 + one fp16 scale per group."""
        return self.geom.row_elems + self.groups * SCALE_BYTES

    def allocated_device_bytes(self) -> int:
        return self.t0.numel() * self.itemsize

    def allocated_host_bytes(self) -> int:
        return self.t1.numel() * self.itemsize + self.t2q.numel() + self.t2s.numel() * SCALE_BYTES

    # ---- T0 (device) ----------------------------------------------------------------------
    def t0_gather(self, b_idx, s_idx):
        """[K, L, R] copy of the given (row, slot) pairs, all layers (device)."""
        g = self.geom
        return self.t0[:, :, b_idx, :, s_idx].reshape(len(b_idx), g.layers, g.row_elems)

    def t0_scatter(self, b_idx, s_idx, rows) -> None:
        g = self.geom
        self.t0[:, :, b_idx, :, s_idx] = rows.reshape(len(b_idx), g.layers, KV_TENSORS, g.kv_heads, g.head_dim)

    # ---- T1 / T2 (host) -------------------------------------------------------------------
    def t1_gather(self, b_idx, s_idx):
        return self.t1[:, s_idx, b_idx].transpose(0, 1).contiguous()

    def t1_scatter(self, b_idx, s_idx, rows) -> None:
        self.t1[:, s_idx, b_idx] = rows.transpose(0, 1)

    def t2_gather(self, b_idx, s_idx):
        q = self.t2q[:, s_idx, b_idx].transpose(0, 1).contiguous()
        s = self.t2s[:, s_idx, b_idx].transpose(0, 1).contiguous()
        return q, s

    def t2_scatter(self, b_idx, s_idx, q, s) -> None:
        self.t2q[:, s_idx, b_idx] = q.transpose(0, 1)
        self.t2s[:, s_idx, b_idx] = s.transpose(0, 1)
