"""Fit the datasheet model's kernel constants per GPU on the TUNE split of AIConfigurator's measured
kernel tables (issue #20 item 3), and write them to sim/catalog/fitted_kernels.yaml.

    .venv/bin/python scripts/fit_datasheet.py [--check]

The model's shape (sim/device/physics.py), fitted here constant by constant on operator-level
measurements only - never on end-to-end figures, which are for validation:
- a GEMM call:   floor + max((weight + activation bytes) / (HBM x streaming efficiency), FLOP / (peak x FLOP
  efficiency(rows))) + output elements / (HBM x output efficiency) [+ fp8 W8A8 / nvfp4 W4A4: rows x per-row
  quantisation + input elements / (HBM x quantisation efficiency)], per weight dtype the tables measure (bf16,
  fp8, and nvfp4 on Blackwell at its fp4 peak, its weights and inputs at 4.5 bits an element); FLOP
  efficiency(rows) is the catalog's default curve (efficiency.yaml gemm_flop_efficiency_by_rows) scaled to the
  fitted plateau `flop_efficiency` (weights alone left fp8 at a 19-22% held-out median, this shape 9-12%);
  fp8 W8A8's tiles too: each further 128-row output tile re-reads a share of the weights, and the weight
  stream runs at B / (B + half_tiles) of its rate over B = ceil(m / 128) x ceil(n / 128) output tiles, the
  small-M kernels (m <= 64) at their own half point (without them: 9.7 / 11.6% on H100 / H200);
- decode attention (one layer's call), bf16 and fp8 KV, head dim 128: floor + max(KV bytes / (HBM x efficiency(KV
  dtype) x c / (c + half_ctas)), c x per-block cost), c = batch x KV heads the kernel's thread blocks (small grids
  cannot keep HBM busy; long thin grids pay each block's serial cost; fp8 KV dequantises as it streams) - one
  floor and one bf16 efficiency for both dtypes left a 7.7-20% held-out median, this shape 7-9% (L40S 15%);
  TensorRT-LLM's (its XQA kernel) over 2-32 query heads per KV head alone (XQA's range), where XQA's sequence
  split fits the tune split better (H100, H200, A100): floor + KV bytes / (HBM x efficiency x c / (c + half_ctas))
  + blocks x (per-block cost + g x per-head cost), blocks = max(c, min(c x m0, 8 x SMs)), m0 = max(1, min(k,
  round(sqrt(8 k)))), k = floor(n / 128) (XQA's computeMultiBlockCount), g query heads per KV head, n cached
  tokens (the overlapping form over the same points: 11-17% held-out median, this one 8-15%); and TensorRT-LLM's
  one-query-head-per-KV-head rows apart (MMHA, the kernel it decodes chunked layers on below compute capability
  10.x) in the overlapping form, c = batch x heads (`mha_attention`); a sliding window's on its own fit of that
  form per head dim over the window's tokens, plus a floor and a per-block cost once a sequence is longer than
  its window (XQA's split counted over the whole sequence; `window_attention`);
- prefill attention (one layer's causal call over b whole prompts of n tokens), per KV dtype (bf16, fp8), head
  dim 128, prompts >= 15 tokens: floor + max(FLOP / (bf16 peak x FLOP efficiency x n / (n + half_tokens) x
  tiles / (tiles + half_tiles)), K/V bytes / (HBM x the decode fit's efficiency)) + b n x KV heads x cache
  write, tiles = b x heads x ceil(n / 128) (short prompts fill the kernel's tiles poorly, few tiles leave SMs
  idle, each new token's K/V is rotated, quantised and stored: one flat efficiency left a 21-31% held-out
  median, the length alone 9-16% for bf16 KV and 17-20% for fp8 KV); a sliding window's on its own fit of
  that form over the window's pairs at the rate of a min(n, W)-token prompt (`window_prefill`);
- absorbed MLA decode attention (the tables' generation_mla, TensorRT-LLM's kernel, DeepSeek-V3's latent):
  floor + max(latent bytes / (HBM x efficiency(KV dtype) x blocks / (blocks + half_blocks)), FLOP / (bf16 peak
  x FLOP efficiency)), blocks = batch x ceil(heads / 64) (the GQA fit it took before: 10-66% held-out median);
- absorbed MLA's two BMMs (the tables' mla_bmm, the engine's own: q_nope x W_UK and latent x W_UV, the same
  FLOP and bytes), per BMM dtype: floor + max(FLOP / (peak x ef), bytes / (HBM x eh));
- one GPU's fused routed experts (the tables' vLLM fused_experts), per weight format, balanced routing at the
  benchmark's own experts and pairs on the GPU it timed: floor + touched x per-expert cost + max(touched experts'
  weights / (HBM x ew), 2 x pairs x expert params / (peak x ef x r / (r + half_rows))) + routed rows gathered and
  scattered + tokens entering, r = pairs / touched (a grouped GEMM's efficiency follows its rows per expert, not
  the tokens: the dense GEMM fit indexed by tokens left a 25-80% held-out median, this shape 3-23%); the same
  shape fitted again (`moe_power_law`) on the rows of both power-law routings, at the expected experts and pairs
  of their draw on the GPU timed (sim/model/power_law.py): the balanced fit at that load ran 6-12% fast on them;
- an all-reduce (the engine's custom kernel, and NCCL), per group size N the tables measure: the faster of
  two protocols, each floor + ring bytes 2 (N - 1) / N x bytes / its bus bandwidth (a latency protocol and a
  bandwidth one: NCCL's LL and Simple, a custom kernel's one-shot and two-shot; one floor and busbw for
  every N left a 19-31% held-out median, NCCL's floors taken from the custom fit 42-56%);
- NCCL's all-gather and reduce-scatter the same way, each GPU moving (N - 1) / N of the whole buffer (the
  engines' default exchange around a data-parallel attention's experts: device/moe_exchange.py);
- DeepEP's all-to-all (the engines' opt-in exchange), per kernel (high-throughput, low-latency) and phase
  (dispatch, combine): floor + bytes / rate, bytes = tokens a rank x remote ranks a token reaches x hidden
  x wire bytes (TensorRT-LLM's tables, whose wires are stated; the fabric's catalog figures were a floor
  assumed at 15 us and DeepEP's NVLink 5 fraction).
Each fit minimises squared log error (soft-L1, so a few noisy table points do not steer it) over the
domain a decode step asks for; the held-out lines (`split_tables`) are only scored, never fitted.
One file per framework whose tables are fitted (`catalog.fitted_kernels_file`: vLLM's fitted_kernels.yaml,
fitted_kernels.sglang.yaml, fitted_kernels.trtllm.yaml): a run's datasheet constants are its engine's.
`--check` fits and compares with the committed files instead of writing them (exit 1 if one differs).
Needs the `.[measured]` extra (aiconfigurator-core, and scipy which it brings).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import least_squares

from sim.device.kernels import DEFAULT_GROUP_SIZE
from sim.device.measured_kernels import mla_bmm_work, moe_peak_flop_per_s
from sim.device.moe_exchange import A2A_WIRE_BYTES
from sim.device.moe_op import QUANT_AS
from sim.device.physics import kind_prefill_flop_per_pair, xqa_ctas
from sim.inputs import catalog
from sim.inputs.kernel_tables import FRAMEWORK, FRAMEWORKS, PACKAGE, SYSTEMS, load_tables, split_tables, with_moe_mla
from sim.model.dtypes import ACTIVATION_BYTES, WEIGHT_DTYPES
from sim.model.experts import expected_remote_ranks
from sim.model.layers import MLA, window_prefill_work
from sim.model.power_law import power_law_load, routing_alpha
from sim.model.units import FLOP_PER_MAC
from sim.studies.moe_mla_accuracy import balanced_rank0

OUT = Path(__file__).resolve().parents[1] / "sim" / "catalog" / "fitted_kernels.yaml"
ELEMENT_BYTES = {"bf16": 2.0, "fp8": 1.0}
XQA_FRAMEWORK = "trtllm"  # TensorRT-LLM's decode attention is its XQA kernel (GQA, 2-32 query heads per KV head)
XQA_HEADS_PER_KV = (2, 32)  # XQA's range (g = 1 runs MMHA, g > 32 another kernel), fitted and scored over it alone
XQA_GAIN = 0.01  # the tune-median gain XQA's sequence split must show over the overlapping form to be kept
XQA_DOMAIN = ", 2-32 query heads per KV head (TensorRT-LLM's XQA)"
WEIGHT_ONLY = ("int4", "int8")  # TensorRT-LLM's weight-only GEMMs (its A100 tables): W4A16 / W8A16
HEADER = """\
# GENERATED by scripts/fit_datasheet.py - do not edit by hand; rerun the script.
# Per-GPU constants of the datasheet model's kernel shape (sim/device/physics.py), fitted on the tune
# split of NVIDIA AIConfigurator's measured kernel tables; errors = predicted / measured - 1 over the
# fitted domain (tune: the points fitted; held_out: the held-out grid lines, never fitted).
"""


def _gemm_model(p, W, F, shape, A, O, M, K, N, peak, hbm, w8a8, dq=None):
    """`physics.weight_gemm_s` of one call: floor + max((weights + activations) / (HBM x ew), FLOP / (peak x ef x
    shape)) + output elements / (HBM x eo) [+ W8A8: rows x per-row quantisation + input elements / (HBM x eq)].
    `shape`: the default efficiency-by-rows curve over its plateau at each point's rows (the small-row tile waste
    a weight-only kernel's MMA pays); the fit scales it to this GPU's plateau `ef`. W8A8 also has its tiles
    (`physics.weight_stream_s`): each further 128-row tile re-reads a share of the weights, and the stream and the
    compute run at B / (B + half) of their rates over B = ceil(m / 128) x ceil(n / 128) output tiles, the small-M
    kernels (m <= 64) at their own half point. Weight-only int4/int8 (`dq`: the catalog's dequantisation seconds
    per weight, not fitted) have the grid fill (p[4], one half point) and no quantisation or re-read. `w8a8`: the
    quantised-activation form, fp8 W8A8's and nvfp4 W4A4's alike."""
    floor, ew, ef, eo = p[:4]
    if w8a8 or dq is not None:
        tiles_m = np.ceil(M / 128)
        tiles = tiles_m * np.ceil(N / 128)
        half = np.where(M <= 64, p[8], p[7]) if w8a8 else p[4]
        fill = tiles / (tiles + half)
        reread = 1 + p[6] * (tiles_m - 1) if w8a8 else 1.0
        compute = (0.0 if w8a8 else N * K / M * dq) + F / (peak * ef * shape)  # K is m x k: N K / M the weights
        t = floor + np.maximum((W * reread + A) / (hbm * ew * fill), compute / fill) + O / (hbm * eo)
        return t + M * p[4] + K / (hbm * p[5]) if w8a8 else t
    return floor + np.maximum((W + A) / (hbm * ew), F / (peak * ef * shape)) + O / (hbm * eo)


def _row_shape(m: np.ndarray) -> np.ndarray:
    curve = catalog.efficiency_defaults().gemm_flop_efficiency_by_rows
    rows, eff = np.log2([r for r, _ in curve]), np.array([e for _, e in curve])
    return np.interp(np.log2(m), rows, eff) / eff.max()


def _fit(model, x0, lo, hi, args, measured):
    res = least_squares(lambda p: np.log(model(p, *args)) - np.log(measured), x0, bounds=(lo, hi), loss="soft_l1", x_scale="jac",
                        f_scale=0.05)
    return res.x


def _errors(pred, measured) -> dict:
    e = pred / measured - 1
    return {"median": round(float(np.median(np.abs(e))), 4), "worst": round(float(np.max(np.abs(e))), 4),
            "mean": round(float(np.mean(e)), 4), "points": int(len(e))}


def _gemm(gpu, tune, held) -> dict:
    spec = catalog.gpu(gpu)
    out = {}
    for dtype in sorted(set(tune.gemm["dtype"])):
        peak, precision = spec.matmul_peak(dtype)
        # fp8 W8A8 and nvfp4 W4A4 take the quantised-activation form (their tiles) at their peak; weight-only
        # int4 / int8 (TensorRT-LLM's tables) their own
        w8a8 = precision != "bf16"
        if not (dtype == "bf16" or w8a8 or dtype in WEIGHT_ONLY):
            continue
        eb = ACTIVATION_BYTES[precision]  # bytes an input element streams (weight-only: bf16 activations)
        # weight-only: the catalog's dequantisation per weight at the CUDA-core rate (not identifiable here)
        dq = (catalog.efficiency_defaults().dequant_ops_per_weight[dtype] / (spec.fp32_flop_per_s / FLOP_PER_MAC)
              if dtype in WEIGHT_ONLY else None)

        def domain(t, dq=dq, dtype=dtype):
            t = t[(t["dtype"] == dtype) & (t["m"] <= 8192) & (t["n"] >= 256) & (t["k"] >= 256)]
            m, n, k = (t[c].to_numpy().astype(float) for c in ("m", "n", "k"))
            w = WEIGHT_DTYPES[dtype].bytes_for(n * k, DEFAULT_GROUP_SIZE)  # as a run counts them
            return (w, 2.0 * m * n * k, _row_shape(m), m * k * eb, m * n, m, m * k, n, peak,
                    spec.hbm_bytes_per_s, w8a8, dq), t["latency_s"].to_numpy()

        args, meas = domain(tune.gemm)
        x0, lo, hi = [5e-6, 0.85, 0.6, 0.5], [0.0, 0.2, 0.1, 0.01], [1e-4, 1.0, 1.0, 20.0]
        if w8a8:  # + quantisation (per row, per input element), re-read, half tiles (m > 64, m <= 64)
            x0, lo, hi = x0 + [5e-9, 0.2, 0.3, 10.0, 10.0], lo + [0.0, 0.01, 0.0, 0.0, 0.0], hi + [1e-6, 5.0, 1.0, 1e4, 1e4]
        if dq:  # + half tiles
            x0, lo, hi = x0 + [16.0], lo + [0.0], hi + [1e4]
        p = _fit(_gemm_model, x0, lo, hi, args, meas)
        h_args, h_meas = domain(held.gemm)
        tiles = ({"weight_reread": round(float(p[6]), 4), "half_tiles": float(f"{p[7]:.4g}"),
                  "half_tiles_decode": float(f"{p[8]:.4g}")} if w8a8 else
                 {"half_tiles": float(f"{p[4]:.4g}"), "half_tiles_decode": float(f"{p[4]:.4g}")} if dq else {})
        out[dtype] = {"floor_s": float(f"{p[0]:.4g}"), "weight_hbm_efficiency": round(float(p[1]), 4),
                      "flop_efficiency": round(float(p[2]), 4), "output_hbm_efficiency": round(float(p[3]), 4),
                      **({"quant_row_s": float(f"{p[4]:.4g}"), "quant_hbm_efficiency": round(float(p[5]), 4)}
                         if w8a8 else {}),
                      **tiles,
                      "tune": _errors(_gemm_model(p, *args), meas), "held_out": _errors(_gemm_model(p, *h_args), h_meas)}
    return out


def _attention_model(p, nbytes, ctas, fp8, hbm, g, n, split):
    """`physics.gqa_datasheet_attention_s` without its FLOP side (decode attention never reaches it here);
    fp8 KV has its own floor and per-block cost (the engines run other kernels for it). `split` (8 x SMs):
    XQA's sequence split, stream and blocks added, each block also paying per query head (p's 8th figure)."""
    floor, eff, eff_fp8, half, per_cta, floor_fp8, per_cta_fp8, *per_head = p
    rate = hbm * np.where(fp8, eff_fp8, eff) * ctas / (ctas + half)
    per = np.where(fp8, per_cta_fp8, per_cta)
    if split:
        return np.where(fp8, floor_fp8, floor) + nbytes / rate + xqa_ctas(ctas, n, split) * (per + g * per_head[0])
    return np.where(fp8, floor_fp8, floor) + np.maximum(nbytes / rate, per * ctas)


def _attention_fit(args, meas, split: bool):
    """The fitted figures [floor, eff, fp8 eff, half, per block, fp8 floor, fp8 per block(, per head)]."""
    x0 = [1e-5, 0.9, 0.8, 2.0, 2e-8, 1e-5, 2e-8] + ([1e-9] if split else [])
    lo, hi = [0.0, 0.2, 0.1, 0.0, 0.0, 0.0, 0.0] + [0.0] * split, [1e-4, 1.0, 1.0, 1e4, 1e-5, 1e-4, 1e-5] + [1e-6] * split
    if args[2].any():
        return list(_fit(_attention_model, x0, lo, hi, args, meas))

    def full(q):  # no fp8 KV timed (A100): fp8 takes the bf16 figures
        return [q[0], q[1], q[1], q[2], q[3], q[0], q[3], *q[4:]]

    keep = [0, 1, 3, 4] + ([7] if split else [])
    q = _fit(lambda q, *a: _attention_model(full(q), *a), [x0[i] for i in keep], [lo[i] for i in keep],
             [hi[i] for i in keep], args, meas)
    return full(q)


def _attention_domain(a, hbm: float, split: float, heads_per_kv: tuple[float, float] | None):
    """(model args, measured seconds) of the decode-attention rows at head dim 128 over >= 15 cached tokens
    (bf16 and fp8 KV), `heads_per_kv` (lo, hi) query heads per KV head only (None: all)."""
    a = a[(a["head_dim"] == 128) & (a["window"] == 0) & (a["kv_tokens"] >= 15) & a["kv_dtype"].isin(["bf16", "fp8"])]
    kv_heads = np.where(a["kv_heads"] == 0, a["heads"], a["kv_heads"]).astype(float)
    g = a["heads"].to_numpy() / kv_heads
    if heads_per_kv is not None:
        a, kv_heads, g = (x[(g >= heads_per_kv[0]) & (g <= heads_per_kv[1])] for x in (a, kv_heads, g))
    fp8 = (a["kv_dtype"] == "fp8").to_numpy()
    b, n = a["batch"].to_numpy().astype(float), a["kv_tokens"].to_numpy().astype(float)
    nbytes = (b * n + b) * 2 * kv_heads * 128 * np.where(fp8, 1.0, 2.0)  # every cached token read, the new one written
    return (nbytes, b * kv_heads, fp8, hbm, g, n, split), a["latency_s"].to_numpy()


def _figures(p) -> dict:
    """The decode-attention constants the catalog reads (`catalog.FittedAttention`), p as `_attention_fit`'s."""
    return {"floor_s": float(f"{p[0]:.4g}"), "hbm_efficiency": round(float(p[1]), 4),
            "fp8_hbm_efficiency": round(float(p[2]), 4), "half_ctas": float(f"{p[3]:.4g}"),
            "per_cta_s": float(f"{p[4]:.4g}"), "fp8_floor_s": float(f"{p[5]:.4g}"),
            "fp8_per_cta_s": float(f"{p[6]:.4g}")}


WINDOW_MIN_POINTS = 20  # a head dim's window rows in the tune split below this: no window fit of its own


def _window_attention_model(p, nbytes, ctas, fp8, hbm, g, n, split, past):
    """`_attention_model` over a window's tokens (each sequence's last min(n, W) read), plus what a sequence
    longer than its window costs on top: past x (floor + c x per-block cost), past = 1 where n > W. XQA's
    split (`split`) counts its blocks by the sequence's whole length n, as the tables show: TensorRT-LLM's
    window-128 call over 64 sequences doubles from 23 to 43 us once n passes 128 (H200), though it reads no
    more; vLLM's steps up 1-5 us there."""
    return _attention_model(p[:8], nbytes, ctas, fp8, hbm, g, n, split) + past * (p[8] + p[9] * ctas)


def _window_attention_fit(args, meas, split: bool) -> list:
    """The figures [floor, eff, fp8 eff, half, per block, fp8 floor, fp8 per block, per head, past floor, past
    per block]: per head 0 without XQA's split, the fp8 ones the bf16 ones where no fp8 KV is timed."""
    x0 = [1e-5, 0.9, 0.8, 2.0, 2e-8, 1e-5, 2e-8, 1e-9, 1e-6, 1e-9]
    lo, hi = [0.0, 0.05, 0.05] + [0.0] * 7, [1e-4, 1.0, 1.0, 1e4, 1e-5, 1e-4, 1e-5, 1e-6, 1e-4, 1e-6]
    fp8 = bool(args[2].any())
    keep = [0, 1, 3, 4] + ([2, 5, 6] if fp8 else []) + ([7] if split else []) + [8, 9]

    def full(q):
        p = dict(zip(keep, q))
        out = [p.get(i, 0.0) for i in range(10)]
        if not fp8:
            out[2], out[5], out[6] = out[1], out[0], out[4]
        return out

    q = _fit(lambda q, *a: _window_attention_model(full(q), *a), [x0[i] for i in keep], [lo[i] for i in keep],
             [hi[i] for i in keep], args, meas)
    return full(q)


def _window_attention_domain(a, hbm: float, split: float, head_dim: int, heads_per_kv: tuple[float, float] | None):
    """(model args, measured seconds) of the decode table's sliding-window rows at `head_dim` over >= 15 cached
    tokens (bf16 and fp8 KV; every window the tables time at that head dim), `heads_per_kv` as
    `_attention_domain`'s."""
    a = a[(a["window"] > 0) & (a["head_dim"] == head_dim) & (a["kv_tokens"] >= 15)
          & a["kv_dtype"].isin(["bf16", "fp8"])]
    kv_heads = np.where(a["kv_heads"] == 0, a["heads"], a["kv_heads"]).astype(float)
    g = a["heads"].to_numpy() / kv_heads
    if heads_per_kv is not None:
        keep = (g >= heads_per_kv[0]) & (g <= heads_per_kv[1])
        a, kv_heads, g = a[keep], kv_heads[keep], g[keep]
    fp8 = (a["kv_dtype"] == "fp8").to_numpy()
    b, n, w = (a[k].to_numpy().astype(float) for k in ("batch", "kv_tokens", "window"))
    nbytes = (b * np.minimum(n, w) + b) * 2 * kv_heads * head_dim * np.where(fp8, 1.0, 2.0)
    return (nbytes, b * kv_heads, fp8, hbm, g, n, split, (n > w).astype(float)), a["latency_s"].to_numpy()


def _window_attention(gpu, tune, held, framework: str = FRAMEWORK) -> dict | None:
    """A sliding window's decode attention on its own fit per head dim (`_window_attention_model` on
    `_window_attention_domain`), where the tune split times >= `WINDOW_MIN_POINTS` rows of it; TensorRT-LLM's
    over XQA's 2-32 query heads per KV head, its sequence split kept as `_attention` keeps it. The decode fit
    over the window's tokens, which physics gave a window layer before, left a 14-26% held-out median on
    H100 / H200 (TensorRT-LLM's blocks grow with n, not W; the head dims differ: SGLang's head-dim-192 rows
    run ~2x slower than head dim 128's form says). None where the tables time no window."""
    spec, xqa, out = catalog.gpu(gpu), framework == XQA_FRAMEWORK, {}
    ranges = XQA_HEADS_PER_KV if xqa else None
    a = tune.decode_attention
    for head_dim in sorted(int(d) for d in a.loc[a["window"] > 0, "head_dim"].unique()):
        fits = []
        for split in ((0.0, 8.0 * spec.sm_count) if xqa and spec.sm_count else (0.0,)):
            args, meas = _window_attention_domain(tune.decode_attention, spec.hbm_bytes_per_s, split, head_dim, ranges)
            if len(meas) < WINDOW_MIN_POINTS:
                break
            p = _window_attention_fit(args, meas, bool(split))
            fits.append((_errors(_window_attention_model(p, *args), meas), p, split))
        if not fits:
            continue
        tune_errors, p, split = (fits[1] if len(fits) > 1 and fits[1][0]["median"] <= fits[0][0]["median"] - XQA_GAIN
                                 else fits[0])
        h_args, h_meas = _window_attention_domain(held.decode_attention, spec.hbm_bytes_per_s, split, head_dim, ranges)
        out[head_dim] = {**_figures(p), "per_cta_head_s": float(f"{p[7]:.4g}") if split else 0.0,
                         "sequence_split": bool(split), "past_window_floor_s": float(f"{p[8]:.4g}"),
                         "past_window_per_cta_s": float(f"{p[9]:.4g}"), "tune": tune_errors,
                         "held_out": _errors(_window_attention_model(p, *h_args), h_meas)}
    return out or None


def _mha_attention(gpu, tune, held) -> dict | None:
    """TensorRT-LLM's multi-head decode kernel (MMHA) on its own: the tables' rows of one query head per KV head,
    which XQA leaves to it (`XQA_HEADS_PER_KV`), in the overlapping form with c = batch x heads blocks. The
    engine runs it for the chunked layers XQA refuses below compute capability 10.x
    (`engine_rules.trtllm_chunked_decode_on_mmha`); None where the tables time no such row."""
    spec = catalog.gpu(gpu)
    args, meas = _attention_domain(tune.decode_attention, spec.hbm_bytes_per_s, 0.0, (1.0, 1.0))
    if not len(meas):
        return None
    p = _attention_fit(args, meas, False)
    h_args, h_meas = _attention_domain(held.decode_attention, spec.hbm_bytes_per_s, 0.0, (1.0, 1.0))
    return {**_figures(p), "tune": _errors(_attention_model(p, *args), meas),
            "held_out": _errors(_attention_model(p, *h_args), h_meas)}


def _attention(gpu, tune, held, framework: str = FRAMEWORK) -> dict:
    """bf16 and fp8 KV together (fp8 its own streaming efficiency; the bf16 one where no fp8 KV is timed).
    TensorRT-LLM (XQA): over 2-32 query heads per KV head, the overlapping form and XQA's sequence split
    both fitted, the split kept where its tune median is lower by `XQA_GAIN` or more (the held-out split never
    chooses)."""
    spec = catalog.gpu(gpu)
    xqa = framework == XQA_FRAMEWORK

    def domain(a, split):
        return _attention_domain(a, spec.hbm_bytes_per_s, split, XQA_HEADS_PER_KV if xqa else None)

    fits = []  # the split needs the GPU's SM count (B200's is not published: the overlapping form only)
    for split in ((0.0, 8.0 * spec.sm_count) if xqa and spec.sm_count else (0.0,)):
        args, meas = domain(tune.decode_attention, split)
        p = _attention_fit(args, meas, bool(split))
        fits.append((_errors(_attention_model(p, *args), meas), p, split))
    # the split where it lowers the tune median by a point or more (L40S: 19.51% against 19.52%, a tie)
    tune_errors, p, split = fits[1] if len(fits) > 1 and fits[1][0]["median"] <= fits[0][0]["median"] - XQA_GAIN else fits[0]
    h_args, h_meas = domain(held.decode_attention, split)
    xqa_figures = {"per_cta_head_s": float(f"{p[7]:.4g}") if split else 0.0, "sequence_split": bool(split)} if xqa else {}
    held_errors = _errors(_attention_model(p, *h_args), h_meas)
    return {**_figures(p), **xqa_figures, "tune": tune_errors, "held_out": held_errors}


# the prefill form's start and bounds: floor, FLOP efficiency, half tokens, half tiles, cache write a token and KV head
PREFILL_START_BOUNDS = ([1e-5, 0.6, 500.0, 50.0, 1e-12], [0.0, 0.05, 1.0, 0.0, 0.0], [1e-3, 1.0, 1e5, 1e5, 1e-8])


def _prefill_model(p, flop, nbytes, n, tiles, token_heads, peak, hbm):
    """`physics.datasheet_prefill_attention_s` of whole prompts."""
    floor, ef, half, half_tiles, kv_write = p
    return floor + np.maximum(flop / (peak * ef * n / (n + half) * tiles / (tiles + half_tiles)), nbytes / hbm) \
        + kv_write * token_heads


def _prefill(gpu, tune, held, attention: dict) -> dict | None:
    """Per KV dtype the context table times (bf16, fp8): the floor, the FLOP efficiency plateau, the prompt
    length and the query-tile count at half of it, and each new token's cache write per KV head; the
    bytes side at the decode fit's bf16 HBM efficiency. None where the tables have no context table."""
    if tune.context_attention is None:
        return None
    spec = catalog.gpu(gpu)
    out = {}
    for dtype in ("bf16", "fp8"):
        def domain(c, d=128):
            c = c[(c["kv_dtype"] == dtype) & (c["head_dim"] == d) & (c["window"] == 0) & (c["kv_tokens"] >= 15)]
            kv_heads = np.where(c["kv_heads"] == 0, c["heads"], c["kv_heads"])
            b, n, h = (c[k].to_numpy().astype(float) for k in ("batch", "kv_tokens", "heads"))
            flop = 4 * h * d * b * n * (n + 1) / 2
            tiles = b * h * np.ceil(n / 128)
            kv_bytes = b * n * 2 * kv_heads * d * ELEMENT_BYTES[dtype]
            return (flop, kv_bytes, n, tiles, b * n * kv_heads, spec.bf16_flop_per_s,
                    spec.hbm_bytes_per_s * attention["hbm_efficiency"]), c["latency_s"].to_numpy()

        args, meas = domain(tune.context_attention)
        if not len(meas):
            continue
        p = _fit(_prefill_model, *PREFILL_START_BOUNDS, args, meas)
        h_args, h_meas = domain(held.context_attention)
        out[dtype] = {"floor_s": float(f"{p[0]:.4g}"), "flop_efficiency": round(float(p[1]), 4),
                      "half_tokens": float(f"{p[2]:.4g}"), "half_tiles": float(f"{p[3]:.4g}"),
                      "kv_write_s": float(f"{p[4]:.4g}"),
                      "tune": _errors(_prefill_model(p, *args), meas),
                      "held_out": _errors(_prefill_model(p, *h_args), h_meas),
                      **_head_dim_64(p, domain(tune.context_attention, 64), domain(held.context_attention, 64))}
    return out or None


def _mla_prefill_domain(gpu: str, c, dtype: str, attention: dict) -> tuple:
    """TensorRT-LLM's context-MLA rows of one KV dtype as `physics.prefill_attention_s` asks the datasheet
    formula for DeepSeek-R1 sharded to the row's heads: its MLA FLOP a pair (q / k of 192, v of 128 a head),
    the latent bytes a token, head dim 192, one latent KV head."""
    if c is None or not len(c):
        return (), np.array([])
    c = c[c["kv_dtype"] == dtype]
    spec, r1 = catalog.gpu(gpu), catalog.model("deepseek-r1")
    b, n, h = (c[k].to_numpy().astype(float) for k in ("batch", "tokens", "heads"))
    per_pair = np.array([kind_prefill_flop_per_pair(r1.shard(r1.num_heads // int(x)), MLA) for x in h])
    latent = r1.kind_kv_bytes_per_token_layer(MLA, dtype)
    return ((per_pair * b * n * (n + 1) / 2, b * n * latent, n, b * h * np.ceil(n / 128), b * n, spec.bf16_flop_per_s,
             spec.hbm_bytes_per_s * attention["hbm_efficiency"]), c["latency_s"].to_numpy())


def _mla_prefill(gpu, tune, held, attention: dict) -> dict | None:
    """MLA prefill (TensorRT-LLM's context-MLA kernel, not absorbed) on its own fit per KV dtype, the prefill
    attention form and parameters (`_prefill_model`) on the context-MLA rows as physics asks them for
    DeepSeek-R1 (`_mla_prefill_domain`); the GQA fit's shape left its held-out median at 9-18% there. None
    where the tables time none."""
    out = {}
    for dtype in ("bf16", "fp8"):
        args, meas = _mla_prefill_domain(gpu, tune.mla_context, dtype, attention)
        h_args, h_meas = _mla_prefill_domain(gpu, held.mla_context, dtype, attention)
        if not len(meas) or not len(h_meas):
            continue
        p = _fit(_prefill_model, *PREFILL_START_BOUNDS, args, meas)
        out[dtype] = {"floor_s": float(f"{p[0]:.4g}"), "flop_efficiency": round(float(p[1]), 4),
                      "half_tokens": float(f"{p[2]:.4g}"), "half_tiles": float(f"{p[3]:.4g}"),
                      "kv_write_s": float(f"{p[4]:.4g}"), "tune": _errors(_prefill_model(p, *args), meas),
                      "held_out": _errors(_prefill_model(p, *h_args), h_meas)}
    return out or None


def _window_prefill_domain(gpu: str, c, dtype: str, attention: dict, skips: bool) -> tuple:
    """The context table's sliding-window rows of one KV dtype (every window and head dim it times:
    gpt-oss's 128 at head dim 64 among them) as physics asks the datasheet formula for a window layer.
    `skips`: a kernel that skips the key tiles outside the window, 4 H d b x the window's pairs
    (`window_pairs`) at the rate of a prompt of min(n, W) tokens - the length its key loop runs (rated at
    n, the fit left 7-23% on H100 / H200 / B200 and 2-3x on the head-dim-128 rows); else one that masks
    them, the whole causal prompt's pairs at n's rate."""
    if c is None:
        return (), np.array([])
    c = c[(c["kv_dtype"] == dtype) & (c["window"] > 0) & (c["kv_tokens"] >= 15)]
    spec = catalog.gpu(gpu)
    kv_heads = np.where(c["kv_heads"] == 0, c["heads"], c["kv_heads"])
    b, n, h, d, w = (c[k].to_numpy().astype(float) for k in ("batch", "kv_tokens", "heads", "head_dim", "window"))
    pairs, length = window_prefill_work(n, w, skips)
    return ((4 * h * d * b * pairs, b * n * 2 * kv_heads * d * ELEMENT_BYTES[dtype], length,
             b * h * np.ceil(n / 128), b * n * kv_heads, spec.bf16_flop_per_s,
             spec.hbm_bytes_per_s * attention["hbm_efficiency"]), c["latency_s"].to_numpy())


def _window_prefill(gpu, tune, held, attention: dict) -> dict | None:
    """A sliding window's prefill attention on its own fit per KV dtype, the prefill form and parameters
    (`_prefill_model`) on the window rows (`_window_prefill_domain`), as a kernel that skips the tiles
    outside the window or one that masks them - whichever fits the tune split better (`skips_window`;
    SGLang's kernels on L40S, the RTX PRO 6000 and Blackwell mask them: held-out 16-20% and, Blackwell fp8,
    5%, where the skipping form left 30-52%; its Blackwell bf16 rows fit neither, 22-40%). The head-dim-128
    fit, which physics gave a window layer's FLOP before, left a 21-31% held-out median there (a window-128
    prompt of 8,192 tokens on H200 5x too fast). None where the tables time no window."""
    out = {}
    for dtype in ("bf16", "fp8"):
        fits = []
        for skips in (True, False):
            args, meas = _window_prefill_domain(gpu, tune.context_attention, dtype, attention, skips)
            h_args, h_meas = _window_prefill_domain(gpu, held.context_attention, dtype, attention, skips)
            if not len(meas) or not len(h_meas):
                break
            p = _fit(_prefill_model, *PREFILL_START_BOUNDS, args, meas)
            fits.append((_errors(_prefill_model(p, *args), meas), p, skips, _errors(_prefill_model(p, *h_args), h_meas)))
        if not fits:
            continue
        tune_errors, p, skips, held_errors = min(fits, key=lambda f: f[0]["median"])
        out[dtype] = {"floor_s": float(f"{p[0]:.4g}"), "flop_efficiency": round(float(p[1]), 4),
                      "half_tokens": float(f"{p[2]:.4g}"), "half_tiles": float(f"{p[3]:.4g}"),
                      "kv_write_s": float(f"{p[4]:.4g}"), "skips_window": skips, "tune": tune_errors,
                      "held_out": held_errors}
    return out or None


def _head_dim_64(p, tune: tuple, held: tuple) -> dict:
    """Head dim 64's FLOP efficiency as a scale on the head-dim-128 fit `p` (the rest held), fitted on the
    tune split's head-dim-64 rows and scored on the held-out ones; nothing where the tables time none."""
    (args, meas), (h_args, h_meas) = tune, held
    if not len(meas) or not len(h_meas):
        return {}

    def model(q, *a):
        return _prefill_model([p[0], p[1] * q[0], *p[2:]], *a)

    scale = _fit(model, [1.0], [0.1], [2.0], args, meas)
    return {"head_dim_64_flop_scale": round(float(scale[0]), 4),
            "held_out_head_dim_64": _errors(model(scale, *h_args), h_meas)}


MLA_BLOCK_HEADS = 64  # query heads one block of the absorbed MLA kernel takes (FlashMLA's tile)


def _mla_model(p, flop, nbytes, fp8, blocks, peak, hbm):
    """`physics.mla_datasheet_attention_s`: floor + max(latent bytes / (HBM x efficiency(KV dtype) x
    blocks / (blocks + half_blocks)), FLOP / (bf16 peak x FLOP efficiency))."""
    floor, e, e8, ef, half = p
    return floor + np.maximum(nbytes / (hbm * np.where(fp8, e8, e) * blocks / (blocks + half)), flop / (peak * ef))


def _mla(gpu, tune, held) -> dict | None:
    """The absorbed MLA decode kernel (the tables' generation_mla, DeepSeek-V3's 512 + 64 latent, heads
    per GPU as TP leaves them), bf16 and fp8 latents; None where the tables time none."""
    if tune.mla_decode is None or not len(tune.mla_decode):
        return None
    spec = catalog.gpu(gpu)
    r1 = catalog.model("deepseek-r1")
    mla = r1.mla

    def domain(m):
        h, b, n = (m[k].to_numpy().astype(float) for k in ("heads", "batch", "kv_tokens"))
        fp8 = (m["kv_dtype"] == "fp8").to_numpy()
        flop = FLOP_PER_MAC * h * (mla.latent_dim + mla.kv_lora_rank) * b * n  # absorbed: QK over the latent, PV
        nbytes = (b * n + b) * mla.latent_dim * np.where(fp8, 1.0, 2.0)
        return (flop, nbytes, fp8, b * np.ceil(h / MLA_BLOCK_HEADS), spec.bf16_flop_per_s, spec.hbm_bytes_per_s), \
            m["latency_s"].to_numpy()

    args, meas = domain(tune.mla_decode[tune.mla_decode["kv_dtype"].isin(["bf16", "fp8"])])
    p = _fit(_mla_model, [1e-5, 0.8, 0.8, 0.5, 1.0], [0.0, 0.1, 0.1, 0.05, 0.0], [1e-3, 1.0, 1.0, 1.0, 1e4], args, meas)
    h_args, h_meas = domain(held.mla_decode[held.mla_decode["kv_dtype"].isin(["bf16", "fp8"])])
    return {"floor_s": float(f"{p[0]:.4g}"), "hbm_efficiency": round(float(p[1]), 4),
            "fp8_hbm_efficiency": round(float(p[2]), 4), "flop_efficiency": round(float(p[3]), 4),
            "half_blocks": float(f"{p[4]:.4g}"),
            "tune": _errors(_mla_model(p, *args), meas), "held_out": _errors(_mla_model(p, *h_args), h_meas)}


def _mla_bmm_model(p, flop, nbytes, peak, hbm):
    """`moe_mla_costs.datasheet_mla_bmm_s`: floor + max(FLOP / (peak x ef), bytes / (HBM x eh))."""
    return p[0] + np.maximum(flop / (peak * p[1]), nbytes / (hbm * p[2]))


def _mla_bmm(gpu, tune, held) -> dict | None:
    """Absorbed MLA's BMMs (the tables' mla_bmm, pre and post alike: the same FLOP and bytes), per BMM dtype."""
    if tune.mla_bmm is None or not len(tune.mla_bmm):
        return None
    spec = catalog.gpu(gpu)
    out = {}
    for dtype, t in tune.mla_bmm.groupby("dtype"):
        peak = spec.matmul_peak(dtype)[0]

        def domain(b, dtype=dtype, peak=peak):
            b = b[b["dtype"] == dtype]
            flop, nbytes = mla_bmm_work(b["tokens"].to_numpy().astype(float), b["heads"].to_numpy().astype(float),
                                        1.0 if dtype == "fp8" else 2.0)
            return (flop, nbytes, peak, spec.hbm_bytes_per_s), b["latency_s"].to_numpy()

        args, meas = domain(t)
        h_args, h_meas = domain(held.mla_bmm)
        p = _fit(_mla_bmm_model, [5e-6, 0.5, 0.5], [0.0, 0.01, 0.01], [1e-3, 1.0, 1.0], args, meas)
        out[dtype] = {"floor_s": float(f"{p[0]:.4g}"), "flop_efficiency": round(float(p[1]), 4),
                      "hbm_efficiency": round(float(p[2]), 4),
                      "tune": _errors(_mla_bmm_model(p, *args), meas), "held_out": _errors(_mla_bmm_model(p, *h_args), h_meas)}
    return out


def _moe_model(p, touched, pairs, expert, wb, hidden, inter, tokens, peak, hbm):
    """`physics.datasheet_moe_s`: floor + touched x per-expert cost + max(touched experts' weights / (HBM x ew),
    2 x pairs x expert params / (peak x ef x r / (r + half_rows))) + routed rows gathered and scattered (pairs x (h +
    I) x 2 B / (HBM x ea)) + the tokens entering (tokens x h x 2 B / (HBM x et)), r = pairs / touched rows per expert."""
    floor, per_expert, ew, ef, half, ea, et = p
    r = pairs / np.maximum(touched, 1e-9)
    return (floor + touched * per_expert
            + np.maximum(touched * expert * wb / (hbm * ew), 2 * pairs * expert / (peak * ef * r / (r + half)))
            + pairs * (hidden + inter) * 2.0 / (hbm * ea) + tokens * hidden * 2.0 / (hbm * et))


def _moe(gpu, tune, held, power_law: bool = False) -> dict | None:
    """One GPU's fused routed experts (the tables' vLLM fused_experts), per weight format, at the experts and
    token-expert pairs the benchmark put on the GPU it timed: the rows of balanced routing
    (`moe_mla_accuracy.balanced_rank0`), or with `power_law` those of both power-law routings at the expected
    load of their draw (`sim.model.power_law.power_law_load`); None where the tables time no MoE."""
    if tune.moe is None or not len(tune.moe):
        return None
    spec = catalog.gpu(gpu)
    out = {}
    for quant in sorted(set(tune.moe["quant"])):
        if quant not in QUANT_AS:
            continue
        dtype, group = QUANT_AS[quant]
        wb = WEIGHT_DTYPES[dtype].bytes_for(2**20, group) / 2**20
        peak = moe_peak_flop_per_s(spec, quant)

        def domain(m):
            routed = m["distribution"] != "balanced" if power_law else m["distribution"] == "balanced"
            m = m[(m["quant"] == quant) & routed]
            rows = m[["tokens", "experts", "top_k", "ep", "distribution"]].itertuples(index=False)
            load = [_routed_load(*row) for row in rows]
            touched, pairs = (np.array(load, dtype=float).T if load else (np.zeros(0), np.zeros(0)))
            h, inter = m["hidden"].to_numpy(float), (m["inter"] // m["tp"]).to_numpy(float)
            return (touched, pairs, 3.0 * h * inter, wb, h, inter, m["tokens"].to_numpy(float), peak,
                    spec.hbm_bytes_per_s), m["latency_s"].to_numpy()

        args, meas = domain(tune.moe)
        h_args, h_meas = domain(held.moe)
        if not len(meas) or not len(h_meas):
            continue
        p = _fit(_moe_model, [1e-5, 1e-7, 0.7, 0.5, 16.0, 0.5, 0.5], [0.0, 0.0, 0.05, 0.01, 0.0, 0.005, 0.005],
                 [2e-4, 1e-4, 1.0, 1.0, 2048.0, 50.0, 50.0], args, meas)
        out[quant] = {"floor_s": float(f"{p[0]:.4g}"), "per_expert_s": float(f"{p[1]:.4g}"),
                      "weight_hbm_efficiency": round(float(p[2]), 4), "flop_efficiency": round(float(p[3]), 4),
                      "half_rows": float(f"{p[4]:.4g}"), "pair_hbm_efficiency": round(float(p[5]), 4),
                      "token_hbm_efficiency": round(float(p[6]), 4),
                      "tune": _errors(_moe_model(p, *args), meas), "held_out": _errors(_moe_model(p, *h_args), h_meas)}
    return out or None


def _routed_load(tokens, experts, top_k, ep, distribution) -> tuple[float, float]:
    """(experts, pairs) a table row's routing put on the GPU it timed: balanced's exactly, a power law's expected."""
    alpha = routing_alpha(distribution)
    if alpha is None:
        return balanced_rank0(int(tokens), int(experts), int(top_k), int(ep))
    return power_law_load(int(tokens), int(experts), int(top_k), int(ep), alpha)


def _allreduce_model(p, nbytes, gpus):
    """`collectives.two_protocol_allreduce_s`: the faster of a latency protocol and a bandwidth one."""
    ring = 2 * (gpus - 1) / gpus * nbytes
    return np.minimum(p[0] + ring / (p[1] * 1e9), p[2] + ring / (p[3] * 1e9))


def _gather_model(p, nbytes, gpus):
    """`collectives.two_protocol_s` over (N - 1) / N of the whole buffer (all-gather, reduce-scatter)."""
    return _allreduce_model(p, nbytes / 2, gpus)  # 2 (N - 1) / N x S / 2


def _protocols(model, tune: dict, held: dict) -> dict:
    """Per table (an all-reduce implementation, or NCCL's all_gather / reduce_scatter) and group size the
    tables measure: two (floor, busbw) protocols, the faster one taken at each size (NCCL's LL / Simple
    protocols, a custom kernel's one-shot / two-shot)."""
    out = {}
    for name, t in tune.items():
        def domain(c):
            c = c[c["bytes"] <= 64 * 2**20]
            return (c["bytes"].to_numpy(), c["gpus"].to_numpy().astype(float)), c["latency_s"].to_numpy()

        args, meas = domain(t)
        h_args, h_meas = domain(held[name])
        by_gpus, pred, h_pred = {}, np.empty_like(meas), np.empty_like(h_meas)
        for n in sorted(set(args[1].astype(int))):
            at, h_at = args[1] == n, h_args[1] == n
            p = _fit(model, [5e-6, 50.0, 2e-5, 300.0], [0.0, 0.1, 0.0, 0.1], [1e-3, 5000.0, 1e-3, 5000.0],
                     (args[0][at], float(n)), meas[at])
            lat, bw = sorted([(p[0], p[1]), (p[2], p[3])])  # the latency protocol: the lower floor
            p = [lat[0], lat[1], bw[0], bw[1]]
            pred[at] = model(p, args[0][at], float(n))
            h_pred[h_at] = model(p, h_args[0][h_at], float(n))
            by_gpus[int(n)] = {"latency_floor_s": float(f"{p[0]:.4g}"), "latency_bus_bytes_per_s": float(f"{p[1] * 1e9:.4g}"),
                               "bandwidth_floor_s": float(f"{p[2]:.4g}"),
                               "bandwidth_bus_bytes_per_s": float(f"{p[3] * 1e9:.4g}")}
        out[name] = {"by_gpus": by_gpus, "tune": _errors(pred, meas), "held_out": _errors(h_pred, h_meas)}
    return out


def _alltoall(tune, held) -> dict | None:
    """Per DeepEP kernel and phase: (floor, bytes / s) over every shape the tables time (`a2a_roofline_s`'s bytes)."""
    if tune.a2a is None or not len(tune.a2a):
        return None

    def domain(a):
        remote = np.array([expected_remote_ranks(int(e), int(k), int(p)) for e, k, p in a[["experts", "top_k", "ep"]].to_numpy()])
        wire = a["wire"].map(A2A_WIRE_BYTES).to_numpy()
        return (a["tokens"].to_numpy() * remote * a["hidden"].to_numpy() * wire,), a["latency_s"].to_numpy()

    out = {}
    for (backend, phase), t in tune.a2a.groupby(["backend", "phase"]):
        args, meas = domain(t)
        h = held.a2a[(held.a2a["backend"] == backend) & (held.a2a["phase"] == phase)]
        h_args, h_meas = domain(h)
        p = _fit(_a2a_model, [3e-5, 300.0], [0.0, 1.0], [1e-3, 5000.0], args, meas)
        out.setdefault(backend, {})[phase] = {
            "floor_s": float(f"{p[0]:.4g}"), "bytes_per_s": float(f"{p[1] * 1e9:.4g}"),
            "tune": _errors(_a2a_model(p, *args), meas), "held_out": _errors(_a2a_model(p, *h_args), h_meas)}
    return out


def _a2a_model(p, nbytes):
    """One DeepEP phase: floor + bytes / rate (GB/s)."""
    return p[0] + nbytes / (p[1] * 1e9)


def fit(framework: str = FRAMEWORK) -> dict:
    """Every GPU's constants fitted on `framework`'s tables (the engine's kernels: vLLM's, SGLang's,
    TensorRT-LLM's)."""
    gpus = {}
    versions = set()
    for gpu in SYSTEMS:
        tables = with_moe_mla(load_tables(gpu, framework))
        versions.add(f"{tables.system}: {tables.framework} {tables.framework_version}, NCCL {tables.nccl_version}")
        tune, held = split_tables(tables)
        attention = _attention(gpu, tune, held, framework)
        gpus[gpu] = {"gemm": _gemm(gpu, tune, held), "attention": attention,
                     "allreduce": _protocols(_allreduce_model, tune.allreduce, held.allreduce)}
        if tune.gather:
            gpus[gpu]["gather"] = _protocols(_gather_model, tune.gather, held.gather)
        a2a = _alltoall(tune, held)
        if a2a is not None:
            gpus[gpu]["alltoall"] = a2a
        prefill = _prefill(gpu, tune, held, attention)
        if prefill is not None:
            gpus[gpu]["prefill_attention"] = prefill
        mla_prefill = _mla_prefill(gpu, tune, held, attention)
        if mla_prefill is not None:
            gpus[gpu]["mla_prefill"] = mla_prefill
        window_prefill = _window_prefill(gpu, tune, held, attention)
        if window_prefill is not None:
            gpus[gpu]["window_prefill"] = window_prefill
        window_attention = _window_attention(gpu, tune, held, framework)
        if window_attention is not None:
            gpus[gpu]["window_attention"] = window_attention
        mha = _mha_attention(gpu, tune, held) if framework == XQA_FRAMEWORK else None
        if mha is not None:
            gpus[gpu]["mha_attention"] = mha
        mla = _mla(gpu, tune, held)
        if mla is not None:
            gpus[gpu]["mla_attention"] = mla
        bmm = _mla_bmm(gpu, tune, held)
        if bmm:
            gpus[gpu]["mla_bmm"] = bmm
        moe = _moe(gpu, tune, held)
        if moe is not None:
            gpus[gpu]["moe"] = moe
        moe_power_law = _moe(gpu, tune, held, power_law=True)
        if moe_power_law is not None:
            gpus[gpu]["moe_power_law"] = moe_power_law
    package = load_tables(next(iter(SYSTEMS)), framework).package_version
    return {"source": (f"fitted: {PACKAGE} {package} (NVIDIA AIConfigurator kernel database, Apache-2.0), tune "
                       f"split of {'; '.join(sorted(versions))}; GEMMs of 1-8192 rows with n, k >= 256, decode "
                       f"attention at head dim 128{XQA_DOMAIN if framework == XQA_FRAMEWORK else ''} over >= 15 cached "
                       f"tokens (bf16 and fp8 KV), prefill attention at "
                       f"head dim 128 over prompts of >= 15 tokens (bf16 and fp8 KV), sliding-window decode and "
                       f"prefill attention (every window the tables time), all-reduces, all-gathers and "
                       f"reduce-scatters to 64 MiB, DeepEP all-to-alls"),
            "gpus": gpus}


def _differences(committed, fitted, path: str = "", rel: float = 5e-3) -> list[str]:
    """Where the committed constants and a fresh fit disagree by more than `rel` (a solver release
    may move the last printed digit; a changed table or model moves more)."""
    if isinstance(fitted, dict):
        if not isinstance(committed, dict) or set(committed) != set(fitted):
            return [f"{path or 'top'}: keys differ"]
        return [d for k in fitted for d in _differences(committed[k], fitted[k], f"{path}.{k}".lstrip("."), rel)]
    if isinstance(fitted, (int, float)) and isinstance(committed, (int, float)):
        return [] if abs(committed - fitted) <= rel * max(abs(fitted), 1e-12) + 1e-12 else [f"{path}: {committed} vs {fitted}"]
    return [] if committed == fitted else [f"{path}: differs"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing them")
    args = ap.parse_args()
    failed = False
    for framework in FRAMEWORKS:  # one file per engine whose kernels the tables time
        out = OUT.with_name(catalog.fitted_kernels_file(framework))
        fitted = fit(framework)
        if args.check:
            differ = _differences(yaml.safe_load(out.read_text()) if out.is_file() else {}, fitted)
            print(f"{out}: " + ("matches the fit" if not differ else "differs from the fit (rerun "
                                "scripts/fit_datasheet.py): " + "; ".join(differ[:5])))
            failed = failed or bool(differ)
            continue
        tmp = out.with_suffix(".yaml.tmp")
        tmp.write_text(HEADER + yaml.safe_dump(fitted, sort_keys=False, width=120))
        tmp.replace(out)
        print(f"wrote {out}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
