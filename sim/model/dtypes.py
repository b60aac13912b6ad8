"""Storage formats: bytes per element and per-group scale overhead.

These are definitions of the formats, not datasheet figures.
"""

from __future__ import annotations

from dataclasses import dataclass

SCALE_BYTES = 2  # one fp16 scale per quantisation group
NVFP4_GROUP, NVFP4_SCALE_BYTES = 16, 1  # NVFP4: one FP8 (E4M3) scale per 16 FP4 (E2M1) values, fixed by the format
MXFP4_GROUP, MXFP4_SCALE_BYTES = 32, 1  # OCP MXFP4: one E8M0 scale per 32 FP4 (E2M1) values


@dataclass(frozen=True)
class DType:
    name: str
    bits: int
    grouped: bool  # integer formats carry one scale per group of elements
    scale_bytes: int = SCALE_BYTES
    fixed_group: int | None = None  # the format fixes its group size (NVFP4: 16); None: the scenario's

    @property
    def bytes_per_element(self) -> float:
        return self.bits / 8

    @property
    def packed_bytes_per_element(self) -> float:
        """An element's bytes with its share of a fixed-group format's scale (NVFP4 0.5625, MXFP4 0.53125);
        bits / 8 where the scenario sets the group (its scales are counted by `bytes_for`)."""
        return self.bits / 8 + (self.scale_bytes / self.fixed_group if self.fixed_group else 0.0)

    def bytes_for(self, elements: int, group_size: int) -> float:
        """Bytes for `elements` values: elements * bits / 8, plus one scale per group if grouped (a format
        that fixes its group, NVFP4, ignores `group_size`)."""
        payload = elements * self.bits / 8
        if not self.grouped:
            return payload
        groups = -(-elements // (self.fixed_group or group_size))  # ceil
        return payload + groups * self.scale_bytes


WEIGHT_DTYPES: dict[str, DType] = {
    "bf16": DType("bf16", 16, False),
    "fp16": DType("fp16", 16, False),
    "fp8": DType("fp8", 8, False),  # per-tensor scale: negligible
    "int8": DType("int8", 8, True),
    "int4": DType("int4", 4, True),
    # NVIDIA's NVFP4 (ModelOpt / compressed-tensors W4A4 checkpoints): 4.5 bits a weight, plus one fp32
    # scale per tensor (negligible)
    "nvfp4": DType("nvfp4", 4, True, NVFP4_SCALE_BYTES, NVFP4_GROUP),
    # OCP MXFP4 (gpt-oss's experts): 4.25 bits a weight
    "mxfp4": DType("mxfp4", 4, True, MXFP4_SCALE_BYTES, MXFP4_GROUP),
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

# Weight dtypes whose GEMMs quantise their activations too and run on low-precision tensor cores where the
# GPU has them: weight dtype -> (the tensor cores it needs, the peak it runs at there). fp8: W8A8 at the fp8
# peak; nvfp4: W4A4 at the fp4 peak (Blackwell); mxfp4: W4A8, MXFP8 activations on Blackwell's block-scaled
# MMA at the fp8 rate (TensorRT-LLM's W4A8_MXFP4_MXFP8 on SM100). Weight-only int formats - and these where
# the GPU lacks those tensor cores (mxfp4 on Hopper: W4A16) - dequantise to bf16 at the bf16 rate.
TENSOR_CORE_PATHS = {"fp8": ("fp8", "fp8"), "nvfp4": ("fp4", "fp4"), "mxfp4": ("fp4", "fp8")}
# bytes a GEMM streams per input element once its activations are quantised (fp4: NVFP4's, a scale per 16)
ACTIVATION_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": WEIGHT_DTYPES["nvfp4"].packed_bytes_per_element}
