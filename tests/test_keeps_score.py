"""Every run keeps score (issue 25) and names the next command (issue 27), in process, no training.

The launcher's own end of a run (`qwen3exp.launchers.outcome.summarize` and `say`) runs on a run
directory laid out as the ranks leave it: a real plan of the tiny experiment on 2 CPU ranks,
metrics.jsonl, and each rank's peak memory written by the same `RankPeak` the ranks use
(`qwen3exp.titan.metrics`). The peaks are chosen so the plan's estimate is beaten by more than 15%
(the warning) or not (no warning). The real 2-rank run's score is checked in tests/test_cli.py,
on the training that file runs anyway.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import time

import pytest

from conftest import compose
from qwen3exp.analysis import report
from qwen3exp.config.schema import validate_experiment
from qwen3exp.config.sections.platform import CpuPlatform, CudaPlatform, NeuronPlatform
from qwen3exp.launchers import next_steps, outcome
from qwen3exp.plan.build import make_plan
from qwen3exp.run import rundir, scorecard
from qwen3exp.units import GIB


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("score") / "run"
    exp = validate_experiment(compose("platform=cpu", "launcher.nproc_per_node=2"))
    return make_plan(exp, run_dir)


def _run_dir(plan, tmp_path, peaks: dict[int, float], **checkpoint):
    """A run directory of `plan` (its experiment, with `checkpoint` keys changed) as 2 ranks leave it."""
    run_dir = tmp_path / "run"
    data = plan.exp.model_dump(mode="json")
    data["checkpoint"].update(checkpoint)
    rundir.atomic_write_text(run_dir / rundir.EXPERIMENT, rundir.experiment_yaml(data))
    rows = [
        {"step": s, "loss": 4.0 - s / 2, "tokens_per_second": 100.0, "memory_gib": peaks.get(0), "step_seconds": t}
        for s, t in ((1, 9.0), (2, 0.5), (3, 0.25), (4, 2.0))
    ]
    rundir.atomic_write_text(run_dir / rundir.METRICS, "".join(json.dumps(r) + "\n" for r in rows))
    for rank, gib in peaks.items():
        scorecard.RankPeak(run_dir / rundir.LOGS, rank).record(2, gib)
    return run_dir


def _end(plan, run_dir, capsys, *, status="completed", error=None) -> tuple[dict, list[str]]:
    summary = outcome.summarize(plan, run_dir, exit_code=0, status=status, wall=5.0, error=error)
    capsys.readouterr()
    outcome.say(summary, run_dir)
    return summary, capsys.readouterr().out.splitlines()


def test_a_run_above_the_plan_by_more_than_15_percent_says_so(plan, tmp_path, capsys):
    predicted = plan.memory.peak / GIB
    run_dir = _run_dir(plan, tmp_path, {0: 1.2 * predicted, 1: 1.5 * predicted})
    summary, lines = _end(plan, run_dir, capsys)
    # summary.json: the plan's per-rank estimate, the peak over steps and ranks, the ratio.
    assert rundir.read_json(run_dir / rundir.SUMMARY) == summary
    assert summary["memory_predicted_gib"] == pytest.approx(predicted)
    assert summary["memory_measured_gib"] == pytest.approx(1.5 * predicted) and summary["memory_measured_rank"] == 1
    assert summary["memory_ratio"] == pytest.approx(1.5)
    # The ending: outcome (with the score), the warning, nothing saved, the next commands.
    assert len(lines) == 4, lines
    assert lines[0].startswith(f"qwen3exp: completed: {run_dir}  last loss 2.0000  peak memory ")
    assert (
        f"({1.5 * predicted:.2f} GiB per rank (plan {predicted:.2f} GiB, 1.50x)" in f"({lines[0].split('memory ')[1]}"
    )
    warnings = [line for line in lines if "under-estimates" in line]
    assert warnings == [lines[1]]
    assert f"measured {1.5 * predicted:.2f} GiB" in lines[1] and f"predicted {predicted:.2f} GiB" in lines[1]
    assert "(1.50x, more than 1.15x)" in lines[1]
    assert "platform.memory_per_rank_gib" in lines[1] and "training.activation_checkpoint=full" in lines[1]
    assert lines[2] == "qwen3exp: no checkpoint was saved (checkpoint=none); add checkpoint=dcp to keep the weights"
    assert lines[3] == (f"qwen3exp: next: qwen3exp report {run_dir}  |  qwen3exp relaunch {run_dir} (runs it again)")


def test_a_run_within_15_percent_of_the_plan_does_not_warn(plan, tmp_path, capsys):
    predicted = plan.memory.peak / GIB
    run_dir = _run_dir(plan, tmp_path, {0: 1.1 * predicted, 1: 0.9 * predicted}, save=True)
    (run_dir / rundir.CHECKPOINT / "step-2").mkdir(parents=True)  # unsigned: chat would refuse it
    summary, lines = _end(plan, run_dir, capsys)
    assert summary["memory_ratio"] == pytest.approx(1.1) and summary["memory_measured_rank"] == 0
    assert not any("under-estimates" in line or "no checkpoint" in line for line in lines), lines
    assert lines[-1] == f"qwen3exp: next: qwen3exp report {run_dir}  |  qwen3exp relaunch {run_dir} (runs it again)"


def test_an_earlier_attempts_peak_is_not_this_launchs(plan, tmp_path, capsys):
    """A rank file written before this launch began (an earlier attempt in the same directory)
    is left out: the summary measures this launch."""
    run_dir = _run_dir(plan, tmp_path, {0: 0.01, 1: 9.0})
    old = time.time() - 3600
    os.utime(run_dir / rundir.LOGS / "memory_rank1.json", (old, old))
    summary, _ = _end(plan, run_dir, capsys)
    assert summary["memory_measured_gib"] == 0.01 and summary["memory_measured_rank"] == 0


def test_a_run_that_measured_nothing_has_no_score_and_no_warning(plan, tmp_path, capsys):
    run_dir = _run_dir(plan, tmp_path, {})
    summary, lines = _end(plan, run_dir, capsys, status="failed", error="boom")
    assert summary["memory_measured_gib"] is None and summary["memory_ratio"] is None
    assert summary["memory_predicted_gib"] == pytest.approx(plan.memory.peak / GIB)
    logs = run_dir / rundir.LOGS
    assert lines == [
        f"qwen3exp: failed: {run_dir}  last loss 2.0000  wall 5.0s",
        "  error: boom",
        f"qwen3exp: next: the ranks' output is in {logs}; to run it again: qwen3exp relaunch {run_dir}",
    ]


def test_the_step_time_is_scored_against_the_plans_cost_model(plan, tmp_path, capsys):
    """The median logged step after the first (9 s: allocation, compilation) next to plan.json's step."""
    assert plan.step is not None and plan.as_json()["step"]["step_s"] == plan.step.step_s > 0
    summary, lines = _end(plan, _run_dir(plan, tmp_path, {0: 0.1, 1: 0.1}), capsys)
    assert summary["step_time_predicted_s"] == plan.step.step_s
    assert summary["step_time_measured_s"] == 0.5  # the median of 0.5, 0.25 and 2.0
    assert summary["step_time_ratio"] == pytest.approx(0.5 / plan.step.step_s)
    assert f"step 0.5s (plan {plan.step.step_s:.3g}s, {0.5 / plan.step.step_s:.2f}x)" in lines[0]
    assert scorecard.step_score(None, [{"step": 1}])["step_time_ratio"] is None


def test_weights_loaded_is_what_the_ranks_report(plan, tmp_path):
    """Issue 39: `weights_loaded` was the configuration (checkpoint.load) and a step-1 loss. It is
    what rank 0 recorded after the step-0 load (`qwen3exp.titan.weights_record`): a run configured
    to load whose ranks recorded no load says false; the recorded tensors are counted."""
    import dataclasses

    from qwen3exp.titan import weights_record

    source = str(tmp_path / "elsewhere" / "step-3")
    checkpoint = plan.exp.checkpoint.model_copy(update={"load": "dcp", "path": source})
    loading = dataclasses.replace(plan, exp=plan.exp.model_copy(update={"checkpoint": checkpoint}))
    run_dir = _run_dir(plan, tmp_path, {0: 1.0})
    summary = outcome.summarize(loading, run_dir, exit_code=0, status="completed", wall=5.0, error=None)
    assert summary["step1_loss"] == 3.5 and summary["weights_source"] == source
    assert summary["weights_loaded"] is False and summary["weights_loaded_tensors"] == 0
    weights_record.write(run_dir, source=source, hf=False, names=["tok_embeddings.weight", "norm.weight"])
    summary = outcome.summarize(loading, run_dir, exit_code=0, status="completed", wall=5.0, error=None)
    assert summary["weights_loaded"] is True and summary["weights_loaded_tensors"] == 2
    assert rundir.read_json(weights_record.path(run_dir))["names"] == ["norm.weight", "tok_embeddings.weight"]
    weights_record.clear(run_dir)  # a launch that starts from step 1: its ranks report their own
    summary = outcome.summarize(plan, run_dir, exit_code=0, status="completed", wall=5.0, error=None)
    assert summary["weights_loaded"] is False and summary["weights_source"] is None


def test_rank_peak_keeps_the_highest_reading():
    from pathlib import Path
    from tempfile import TemporaryDirectory

    with TemporaryDirectory() as tmp:
        peak = scorecard.RankPeak(Path(tmp) / "logs", 3)
        for step, gib in ((1, 0.5), (2, 0.7), (3, 0.6), (4, float("nan")), (5, None)):
            peak.record(step, gib)
        assert rundir.read_json(peak.path) == {"rank": 3, "peak_gib": 0.7, "step": 2}
        assert scorecard.measured_peak(Path(tmp) / "logs", since=time.time()) == (0.7, 3)


def test_each_platform_names_its_memory_key():
    """The warning names the platform section's memory-per-rank key, found on its class."""
    assert scorecard.budget_key("cpu") == "platform.memory_per_rank_gib"
    assert scorecard.budget_key("cuda") == "platform.memory_per_gpu_gib"
    assert scorecard.budget_key("neuron") == "platform.hbm_per_core_gib"
    for section, key in ((CpuPlatform, "memory_per_rank_gib"), (CudaPlatform, "memory_per_gpu_gib")):
        assert key in section.model_fields
    assert "hbm_per_core_gib" in NeuronPlatform.model_fields
    assert scorecard.budget_key("nowhere") is None and scorecard.budget_key(None) is None


def test_chat_and_resume_are_named_when_the_run_kept_weights(plan, tmp_path):
    run_dir = _run_dir(plan, tmp_path, {0: 0.5}, export="end")
    (run_dir / rundir.EXPORT / "step-2").mkdir(parents=True)
    (run_dir / rundir.EXPORT / "step-2" / "config.json").write_text("{}")
    assert next_steps.lines({"status": "completed"}, run_dir) == [
        f"qwen3exp: next: qwen3exp report {run_dir}  |  qwen3exp chat {run_dir}  |  "
        f"qwen3exp relaunch {run_dir} (runs it again)"
    ]
    # A failed resumable run with a checkpoint: the recorded command, in this run directory.
    resumable = _run_dir(plan, tmp_path / "b", {0: 0.5}, save=True)
    step = resumable / rundir.CHECKPOINT / "step-1"
    step.mkdir(parents=True)
    (step / ".metadata").write_text("")  # complete, and its one rank's signature is there (not checked)
    (step / ".qwen3exp-signed-0.json").write_text('{"world": 1}')
    command = ["python", "-m", "qwen3exp", "checkpoint=dcp", "hydra.run.dir=elsewhere"]
    rundir.atomic_write_json(resumable / rundir.PROVENANCE, {"command": command, "hydra": {"mode": "RUN"}})
    [line] = next_steps.lines({"status": "failed"}, resumable)
    assert line.endswith(
        f"to resume from checkpoint step-1: python -m qwen3exp checkpoint=dcp hydra.run.dir={resumable}"
    )
    # A job of a sweep: the end of the sweep names the report of all its jobs.
    rundir.atomic_write_json(resumable / rundir.PROVENANCE, {"command": command, "hydra": {"mode": "MULTIRUN"}})
    assert next_steps.lines({"status": "failed"}, resumable) == []
    # Loaded from Hugging Face, saved nothing: the key to add keeps the load.
    assert "add checkpoint.save=true" in next_steps.nothing_saved({"load": "hf", "save": False, "export": "none"})


def test_report_shows_predicted_measured_and_ratio(plan, tmp_path, capsys):
    predicted = plan.memory.peak / GIB
    run_dir = _run_dir(plan, tmp_path, {0: 2 * predicted, 1: 3 * predicted})
    _end(plan, run_dir, capsys)
    # A report.csv an earlier version wrote (its columns had no score) is still report's own.
    (run_dir / report.REPORT_CSV).write_text("run,status,steps,final loss,val loss,tokens/s,peak mem GiB,wall s\n")
    assert report.main([str(run_dir), "--format", "csv"]) == 0
    [row] = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert float(row["plan mem GiB"]) == pytest.approx(predicted)
    assert float(row["peak mem GiB"]) == pytest.approx(3 * predicted) and float(row["mem ratio"]) == pytest.approx(3)
    assert (
        (run_dir / report.REPORT_CSV)
        .read_text()
        .splitlines()[0]
        .endswith("plan mem GiB,peak mem GiB,mem ratio,step ratio,wall s")
    )
    assert float(row["step ratio"].rstrip("x")) == pytest.approx(0.5 / plan.step.step_s, rel=1e-2)
    assert report.main([str(run_dir), "--no-files"]) == 0
    header, _, values = capsys.readouterr().out.splitlines()[:3]
    assert re.search(r"plan mem GiB\s+peak mem GiB\s+mem ratio", header)
    assert re.search(rf"{predicted:.2f}\s+{3 * predicted:.2f}\s+3\.00x", values), values
