""""The paper, checked": the paper's own sizing rule reproduces its numbers from the catalog, GQA
gives the corrected ones, and the prototype runs come from the simulator."""

from __future__ import annotations

import pytest

from sim.inputs import catalog
from sim.model.units import GB, MB
from sim.report.figures_paper import paper_figures
from sim.studies import paper_claims as paper
from sim.studies.paper_check import check_paper, paper_rule_kv_bytes_per_token

MODELS = (("7B", "deepseek-r1-distill-qwen-7b"), ("70B", "deepseek-r1-distill-llama-70b"))


@pytest.fixture(scope="module")
def check():
    return check_paper(MODELS)


def test_paper_rule_reproduces_its_401408_bytes_and_gqa_is_7x_smaller():
    m = catalog.model("deepseek-r1-distill-qwen-7b")
    assert paper_rule_kv_bytes_per_token(m, "fp16") == paper.KV_BYTES_PER_TOKEN_7B
    assert m.kv_bytes_per_token("fp16") == 2 * 28 * 4 * 128 * 2
    assert paper.EXAMPLE_TOKENS * m.kv_bytes_per_token("fp16") / MB == pytest.approx(114.7, abs=0.1)


def test_kv_table_70b_batch8_4k_is_10_7_gb_not_80(check):
    row = check.kv_table.set_index("model").loc["70B"]
    assert row.gqa_bytes / GB == pytest.approx(10.74, abs=0.01)
    assert row.paper_rule_bytes / row.gqa_bytes == pytest.approx(64 / 8)
    assert 0 < row.saved_bytes < row.gqa_bytes
    assert row.paper_rule_saved_bytes == pytest.approx(row.saved_bytes * 8)


def test_claim_rows_quote_the_paper_and_the_corrected_numbers(check):
    by = {r.claim: r for r in check.rows}
    kv = by["KV bytes per token, 7B"]
    assert "401,408" in kv.printed and kv.corrected == "57,344 B"
    assert any("70B int4" in c and "70%" in r.printed for c, r in by.items())
    saved = next(r for c, r in by.items() if c.startswith("HBM saved"))
    assert saved.printed == "2-48 GB"


def test_prototype_runs_beside_the_paper(check):
    full, proto, ours = check.prototype
    assert full.throughput_tok_per_s == pytest.approx(paper.FULL_TOK_PER_S, rel=0.01)  # fitted by construction
    assert proto.throughput_tok_per_s < full.throughput_tok_per_s
    assert ours.throughput_tok_per_s > proto.throughput_tok_per_s
    n = check.numbers
    assert n["paper_cost"] == pytest.approx(1 - paper.TIERED_TOK_PER_S / paper.FULL_TOK_PER_S)
    assert f"{n['paper_cost']:.1%}" in check.prototype_note and f"{n['sim_cost']:.1%}" in check.prototype_note
    # the prototype's host-side concatenation is costed: without it only link time is left, and less
    assert 0 < n["link_only_cost"] < n["sim_cost"] and f"{n['link_only_cost']:.1%}" in check.prototype_note
    assert "concatenated on the host" in check.prototype_note
    ids = [fid for fid, _ in paper_figures(check)]
    assert ids == ["fig-paper-kv", "fig-paper-throughput"]
    bars = paper_figures(check)[1][1].data
    assert list(bars[0].y) == [paper.FULL_TOK_PER_S, paper.TIERED_TOK_PER_S]
    assert bars[2].y[0] == pytest.approx(proto.throughput_tok_per_s)


def test_missing_prototype_scenario_leaves_that_part_out(tmp_path):
    c = check_paper(MODELS[:1], scenario_path=tmp_path / "missing.yaml")
    assert c.prototype == [] and "not found" in c.prototype_note
    assert [fid for fid, _ in paper_figures(c)] == ["fig-paper-kv"]
