"""Ctrl-C, SIGTERM and SIGHUP stop a launch and a dry run at every moment, from the command's first
instruction to its last (`qwen3exp.run.stopping`): exit 130 (143 for SIGTERM and SIGHUP), never a
traceback, and left behind: nothing before a job started, a summary after it.

Each point starts the real command line in a new interpreter (the import is a phase of its own),
waits for a moment of it, sends the signal and checks the outcome. Half the points start as a
script's `qwen3exp ... &` starts it, with SIGINT ignored (the issue: `kill -INT` was swallowed for the
first second and the run trained to the end with exit 0). The moments are taken from what the command
shows, plus delays: its handler in place (/proc's SigCgt: the command's first instruction ran), the
run directory claimed, `logs/` made by the job, the first metrics row, every step's row; the delays
after them put points into the import, the compose and checks, the plan, the ranks' start, the first
step and the end whatever the machine's load. A point whose command had already ended when the signal
came (exit 0 with a completed summary or a whole dry-run plan) proves nothing and is counted apart;
most points must have been stopped.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from qwen3exp.run import stopping
from runprocs import TINY, assert_no_survivors, kill_leftovers, metric_rows, start_cli

slow = pytest.mark.slow  # new interpreters (the import is a phase of its own), 13 of them launches

STEPS = 3
LAUNCH = (*TINY, f"training.steps={STEPS}", "launcher.nproc_per_node=1", "validation.enable=false")
DRY = ("dry_run=true",)
CODE = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 143}
INT, TERM, HUP = signal.SIGINT, signal.SIGTERM, signal.SIGHUP

# (moment, seconds after it, signals sent 30 ms apart). "ready": the handler is in (the import has
# begun); "check": that fraction of the way from "ready" to "dir" in a dry run measured just before
# (compose and checks: no file shows them); "dir": the run directory claimed (a dry run plans, a
# launch plans and writes it); "logs": the job made logs/ (the ranks start); "step": the first
# metrics row; "all": the last step's row.
DRY_GRID = [
    *(("ready", s, (INT,)) for s in (0.0, 0.1, 0.25, 0.45)),
    *(("check", f, (INT,)) for f in (0.8, 0.88, 0.95)),  # the import takes ~3/4 of the way
    *(("dir", s, (INT,)) for s in (0.0, 0.05, 0.15)),
    ("ready", 0.2, (TERM,)),
    ("dir", 0.0, (HUP,)),
    ("dir", 0.0, (INT, INT)),  # two Ctrl-C while it plans
]
LAUNCH_GRID = [
    *(("ready", s, (INT,)) for s in (0.05, 0.3)),
    ("check", 0.9, (INT,)),
    *(("dir", s, (INT,)) for s in (0.0, 0.15)),
    ("logs", 0.0, (INT,)),
    ("logs", 0.6, (INT,)),
    ("step", 0.0, (INT,)),
    ("all", 0.0, (INT,)),
    ("dir", 0.05, (TERM,)),
    ("logs", 0.3, (HUP,)),
    ("dir", 0.0, (INT, INT)),  # two Ctrl-C while the launcher plans
]


def _handler_in(pid: int) -> bool:
    """The command installed its handler: SIGTERM is caught (a new interpreter catches only SIGINT)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught & (1 << (signal.SIGTERM - 1)))


def _phase(run_dir: Path, seen_dir: bool) -> str:
    """Where the command is, as far as its files show."""
    if (run_dir / "summary.json").is_file() or (seen_dir and not run_dir.exists()):
        return "closing"  # a launch wrote its summary, a dry run removed its claim: what is left is its exit
    rows = metric_rows(run_dir)
    if rows >= STEPS:
        return "end"
    if rows:
        return "first step"
    if (run_dir / "logs").is_dir():
        return "start"
    if run_dir.is_dir():
        return "plan"
    return "import/check"


def _reached(moment: str, run_dir: Path, pid: int) -> bool:
    return {
        "ready": lambda: _handler_in(pid),
        "check": lambda: _handler_in(pid),
        "dir": run_dir.is_dir,
        "logs": lambda: (run_dir / "logs").is_dir(),
        "step": lambda: metric_rows(run_dir) >= 1,
        "all": lambda: metric_rows(run_dir) >= STEPS,
    }[moment]()


def _point(args: tuple, run_dir: Path, log: Path, moment: str, delay: float, sigs: tuple, ignored: tuple) -> dict:
    """Start, wait for the moment, signal; what happened."""
    proc = start_cli(*args, f"hydra.run.dir={run_dir}", log=log, fresh=True, ignored=ignored)
    begun, seen_dir = time.monotonic(), False
    try:
        while not _reached(moment, run_dir, proc.pid) and proc.poll() is None:
            assert time.monotonic() - begun < 300, f"{moment} never came"
            time.sleep(0.002)
        ready = time.monotonic()
        while time.monotonic() - ready < delay:
            seen_dir = seen_dir or run_dir.is_dir()
            time.sleep(0.002)
        phase = "ended" if proc.poll() is not None else _phase(run_dir, seen_dir or moment == "dir")
        at = time.monotonic() - begun
        for i, sig in enumerate(sigs):
            if i:
                time.sleep(0.03)
            if proc.poll() is None:
                proc.send_signal(sig)
        code = proc.wait(timeout=120)
        if run_dir.is_dir():
            assert_no_survivors(run_dir)
    finally:
        kill_leftovers(run_dir)
    out = log.read_text()
    if phase == "import/check":
        phase = "import" if "stopped before anything started" in out else "check"
    summary = run_dir / "summary.json"
    return {
        "at": round(at, 2),
        "phase": phase,
        "code": code,
        "out": out,
        "summary": json.loads(summary.read_text()) if summary.is_file() else None,
        "left": sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else None,
    }


def _check(r: dict, sigs: tuple, dry: bool) -> str | None:
    """What is wrong with one point (None: nothing); sets r["stopped"]."""
    expected, summary = CODE[sigs[0]], r["summary"]
    r["stopped"] = r["code"] == expected
    if "Traceback" in r["out"]:
        return "a traceback"
    if r["code"] == 0:  # only where it had ended before the signal came, and whole
        if r["phase"] not in ("ended", "closing"):
            return "exit 0: the signal was swallowed"
        if dry and "dry run:" in r["out"] and r["left"] is None:
            return None
        if not dry and summary and summary["status"] == "completed" and summary["steps_completed"] == STEPS:
            return None
        return f"exit 0 without having ended (summary {summary and summary['status']})"
    if not r["stopped"]:
        return f"exit {r['code']}, not {expected}"
    if dry or summary is None:
        return None if r["left"] is None else f"left {r['left']}"
    if summary["status"] == "interrupted" and summary["exit_code"] == expected:
        return None
    if summary["status"] == "completed" and summary["steps_completed"] == STEPS:
        return None  # every step had run: the signal came while it closed
    return f"summary {summary['status']} / {summary['exit_code']}"


def _check_span(tmp_path: Path) -> float:
    """Seconds from the handler to the claim in a whole dry run (which must end with 0, its plan
    printed, nothing left)."""
    run_dir, log = tmp_path / "whole", tmp_path / "whole.log"
    proc = start_cli(*DRY, f"hydra.run.dir={run_dir}", log=log, fresh=True)
    begun = time.monotonic()
    while not _handler_in(proc.pid) and proc.poll() is None:
        time.sleep(0.002)
    ready = time.monotonic()
    while not run_dir.is_dir() and proc.poll() is None:
        assert time.monotonic() - begun < 300, "the dry run never claimed its directory"
        time.sleep(0.002)
    span = time.monotonic() - ready
    assert proc.wait(timeout=120) == 0 and "dry run:" in log.read_text() and not run_dir.exists()
    return span


def _grid(tmp_path: Path, args: tuple, grid: list, dry: bool) -> list[dict]:
    results, problems = [], []
    span = _check_span(tmp_path)
    for i, (moment, at, sigs) in enumerate(grid):
        delay = at * span if moment == "check" else at
        ignored = (INT,) if i % 2 else ()  # every other point: as `qwen3exp ... &` in a script
        run_dir, log = tmp_path / f"run{i}", tmp_path / f"out{i}.log"
        r = _point(args, run_dir, log, moment, delay, sigs, ignored)
        problem = _check(r, sigs, dry)
        names = "+".join(signal.Signals(s).name for s in sigs)
        r["row"] = (
            f"{moment}+{delay:.2f}s (at {r['at']:.2f}s) {names}{' (SIGINT ignored at start)' if ignored else ''}: "
            f"{r['phase']}, exit {r['code']}"
        )
        results.append(r)
        if problem:
            problems.append(f"{r['row']}: {problem}\n{r['out'][-1500:]}")
    table = "\n".join(r["row"] for r in results)
    print(table)
    assert not problems, "\n\n".join(problems) + "\n\n" + table
    stopped = sum(r["stopped"] for r in results)
    assert stopped >= len(grid) - 2, f"only {stopped} of {len(grid)} points were inside the command:\n{table}"
    return results


@slow
def test_a_signal_at_any_moment_of_a_dry_run_stops_it(tmp_path):
    results = _grid(tmp_path, DRY, DRY_GRID, dry=True)
    phases = {r["phase"] for r in results if r["stopped"]}
    assert {"import", "plan"} <= phases, phases  # ("check" too, unless the load changed a lot since the span)


@slow
def test_a_signal_at_any_moment_of_a_launch_stops_it(tmp_path):
    results = _grid(tmp_path, LAUNCH, LAUNCH_GRID, dry=False)
    phases = {r["phase"] for r in results if r["stopped"]}
    assert {"import", "plan", "start", "first step", "end"} <= phases, phases


def test_nohup_keeps_a_hang_up_ignored():
    """A command started under nohup (SIGHUP ignored) outlives its terminal; SIGINT is taken over an
    inherited SIG_IGN (a script's `qwen3exp ... &`), SIGTERM always."""
    before = {s: signal.getsignal(s) for s in stopping.SIGNALS}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        old = stopping.install()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is stopping.handler is signal.getsignal(signal.SIGTERM)
        stopping.restore(old)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
