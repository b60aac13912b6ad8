"""Disaggregated prefill/decode (issue #21 item 3): the splits, the K/V transfer by hand, decode
instances fed prefilled requests, both pools probed at each rate, ranking, the launch commands."""

from __future__ import annotations

import pytest

from sim.inputs import catalog
from sim.inputs.scenario import scenario_from_dict
from sim.plan import candidates as C
from sim.plan import disagg as D
from sim.plan import search as P
from sim.plan.answer import launch_lines
from sim.plan.evaluate import probe_at
from sim.serving.run import simulate_serving

from .test_plan import SCENARIO


@pytest.fixture(scope="module")
def base():
    return scenario_from_dict(SCENARIO, "disagg")


def test_every_split_of_the_gpus_into_prefill_and_decode_instances():
    got = {(s.prefill, s.tp_p, s.decode, s.tp_d) for s in D.splits([1, 2], 4)}
    assert got == {(1, 1, 3, 1), (2, 1, 2, 1), (3, 1, 1, 1), (2, 1, 1, 2), (1, 2, 2, 1), (1, 2, 1, 2)}
    assert all(s.gpus == 4 for s in D.splits([1, 2], 4)) and D.splits([2], 2) == []
    assert D.Split(1, 2, 3, 2).label == "1P(TP2) + 3D(TP2)"
    cand = C.Candidate("h100-sxm", 8, "full_hbm", 2, (1, 2))
    assert cand.replicas == 3 and cand.layout == "1P(TP2) + 3D(TP2)"


def test_kv_transfer_by_hand(base):
    """14B: 48 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes = 196,608 B a token; 256 prompt tokens
    from TP1 to TP1 over NVLink 4 (370 GB/s, 20 us) and over InfiniBand between nodes (45 GB/s, 30 us)."""
    per_token = D.model_kv_bytes_per_token(base)
    assert per_token == 48 * 8 * 128 * 2 * 2
    split = D.Split(1, 1, 1, 1)
    nvlink = D.fabric("h100-sxm", 2)
    assert nvlink.name == "nvlink4" and nvlink.bytes_per_s == catalog.interconnect("nvlink4").bus_bytes_per_s
    assert D.kv_transfer_s(per_token, 256, split, nvlink) == pytest.approx(20e-6 + 256 * per_token / 370e9)
    ib = D.fabric("h100-sxm", 16)
    assert ib.name == "infiniband-ndr-400"
    assert D.kv_transfer_s(per_token, 256, D.Split(2, 4, 2, 4), ib) == pytest.approx(30e-6 + 256 * per_token / (4 * 45e9))


def test_a_decode_instance_serves_prefilled_requests_without_prefill_work(base):
    sc = C.candidate_scenario(base, C.Candidate("h100-sxm", 1, "full_hbm"), 8.0, C.PlanSpec(8.0, 0.5, 0.015), requests=300)
    mixed = simulate_serving(sc)
    decode = simulate_serving(sc, prefilled=True)
    r = decode.requests
    assert (r.ttft_s == 0).all()  # the first token came with the request
    assert r.finish_s.notna().all() and decode.summary.total_output_tokens == mixed.summary.total_output_tokens
    assert decode.summary.tpot_p99_s < mixed.summary.tpot_p99_s  # no prompt chunk in any decode step
    assert decode.summary.steps < mixed.summary.steps + 300


def test_both_pools_are_probed_and_the_ttft_adds_the_transfer(base):
    spec = C.PlanSpec(8.0, 0.5, 0.015, requests=200)
    cand = C.Candidate("h100-sxm", 2, "full_hbm", 1, (1, 1))
    p = probe_at(base, cand, spec, 8.0)
    (pre_name, pre), (dec_name, dec) = p.parts
    assert (pre_name, dec_name) == ("prefill", "decode")
    transfer = D.longest_transfer_s(base, D.split_of(cand), "h100-sxm")
    assert p.stats["ttft_p99"].value_s == pytest.approx(pre.stats["ttft_p99"].value_s + transfer)
    assert p.stats["tpot_p99"].value_s == dec.stats["tpot_p99"].value_s
    assert p.passed == (pre.passed and dec.passed)


def test_aggregated_ranks_first_at_equal_cost_and_disaggregated_launch_commands(base):
    spec = C.PlanSpec(8.0, 0.5, 0.015, requests=120, top=0)
    res = P.search(base, spec, ["h100-sxm"], [2], ["full_hbm"], C.load_prices(), workers=1)
    passing = [r for r in res.rows if r["status"] == "pass"]
    layouts = [r["layout"] for r in passing]
    assert "1P(TP1) + 1D(TP1)" in layouts and layouts.index("1P(TP1) + 1D(TP1)") > layouts.index("TP1 x 2")
    pools = {p["pool"] for p in res.probes if "prefill 1xTP1" in p["candidate"]}
    assert pools == {"prefill", "decode"}
    row = next(r for r in passing if r["prefill"])
    lines = launch_lines(row, base)
    assert set(lines) == {"vllm prefill", "vllm decode", "sglang prefill", "sglang decode"}
    assert '"kv_connector":"NixlConnector"' in lines["vllm decode"] and "--data-parallel-size 1" in lines["vllm prefill"]
    assert "--disaggregation-mode prefill --disaggregation-transfer-backend nixl" in lines["sglang prefill"]


def test_a_disaggregated_plan_folder_reads_back_for_the_report(tmp_path):
    import yaml

    from sim.report.figures_serving import latency_figure, plan_sentences, table_rows
    from sim.report.plan_input import load_plan

    from .conftest import run_cli

    (tmp_path / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    res = run_cli("plan", str(tmp_path / "s.yaml"), "--rate", "8", "--ttft-p99-ms", "500", "--tpot-p99-ms", "15",
                  "--gpus", "h100-sxm", "--counts", "2", "--policies", "full_hbm", "--requests", "120", "--top", "0",
                  "--workers", "1", "--out", str(tmp_path / "plan"))
    assert res.returncode == 0, res.stderr
    pf = load_plan(tmp_path / "plan")
    assert set(pf.probes.pool) == {"aggregated", "prefill", "decode"} and pf.doc.disagg
    assert any(r[3] == "1P(TP1) + 1D(TP1)" for r in table_rows(pf))
    assert latency_figure(pf).data and plan_sentences(pf)[0].startswith("Cheapest: 2 x H100 SXM")
