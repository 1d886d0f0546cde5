"""metrics.jsonl is strict JSON on every line: non-finite numbers are written as null plus a
`nonfinite` flag, and the readers (summary, report) take a null loss."""

from __future__ import annotations

import json
import math

import pytest

from qwen3exp.run import metrics_file, rundir


def _strict(line: str) -> dict:
    def refuse(name):
        raise ValueError(f"not JSON: {name}")

    return json.loads(line, parse_constant=refuse)


def _metrics(loss: float, grad_norm: float) -> dict:
    # The keys torchtitan's MetricsProcessor passes to its loggers on a training step.
    return {
        "loss_metrics/global_avg_loss": loss,
        "loss_metrics/global_max_loss": loss,
        "grad_norm": grad_norm,
        "throughput(tps)": 1000.0,
        "memory/max_reserved(GiB)": 1.5,
        "mfu(%)": 0.1,
        "lr": 1e-3,
        "time_metrics/end_to_end(s)": 0.2,
    }


def test_non_finite_values_are_written_as_null_with_a_flag(tmp_path):
    from qwen3exp.titan.metrics import JsonlLogger

    path = tmp_path / rundir.METRICS
    log = JsonlLogger(str(path), peak_flops_known=True)
    log.log(_metrics(2.5, 1.0), step=1)
    log.log(_metrics(math.nan, math.inf), step=2)
    log.log(_metrics(-math.inf, 0.5), step=3)
    log.close()

    lines = path.read_text().splitlines()
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()
    rows = [_strict(line) for line in lines]  # every line parses as strict JSON
    assert rows[0]["loss"] == 2.5 and "nonfinite" not in rows[0]
    assert rows[1]["loss"] is None and rows[1]["grad_norm"] is None
    assert rows[1]["nonfinite"] == ["loss", "grad_norm"]
    assert rows[1]["tokens_per_second"] == 1000.0  # finite values of the same row are kept
    assert rows[2]["loss"] is None and rows[2]["grad_norm"] == 0.5 and rows[2]["nonfinite"] == ["loss"]


def test_plain_json_dumps_would_not_be_strict():
    # Why the logger sanitizes: Python's json writes NaN, which strict readers refuse.
    with pytest.raises(ValueError, match="not JSON"):
        _strict(json.dumps({"loss": math.nan}))


def test_readers_take_a_null_loss(tmp_path):
    from qwen3exp.analysis import report

    rows = [
        {"step": 1, "loss": 3.0, "tokens_per_second": 10.0, "memory_gib": 1.0},
        {
            "step": 2,
            "loss": None,
            "grad_norm": None,
            "tokens_per_second": 12.0,
            "memory_gib": 1.0,
            "nonfinite": ["loss", "grad_norm"],
        },
    ]
    (tmp_path / rundir.METRICS).write_text("".join(json.dumps(r, allow_nan=False) + "\n" for r in rows))
    assert metrics_file.read_metrics(tmp_path) == rows
    run = report.load_run(tmp_path, experiment={"name": "x"})
    assert run.final_loss is None and run.steps == 2
    t = report.table([run])
    assert "-" in report.render_terminal(t)  # a null loss shows as "-"
    report.plot_losses(t, tmp_path / "loss.png")  # the null point is left out of the curve
    metrics_file.truncate_metrics(tmp_path, 2)  # a resume rewrites the rows: still strict JSON
    assert [_strict(line) for line in (tmp_path / rundir.METRICS).read_text().splitlines()] == rows
