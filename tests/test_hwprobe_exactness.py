"""`hwprobe exactness` on the CPU: Proposition 1 holds (T1 offload exact), T2 stays within half an
int8 step, T3 eviction changes attention and makes greedy decoding diverge."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from hwprobe.cli import app  # noqa: E402
from hwprobe.exactness_cmd import RETIER_INTERVAL, run_exactness  # noqa: E402

runner = CliRunner()


@pytest.fixture(scope="module")
def result():
    before = torch.get_num_threads()
    res = runner.invoke(app, ["exactness", "--device", "cpu", "--json"])
    torch.set_num_threads(before)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_t1_offload_is_bitwise_exact(result):
    assert result["t1_offload"]["max_abs_diff"] == 0.0
    assert result["t1_offload"]["exact"] is True


def test_t1_offload_merged_within_tolerance(result):
    m = result["t1_offload_merged"]
    assert m["within_tolerance"] and m["max_abs_diff"] <= m["tolerance"] < 1e-4


def test_t1_on_the_host_and_split_within_tolerance_with_identical_greedy_tokens(result):
    for key in ("t1_host_attention", "t1_split"):
        h = result[key]
        assert h["within_tolerance"] and h["max_abs_diff"] <= h["tolerance"] < 1e-4
    assert 0 < result["t1_split"]["host_fraction"] < 1
    assert result["greedy"]["full_vs_host_attention_identical"] is True
    assert result["greedy"]["full_vs_split_identical"] is True


def test_t2_int8_bounded_by_half_a_step_and_visible(result):
    t2 = result["t2_int8"]
    assert t2["tokens_in_t2"] > 0
    assert 0.0 < t2["kv_max_abs_err"] <= t2["kv_err_bound"]
    assert t2["within_bound"] is True
    assert t2["max_abs_diff"] > 0.0


def test_t3_eviction_changes_attention_more_than_t2(result):
    assert result["t3_evict"]["evicted_tokens"] > 0
    assert result["t3_evict"]["max_abs_diff"] > result["t2_int8"]["max_abs_diff"]


def test_greedy_tokens_identical_without_eviction_and_diverge_with_it(result):
    g = result["greedy"]
    assert g["full_vs_t1_identical"] is True
    assert g["full_vs_evicted_identical"] is False
    # nothing is evicted before the first re-tier (after step RETIER_INTERVAL - 1)
    assert RETIER_INTERVAL <= g["first_divergent_step"] <= g["steps"]


def test_table_output_names_every_check():
    res = runner.invoke(app, ["exactness", "--device", "cpu"], env={"COLUMNS": "200"})
    assert res.exit_code == 0
    for words in ("T1 offload, same kernel", "bitwise equal", "T1 on the host", "T2 int8", "T3 eviction",
                  "diverge at step"):
        assert words in res.stdout


def test_cuda_without_gpu_is_one_line_exit_2():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    res = runner.invoke(app, ["exactness", "--device", "cuda"])
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "no CUDA device" in res.stderr


@pytest.mark.cuda
def test_exactness_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    r = run_exactness("cuda")
    assert r["t1_offload"]["exact"] and r["t2_int8"]["within_bound"]
    assert r["greedy"]["full_vs_t1_identical"] and not r["greedy"]["full_vs_evicted_identical"]
