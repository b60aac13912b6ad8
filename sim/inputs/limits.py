"""Bounds on what the tools accept: far above any real workload, far below what would hang a run or
exhaust memory. Every refusal names the limit, so a message reads `... at most 65536`."""

from __future__ import annotations

MAX_INPUT_BYTES = 8 * 2**20  # a CSV the tools read: 8 MiB
MAX_DOCUMENT_BYTES = 2**20  # a YAML or JSON document (scenario, profile, config.json): 1 MiB; pure-Python
                            # YAML parses about 0.2 MB/s, so this also bounds the time to read one
MAX_INPUT_DEPTH = 64  # nesting of mappings and lists in a YAML or JSON document
MAX_INPUT_NODES = 1_000_000  # values in one document, aliases counted each time they are used

MAX_BATCH = 65536  # sequences in a batch
MAX_TOKENS = 2**22  # prompt or reasoning tokens of one sequence (4M)
MAX_TOKEN_SLOTS = 2**26  # batch x (prompt + longest reasoning): per-token state the simulator keeps (~1 GB)
MAX_LAYER_STEPS = 2**26  # simulated steps x layers at detail 'layer' (SimPy events per layer)
MAX_LAYERS = 1024
MAX_HIDDEN = 2**18
MAX_HEADS = 4096
MAX_HEAD_DIM = 4096
MAX_INTERMEDIATE = 2**20
MAX_VOCAB = 2**22
MAX_EXPERTS = 4096

MAX_SECONDS = 3600.0  # any duration in a profile or an override
MAX_OVERHEAD_S = 1.0  # a fixed per-layer or per-step cost
MAX_BYTES = 1e15  # any memory size (1 PB)
MAX_BYTES_PER_S = 1e15  # any bandwidth (1 PB/s)
MAX_FLOP_PER_S = 1e18  # any compute rate (1 EFLOP/s)
# Lower ends: a rate so small that it underflows once scaled by an efficiency means nothing.
MIN_BYTES_PER_S = 1e3  # 1 kB/s
MIN_FLOP_PER_S = 1e6  # 1 MFLOP/s
MIN_EFFICIENCY = 1e-3  # an achieved fraction of a datasheet figure
MAX_RATIO = 1e3  # a ratio of one pool's or count's size to another's (SGLang's swa_full_tokens_ratio)
MAX_SEED = 2**63 - 1
MAX_NAME_CHARS = 200  # names (scenario, GPU, link, ...)
MAX_TEXT_CHARS = 10_000  # descriptions, paths

MAX_REQUESTS = 2**20  # requests of one serving run (workload.arrivals)
MAX_RATE_PER_S = 1e6  # an arrival rate, requests per second
# A served request's arrival (a trace's arrival_s, the last of a drawn process): beyond it a step time
# (microseconds and up) would vanish beside the clock (float64 resolves ~2 ns at 1e7 s, 16 ks at 1e20 s)
MAX_ARRIVAL_S = 1e7  # about 116 days
MAX_USD_PER_GPU_HOUR = 10_000.0  # a price (kvsim plan --price, sim/catalog/prices.yaml)
MAX_RATE_FACTOR = 1000.0  # kvsim plan --max-factor

MAX_STORE_ENTRY_BYTES = 8 * 2**20  # one result-store entry (sim/runner/store.py); larger is damaged

# Cost estimated before work starts (sim/inputs/cost.py): more is refused unless the command is given
# --allow-large, which warns with the estimate instead. Each is minutes of work on one core.
MAX_SERVING_STEPS = 2**20  # steps one serving simulation takes at least (~100 us each)
MAX_SERVING_TOKENS = 2**27  # prompt + output tokens of one serving simulation's requests
MAX_PLAN_STEPS = 2**24  # steps the simulations of a kvsim plan search take at least, together (each candidate once)
MAX_SWEEP_POINTS = 100_000  # points of one sweep (each validated before any runs, ~20 kB and ~0.1 ms each)

# GPUs that share one NVLink domain (an HGX board). A tensor-parallel group larger than this would span
# nodes, whose all-reduces and all-to-alls cross InfiniBand: not modelled, so refused (parallel.tp).
NODE_GPUS = 8
