"""`kvsim accuracy` (docs/accuracy.md): the committed table of public end-to-end measurements, the
study that holds kvtier against it, the command, and an accuracy assertion on the end-to-end figures.

The assertion is an accuracy check, not a timed test. Issue #20 item 5 sets the goals: end to end,
median |error| <= 5% and worst <= 15% with the measured kernel tables, median <= 10% in datasheet
mode. Over the whole table kvtier meets none of them now (2026-12-07: measured 9.8% / 70.0%, datasheet 10.2%);
the thresholds below are the level it reaches now, rounded up, each labelled with its goal, so a regression
fails them."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from sim.inputs import catalog
from sim.inputs.errors import ConfigError
from sim.inputs.kernel_tables import tables_available
from sim.studies.accuracy import MODES, e2e_summary, operator_table, run, scenario_for, simulations
from sim.studies.e2e_table import FAMILY_METRICS, default_path, load_measurements
from tests.conftest import run_cli

SUBSET = ("vllm-ci-h200-8b-b8", "nim-h100-70b-tp2-c5-itl", "nim-h100-70b-tp2-c5-ttft", "trt013-h100-8b-fp8-2048-128")
NEEDS_TABLES = pytest.mark.skipif(not tables_available(), reason="aiconfigurator-core (the .[measured] extra) not installed")


def _rows(*ids):
    rows = {m.id: m for m in load_measurements()}
    return [rows[i] for i in ids]


def test_every_row_is_complete_and_named_as_the_catalog_names_it():
    rows = load_measurements()
    assert len(rows) >= 15
    for m in rows:
        assert catalog.gpu(m.gpu).name == m.gpu and catalog.model(m.model).name == m.model, m.id
        assert m.source_url.startswith("https://"), m.id
        for field in ("publisher", "source_date", "engine", "engine_version", "source_model", "notes"):
            assert getattr(m, field).strip(), (m.id, field)
        assert m.metric in FAMILY_METRICS[m.family], m.id
    assert len({m.gpu for m in rows}) >= 7  # H100, H200, A100, L40S, B200, GB200, RTX PRO 6000
    assert len({m.model for m in rows}) >= 4
    assert len({m.publisher for m in rows}) >= 4
    assert {m.family for m in rows} == set(FAMILY_METRICS)


def test_every_row_becomes_its_scenario():
    for m in load_measurements():
        sc = scenario_for(m, "datasheet")
        assert sc.model.name == m.model and sc.hardware.gpu == m.gpu and sc.parallel.tp == m.tp
        assert sc.parallel.pp == m.pp and m.gpus == m.tp * m.pp
        assert sc.model.weight_dtype == m.weight_dtype and sc.model.kv_dtype == m.kv_dtype
        assert sc.model.weight_group_size == (m.weight_group_size or 128), m.id  # gpt-oss's MXFP4: 32
        assert (sc.workload.arrivals is None) == (m.workload == "closed_batch")
        if m.admission == "no_evict":  # TensorRT-LLM's Guaranteed No Evict: the whole length reserved
            assert sc.scheduler.admission == "no_evict"
            # each of the pp micro-batches in flight holds up to max_batch_size (TensorRT-LLM's capacity: x pp)
            assert sc.scheduler.max_num_seqs == m.rank_limits()[0] * m.attention_dp * m.pp
        assert sc.scheduler is None or sc.scheduler.chunked_prefill == m.chunked_prefill or m.workload == "closed_batch"
        said = {"TensorRT-LLM": "tensorrt-llm", "SGLang": "sglang", "vLLM": "vllm"}
        engine = next(name for text, name in said.items() if text in m.engine)  # every row names one
        own = "PyTorch backend" in m.engine or engine != "tensorrt-llm"  # the tables time TensorRT-LLM's PyTorch flow
        assert sc.engine.name == engine
        assert sc.engine.kernel_framework == ({"tensorrt-llm": "trtllm"}.get(engine, engine) if own else "vllm")


def _write_table(tmp_path, **change):
    data = yaml.safe_load(default_path().read_text())
    row = {**data["measurements"][0], **change}
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump({"measurements": [row]}))
    return path


@pytest.mark.parametrize(("change", "said"), [
    ({"gpu": "h900"}, "gpu: unknown GPU"),
    ({"gpu": "h100"}, "gpu: name it as the catalog does: 'h100-sxm'"),
    ({"model": "deepseek-r1-distill-llama-70b"}, "model: name it as the catalog does: 'llama-3.1-70b'"),
    ({"metric": "itl_p50_ms"}, "family batch-latency reports latency_ms"),
    ({"batch_size": None}, "a closed_batch workload needs batch_size"),
    ({"source_url": "http://example.com"}, "source_url"),
    ({"gpus": 2}, "gpus (2) must equal tp x pp (1 x 1)"),
    ({"pp": 2}, "gpus (1) must equal tp x pp (1 x 2)"),
    ({"colour": "red"}, "colour: unknown key"),
])
def test_a_bad_row_is_one_line_naming_its_field(tmp_path, change, said):
    with pytest.raises(ConfigError) as err:
        load_measurements(_write_table(tmp_path, **change))
    assert said in err.value.line() and "measurements.0" in err.value.line()


def test_ids_are_unique(tmp_path):
    data = yaml.safe_load(default_path().read_text())
    path = tmp_path / "table.yaml"
    path.write_text(yaml.safe_dump({"measurements": data["measurements"][:1] * 2}))
    with pytest.raises(ConfigError, match="appears twice"):
        load_measurements(path)


def test_the_study_on_a_subset_gives_finite_errors():
    rows = _rows(*SUBSET)
    modes = MODES if tables_available() else ("datasheet",)
    assert len(simulations(rows, modes)) == 3 * len(modes)  # the two NIM rows share one run
    points = run(rows, modes)
    assert len(points) == len(rows) * len(modes)
    assert all(math.isfinite(e) for e in points["error"]), points
    summary = e2e_summary(points)
    assert set(summary["mode"]) == set(modes)
    assert set(summary.loc[summary["by"] == "family", "key"]) == {m.family for m in rows}
    assert set(summary.loc[summary["by"] == "engine", "key"]) == {m.engine for m in rows}
    assert set(summary.loc[summary["by"] == "model", "key"]) == {m.model for m in rows}
    assert set(summary.loc[summary["by"] == "shape", "key"]) == {m.shape for m in rows}
    assert list(points["shape"]) == [m.shape for m in rows for _ in modes]


@NEEDS_TABLES
def test_the_operator_table_per_family_and_gpu():
    ops = operator_table(["h100-sxm"])
    assert set(ops["family"]) == {"gemm", "decode attention", "prefill attention", "window decode attention",
                                  "window prefill attention", "all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                  "mla decode", "mla bmm", "mla prefill", "moe experts", "elementwise (per layer)"}
    assert set(ops["gpu"]) == {"h100-sxm", "all"}
    elementwise = ops["family"] == "elementwise (per layer)"  # Vidur's profiles: no table, the datasheet alone
    assert ops[elementwise]["tables_median"].isna().all() and (ops[elementwise]["points"] == 26).all()  # 70B, held out
    gather = ops["family"].isin(["all-gather", "reduce-scatter"])
    tables = ~gather & ~elementwise
    assert (ops[tables]["tables_median"] < ops[tables]["datasheet_median"]).all()  # the tables are the closer model
    # NCCL's all-gather / reduce-scatter: 12 held-out points each, both within a few percent (H100's reduce-scatter:
    # the fit 3.1%, the tables 3.4%)
    assert (ops[gather][["tables_median", "datasheet_median"]] < 0.08).all().all()


def test_the_command(tmp_path):
    res = run_cli("accuracy", "--mode", "datasheet", "--only", "vllm-ci-h200-8b-b8", "--no-operators", "--json",
                  "--out", str(tmp_path / "acc"))
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert [r["id"] for r in doc["rows"]] == ["vllm-ci-h200-8b-b8"] and doc["operators"] == []
    assert math.isfinite(doc["rows"][0]["error"])
    assert (tmp_path / "acc" / "e2e.csv").read_text().startswith("id,family,gpu,model,engine,metric,shape,mode,")
    assert (tmp_path / "acc" / "e2e_summary.csv").exists()


@pytest.mark.parametrize(("args", "said"), [
    (("--mode", "tables"), "kvsim: --mode: expected one of measured, datasheet, both; got 'tables'"),
    (("--only", "no-such-row"), "kvsim: --only: no row 'no-such-row' in the table"),
    (("--workers", "0"), "kvsim: --workers: expected at least 1, got 0"),
])
def test_bad_options_are_one_line(args, said):
    res = run_cli("accuracy", *args)
    assert res.returncode == 2 and res.stderr.strip() == said and "Traceback" not in res.stderr


@pytest.fixture(scope="module")
def full_points():
    """Every row in every mode this machine has (the whole study: about two minutes on 2 cores)."""
    modes = MODES if tables_available() else ("datasheet",)
    return run(load_measurements(), modes, workers=None)


@pytest.fixture(scope="module")
def full_summary(full_points):
    summary = e2e_summary(full_points)
    return {(r["mode"], r["by"], r["key"]): r for r in summary.to_dict("records")}


def _level(summary, mode, by, key):
    r = summary[(mode, by, key)]
    return r["median_abs_error"], r["worst_abs_error"]


# TensorRT-LLM's small-active MoE rows at 1,000+ sequences: GPT-OSS on Hopper (kvtier -13..+43%; +6..+62% before
# TensorRT-LLM's window pools) and on Blackwell (-1..+57%; +23..+65%), Qwen3-30B-A3B on B200 / GB200 (-6..+45%,
# +11..+115% before the MoE kernel lanes; GB200's Grace host slower than B200's where the batch is largest) -
# docs/accuracy.md
SMALL_MOE = ("gpt-oss-120b", "gpt-oss-20b", "qwen3-30b-a3b")


@pytest.fixture(scope="module")
def summary_without_small_moe(full_points):
    """The summary over the rows but the small-active MoE ones (`SMALL_MOE`; 60 rows before them, 84 with the
    NVFP4 rows): the levels the physics had reached there stay guarded while the whole table's carry their miss."""
    summary = e2e_summary(full_points[~full_points["model"].isin(SMALL_MOE)])
    return {(r["mode"], r["by"], r["key"]): r for r in summary.to_dict("records")}


@NEEDS_TABLES
def test_end_to_end_accuracy_with_measured_tables(full_summary, summary_without_small_moe):
    # the whole table: 9.1% / 70.0% since a GQA mixture of experts' GEMMs around its routed experts take the GEMM
    # tables (2026-12-07, session 41, moe_mla_costs.measured_moe_rest_s: Maverick 7.5% / 24.3% -> 7.0% / 15.2%,
    # Qwen3-30B 7.4% -> 7.1%, B200 15.3% -> 10.4%); 9.8% / 70.0% since a mixture of experts reads the fused-experts
    # tables' power-law rows at
    # AIConfigurator's own alpha for its family (2026-12-07, session 39, docs/models.md moe_routing: GPT-OSS 25.0% ->
    # 15.0%, Qwen3-235B 12.2% -> 6.8%, Maverick 12.6% -> 7.5%, R1 19.9% -> 16.9%); 11.7% / 70.0% before;
    # 11.6% / 70.0% since TensorRT-LLM's Blackwell NVFP4 experts take the CUTLASS rows at
    # every batch (2026-12-06, session 34: Qwen3-30B-A3B's 1k/32k +22 / +15% -> -8 / -14%); 12.2% / 70.0% since layer
    # kinds take the attention tables kind by kind (2026-12-06,
    # session 33: GPT-OSS 24.9% -> 22.8%, Maverick 14.2% -> 13.9%); 12.4% / 70.0% since Hopper's chunked decode
    # runs on MMHA (2026-12-06, late:
    # Maverick's three H200 rows past the chunk, +89 / +26 / +12% -> -7 / -15 / +2%); 12.5% / 88.8% since
    # TensorRT-LLM's window pools (2026-12-06: gpt-oss's full
    # layers get half the KV budget, kvCacheManager.cpp; GPT-OSS 44.4% / 39.1% -> 23.1% / 27.4%, the rest unchanged);
    # 14.2% / 88.8% since TensorRT-LLM's fp8 KV prefills with its fp8 context FMHA (2026-12-06); 14.1% / 88.8%
    # with the RTX PRO 6000's 11 pipeline-parallel cells (2026-12-06, 12.6%, the Qwen3 DEP2,PP2 ones up to +30%);
    # 14.1% over 180 with its 13 Qwen3 cells (7.6%); 14.6% /
    # 88.8% over the 167 since Llama-4 Maverick's 17 (2026-12-06; its H200 DEP8 FP8 1k/8k
    # +88.8%: Hopper's chunked decode runs on TensorRT-LLM's MMHA kernel, not modelled) and the attention-DP dense
    # GEMMs over their rank's rows (14.8% over the 150 before Maverick); before them 15.2% / 70.0% over 150 rows, 56
    # of them small-active MoE (GPT-OSS on Hopper +6..+62% and on
    # Blackwell +23..+65%, Qwen3-30B-A3B -6..+45%), 10 DeepSeek-R1 NVFP4 DEP4 on B200 / GB200 (-45..+32%, mostly too
    # slow); 13.0% over the 140 before those, 16.1% / 115.4% before TensorRT-LLM's MoE kernel lanes, 18.2% before
    # head dim 64's prefill rate, 11.4% over the 116 before GPT-OSS's 24 Blackwell rows, 13.9% / 70.0% over the 80
    # before the NVFP4 rows
    assert _level(full_summary, "measured", "all", "all")[0] <= 0.10
    # 9.1% since the measured GEMMs around the experts, 10.0% since the power-law routing (12.3% before it, 14.3% before
    # the pools)
    assert _level(full_summary, "measured", "family", "offline-throughput")[0] <= 0.10
    # GPT-OSS: 120b 22.0% / 55.5%, 20b 26.0% / 44.5% since its window layers take the tables' window rows; under
    # TensorRT-LLM's window pools: 120b 23.1% / 56.7%, 20b 27.4% / 46.0% (44.4% and 39.1% while
    # its window layers shared one pool, as vLLM's): the Blackwell 1k/1k rows, bound by max_batch_size not KV,
    # still +23..+57%
    # (since the power-law routing 120b 15.6% / 44.2%, 20b 14.7% / 30.1%)
    assert _level(full_summary, "measured", "model", "gpt-oss-120b")[0] <= 0.18
    assert _level(full_summary, "measured", "model", "gpt-oss-20b")[0] <= 0.17
    # Qwen3-30B-A3B: 7.1% / 50.0% since the measured GEMMs around the experts (7.4% / 51.5% before); 7.6% / 44.9%
    # (7.6% / 45.4% before the CUTLASS rows at every batch; 9.5% before TensorRT-LLM's fp8
    # context FMHA; 8.8% before its three
    # pipeline-parallel rows, 10.2% before the RTX PRO 6000's
    # one-stage ones); 37.8% / 115.4% while half the Blackwell NVFP4 MoE points took the min-latency
    # kernel's time at large batches
    assert _level(full_summary, "measured", "model", "qwen3-30b-a3b")[0] <= 0.15
    # Llama-4 Maverick: 7.0% / 15.2% since the measured GEMMs around the experts (its shared expert and dense MLP
    # layers: the NVFP4 8k/1k and 32k/1k rows +18..+24% -> +5..+7%, the 1k/32k ones -2..-3% -> -14..-15%); 7.5% / 24.3%
    # since the power-law routing (alpha 1.01: its NVFP4 8k/1k and 32k/1k rows +8..+14%
    # -> +17..+26%, the rest closer), 12.6% / 17.7% since the NVFP4 experts' CUTLASS rows at every batch, 13.9% / 17.7%
    # since its chunked layers prefill on the context table, 14.2% / 19.2% since
    # Hopper decodes its chunked layers on MMHA (14.3% / 88.8% before)
    median, worst = _level(full_summary, "measured", "model", "llama-4-maverick")
    assert median <= 0.08 and worst <= 0.17
    median, worst = _level(summary_without_small_moe, "measured", "all", "all")
    # current level (7.3% over the 122 rows without the small MoE ones since the measured GEMMs around the experts;
    # 7.6% since the power-law routing; 9.3% since the
    # NVFP4 experts' CUTLASS rows at every batch; 9.8% since Hopper's chunked decode on MMHA; 10.1%
    # since TensorRT-LLM's fp8 KV prefills with its
    # fp8 context FMHA (2026-12-06: the RTX PRO 6000's long prompts -26..-9% -> -2..+6%, its shorter ones 5-8 points
    # further too fast: a cost of that GPU's runs kvtier lacks, as its pipeline-parallel cells show); 9.6% with the
    # RTX PRO 6000's Llama and Qwen3-235B pipeline-parallel rows, 9.2% over the 114 before them; 9.4%
    # over 111: the attention-DP dense GEMMs over their rank's
    # rows put Qwen3-235B's DEP rows 8.8% too fast (4.0% before) and DeepSeek-R1's H200 DEP8 +5..+12% where they had
    # been within 4% - a per-step cost of those runs the group's re-read tiles had stood in for; 6.8% over the 94
    # rows before that and Maverick, 5.9% over the 84 before DeepSeek-R1's NVFP4
    # rows (6.0% over the 96 without GPT-OSS), 7.1% over the 60 before the NVFP4 rows; 6.9% over
    # 57 rows:
    # the goal median <= 5% not met since DataCrunch's five SGLang offline rows
    # (+38..+82%) and GPUStack's three vLLM 0.11 DeepSeek-R1 TP8 bursts (+32..+59%) joined; 6.0% over the 54 with the
    # first, 4.9% over the 49 before, the goal met by 0.06 points; 6.2% before the grids' hole fill from
    # below, 6.0% before attention-DP prefill waited for its busiest rank, 6.2% before TensorRT-LLM's data-parallel
    # dense
    # parts, 6.1% over the 34 before the PyTorch overview's other cells, 6.6% before TensorRT-LLM's padded CUDA graphs,
    # 8.8% before the engines' all-gather + reduce-scatter around attention-DP experts, 9.3% before trtllm-bench's batch
    # limits)
    assert median <= 0.08
    # current level (70.0%, DataCrunch's SGLang offline 4096/2048 - 81.7% earlier - since Hopper's chunked decode runs
    # on MMHA, one block per query head (2026-12-06: Llama-4 Maverick's H200 DEP8 FP8 1k/8k +88.8% -> -6.8%, where
    # kvtier had taken the XQA table); DataCrunch's compute-bound figures run
    # 1.4-1.8x slower than kvtier - as its TTFT rows do - while its memory-bound ITL matches; before those rows 56.7%,
    # SGLang TTFT at 4 req/s -
    # 53.8% before SGLang's prefill batches ran alone, a cited rule of
    # its scheduler that shortens the step a new prompt waits for, where the per-request cost outside the GPU that the
    # row lacks is larger; then 4 x L40S TP4 over PCIe 52.5%. DeepSeek-R1 DEP8 was the worst
    # at +54.2% until it ran trtllm-bench's batch limits - 160 sequences a rank, not ~300 - then +13.1%, +6.3% with
    # TensorRT-LLM's all-gather + reduce-scatter around its experts; +82.2% before the fp8 GEMM tiles); goal worst
    # <= 15% NOT met
    assert worst <= 0.72
    assert _level(summary_without_small_moe, "measured", "family", "served-itl")[0] <= 0.05  # 1.3%: the 5% goal met
    # 6.9% over 41 rows, 6.0% over 38, 4.7% over the 33 before DataCrunch's SGLang offline and GPUStack's vLLM rows
    # (6.2% before TensorRT-LLM's data-parallel dense parts, 6.1% over 18 before the PyTorch
    # overview's other cells, 6.6% before TensorRT-LLM's padded graphs, 8.8% before the engines' MoE exchange, 9.7%
    # before trtllm-bench's batch limits, 10.5% before the fp8 GEMM tiles, 9.1% before the tables' floor baseline, the
    # datasheet GEMM shape, which its MoE layers' rest takes, and the engines' own MoE tables and fits; 9.4% over 104
    # rows since the attention-DP dense GEMMs over their rank's rows and Maverick's rows; 9.7% over 106 with the
    # pipeline-parallel rows, 10.7% since TensorRT-LLM's fp8 context FMHA, 7.6% since the power-law routing, 7.3% since
    # the measured GEMMs around the experts); goal 5%
    assert _level(summary_without_small_moe, "measured", "family", "offline-throughput")[0] <= 0.08
    assert _level(full_summary, "measured", "family", "served-ttft")[0] <= 0.10  # 9.8%; goal 5% not met
    assert _level(full_summary, "measured", "family", "batch-latency")[0] <= 0.20  # 15.8%; goal 5% not met


@pytest.mark.parametrize("mode", MODES)
def test_blackwell_without_the_small_moe_rows(summary_without_small_moe, mode):
    """Blackwell's rows but the small-active MoE ones - Llama-3.3-70B, Qwen3-235B, DeepSeek-R1 and Llama-4 Maverick
    DEP4, NVFP4: measured B200 6.2% (22 rows) and GB200 5.4% (21), datasheet 4.6% and 3.6%, since the GEMMs around a
    GQA mixture of experts' routed experts are priced one call each (measured 5.2% / 8.4% and datasheet 8.3% / 9.2%
    before, 2026-12-07); B200 8.1% and GB200 14.2%, datasheet 11.4% and 10.6%, since TensorRT-LLM's fp8
    KV prefills with its fp8 context FMHA (7.7% / 14.0% and 10.7% / 10.6% before), and since the attention-DP
    dense GEMMs run over their rank's rows (GB200's DEP rows too fast: Qwen3-235B +9..+28%); before that and
    Maverick's rows B200 4.7% (16) and GB200 8.5% (15), datasheet 7.1% and 8.5% (3.5% / 5.3% and 6.7% / 5.4% before
    DeepSeek-R1's rows)."""
    if mode == "measured" and not tables_available():
        pytest.skip("the .[measured] extra is not installed")
    for gpu in ("b200", "gb200"):
        assert _level(summary_without_small_moe, mode, "gpu", gpu)[0] <= 0.08


def test_end_to_end_accuracy_in_datasheet_mode(full_summary, summary_without_small_moe):
    # the whole table: 8.4% / 64.5% since the GEMMs around a GQA mixture of experts' routed experts are priced one call
    # each, in their format over their rows, with their floors, grid fill and activation terms, where they were one
    # aggregate kernel (2026-12-07, session 41, physics.datasheet_moe_rest_s: Qwen3-235B 9.9% -> 4.3%, Maverick 10.6%
    # -> 6.3%, the signed mean +5.5% -> +3.5%): the 10% goal met; 10.2% / 64.5% since datasheet mode prices a mixture
    # of experts at the tables' power-law routing
    # (2026-12-07, session 40: the fused-experts form fitted on the power-law rows at the draw's load; GPT-OSS 21.2% ->
    # 19.2%, Qwen3-235B 12.7% -> 9.9%, Maverick 12.8% -> 10.6%); 11.5% / 64.5% before; 10.9% / 64.5% over 191 rows
    # since window layers prefill on their own fit (2026-12-06, session 33;
    # unchanged by session 34's CUTLASS-only NVFP4 experts and MoE fit), 11.2% since MLA prefill's own fit, 11.4% since
    # datasheet mode costs that MMHA by its own fit (Maverick's H200
    # 1k/32k +4% -> -12%), 11.2% / 64.5% since Hopper's chunked decode on MMHA; 11.4% / 89.5% since
    # TensorRT-LLM's window pools (GPT-OSS 43.2% / 33.3% ->
    # 21.1% / 22.9%); 13.4% / 89.5% since TensorRT-LLM's fp8 context FMHA; 13.9% with the RTX PRO
    # 6000's pipeline-parallel cells (13.0%); 14.1% /
    # 89.5% over 180 with its Qwen3 cells; 14.7% / 89.5% over the 167
    # since Llama-4 Maverick's and the attention-DP dense GEMMs over their
    # rank's rows (15.5% over the 150 before Maverick); before them 14.2% / 64.5% over 150 rows (14.1% over the 140
    # before DeepSeek-R1's NVFP4 rows; 14.7% / 65.3%
    # before TensorRT-LLM's MoE kernel lanes, 10.6% over
    # the 116 before GPT-OSS's Blackwell rows, 14.0% over the 80 before the NVFP4 rows): the 10% goal not met until then
    assert _level(full_summary, "datasheet", "all", "all")[0] <= 0.10
    # 8.4% since the GEMMs around the experts one call each, 10.2% since the power-law routing (11.5% before it, 11.4%
    # once, 13.7% before the pools)
    assert _level(full_summary, "datasheet", "family", "offline-throughput")[0] <= 0.10
    median, worst = _level(summary_without_small_moe, "datasheet", "all", "all")
    # current level (6.3% over the 122 rows without the small MoE ones since the GEMMs around the experts one call each;
    # 8.8% since the power-law routing, 9.4% before it;
    # 9.2% since Hopper's chunked decode on MMHA, its own
    # datasheet fit included; 9.4%
    # since TensorRT-LLM's fp8 context FMHA, 9.7%
    # before it; 9.7% over the 114 rows without the small MoE ones with the RTX PRO 6000's Qwen3-235B DEP8; 10.5%
    # over the 111 since the attention-DP dense GEMMs over their
    # rank's rows and Maverick's rows - the 10% goal no longer met there; 7.5% over the 94 rows before them, 7.0% over
    # the 84 before DeepSeek-R1's NVFP4
    # rows (7.3% before the MoE kernel lanes), 8.0% over
    # the 60 before the NVFP4 rows; 8.2% over
    # 57 rows,
    # 7.3% over 54, 5.9% over the 49 before DataCrunch's SGLang offline and GPUStack's
    # vLLM rows; 6.3% before SGLang's
    # scheduling; 7.6% before TensorRT-LLM's data-parallel dense parts, 8.1% over the 34 before
    # the PyTorch overview's other cells, 8.6% before TensorRT-LLM's padded CUDA graphs. The 10% goal met since the fp8
    # GEMM tiles of 2026-12-05 - 9.2% then, 8.5% with fp8 KV's own decode-attention floor, 9.4% with TensorRT-LLM's XQA
    # sequence split, whose three GQA rows' attention had been 10-23% too slow and hid the rest's optimism, 8.6% with
    # the engines' all-gather + reduce-scatter around attention-DP experts; 11.5% before the tiles, 15.5% before that
    # day's fits)
    assert median <= 0.08
    # current level (64.5%, DataCrunch's SGLang offline 4096/2048, since Hopper's chunked decode runs on MMHA - 89.5%,
    # Llama-4 Maverick's H200 DEP8 FP8 1k/8k, before it; 75.5% before the elementwise passes were costed by bytes;
    # before those rows 54.1%, SGLang TTFT at 4 req/s,
    # 50.3% before its prefill batches ran alone; then 4 x L40S TP4 over PCIe 52.3%. DeepSeek-R1 DEP8 was the worst
    # at +58.3% until it ran trtllm-bench's batch limits, then +13.7%, +7.7% with TensorRT-LLM's all-gather +
    # reduce-scatter; 88.8% before the fp8 GEMM tiles, 139.3% with the experts as dense fp8 GEMMs; docs/accuracy.md)
    assert worst <= 0.66
    assert _level(full_summary, "datasheet", "family", "served-itl")[0] <= 0.05  # 4.2% (6.0% before the fp8 tiles)
    assert _level(full_summary, "datasheet", "family", "served-ttft")[0] <= 0.25  # 20.0% (46% before the fp8 GEMM shape); goal 10%
    # 8.2% over 41 rows, 6.3% over 38, 5.5% over the 33 before DataCrunch's SGLang offline and GPUStack's vLLM rows
    # (6.7% before TensorRT-LLM's data-parallel dense parts, 8.1% over 18 before the PyTorch
    # overview's other cells, 8.6% before TensorRT-LLM's padded graphs, 9.4% before the engines' MoE exchange, unchanged
    # by trtllm-bench's batch limits; 8.5% before XQA's sequence split, 11.5% before the fp8 tiles; 10.5% over 104 rows
    # since the attention-DP dense GEMMs over their rank's rows and Maverick's rows; 8.8% since the power-law routing,
    # 6.1% since the GEMMs around the experts one call each)
    assert _level(summary_without_small_moe, "datasheet", "family", "offline-throughput")[0] <= 0.08


# ---- the committed bands (sim/catalog/accuracy_bands.yaml) -------------------------------------
BAND_TOLERANCE = 1e-4  # the file keeps 4 decimals: one unit in the last place


def _band_differences(committed: dict, computed: dict) -> list[str]:
    """Where the committed bands differ from the study's, mode by mode that the study ran."""
    out = []
    for mode, families in computed.items():
        have = committed.get(mode, {})
        for family in sorted(set(families) | set(have)):
            new, old = families.get(family, {}), have.get(family, {})
            for gpu in sorted(set(new) | set(old)):
                a, b = old.get(gpu), new.get(gpu)
                if a is None or b is None:
                    out.append(f"{mode}/{family}/{gpu}: {'not in the file' if a is None else 'no longer computed'}")
                    continue
                for k, v in b.items():
                    if k not in a or (a[k] != v if k == "rows" else abs(a[k] - v) > BAND_TOLERANCE):
                        out.append(f"{mode}/{family}/{gpu}: {k} is {a.get(k)} in the file, {v} today")
    return out


def test_the_committed_accuracy_bands_are_what_the_study_computes_today(full_points):
    from sim.inputs.accuracy_bands import default_path
    from sim.studies.accuracy import bands

    committed = yaml.safe_load(default_path().read_text())
    stale = (_band_differences(committed["bands"], bands(full_points))
             + _band_differences(committed.get("by_model", {}), bands(full_points, "model"))
             + _band_differences(committed.get("by_shape", {}), bands(full_points, "shape")))
    assert not stale, ("sim/catalog/accuracy_bands.yaml is stale: it is not what the study computes today. Run "
                       "`kvsim accuracy --write-bands` and commit the file (and the figures of docs/accuracy.md).\n"
                       + "\n".join(stale[:20]))
    if tables_available():
        assert set(committed["bands"]) == set(MODES)


def test_band_differences_see_a_stale_file():
    """The staleness check is not vacuous: a changed figure, a missing GPU and a changed count are seen."""
    computed = {"measured": {"all": {"all": {"rows": 3, "median_abs_error": 0.1, "worst_abs_error": 0.2,
                                             "mean_error": -0.1}}}}
    assert _band_differences(computed, computed) == []
    moved = {"measured": {"all": {"all": {**computed["measured"]["all"]["all"], "median_abs_error": 0.1002}}}}
    assert _band_differences(moved, computed) == ["measured/all/all: median_abs_error is 0.1002 in the file, 0.1 today"]
    assert _band_differences({"measured": {"all": {}}}, computed) == ["measured/all/all: not in the file"]
    fewer = {"measured": {"all": {"all": {**computed["measured"]["all"]["all"], "rows": 2}}}}
    assert _band_differences(fewer, computed) == ["measured/all/all: rows is 2 in the file, 3 today"]


def test_write_bands_is_refused_for_a_part_of_the_table():
    res = run_cli("accuracy", "--write-bands", "--only", "vllm-ci-h200-8b-b8")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip() == ("kvsim: --write-bands: the committed bands are the whole committed table in both "
                                  "modes; drop --only")
