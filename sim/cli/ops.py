"""`kvsim ops`: one operator's predicted time from flags, or a CSV of operators in and a CSV of
predicted times out - by kvtier's datasheet model, by the measured kernel tables, or both - so
anyone can hold kvtier against a measured table without importing its internals."""

from __future__ import annotations

import csv
import functools
import io
import sys
from pathlib import Path
from typing import Optional

import typer

from sim.inputs.errors import ConfigError
from sim.outputs.run_folder import to_json

OPS = "gemm, attention, prefill, allreduce, allgather, reducescatter, alltoall, mlabmm, elementwise, moe"
KERNELS_HELP = "datasheet, measured or both (measured: AIConfigurator's tables, where they cover the GPU)"


def ops(
    op: Optional[str] = typer.Argument(None, help=f"{OPS} (or give --csv)"),
    gpu: str = typer.Option("h200-sxm", "--gpu", help="catalog GPU (kvsim gpus)"),
    m: Optional[int] = typer.Option(None, "--m", help="gemm, elementwise: rows (tokens)"),
    n: Optional[int] = typer.Option(None, "--n", help="gemm: output features per GPU"),
    k: Optional[int] = typer.Option(None, "--k", help="gemm: input features (the reduction)"),
    dtype: Optional[str] = typer.Option(
        None, "--dtype", help="gemm, moe: weight dtype bf16, fp16, fp8, int8 (not moe), int4, nvfp4, mxfp4; "
                              "mlabmm: bf16, fp8"),
    batch: Optional[int] = typer.Option(None, "--batch", help="attention: sequences"),
    kv_tokens: Optional[int] = typer.Option(None, "--kv-tokens", help="attention: cached tokens each attends; "
                                            "prefill: each prompt's tokens"),
    heads: Optional[int] = typer.Option(None, "--heads", help="attention, mlabmm: query heads per GPU"),
    kv_heads: Optional[int] = typer.Option(None, "--kv-heads", help="attention: KV heads per GPU"),
    head_dim: Optional[int] = typer.Option(None, "--head-dim", help="attention: head dimension"),
    kv_dtype: Optional[str] = typer.Option(None, "--kv-dtype", help="attention: KV dtype bf16, fp16, fp8, int8"),
    window: Optional[int] = typer.Option(None, "--window", help="attention, prefill: a sliding window of W tokens"),
    nbytes: Optional[float] = typer.Option(None, "--bytes", help="allreduce: message bytes; allgather / reducescatter: "
                                           "the whole buffer (gathered output, reduced input)"),
    gpus: Optional[int] = typer.Option(None, "--gpus", help="allreduce, allgather, reducescatter: GPUs; alltoall: EP ranks"),
    impl: Optional[str] = typer.Option(None, "--impl", help="allreduce: custom or nccl"),
    tokens: Optional[int] = typer.Option(None, "--tokens", help="alltoall: tokens a rank; mlabmm: tokens; moe: tokens "
                                         "entering the layer"),
    hidden: Optional[int] = typer.Option(None, "--hidden", help="alltoall, moe: hidden size"),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="alltoall, moe: experts a token"),
    experts: Optional[int] = typer.Option(None, "--experts", help="alltoall, moe: routed experts"),
    inter: int | None = typer.Option(None, "--inter", help="moe: one expert's full intermediate width"),
    tp: int | None = typer.Option(None, "--tp", help="moe: GPUs splitting every expert's width (default 1)"),
    ep: int | None = typer.Option(None, "--ep", help="moe: GPUs splitting the experts whole (default 1)"),
    routing: str | None = typer.Option(None, "--routing", help="moe: the tables' routing, balanced (default), "
                                       "power_law_1.01 or power_law_1.2 (a model's own: docs/models.md moe_routing)"),
    phase: Optional[str] = typer.Option(None, "--phase", help="alltoall: dispatch or combine"),
    kernel: Optional[str] = typer.Option(None, "--kernel", help="alltoall: DeepEP's ll (low latency) or ht"),
    wire: Optional[str] = typer.Option(None, "--wire", help="alltoall: bf16, fp8 (TensorRT-LLM's tables), default (vLLM's)"),
    bmm: Optional[str] = typer.Option(None, "--bmm", help="mlabmm: pre (q_nope x W_UK) or post (latent x W_UV)"),
    kind: Optional[str] = typer.Option(None, "--kind", help="elementwise: rmsnorm, add_rmsnorm, rope, silu_mul or add"),
    width: Optional[int] = typer.Option(None, "--width", help="elementwise: elements a row on one GPU (hidden size; "
                                        "rope: rotated q + k; silu_mul: the MLP's intermediate / tp)"),
    csv_in: Optional[Path] = typer.Option(None, "--csv", help="operators, one per row (columns as the flags: op, gpu, m, n, k, ...)"),
    out: Optional[Path] = typer.Option(None, "--out", help="with --csv: write the predictions here (default stdout)"),
    kernels: str = typer.Option("both", "--kernels", help=KERNELS_HELP),
    framework: str = typer.Option("vllm", "--tables", help="whose kernels - vllm, sglang or trtllm: the tables "
                               "AIConfigurator measured of that engine (measured), and the datasheet constants fitted "
                               "on them (datasheet)"),
    profile: Optional[Path] = typer.Option(None, "--profile", help="measured: the kernels a hwprobe calibrate profile timed "
                                           "on your own device, instead of AIConfigurator's tables"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """Predicted time of one operator call (GEMM, decode or prefill attention, all-reduce, all-gather,
    reduce-scatter, DeepEP all-to-all, absorbed-MLA BMM, an elementwise pass, one GPU's fused routed experts)."""
    values = {"op": op, "gpu": gpu, "m": m, "n": n, "k": k, "dtype": dtype, "batch": batch, "kv_tokens": kv_tokens,
              "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "kv_dtype": kv_dtype, "window": window,
              "bytes": nbytes,
              "gpus": gpus, "impl": impl, "tokens": tokens, "hidden": hidden, "top_k": top_k, "experts": experts,
              "phase": phase, "kernel": kernel, "wire": wire, "bmm": bmm, "kind": kind, "width": width, "inter": inter,
              "tp": tp, "ep": ep, "routing": routing}
    _run(values, csv_in, out, kernels, framework, profile, as_json)


def _run(values: dict, csv_in: Path | None, out: Path | None, kernels: str, framework: str, profile: Path | None,
         as_json: bool) -> None:
    """One operator from the flags' `values`, or the CSV path, under the chosen kernel models and tables."""
    from sim.device.kernels import KERNELS, predict, profile_kernels
    from sim.inputs import catalog
    from sim.inputs.kernel_tables import FRAMEWORKS
    from sim.inputs.op_queries import op_query
    from sim.inputs.profile import device_mismatch, load_profile

    chosen = KERNELS if kernels == "both" else (kernels,)
    if any(kind not in KERNELS for kind in chosen):
        raise ConfigError(f"expected one of datasheet, measured, both; got {kernels!r}", field="--kernels")
    if framework not in FRAMEWORKS:
        raise ConfigError(f"expected one of {', '.join(FRAMEWORKS)}; got {framework!r}", field="--tables")
    if profile is not None and framework != "vllm":
        raise ConfigError("--tables picks AIConfigurator's tables; --profile uses your own instead: give one", field="--tables")
    prof = load_profile(profile) if profile is not None else None
    tables = functools.lru_cache(lambda gpu: profile_kernels(prof, gpu))  # built once per GPU, not per row
    own = (lambda q: tables(q.gpu)) if prof is not None else (lambda q: None)
    if prof is not None and (mismatch := device_mismatch(prof, catalog.gpu(values["gpu"]))):
        print(f"kvsim: ops: note: {mismatch}", file=sys.stderr)  # never a GPU number from a CPU
    if csv_in is None:
        if values["op"] is None:
            raise ConfigError(f"give an operator ({OPS}) or --csv FILE", field="OP")
        q = op_query(values, "kvsim ops")
        _print_one(q, predict(q, chosen, own(q), framework), chosen, as_json)
        return
    if values["op"] is not None:
        raise ConfigError("give an operator or --csv, not both", field="--csv")
    _ops_csv(csv_in, out, lambda q: predict(q, chosen, own(q), framework), as_json)


def _ops_csv(csv_in: Path, out: Path | None, predicted, as_json: bool) -> None:
    """The CSV path: every row's prediction beside its columns, on stdout or written atomically."""
    from sim.inputs.op_queries import read_op_csv
    from sim.outputs.atomic import write_text_atomic
    from sim.outputs.run_folder import check_out_path

    if out is not None:
        check_out_path(out, folder=False)
    queries, rows = read_op_csv(csv_in)
    table = [{**row, **predicted(q)} for q, row in zip(queries, rows)]
    if as_json:
        print(to_json(table))
    text = _csv_text(table)
    if out is None:
        if not as_json:
            sys.stdout.write(text)
        return
    write_text_atomic(out, text)
    print(f"kvsim: ops: {len(table)} operators predicted, wrote {out}", file=sys.stderr)


def _print_one(q, result: dict, chosen: tuple[str, ...], as_json: bool) -> None:
    if as_json:
        print(to_json({**q.model_dump(), **result}))
        return
    print(f"{q.op} on {q.gpu}: {_shape(q)}")
    for kind in chosen:
        s = result[f"{kind}_s"]
        figure = "-" if s is None else f"{s * 1e6:,.2f} us"
        said = "; ".join(t for t in (result[f"{kind}_source"], result[f"{kind}_note"]) if t)
        print(f"  {kind:<9} {figure:>14}  {said}")


def _shape(q) -> str:
    if q.op == "gemm":
        return f"m {q.m} x n {q.n} x k {q.k}, {q.dtype} weights"
    window = f", window {q.window}" if q.window else ""
    if q.op == "prefill":
        return (f"{q.batch} prompts x {q.kv_tokens} tokens, {q.heads} heads / {q.kv_heads} KV heads x {q.head_dim}, "
                f"KV {q.kv_dtype}{window}")
    if q.op == "attention":
        return (f"batch {q.batch} x {q.kv_tokens} cached tokens, {q.heads} heads / {q.kv_heads} KV heads x "
                f"{q.head_dim}, KV {q.kv_dtype}{window}")
    if q.op in ("allgather", "reducescatter"):
        return f"a {q.bytes:,.0f}-byte buffer over {q.gpus} GPUs (NCCL)"
    if q.op == "alltoall":
        return (f"DeepEP {q.kernel} {q.phase} of {q.tokens} tokens a rank, hidden {q.hidden}, top-{q.top_k} of "
                f"{q.experts} experts over {q.gpus} ranks, {q.wire} wire")
    if q.op == "mlabmm":
        return f"absorbed-MLA BMM {q.bmm} of {q.tokens} tokens x {q.heads} heads, {q.dtype}"
    if q.op == "elementwise":
        return f"{q.kind} over {q.m} rows x {q.width} elements, bf16"
    if q.op == "moe":
        split = f", tp {q.tp}" if q.tp > 1 else f", ep {q.ep}" if q.ep > 1 else ""
        return (f"fused experts: {q.tokens} tokens, top-{q.top_k} of {q.experts} experts, hidden {q.hidden} x inter "
                f"{q.inter}{split}, {q.dtype} weights, {q.routing} routing")
    return f"{q.bytes:,.0f} bytes over {q.gpus} GPUs ({q.impl})"


def _csv_text(table: list[dict]) -> str:
    """The predictions as CSV (columns in first-seen order), cells a spreadsheet would run as formulas
    neutralised as in every CSV the tools write (`sim.outputs.csv_text`)."""
    from sim.outputs.csv_text import neutralise

    buf = io.StringIO()
    columns = list(dict.fromkeys(c for row in table for c in row))
    w = csv.DictWriter(buf, fieldnames=[neutralise(c) for c in columns], lineterminator="\n")
    w.writeheader()
    w.writerows({neutralise(c): neutralise(v) for c, v in row.items()} for row in table)
    return buf.getvalue()
