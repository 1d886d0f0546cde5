"""Faults, for real: the launcher runs as a subprocess with 2 CPU ranks under torchrun, and gets
SIGTERM, Ctrl-C (SIGINT) while a rank is stuck, a rank that raises, and SIGKILL followed by a
relaunch that resumes. After each, no process of the run may survive (checked by scanning /proc)."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from conftest import CONF, read_metrics, read_summary, run_cli
from runprocs import TINY, assert_no_survivors, kill_leftovers, metric_rows, start_cli, wait_for

pytestmark = pytest.mark.slow

LONG = (*TINY, "training.steps=400")  # long enough never to finish by itself within a test


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    yield run
    kill_leftovers(run)


def _stop(proc, sig: int) -> tuple[int, float]:
    t = time.monotonic()
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
    return code, time.monotonic() - t


def test_sigterm_stops_every_rank(run_dir, tmp_path):
    proc = start_cli(*LONG, f"hydra.run.dir={run_dir}", log=tmp_path / "log")
    wait_for(lambda: metric_rows(run_dir) >= 2, proc=proc, what="two training steps")
    code, seconds = _stop(proc, signal.SIGTERM)
    assert code == 143, (tmp_path / "log").read_text()[-3000:]
    assert seconds < 10, f"the launcher took {seconds:.1f}s to stop"
    assert_no_survivors(run_dir)
    s = read_summary(run_dir)
    assert s["status"] == "interrupted" and s["exit_code"] == 143 and s["error"] == "stopped by SIGTERM"
    assert 2 <= s["steps_completed"] < 400


def test_ctrl_c_stops_every_rank_while_one_is_stuck(run_dir, tmp_path):
    # Rank 1 stops making progress at step 3; rank 0 then waits for it inside a gloo collective,
    # where a KeyboardInterrupt cannot reach it: the hard case for Ctrl-C.
    proc = start_cli(*LONG, f"hydra.run.dir={run_dir}", log=tmp_path / "log",
                     QWEN3EXP_FAULT_HANG_AT_STEP="3", QWEN3EXP_FAULT_RANK="1")
    wait_for(lambda: metric_rows(run_dir) >= 2, proc=proc, what="two training steps")
    time.sleep(1.0)  # rank 0 is now blocked in step 3's collective
    assert metric_rows(run_dir) == 2  # ... and really stuck
    code, seconds = _stop(proc, signal.SIGINT)
    assert code == 130, (tmp_path / "log").read_text()[-3000:]
    assert seconds < 10, f"the launcher took {seconds:.1f}s to stop"
    assert_no_survivors(run_dir)
    s = read_summary(run_dir)
    assert s["status"] == "interrupted" and s["exit_code"] == 130 and s["steps_completed"] == 2


def test_a_rank_that_raises_fails_the_job_fast_with_its_own_error(run_dir, reference_losses):
    r = run_cli(*TINY, f"hydra.run.dir={run_dir}",
                env={"QWEN3EXP_FAULT_RAISE_AT_STEP": "3", "QWEN3EXP_FAULT_RANK": "1"})
    assert r.returncode == 1, r.stderr[-3000:]
    assert_no_survivors(run_dir)
    s = read_summary(run_dir)
    assert s["status"] == "failed" and s["steps_completed"] == 2
    assert [row["loss"] for row in read_metrics(run_dir)] == reference_losses[:2]  # the hook changes nothing before
    # The rank's own message, not torchrun's ChildFailedError text (which names no cause).
    assert s["error"] == "rank 1: InjectedFault: injected fault: QWEN3EXP_FAULT_RAISE_AT_STEP=3 on rank 1"
    raised = json.loads((run_dir / "logs" / "error_rank1.json").read_text())
    assert "InjectedFault" in raised["traceback"] and "train_step" in raised["traceback"]
    # Fail fast: the other rank waited for rank 1 in a collective; the job ended within seconds.
    assert (run_dir / "summary.json").stat().st_mtime - raised["time"] < 10


DCP = (CONF / "checkpoint" / "dcp.yaml").is_file()
CKPT = ("checkpoint=dcp", "checkpoint.interval=2", "checkpoint.keep_latest_k=0") if DCP else ()


def test_sigkill_of_the_launcher_then_a_relaunch_resumes(run_dir, tmp_path, reference_losses):
    """SIGKILL gives the launcher no chance to clean up: the kernel's parent-death signals stop
    torchrun and the ranks. The killed run has no summary.json. Relaunched into the same run
    directory (checkpoint=dcp), it resumes from the newest complete checkpoint, skipping a torn
    one, and reproduces the uninterrupted run's losses.

    The resume half needs the `checkpoint=dcp` option (issue 3); without it the test checks the
    kill half and then reports itself as skipped."""
    args = (*TINY, *CKPT)
    # Rank 1 hangs at step 5, so the kill lands after checkpoint step-4 and before step 5.
    proc = start_cli(*args, f"hydra.run.dir={run_dir}", log=tmp_path / "log",
                     QWEN3EXP_FAULT_HANG_AT_STEP="5", QWEN3EXP_FAULT_RANK="1")
    ready = (lambda: (run_dir / "checkpoint" / "step-4" / ".metadata").is_file()) if DCP \
        else (lambda: metric_rows(run_dir) >= 4)
    wait_for(ready, proc=proc, what="checkpoint step 4" if DCP else "four training steps")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert_no_survivors(run_dir, grace=10)
    assert not (run_dir / "summary.json").exists()  # nothing claims the run finished
    if not DCP:
        pytest.skip("resume half needs checkpoint=dcp (issue 3): enable by merging it; the kill half passed")

    # A save cut short by a kill: the step folder exists, its data is garbage, its metadata is missing.
    torn = run_dir / "checkpoint" / "step-6"
    torn.mkdir()
    (torn / "__0_0.distcp").write_bytes(b"\0garbage")
    r = run_cli(*args, f"hydra.run.dir={run_dir}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from checkpoint step 4" in r.stdout
    assert_no_survivors(run_dir)

    got = read_metrics(run_dir)
    assert [row["step"] for row in got] == [1, 2, 3, 4, 5, 6]  # each step once
    # Bit-exact with the uninterrupted run (no checkpoints there: saving changes no numbers);
    # steps 5-6 were trained after the resume.
    assert [row["loss"] for row in got] == reference_losses
    s = read_summary(run_dir)
    assert s["status"] == "completed" and s["steps_completed"] == 6 and s["first_loss"] == reference_losses[0]
    assert (torn / ".metadata").is_file()  # step 6 was written again, completely
