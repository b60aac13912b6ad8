"""Weight-only int4 projections (hwprobe/model/qlinear.py): torch's tinygemm layout on the CPU,
numerics against the dequantised weight, exact byte counts, shapes the kernel cannot take, and
`hwprobe run` of an int4 scenario."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from hwprobe.cli import app  # noqa: E402
from hwprobe.model.qlinear import Linear, int4_dequantise, int4_quantise, int4_supported  # noqa: E402
from tests.conftest import REPO  # noqa: E402

N, K, GROUP = 96, 256, 64


def test_int4_round_trip_error_is_within_half_a_step():
    w = torch.randn(N, K, generator=torch.Generator().manual_seed(0))
    q, scale, zero = int4_quantise(w, GROUP)
    assert q.dtype == torch.int32 and int(q.min()) >= 0 and int(q.max()) <= 15
    err = (int4_dequantise(q, scale, zero, GROUP) - w).view(N, K // GROUP, GROUP).abs()
    assert bool((err <= scale / 2 + 1e-6).all())  # rounding to the nearest of 16 levels per group


def test_int4_linear_matches_the_dequantised_weight_and_counts_its_bytes():
    g = torch.Generator().manual_seed(1)
    w = (torch.randn(N, K, generator=g) / 16).to(torch.bfloat16)
    bias = (torch.randn(N, generator=g) / 10).to(torch.bfloat16)
    x = torch.randn(3, K, generator=g).to(torch.bfloat16)
    lin = Linear(w, bias, "int4", GROUP, torch.bfloat16)
    ref = x.float() @ int4_dequantise(*int4_quantise(w, GROUP), GROUP).T + bias.float()
    y = lin(x)
    assert y.dtype == torch.bfloat16 and y.shape == (3, N)
    assert (y.float() - ref).abs().max().item() < 0.02 * ref.abs().max().item()  # bf16 arithmetic
    # 4 bits per weight + a bf16 scale and zero per group (tinygemm's [K/g, N, 2])
    assert sum(t.numel() * t.element_size() for t in lin.tensors) == N * K // 2 + (K // GROUP) * N * 2 * 2
    plain = Linear(w, bias, "bf16", GROUP, torch.bfloat16)
    assert plain.tensors == (w,) and torch.equal(plain(x), torch.nn.functional.linear(x, w, bias))


@pytest.mark.parametrize("n, k, group, why", [(96, 200, 64, "multiple of the group"), (96, 80, 16, "multiple of 32"),
                                              (90, 256, 64, "out_features 90")])
def test_shapes_the_int4_kernel_cannot_take_are_refused(n, k, group, why):
    assert why in int4_supported(n, k, group)
    with pytest.raises(ValueError, match=why):
        Linear(torch.zeros(n, k), None, "int4", group, torch.bfloat16)


def _scenario(tmp_path, **model):
    path = tmp_path / "int4.yaml"
    path.write_text(json.dumps({
        "name": "tiny-int4",
        "model": {"hf_config": str(REPO / "scenarios" / "models" / "tiny-qwen2.json"), **model},
        "workload": {"batch_size": 2, "prompt_tokens": 16, "reasoning_tokens": 8},
        "policy": {"hbm_ratio": 0.5, "retier_interval": 4, "recent_window": 2},
    }))
    return path


runner = CliRunner()


def _run(path, tmp_path):
    before = torch.get_num_threads()
    res = runner.invoke(app, ["run", str(path), "--device", "cpu", "--threads", "1", "--json", "--out", str(tmp_path / "r")])
    torch.set_num_threads(before)
    return res


def test_hwprobe_run_streams_int4_weights(tmp_path):
    res = _run(_scenario(tmp_path, weight_dtype="int4", weight_group_size=32), tmp_path)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["weight_dtype_run"] == "int4" and any("int4 weights" in n for n in s["notes"])
    # tiny-qwen2: hidden 256, q 256 + k/v 2 x 64, intermediate 512, vocab 1000, 4 layers, q/k/v bias
    h, qkv, inter, vocab, layers = 256, 256 + 2 * 64, 512, 1000, 4
    shapes = [(qkv, h), (h, 256), (2 * inter, h), (h, inter)]
    int4 = sum(n * k // 2 + (k // 32) * n * 4 for n, k in shapes)
    per_layer = int4 + 2 * (2 * h + qkv)  # + two norms and the q/k/v bias in bf16
    assert s["weights_bytes"] == layers * per_layer + 2 * (2 * vocab * h + h)  # + embedding, LM head, final norm


def test_int8_weights_run_in_bf16_and_say_so(tmp_path):
    res = _run(_scenario(tmp_path, weight_dtype="int8"), tmp_path)
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    assert s["weight_dtype_run"] == "bf16" and any("scenario says int8" in n for n in s["notes"])


def test_a_group_the_int4_kernel_cannot_take_is_one_line_exit_2(tmp_path):
    res = _run(_scenario(tmp_path, weight_dtype="int4", weight_group_size=48), tmp_path)
    assert res.exit_code == 2 and res.stderr.strip().count("\n") == 0
    assert "model.weight_group_size" in res.stderr and "int4" in res.stderr


@pytest.mark.cuda
def test_int4_linear_on_cuda_matches_the_dequantised_weight():
    """The CUDA tinygemm path (nibble packing, inner K tiles) at a 7B projection's shape."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    g = torch.Generator(device="cuda").manual_seed(2)
    n, k = 512, 3584
    w = (torch.randn(n, k, generator=g, device="cuda") / 60).to(torch.bfloat16)
    x = torch.randn(4, k, generator=g, device="cuda").to(torch.bfloat16)
    lin = Linear(w, None, "int4", 128, torch.bfloat16)
    ref = x.float() @ int4_dequantise(*int4_quantise(w, 128), 128).T
    assert (lin(x).float() - ref).abs().max().item() < 0.02 * ref.abs().max().item()
