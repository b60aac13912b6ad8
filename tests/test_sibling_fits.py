"""GPUs no kernel table measures take a sibling's fitted constants (gpus.yaml `fit_sibling`,
`catalog.fitted_kernels_for`), and the RTX PRO 6000 Server the tables do measure."""

from __future__ import annotations

import pytest

from sim.device.kernels import AllReduce, DecodeAttention, Gemm, datasheet_cost, datasheet_hardware
from sim.inputs import catalog
from sim.inputs.kernel_tables import system_for, tables_available

SIBLINGS = {"rtx-4090": "l40s", "rtx-5090": "rtx-pro-6000-server", "rtx-5080": "rtx-pro-6000-server",
            "gh200-144gb": "h200-sxm"}


def test_every_catalog_gpu_has_a_fit_of_its_own_or_its_siblings():
    fits = catalog.fitted_kernels()
    for name in catalog.gpus():
        assert name in fits or catalog.gpu(name).fit_sibling in fits, name
    assert {n: g.fit_sibling for n, g in catalog.gpus().items() if g.fit_sibling} == SIBLINGS


@pytest.mark.parametrize("gpu,sibling", sorted(SIBLINGS.items()))
def test_a_sibling_takes_the_fitted_fractions_at_its_own_peaks(gpu, sibling):
    own, sib = catalog.fitted_kernels_for(gpu), catalog.fitted_kernels()[sibling]
    assert own.gemm["bf16"].weight_hbm_efficiency == sib.gemm["bf16"].weight_hbm_efficiency
    assert own.attention.floor_s == sib.attention.floor_s
    hw = datasheet_hardware(gpu)
    assert hw.weight_hbm_bytes_per_s == pytest.approx(catalog.gpu(gpu).hbm_bytes_per_s * sib.gemm["bf16"].weight_hbm_efficiency)
    said = hw.sources["weight_hbm_efficiency"]
    assert said.startswith(f"fitted on {sibling}'s measured bf16 GEMMs") and "taken as its sibling's" in said
    assert catalog.gpu(gpu).fit_sibling_why in said


def test_the_all_reduce_fit_goes_with_the_fabric_not_the_die():
    # GH200 and H200 share NVLink 4: the fitted protocols carry over
    gh, h2 = catalog.fitted_kernels_for("gh200-144gb"), catalog.fitted_kernels()["h200-sxm"]
    assert gh.allreduce["custom"].by_gpus == h2.allreduce["custom"].by_gpus
    assert datasheet_cost("gh200-144gb", AllReduce(1e6, 4)).seconds == datasheet_cost("h200-sxm", AllReduce(1e6, 4)).seconds
    # the RTX 4090 has no peer-to-peer, L40S does: no all-reduce fit, the catalog ring (2 (N-1)/N x bytes / busbw + hops)
    assert catalog.fitted_kernels_for("rtx-4090").allreduce == {}
    fabric = catalog.interconnect("pcie-host")
    assert datasheet_cost("rtx-4090", AllReduce(1e6, 4)).seconds == pytest.approx(
        1.5e6 / fabric.bus_bytes_per_s + 6 * fabric.per_hop_latency_s)


def test_fit_from_takes_another_gpus_fit_or_none():
    h200 = catalog.fitted_kernels()["h200-sxm"]
    assert catalog.fitted_kernels_for("h100-sxm") == catalog.fitted_kernels()["h100-sxm"]  # its own first
    other = catalog.fitted_kernels_for("h100-sxm", fit_from="h200-sxm")
    assert other.attention.hbm_efficiency == h200.attention.hbm_efficiency
    assert other.attention.borrowed == "h200-sxm: a study of how fits carry over"
    assert catalog.fitted_kernels_for("rtx-4090", fit_from=catalog.NO_FIT) is None
    # decode attention on H100 with H200's fit: H100's own HBM x H200's fitted fraction
    op = DecodeAttention(256, 4096, 32, 8, 128, "bf16")
    a = datasheet_cost("h100-sxm", op, fit_from="h200-sxm").seconds
    b = datasheet_cost("h100-sxm", op).seconds
    assert a != b and a == pytest.approx(b, rel=0.2)


def test_a_bad_sibling_is_refused(monkeypatch):
    data = catalog._read_catalog("gpus.yaml")  # a copy
    next(e for e in data["gpus"] if e["name"] == "rtx-4090")["fit_sibling"] = "rtx-5090"  # itself a sibling-taker
    monkeypatch.setattr(catalog, "_read_catalog", lambda name: data)
    catalog.gpus.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"gpus.yaml: rtx-4090.fit_sibling: expected a catalog GPU without a "
                                             r"sibling of its own, and fit_sibling_why; got 'rtx-5090'"):
            catalog.gpus()
    finally:
        monkeypatch.undo()
        catalog.gpus.cache_clear()


def test_rtx_pro_6000_server_is_measured_by_its_own_tables():
    assert system_for("rtx-pro-6000-server") == "rtx_pro_6000_server"
    gpu = catalog.gpu("RTX-PRO-6000-Server")
    assert gpu.memory_bytes == 97887 * 2**20 and gpu.hbm_bytes_per_s == 1792e9 and gpu.fit_sibling is None
    if not tables_available():
        pytest.skip("aiconfigurator-core (the .[measured] extra) not installed")
    from sim.device.kernels import measured_cost
    c = measured_cost("rtx-pro-6000-server", Gemm(8, 4096, 4096, "bf16"))
    assert "rtx_pro_6000_server" in c.source and c.seconds > 0


def test_kvsim_gpus_says_which_tables_or_fit_cost_each_gpu():
    import json

    from .conftest import run_cli

    res = run_cli("gpus", "--json")
    assert res.returncode == 0, res.stderr
    rows = {r["name"]: r for r in json.loads(res.stdout)}
    assert (rows["h100-sxm"]["kernel_tables"], rows["h100-sxm"]["fitted_on"]) == ("h100_sxm", "h100-sxm")
    assert (rows["rtx-4090"]["kernel_tables"], rows["rtx-4090"]["fitted_on"]) == (None, "l40s")
    assert rows["rtx-pro-6000-server"]["kernel_tables"] == "rtx_pro_6000_server"
    assert run_cli("gpus").returncode == 0
