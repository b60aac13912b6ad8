"""The report's "Accuracy" section: kvtier's errors against public end-to-end measurements, read from
the committed bands file (sim/catalog/accuracy_bands.yaml, `kvsim accuracy --write-bands`); nothing
is recomputed here (docs/accuracy.md)."""

from __future__ import annotations

from sim.inputs.accuracy_bands import ALL, MODES, SHAPE_WORDS, AccuracyBands, Band

from . import html as h

# issue #20 item 5: end to end, median and worst |error| with the measured tables; median in datasheet mode
GOALS = {"measured": (0.05, 0.15), "datasheet": (0.10, None)}
HEADERS = ["mode", "family", "GPU", "rows", "median |error|", "worst |error|", "signed mean"]
MODEL_HEADERS = ["mode", "model", "rows (every family)", "median |error|", "worst |error|", "signed mean"]
SHAPE_HEADERS = ["mode", "family", "workload shape", "rows", "median |error|", "worst |error|", "signed mean"]
MODE_WORDS = {"measured": "measured kernel tables", "datasheet": "datasheet"}


def _pct(x: float, signed: bool = False) -> str:
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def _rows(bands: AccuracyBands) -> list[list[str]]:
    """One row per mode, family ("all" first) and GPU ("all" first), as the file orders them."""
    out = []
    for mode in [m for m in MODES if m in bands.bands]:
        for family, by_gpu in bands.bands[mode].items():
            for gpu, b in by_gpu.items():
                out.append([MODE_WORDS[mode], "every family" if family == ALL else family,
                            "all GPUs" if gpu == ALL else gpu, str(b.rows), _pct(b.median_abs_error),
                            _pct(b.worst_abs_error), _pct(b.mean_error, signed=True)])
    return out


def _model_rows(bands: AccuracyBands) -> list[list[str]]:
    """One row per mode and model, over every family (the file's by_model "all")."""
    return [[MODE_WORDS[mode], model, str(b.rows), _pct(b.median_abs_error), _pct(b.worst_abs_error),
             _pct(b.mean_error, signed=True)]
            for mode in [m for m in MODES if m in bands.by_model]
            for model, b in bands.by_model[mode].get(ALL, {}).items()]


def _shape_rows(bands: AccuracyBands) -> list[list[str]]:
    """One row per mode, family ("all" first) and workload shape, as the file's by_shape orders them."""
    return [[MODE_WORDS[mode], "every family" if family == ALL else family, f"{shape} ({SHAPE_WORDS[shape]})",
             str(b.rows), _pct(b.median_abs_error), _pct(b.worst_abs_error), _pct(b.mean_error, signed=True)]
            for mode in [m for m in MODES if m in bands.by_shape]
            for family, by in bands.by_shape[mode].items() for shape, b in by.items()]


def _goal_sentence(mode: str, b: Band) -> str:
    median, worst = GOALS[mode]
    parts = [f"median {_pct(b.median_abs_error)} (goal {_pct(median)}: "
             f"{'met' if b.median_abs_error <= median else 'NOT met'})"]
    if worst is not None:
        parts.append(f"worst {_pct(b.worst_abs_error)} (goal {_pct(worst)}: "
                     f"{'met' if b.worst_abs_error <= worst else 'NOT met'})")
    return f"With {MODE_WORDS[mode]}, over all {b.rows} rows: " + ", ".join(parts) + "."


def accuracy_section(bands: AccuracyBands) -> tuple[str, str, str]:
    """(id, title, body): what the bands are, whether the goals are met, and the table."""
    at = bands.computed_at
    body = h.paragraph(
        "These are kvtier's own errors against public end-to-end measurements (vLLM, SGLang, TensorRT-LLM and NIM "
        "benchmarks, each simulated in the configuration it was measured in: sim/catalog/e2e_measurements.yaml). "
        "Error = predicted / measured - 1; the signed mean is negative where kvtier predicts too low. kvsim run and "
        "kvsim plan print the band of each headline figure's family in the mode the run used: its model's rows "
        "where the table holds three in that family, else for a dense GQA model every dense GQA model's, else "
        "its GPU's (all GPUs where the table has no row for it). "
        "Computed by kvsim accuracy --write-bands at kvtier "
        f"{at.commit} on {at.date}; not recomputed for this report.")
    goals = [_goal_sentence(m, bands.bands[m][ALL][ALL]) for m in MODES if ALL in bands.bands.get(m, {})
             and ALL in bands.bands[m][ALL]]
    body += h.paragraph("Goals of issue #20: median 5% and worst 15% with the measured tables, median 10% in datasheet "
                        "mode. " + " ".join(goals)
                        + " Where a goal is not met, kvtier's figures carry that much error.")
    body += h.table_html(HEADERS, _rows(bands))
    if bands.by_model:  # a dense 70B and gpt-oss's sliding-window experts miss differently
        body += h.paragraph("Per model, over every family:") + h.table_html(MODEL_HEADERS, _model_rows(bands))
    if bands.by_shape:  # kvtier misses long outputs, balanced lengths and long prompts differently
        body += (h.paragraph("Per workload shape (by the mean prompt and output lengths), every model and GPU; kvsim "
                             "run and kvsim plan print the shape's band beside the model's where it has three rows:")
                 + h.table_html(SHAPE_HEADERS, _shape_rows(bands)))
    return "accuracy", "Accuracy: kvtier against public measurements", body
