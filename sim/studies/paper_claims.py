"""The reference paper's printed numbers, as printed (arXiv 2605.09490, "Not All Thoughts Need HBM";
see shared/reference/FACTS.md). These are the claims the report checks, never inputs to the
physics: every corrected number is computed from the catalog or the simulator."""

from __future__ import annotations

# Sizing: the transfer microbenchmark and the introduction size the 7B's KV with 28 heads
# ("~400 KB per token", 401,408 B) and say a 2,000-token chain needs "~800 MB".
KV_BYTES_PER_TOKEN_7B = 401_408
EXAMPLE_TOKENS = 2_000
EXAMPLE_BYTES = 800e6

# Projection: "at batch 8 a quantized 7B model's KV is 52% of GPU memory, 70B int4 70%",
# savings "2-48 GB". The batch is printed; the context is read as 4K tokens per sequence
# (FACTS.md: "70B at batch 8 x 4K tokens holds 10.7 GB of KV, not 80 GB").
PROJECTION_BATCH = 8
PROJECTION_CONTEXT_TOKENS = 4_096
KV_SHARE_7B = 0.52
KV_SHARE_70B = 0.70
SAVINGS_BYTES = (2e9, 48e9)

# Prototype (RTX 5080, R1-Distill-Qwen-7B int8, 50% HBM, 10% evicted): full cache 21.8 tok/s,
# tiered 18.7 tok/s, transfers "5-7%" of time.
FULL_TOK_PER_S = 21.8
TIERED_TOK_PER_S = 18.7
TRANSFER_SHARE = (0.05, 0.07)

# Models the projection claims name: (label, catalog name, weight dtype the claim assumes).
# "quantized 7B": the prototype's int8 weights.
SHARE_CLAIMS = (
    ("7B", "deepseek-r1-distill-qwen-7b", "int8", KV_SHARE_7B),
    ("70B", "deepseek-r1-distill-llama-70b", "int4", KV_SHARE_70B),
)
KV_DTYPE = "fp16"  # the prototype's KV precision (2 bytes, like bf16)
