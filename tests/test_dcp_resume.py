"""checkpoint.save=true: a LoRA fine-tune of a Hugging Face folder (checkpoint=hf_finetune: load,
dcp saves and an export in one run) stopped by Ctrl-C after a checkpoint and rerun in the same run
directory with the command its last line names resumes from its dcp step, not from the published
weights, reproduces the remaining steps' losses exactly (compared with an uninterrupted run of the
same experiment, which also checks that keep_latest_k keeps exactly k) and exports at the end;
a rerun of a different experiment into that directory is refused before anything starts."""

from __future__ import annotations

import re
import shlex
import signal
import sys
import time
from pathlib import Path

import pytest

from conftest import compose, read_metrics, read_summary, run_cli
from hf_fixtures import write_checkpoint
from qwen3exp.config.schema import validate_experiment
from qwen3exp.run import rundir
from runprocs import kill_leftovers, launch_seconds, start_cli

pytestmark = pytest.mark.slow

STEPS = 12
ARGS = (
    "checkpoint=dcp",
    "checkpoint.interval=2",
    "checkpoint.keep_latest_k=0",
    f"training.steps={STEPS}",
    "training.warmup_steps=2",
    "training.seq_len=64",
    "training.local_batch_size=4",
    "metrics.tensorboard=false",
)


def _finetune(ckpt: Path) -> tuple[str, ...]:
    """ARGS as a LoRA fine-tune of the Hugging Face folder `ckpt` that also exports at the end."""
    return (
        *ARGS,
        "checkpoint=hf_finetune",
        "checkpoint.dtype=float32",
        "peft=lora",
        "model.flavor=auto",
        f"model.hf_assets_path={ckpt}",
    )


def _interrupt_after_first_checkpoint(args: tuple[str, ...], run_dir: Path, log: Path, timeout: float = 300) -> int:
    """Start the run, Ctrl-C (SIGINT) the launcher once checkpoint step-2 is complete; returns its
    exit code (its output is in `log`)."""
    proc = start_cli(*args, f"hydra.run.dir={run_dir}", log=log)
    deadline = time.monotonic() + timeout
    try:
        while rundir.latest_checkpoint_step(run_dir) is None:  # step-2 saved and signed by every rank
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within the timeout"
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def _checkpoints(run_dir: Path) -> list[int]:
    """The checkpoints a resume may load: complete and signed by every rank."""
    latest = rundir.latest_checkpoint_step(run_dir)
    return [s for s in rundir.complete_checkpoint_steps(run_dir) if latest is not None and s <= latest]


def test_killed_run_resumes_exactly(tmp_path):
    # The uninterrupted reference trains side by side with the run that is stopped (nothing here
    # depends on timing: the Ctrl-C waits for checkpoint step-2 on disk, the losses are bit-exact).
    # It saves every step and keeps 2: torchtitan's last-step save alone kept 3 (issue 22).
    reference, log = tmp_path / "uninterrupted", tmp_path / "uninterrupted.log"
    ckpt = write_checkpoint(tmp_path / "ckpt", tied=True, seed=3)
    args = _finetune(ckpt)
    keep = [a for a in args if not a.startswith(("checkpoint.interval=", "checkpoint.keep_latest_k="))]
    ref = start_cli(*keep, "checkpoint.interval=1", "checkpoint.keep_latest_k=2", f"hydra.run.dir={reference}", log=log)
    try:
        run_dir, stopped_log = tmp_path / "killed", tmp_path / "killed.log"
        killed_code = _interrupt_after_first_checkpoint(args, run_dir, stopped_log)
        ref.wait(timeout=600)
    finally:
        if ref.poll() is None:  # a failure above: leave no process of the reference behind
            ref.kill()
            ref.wait()
            kill_leftovers(reference)
    assert ref.returncode == 0, log.read_text()[-3000:]
    expected = {row["step"]: row["loss"] for row in read_metrics(reference)}
    assert sorted(expected) == list(range(1, STEPS + 1))
    # keep_latest_k=2 after 12 saves (6 x k): exactly the newest 2, the last step's included.
    assert sorted(p.name for p in (reference / "checkpoint").iterdir()) == ["step-11", "step-12"]

    assert killed_code == 130, stopped_log.read_text()[-3000:]
    killed = read_summary(run_dir)
    assert killed["status"] == "interrupted" and killed["error"] == "stopped by SIGINT"
    saved = _checkpoints(run_dir)
    assert saved and saved[-1] < STEPS, f"the Ctrl-C came too late to test a resume: {saved}"
    resume = _stopped_quietly(stopped_log.read_text(), run_dir, saved[-1], read_metrics(run_dir)[-1])
    assert resume == [sys.executable, "-m", "qwen3exp", *args, f"hydra.run.dir={run_dir}"]
    assert not (run_dir / rundir.EXPORT).exists()  # exported at the end only

    started = time.monotonic()
    r = run_cli(*resume[3:], timeout=600)  # the command it names (python -m qwen3exp ARGS, checked above)
    took = time.monotonic() - started
    assert r.returncode == 0, r.stderr[-3000:]
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["resumed_from_step"] == saved[-1]
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))  # one row per step, none twice
    resumed = {row["step"]: row["loss"] for row in rows if row["step"] > saved[-1]}
    assert resumed == {step: expected[step] for step in resumed}  # bit-exact
    assert s["step1_loss"] == expected[1]
    # Step 1 came from the published weights; the resume loaded its own dcp step instead.
    assert killed["weights_loaded"] is True and killed["weights_source"] == str(ckpt)
    assert f"resuming from checkpoint step {saved[-1]} (not from checkpoint.load=hf)" in r.stdout, r.stdout
    assert s["export"]["ok"] and (run_dir / rundir.EXPORT / f"step-{STEPS}" / "adapter").is_dir(), s["export"]
    # The resume shows only its own steps, and no warning (torchtitan's lr scheduler warned on every resume).
    shown = [int(m[1]) for m in re.finditer(r"^qwen3exp: step (\d+)/", r.stdout, re.MULTILINE)]
    assert shown == list(range(saved[-1] + 1, STEPS + 1)), r.stdout
    assert "Warning" not in r.stdout and "Traceback" not in r.stdout + r.stderr, r.stdout
    # The wall time is the command's: at least from the launch's first line to its outcome line, at
    # most the whole process's (issue 22: it started when torchrun did).
    assert launch_seconds(run_dir) <= s["wall_seconds"] <= took, (launch_seconds(run_dir), s["wall_seconds"], took)

    # Another run starting from this run's last dcp step (checkpoint.load=dcp): trained weights, no resume.
    step_dir = run_dir / rundir.CHECKPOINT / f"step-{STEPS}"
    other = tmp_path / "from_dcp"
    same_model = [a for a in args if not a.startswith(("checkpoint=", "training.warmup_steps="))]
    loaded = run_cli(*same_model, "checkpoint.load=dcp", f"checkpoint.path={step_dir}", "training.steps=1",
                     "training.warmup_steps=1", f"hydra.run.dir={other}", timeout=600)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    first = read_summary(other)
    assert first["weights_loaded"] and first["weights_source"] == str(step_dir) and first["resumed_from_step"] is None
    assert first["step1_loss"] < expected[1], (first["step1_loss"], expected[1])


def _stopped_quietly(out: str, run_dir: Path, saved: int, last: dict) -> list[str]:
    """Ctrl-C ends with one line (the last completed step and its loss, what is saved, the command
    that resumes) and nothing of torchrun's shutdown (its SignalException traceback, issue 22).
    Returns the command it names."""
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]
    lines = out.splitlines()
    after = lines[next(i for i, line in enumerate(lines) if line.startswith("qwen3exp: step ")) :]
    assert all(line.startswith("qwen3exp: ") for line in after), out[-3000:]
    final = (
        f"qwen3exp: interrupted by Ctrl-C after step {last['step']}/{STEPS} (loss {last['loss']:.4f}); "
        f"checkpoint step-{saved} is saved; to resume: "
    )
    assert lines[-1].startswith(final), lines[-1]
    assert sum(line.startswith("qwen3exp: interrupted") for line in lines) == 1
    return shlex.split(lines[-1][len(final) :])


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
