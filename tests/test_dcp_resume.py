"""checkpoint=dcp: a run killed after a checkpoint and rerun in the same run directory reproduces
the remaining steps' losses exactly (compared with an uninterrupted run of the same experiment);
a rerun of a different experiment into that directory is refused before anything starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, compose, read_metrics, read_summary, run_cli
from qwen3exp.config.schema import validate_experiment
from qwen3exp.run import rundir
from runprocs import kill_leftovers

pytestmark = pytest.mark.slow

STEPS = 12
ARGS = ("checkpoint=dcp", "checkpoint.interval=2", "checkpoint.keep_latest_k=0", f"training.steps={STEPS}",
        "training.warmup_steps=2", "training.seq_len=64", "training.local_batch_size=4", "metrics.tensorboard=false")


def _kill_after_first_checkpoint(run_dir: Path, timeout: float = 300) -> int:
    """Start the run, SIGTERM the launcher once checkpoint step-2 is complete; returns its exit code."""
    proc = subprocess.Popen([sys.executable, "-m", "qwen3exp", *ARGS, f"hydra.run.dir={run_dir}"], cwd=REPO,
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    try:
        while not (run_dir / "checkpoint" / "step-2" / ".metadata").is_file():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within the timeout"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_killed_run_resumes_exactly(tmp_path):
    # The uninterrupted reference trains side by side with the run that is killed (nothing here
    # depends on timing: the kill waits for checkpoint step-2 on disk, the losses are bit-exact).
    reference, log = tmp_path / "uninterrupted", tmp_path / "uninterrupted.log"
    with log.open("w") as out:
        ref = subprocess.Popen([sys.executable, "-m", "qwen3exp", *ARGS, f"hydra.run.dir={reference}"], cwd=REPO,
                               env={"HF_HUB_OFFLINE": "1", **_env()}, stdout=out, stderr=subprocess.STDOUT)
    try:
        run_dir = tmp_path / "killed"
        killed_code = _kill_after_first_checkpoint(run_dir)
        ref.wait(timeout=600)
    finally:
        if ref.poll() is None:  # a failure above: leave no process of the reference behind
            ref.kill()
            ref.wait()
            kill_leftovers(reference)
    assert ref.returncode == 0, log.read_text()[-3000:]
    expected = {row["step"]: row["loss"] for row in read_metrics(reference)}
    assert sorted(expected) == list(range(1, STEPS + 1))

    assert killed_code == 143
    killed = read_summary(run_dir)
    assert killed["status"] == "interrupted"
    saved = sorted(int(p.name.split("-")[1]) for p in (run_dir / "checkpoint").glob("step-*")
                   if (p / ".metadata").is_file())
    assert saved and saved[-1] < STEPS, f"the kill came too late to test a resume: {saved}"

    r = run_cli(*ARGS, f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from_step"] == saved[-1]
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))  # one row per step, none twice
    resumed = {row["step"]: row["loss"] for row in rows if row["step"] > saved[-1]}
    assert resumed == {step: expected[step] for step in resumed}  # bit-exact
    assert s["step1_loss"] == expected[1]
    assert s["weights_loaded"] is False and s["weights_source"] is None  # random init, no HF weights


def test_rerun_of_a_different_experiment_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    # A run directory as a dcp run leaves it (only the resolved experiment matters for the check).
    exp = validate_experiment(compose(*ARGS))
    (run_dir / "experiment.yaml").write_text(rundir.experiment_yaml(exp.model_dump(mode="json")))
    r = run_cli(*ARGS, "training.lr=1e-3", f"hydra.run.dir={run_dir}")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "different experiment" in r.stderr and "training.lr" in r.stderr
    r = run_cli(*ARGS[3:], "checkpoint=none", f"hydra.run.dir={run_dir}")
    assert r.returncode == 2 and "never overwritten" in r.stderr
    assert not (run_dir / "logs").exists()  # nothing started
