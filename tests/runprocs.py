"""Helpers for the process-level tests: start the real command line in the background, wait for a
condition, and list the processes that belong to a run (by scanning /proc independently of
qwen3exp's own supervision code)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import cli_fork
from conftest import REPO, cli_env

# A few steps of the tiny model on 2 CPU ranks; one intra-op thread per rank everywhere, so that
# runs with different rank layouts compute in the same order. (conftest.py's `reference_losses`
# trains exactly these settings once per session.)
TINY = (
    "platform=cpu",
    "platform.threads_per_rank=1",
    "training.steps=6",
    "training.warmup_steps=1",
    "training.seq_len=64",
    "training.local_batch_size=2",
    "metrics.tensorboard=false",
)


def env_with(**extra: str) -> dict:
    return cli_env(extra)


def start_cli(
    *args: str,
    log: Path,
    err: Path | None = None,
    cwd: Path = REPO,
    fresh: bool = False,
    ignored: tuple[int, ...] = (),
    **env: str,
) -> subprocess.Popen | cli_fork.Started:
    """`python -m qwen3exp ARGS` in the background in `cwd`, stdout to `log` and stderr to `err` (or
    `log` too): forked from a process that has imported it (tests/cli_fork.py) unless `fresh` (a new
    interpreter). `ignored`: signals the new interpreter starts with ignored (SIGINT: as a script's
    `qwen3exp ... &` starts it; SIGHUP: nohup)."""
    if (
        not fresh
        and not ignored
        and (started := cli_fork.start(list(args), cwd, env_with(**env), cli_env(), log, err)) is not None
    ):
        return started

    def ignore() -> None:
        # As at a terminal, whatever this process inherited (pytest under nohup or in a script's
        # background ignores SIGHUP or SIGINT, and a child would keep that): only `ignored` ignored.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN if sig in ignored else signal.SIG_DFL)

    with log.open("w") as out, (err or Path(os.devnull)).open("w") as errors:
        return subprocess.Popen(
            [sys.executable, "-m", "qwen3exp", *args],
            cwd=cwd,
            env=env_with(**env),
            stdout=out,
            stderr=subprocess.STDOUT if err is None else errors,
            preexec_fn=ignore,
        )


def wait_for(
    condition, *, proc: subprocess.Popen | cli_fork.Started | None = None, timeout: float = 300, what: str = ""
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the launcher exited ({proc.returncode}) while waiting for {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def metric_rows(run_dir: Path) -> int:
    """Training rows of metrics.jsonl written so far (validation rows have no "loss" key)."""
    try:
        return sum(
            1
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()
            if line.endswith("}") and '"loss":' in line
        )
    except OSError:
        return 0


def run_processes(run_dir: Path) -> list[str]:
    """'pid: command line' of every live process whose command line names the run directory or
    that holds it (or a file in it) open: a process forked from the tests' fork server keeps the
    server's command line (tests/cli_fork.py)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and (str(run_dir) in cmd or _holds(int(pid), run_dir)):
            out.append(f"{pid}: {cmd[:200]}")
    return out


def _holds(pid: int, run_dir: Path) -> bool:
    """Whether process `pid` has the run directory, or anything under it, open."""
    inside = str(run_dir) + os.sep
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target == str(run_dir) or target.startswith(inside):
            return True
    return False


def assert_no_survivors(run_dir: Path, grace: float = 5.0) -> None:
    """No process of the run may be left (a little grace for the kernel to deliver SIGKILLs)."""
    deadline = time.monotonic() + grace
    while (left := run_processes(run_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, "processes of the run survived:\n" + "\n".join(left)


def kill_leftovers(run_dir: Path) -> None:
    """Test cleanup only: never leave a broken run's processes on the machine."""
    for line in run_processes(run_dir):
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Background:
    """`python -m qwen3exp ARGS` started now and collected later: a module fixture starts a
    training that a later test checks, so that it runs beside the tests in between (a 1-rank
    training leaves the second core of a 2-core machine idle). stdout and stderr go to files in
    `folder` (a pipe nobody reads would stall a chatty launcher). Forked like `start_cli` unless
    `fresh`."""

    def __init__(self, *args: str, folder: Path, cwd: Path = REPO, fresh: bool = False, **env: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.stdout, self.stderr = folder / "stdout.log", folder / "stderr.log"
        self.proc = start_cli(*args, log=self.stdout, err=self.stderr, cwd=cwd, fresh=fresh, **env)

    def result(self, timeout: float = 600) -> subprocess.CompletedProcess:
        """Wait for it (as `conftest.run_cli` would have): exit code, stdout, stderr."""
        self.proc.wait(timeout=timeout)
        return subprocess.CompletedProcess(
            self.proc.args, self.proc.returncode, self.stdout.read_text(), self.stderr.read_text()
        )

    def stop(self, *run_dirs: Path) -> None:
        """Fixture teardown: end it if it still runs (a test failed or was not selected), and any
        process left of its runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for run_dir in run_dirs:
            kill_leftovers(run_dir)


def launch_seconds(run_dir: Path) -> float:
    """From the last launch's first line in qwen3exp.log (the one naming the run directory) to its
    last line (the outcome)."""
    lines = [line for line in (run_dir / "qwen3exp.log").read_text().splitlines() if line.startswith("[")]
    first = max(i for i, line in enumerate(lines) if f"; run directory {run_dir}" in line)
    stamps = [datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f") for line in (lines[first], lines[-1])]
    return (stamps[1] - stamps[0]).total_seconds()
