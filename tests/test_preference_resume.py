"""An exact resume of DPO (checkpoint=dcp): a run stopped by Ctrl-C after a checkpoint and relaunched
with the command its last line names reproduces the uninterrupted run's losses and reward metrics
bit for bit, with LoRA (the reference is the base with the adapters off) and with a full fine-tune
(the reference is a frozen copy of the starting weights, saved with each checkpoint: a resume that
rebuilt it from the weights it resumes would give step 1 of the resumed part a zero margin, not the
uninterrupted run's)."""

from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path

import pytest

from conftest import metrics_rows, read_summary, run_cli
from qwen3exp.objectives.registry import METRICS
from qwen3exp.run import rundir
from runprocs import start_cli

STEPS = 10
ARGS = (
    "experiment=tiny_dpo",
    "checkpoint=dcp",
    "checkpoint.interval=2",
    "checkpoint.keep_latest_k=0",
    f"training.steps={STEPS}",
    "training.warmup_steps=2",
    "training.local_batch_size=4",
    "training.lr=1e-3",
    "validation.enable=false",
    "metrics.tensorboard=false",
)


def _rows(run_dir: Path) -> dict[int, dict]:
    """Each step's loss and pair metrics."""
    keys = ("loss", *METRICS)
    return {r["step"]: {k: r[k] for k in keys if k in r} for r in metrics_rows(run_dir) if "loss" in r}


def _stopped_after_a_checkpoint(args: tuple[str, ...], run_dir: Path, log: Path) -> list[str]:
    """Start the run, Ctrl-C it once a checkpoint is complete; the command its last line names."""
    proc = start_cli(*args, f"hydra.run.dir={run_dir}", log=log)
    deadline = time.monotonic() + 300
    try:
        while rundir.latest_checkpoint_step(run_dir) is None:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "no checkpoint within the timeout"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    last = log.read_text().splitlines()[-1]
    assert "to resume: " in last, last
    return shlex.split(last.split("to resume: ", 1)[1])


@pytest.mark.slow  # trains: 3 runs of up to 10 steps of experiment=tiny_dpo (2 ranks) per case
@pytest.mark.parametrize("peft", ["lora", "none"])
def test_dpo_resumes_exactly(peft, tmp_path):
    args = (*ARGS, f"peft={peft}")
    full = tmp_path / "uninterrupted"
    r = run_cli(*args, f"hydra.run.dir={full}", timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    expected = _rows(full)
    assert sorted(expected) == list(range(1, STEPS + 1)) and set(expected[1]) == {"loss", *METRICS}
    assert abs(expected[1]["loss"] - 0.6931) < 1e-3  # the reference is the start: ln 2

    run_dir = tmp_path / "stopped"
    resume = _stopped_after_a_checkpoint(args, run_dir, tmp_path / "stopped.log")
    saved = rundir.latest_checkpoint_step(run_dir)
    assert saved is not None and saved < STEPS, f"the Ctrl-C came too late to test a resume: {saved}"
    r = run_cli(*resume[3:], timeout=600)  # python -m qwen3exp ARGS
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from_step"] == saved
    got = _rows(run_dir)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert {k: got[k] for k in got if k > saved} == {k: expected[k] for k in expected if k > saved}  # bit-exact
