"""Storage formats: bytes per element and per-group scale overhead.

These are definitions of the formats, not datasheet figures.
"""

from __future__ import annotations

from dataclasses import dataclass

SCALE_BYTES = 2  # one fp16 scale per quantisation group


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    grouped: bool  # integer formats carry one scale per group of elements

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

    def bytes_for(self, elements: int, group_size: int) -> float:
        """Bytes for `elements` values: elements * bits / 8, plus one scale per group if grouped."""
        payload = elements * self.bits / 8
        if not self.grouped:
            return payload
        groups = -(-elements // group_size)  # ceil
        return payload + groups * SCALE_BYTES


WEIGHT_DTYPES: dict[str, DType] = {
    "bf16": DType("bf16", 16, False),
    "fp16": DType("fp16", 16, False),
    "fp8": DType("fp8", 8, False),  # per-tensor scale: negligible
    "int8": DType("int8", 8, True),
    "int4": DType("int4", 4, True),
}

KV_DTYPES: dict[str, DType] = {
    "bf16": DType("bf16", 16, False),
    "fp16": DType("fp16", 16, False),
    "fp8": DType("fp8", 8, False),
    "int8": DType("int8", 8, True),
}

# T2 (compressed host tier) formats.
COMPRESSED_DTYPES: dict[str, DType] = {
    "int8": DType("int8", 8, True),
    "fp8": DType("fp8", 8, True),  # fp8 with per-group scales as well
    "int4": DType("int4", 4, True),
}

# Weight dtypes that run on the tensor cores at the fp8 / int8 rate (W8A8); weight-only int
# formats dequantise to bf16 and compute at the bf16 rate.
FP8_COMPUTE_WEIGHT_DTYPES = {"fp8"}
