"""The output documents (sim/outputs/schema.py): frozen, no undeclared keys, fields in the documented
order, and the validation table's names taken from them."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest

from sim.outputs.schema import (
    ROW_COLUMNS,
    STAT_COLUMNS,
    VALIDATION_CHECKS,
    VALIDATION_METRICS,
    DecodeRates,
    Document,
    MeasuredSummary,
    ProjectionSummary,
    RunName,
    SimRunSummary,
    fields_in_order,
)

PROJECTION = dict(fits=True, hbm_peak_bytes=2e9, host_peak_bytes=0.0, hbm_shortfall_bytes=0.0, hbm_capacity_bytes=8e9,
                  hbm_saved_bytes=0.0, max_batch=None, decode_s=1.0, throughput_tok_per_s=100.0, tpot_p50_s=0.01,
                  h2d_utilization=0.0, d2h_utilization=0.0, stall_share=0.0, transfer_share=0.0, h2d_bytes=0.0,
                  d2h_bytes=0.0)


def test_a_document_is_frozen_and_takes_no_undeclared_key():
    p = ProjectionSummary(**PROJECTION)
    with pytest.raises(pydantic.ValidationError):
        p.fits = False
    with pytest.raises(pydantic.ValidationError):
        ProjectionSummary(**PROJECTION, tpot_p99_s=0.02)


def test_numpy_scalars_become_python_types():
    p = ProjectionSummary(**{**PROJECTION, "fits": np.bool_(True), "hbm_peak_bytes": np.float64(2e9),
                             "max_batch": np.int64(4)})
    assert [type(p.fits), type(p.hbm_peak_bytes), type(p.max_batch)] == [bool, float, int]


def test_groups_come_out_in_the_order_given():
    class Doc(*fields_in_order(DecodeRates, RunName)):
        pass

    assert list(Doc.model_fields) == [*DecodeRates.model_fields, *RunName.model_fields]
    assert issubclass(Doc, Document)


def test_shared_groups_are_declared_once():
    for group in (RunName, DecodeRates):
        assert issubclass(SimRunSummary, group) and issubclass(MeasuredSummary, group)


def test_validation_names_come_from_the_schema():
    both = SimRunSummary.model_fields.keys() & MeasuredSummary.model_fields.keys()
    keys = [m.key for m in VALIDATION_METRICS + VALIDATION_CHECKS]
    assert set(keys) - both == {"device_memory_peak_bytes"}  # derived per side by hwprobe validate
    assert ROW_COLUMNS == ["scenario", "metric", "predicted", "measured", "rel_error"]
    assert STAT_COLUMNS == ["metric", "n", "median_abs_rel_error", "worst_rel_error", "worst_scenario"]
