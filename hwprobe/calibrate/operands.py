"""Operands for compute measurements: random, cold, and within a memory budget.

Each timed call must read its big operand (weights, K/V) from device memory, not from a cache
warmed by the previous call. Rotating through enough copies of the operand to exceed
FLUSH_FACTOR x the last-level cache gives every call cold data - the L2 flush FACTS.md asks for,
without a flush kernel inside the timed window. Values are random: zeros can take fast paths.
"""

from __future__ import annotations

import math
from typing import Any

FLUSH_FACTOR = 2  # rotate through at least this many last-level caches' worth of operands
MAX_ROTATION = 128  # copies of one operand, so tiny operands do not mean thousands of tensors
MEMORY_BUDGET_FRACTION = 0.5  # operands of one measurement use at most this share of free memory

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def torch_dtype(torch: Any, name: str) -> Any:
    return getattr(torch, DTYPES[name])


def budget_bytes(backend: Any) -> int:
    return int(backend.free_device_bytes() * MEMORY_BUDGET_FRACTION)


def rotation_count(operand_bytes: int, cache_bytes: int, budget: int) -> int:
    """Copies to rotate through: enough to exceed FLUSH_FACTOR caches, within the budget.
    0 means not even one copy fits."""
    if operand_bytes > budget:
        return 0
    wanted = math.ceil(FLUSH_FACTOR * cache_bytes / operand_bytes)
    return max(1, min(MAX_ROTATION, wanted, budget // operand_bytes))


def random(backend: Any, shape: tuple[int, ...], dtype: str) -> Any:
    torch = backend.torch
    return torch.randn(*shape, dtype=torch_dtype(torch, dtype), device=backend.tensor_device)
