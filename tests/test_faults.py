"""Faults, for real: the launcher runs as a subprocess with 2 CPU ranks under torchrun, and gets
SIGTERM, Ctrl-C (SIGINT) while a rank is stuck, a rank that raises, a rank killed by SIGKILL, and
SIGKILL followed by a relaunch that resumes. After each, no process of the run may survive (checked
by scanning /proc). The root-cause rules of the summary's `error` are also checked on recorded
failures (no training)."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import CONF, read_metrics, read_summary, run_cli
from qwen3exp.run import agent, procs, rundir
from runprocs import TINY, assert_no_survivors, kill_leftovers, metric_rows, start_cli, wait_for

slow = pytest.mark.slow

LONG = (*TINY, "training.steps=100000")  # long enough never to finish by itself within a test


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


def _comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def _forked_ranks(run_dir: Path, launcher: int) -> list[str]:
    """The names of the ranks of a CPU run, checking that no new interpreter was started for the
    agent or its ranks: the agent is the launcher's fork (`qwen3exp-agent`), the ranks the agent's
    (`rank<R>`), all with the launcher's command line, and `procs.workers_of` finds them all."""
    workers = procs.workers_of(run_dir)
    (agent_pid,) = [p for p in workers if _comm(p) == procs.FORKED_AGENT_NAME]
    assert agent_pid in procs.descendants(launcher)
    ranks = [p for p in procs.descendants(agent_pid) if _comm(p).startswith("rank")]
    assert sorted(workers) == sorted([agent_pid, *ranks])
    assert all(procs.cmdline(p) == procs.cmdline(launcher) for p in [agent_pid, *ranks])
    return sorted(_comm(p) for p in ranks)


@slow
def test_sigterm_stops_every_rank(run_dir, tmp_path):
    proc = start_cli(*LONG, f"hydra.run.dir={run_dir}", log=tmp_path / "log")
    wait_for(lambda: metric_rows(run_dir) >= 2, proc=proc, what="two training steps")
    # On the CPU the launcher forks the agent, which imports torchtitan once and forks both ranks
    # (forked_ranks); forked, they die of SIGTERM as new interpreters do (handlers undone in them).
    assert _forked_ranks(run_dir, proc.pid) == ["rank0", "rank1"]
    code, seconds = _stop(proc, signal.SIGTERM)
    assert code == 143, (tmp_path / "log").read_text()[-3000:]
    assert seconds < 10, f"the launcher took {seconds:.1f}s to stop"
    assert_no_survivors(run_dir)
    s = read_summary(run_dir)
    assert s["status"] == "interrupted" and s["exit_code"] == 143 and s["error"] == "stopped by SIGTERM"
    assert 2 <= s["steps_completed"] < 100000
    _stopped_quietly((tmp_path / "log").read_text(), "SIGTERM", s, run_dir)


@slow
def test_ctrl_c_stops_every_rank_while_one_is_stuck(run_dir, tmp_path):
    # Rank 1 stops making progress at step 3; rank 0 then waits for it inside a gloo collective,
    # where a KeyboardInterrupt cannot reach it: the hard case for Ctrl-C.
    proc = start_cli(
        *LONG,
        f"hydra.run.dir={run_dir}",
        log=tmp_path / "log",
        QWEN3EXP_FAULT_HANG_AT_STEP="3",
        QWEN3EXP_FAULT_RANK="1",
    )
    wait_for(lambda: metric_rows(run_dir) >= 2, proc=proc, what="two training steps")
    time.sleep(1.0)  # rank 0 is now blocked in step 3's collective
    assert metric_rows(run_dir) == 2  # ... and really stuck
    code, seconds = _stop(proc, signal.SIGINT)
    assert code == 130, (tmp_path / "log").read_text()[-3000:]
    assert seconds < 10, f"the launcher took {seconds:.1f}s to stop"
    assert_no_survivors(run_dir)
    s = read_summary(run_dir)
    assert s["status"] == "interrupted" and s["exit_code"] == 130 and s["steps_completed"] == 2
    _stopped_quietly((tmp_path / "log").read_text(), "Ctrl-C", s, run_dir)


def _stopped_quietly(out: str, how: str, summary: dict, run_dir: Path) -> None:
    """A stop ends with one line (the last step and its loss, what is saved, the command that starts
    again) and nothing of torchrun's shutdown (issue 22: its 30-line SignalException traceback)."""
    assert "Traceback" not in out and "SignalException" not in out and "death signal" not in out, out[-3000:]
    lines = out.splitlines()
    step, loss = summary["steps_completed"], summary["last_loss"]
    assert lines[-1] == (
        f"qwen3exp: interrupted by {how} after step {step}/100000 (loss {loss:.4f}); "
        "nothing resumable is saved (checkpoint.save=false); to start again: "
        + shlex.join([sys.executable, "-m", "qwen3exp", *LONG])
    ), lines[-1]  # a new directory: none is reused
    assert sum(line.startswith("qwen3exp: interrupted") for line in lines) == 1
    assert str(run_dir) in out  # the first line names the run directory


@slow
def test_a_rank_that_raises_fails_the_job_fast_with_its_own_error(run_dir, reference_losses):
    r = run_cli(
        *TINY, f"hydra.run.dir={run_dir}", env={"QWEN3EXP_FAULT_RAISE_AT_STEP": "3", "QWEN3EXP_FAULT_RANK": "1"}
    )
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


@slow
def test_a_rank_killed_by_sigkill_is_named_as_the_root_cause(run_dir):
    """kill -9 of rank 0 mid-run: rank 0 writes nothing, rank 1 fails in its next collective with
    "Connection reset by peer" (and writes that); the summary must blame rank 0 and SIGKILL."""
    r = run_cli(
        *TINY,
        "training.steps=4",
        f"hydra.run.dir={run_dir}",
        env={"QWEN3EXP_FAULT_KILL_AT_STEP": "3", "QWEN3EXP_FAULT_RANK": "0"},
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert_no_survivors(run_dir)
    s = read_summary(run_dir)
    assert s["status"] == "failed" and s["steps_completed"] == 2
    assert s["error"].startswith("rank 0 (node 0, pid "), s["error"]
    assert "was killed by SIGKILL" in s["error"], s["error"]
    assert not (run_dir / "logs" / "error_rank0.json").exists()  # the killed rank said nothing
    if (run_dir / "logs" / "error_rank1.json").exists():  # rank 1 noticed before torchrun stopped it
        assert "; rank 1 then failed: " in s["error"], s["error"]
    (record,) = [json.loads(p.read_text()) for p in (run_dir / "logs").glob("agent_failures_node*.json")]
    killed = next(f for f in record["failures"] if f["rank"] == 0)
    assert (killed["signal"], killed["exitcode"], killed["local_rank"], killed["stopped_by_agent"]) == (
        "SIGKILL",
        -9,
        0,
        False,
    )


DCP = (CONF / "checkpoint" / "dcp.yaml").is_file()
CKPT = ("checkpoint=dcp", "checkpoint.interval=2", "checkpoint.keep_latest_k=0") if DCP else ()


@slow
def test_sigkill_of_the_launcher_then_a_relaunch_resumes(run_dir, tmp_path, reference_losses):
    """SIGKILL gives the launcher no chance to clean up: the kernel's parent-death signals stop
    torchrun and the ranks. The killed run has no summary.json. Relaunched into the same run
    directory (checkpoint=dcp), it resumes from the newest complete checkpoint, skipping a torn
    one, and reproduces the uninterrupted run's losses.

    The resume half needs the `checkpoint=dcp` option (issue 3); without it the test checks the
    kill half and then reports itself as skipped."""
    args = (*TINY, *CKPT)
    # Rank 1 hangs at step 5, so the kill lands after checkpoint step-4 and before step 5.
    proc = start_cli(
        *args,
        f"hydra.run.dir={run_dir}",
        log=tmp_path / "log",
        QWEN3EXP_FAULT_HANG_AT_STEP="5",
        QWEN3EXP_FAULT_RANK="1",
    )
    ready = (lambda: rundir.latest_checkpoint_step(run_dir) == 4) if DCP else (lambda: metric_rows(run_dir) >= 4)
    wait_for(ready, proc=proc, what="checkpoint step 4" if DCP else "four training steps")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # torchrun's agent stops its ranks before it exits: seconds, more on a loaded machine.
    assert_no_survivors(run_dir, grace=60)
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


@pytest.fixture
def small_disk(tmp_path):
    """A 128 MiB tmpfs (needs root, as in CI); unmounted afterwards whatever happens."""
    mount = tmp_path / "disk"
    mount.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(mount)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield mount
    finally:
        kill_leftovers(mount)
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> None:
    """Write zeros until the disk is full (the run's own checkpoints may have filled it already)."""
    try:
        with (disk / "filler").open("wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
    except OSError:
        pass


@slow
def test_a_disk_that_fills_during_training_still_gets_its_summary(small_disk, tmp_path):
    """Issue 22: a full disk left no summary.json (the launcher's own write failed too). The disk
    fills after checkpoint step-1; the next save fails in the rank."""
    run_dir = small_disk / "run"
    proc = start_cli(
        *LONG,
        "launcher.nproc_per_node=1",
        "validation.enable=false",
        "checkpoint=dcp",
        "checkpoint.interval=1",
        f"hydra.run.dir={run_dir}",
        log=tmp_path / "log",
    )
    wait_for(lambda: rundir.latest_checkpoint_step(run_dir) is not None, proc=proc, what="checkpoint step-1")
    _fill(small_disk)
    code = proc.wait(timeout=120)
    out = (tmp_path / "log").read_text()
    assert code == 1, out[-3000:]
    assert_no_survivors(run_dir)
    s = read_summary(run_dir)
    assert s["status"] == "failed" and s["exit_code"] == 1 and 1 <= s["steps_completed"] < 100000
    assert s["error"].startswith(f"the disk that holds {run_dir} is full ("), s["error"]
    assert f"error: the disk that holds {run_dir} is full" in out
    assert "Traceback" not in out and "Errno 28" not in out, out[-3000:]  # the clear message only (issue 39)
    assert not list((run_dir / "logs").glob("*.reserve"))  # the room held for the summary is given back


# ------------------------------------------------------- the root cause, from recorded failures
def _record(logs: Path, node: int, *failures: dict, started: float = 100.0) -> None:
    logs.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "local_rank": f["rank"],
            "node": node,
            "pid": 1000 + f["rank"],
            "time": 200,
            "error_file": None,
            "stopped_by_agent": False,
            "signal": agent.signal_name(f["exitcode"]),
            **f,
        }
        for f in failures
    ]
    (logs / f"agent_failures_node{node}.json").write_text(
        json.dumps({"node": node, "agent_pid": 1, "agent_started": started, "written": 201.0, "failures": rows})
    )


def _error(logs: Path, rank: int, type_: str, message: str, at: float) -> None:
    logs.mkdir(parents=True, exist_ok=True)
    (logs / f"error_rank{rank}.json").write_text(
        json.dumps({"rank": rank, "time": at, "type": type_, "message": message, "traceback": ""})
    )


RESET = "[../third_party/gloo/gloo/transport/tcp/pair.cc:544] Read error [127.0.0.1]:41234: Connection reset by peer"


def test_an_agent_that_cannot_prepare_the_forked_ranks_starts_them_anew(capsys):
    """`warm` failing in the agent (e.g. an experiment file changed since the plan) must not end the
    launch in the agent: the ranks start as new interpreters and each reports the error as its own."""

    class Unreadable:
        @staticmethod
        def warm(argv):
            raise ValueError(f"{argv[0]}/experiment.yaml changed")

    assert agent._warmed(Unreadable, ["/r"]) is False
    assert "the ranks start anew (ValueError: /r/experiment.yaml changed)" in capsys.readouterr().err


def test_root_cause_a_killed_rank_comes_before_the_errors_it_caused(tmp_path):
    _record(tmp_path, 0, {"rank": 0, "exitcode": -9}, {"rank": 1, "exitcode": 1})
    _error(tmp_path, 1, "RuntimeError", RESET, at=150.0)
    assert agent.root_cause(tmp_path) == (
        f"rank 0 (node 0, pid 1000) was killed by SIGKILL; rank 1 then failed: RuntimeError: {RESET}"
    )


def test_root_cause_ranks_the_agent_stopped_are_not_causes(tmp_path):
    # Rank 1 raised; the agent then stopped rank 0 (SIGTERM), which it records as a failure too.
    _record(tmp_path, 0, {"rank": 1, "exitcode": 1}, {"rank": 0, "exitcode": -15, "stopped_by_agent": True})
    _error(tmp_path, 1, "InjectedFault", "injected fault", at=150.0)
    assert agent.root_cause(tmp_path) == "rank 1: InjectedFault: injected fault"


def test_root_cause_a_rank_gone_without_an_error_report(tmp_path):
    _record(tmp_path, 0, {"rank": 0, "exitcode": 3})
    _error(tmp_path, 1, "RuntimeError", "Connection closed by peer [127.0.0.1]:1234", at=150.0)
    assert agent.root_cause(tmp_path).startswith(
        "rank 0 (node 0, pid 1000) exited with code 3 and left no error report; rank 1 then failed: "
    )


def test_root_cause_across_nodes(tmp_path):
    # Node 1's rank 3 was killed; node 0's ranks only saw their peer vanish.
    _record(tmp_path, 0, {"rank": 0, "exitcode": 1}, {"rank": 1, "exitcode": 1})
    _record(
        tmp_path,
        1,
        {"rank": 3, "local_rank": 1, "exitcode": -9},
        {"rank": 2, "local_rank": 0, "exitcode": -15, "stopped_by_agent": True},
    )
    _error(tmp_path, 0, "RuntimeError", RESET, at=150.0)
    _error(tmp_path, 1, "DistNetworkError", "failed to recv, got 0 bytes", at=150.5)
    assert agent.root_cause(tmp_path).startswith("rank 3 (node 1, pid 1003) was killed by SIGKILL; rank 0 then failed")


def test_root_cause_without_agent_records_a_real_error_beats_communication_errors(tmp_path):
    _error(tmp_path, 0, "RuntimeError", RESET, at=150.0)
    _error(tmp_path, 1, "ValueError", "bad batch", at=151.0)
    assert agent.root_cause(tmp_path) == "rank 1: ValueError: bad batch"
    assert agent.root_cause(tmp_path / "nothing") is None


def test_root_cause_ignores_error_reports_of_an_earlier_launch(tmp_path):
    _error(tmp_path, 1, "ValueError", "from yesterday", at=50.0)
    _record(tmp_path, 0, {"rank": 1, "exitcode": -6}, started=100.0)
    assert agent.root_cause(tmp_path) == "rank 1 (node 0, pid 1001) was killed by SIGABRT"
