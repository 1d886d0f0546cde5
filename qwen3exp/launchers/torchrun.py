"""One node's torchrun (or srun starting every node's agent), supervised: its environment, the
signals that stop it, its output, and no process left behind.

- Ctrl-C or SIGTERM: torchrun is asked to stop its ranks (SIGTERM, which ends a rank even while it
  waits in a collective); after `launcher.stop_timeout_s` everything left is killed. Before
  torchrun runs, the signal abandons the launch (`Interrupted`).
- A rank torchtitan refused (its refusal file appears): torchrun and its ranks are killed at once.
- No orphans: the launcher is a child subreaper, torchrun dies with the launcher (even a SIGKILLed
  one) and every rank dies with torchrun (`qwen3exp.run.procs`); whatever is left is killed at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from qwen3exp.platforms import PlatformFacts
from qwen3exp.run import forked_agent, procs, stopping, timelimit


def rank_env(facts: PlatformFacts, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(facts.env)
    # Folders the platform keeps inside the run directory (e.g. the Neuron compile cache).
    env.update({k: str(run_dir / v) for k, v in facts.run_dir_env.items()})
    # Nothing is downloaded at run time: tokenizer, data and weights are local.
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Interrupted(BaseException):
    """Ctrl-C / SIGTERM before torchrun was started: the launch is abandoned. A BaseException, as
    KeyboardInterrupt is: library code's `except Exception` (logging's handlers print a traceback and
    go on) must neither swallow it nor turn it into an error of its own."""


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP for the whole launch (in a SLURM job this also replaces submitit's
    handler, which ignores SIGTERM). Before torchrun runs, a signal abandons the launch at once;
    while it runs, the first signal is remembered and torchrun is asked to stop its ranks."""

    def __init__(self, logs: Path | None = None) -> None:
        self.signum: int | None = None
        self.at: float | None = None
        self.proc: subprocess.Popen | forked_agent.Forked | None = None
        self.logs = logs

    def __enter__(self) -> StopSignals:
        self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN:  # (nohup: ignored, as asked)
            self._old[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._handle)
        if (pending := stopping.take_pending()) is not None:  # came while the job was being set up
            self.signum, self.at = _as_stop(pending), time.monotonic()
        # SLURM's pre-timeout signal, should it reach the launcher: a request for the ranks
        # (qwen3exp.run.timelimit); submitit's own handler runs after the launch, if at all.
        self._old[signal.SIGUSR2] = signal.signal(signal.SIGUSR2, self._time_limit)
        return self

    def _time_limit(self, _signum, _frame) -> None:
        if self.logs is not None:
            timelimit.request(self.logs, "launcher")

    def __exit__(self, *exc) -> None:
        for s, h in self._old.items():
            signal.signal(s, h)

    def _handle(self, signum, _frame) -> None:
        first = self.signum is None
        if first:
            self.signum, self.at = _as_stop(signum), time.monotonic()
        if self.proc is None:
            if first:  # a second one must not cut short what the first's unwinding does
                raise Interrupted(self.signum)
            return
        self.stop_torchrun()

    def stop_torchrun(self) -> None:
        # SIGTERM, also for Ctrl-C: torchrun passes it on, and a rank ends on SIGTERM even while it
        # waits in a collective (SIGINT would become a KeyboardInterrupt that waits for the collective).
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _as_stop(signum: int) -> int:
    """A hang-up (the terminal went away) stops a run as SIGTERM does."""
    return signal.SIGTERM if signum == signal.SIGHUP else signum


def run_torchrun(
    argv: list[str],
    env: dict,
    stop_timeout_s: float,
    stop: StopSignals,
    refusal: Path | None = None,
    deadline: float | None = None,
    on_line: Callable[[str], None] | None = None,
    on_tick: Callable[[], None] | None = None,
    fork: bool = False,
) -> int:
    """Start torchrun (or srun) in its own session and supervise it until it and every process it
    started are gone; returns its exit code. `refusal`: the file a rank writes when torchtitan
    refuses the configuration; once it exists torchrun and its ranks are killed at once (no rank
    has trained: they all build the same config before the trainer, and a rank that got past it
    only waits for the others; `launcher.max_restarts` must not restart a configuration error, and
    torchrun's own failure report would bury the message). `on_line`: called (from a reader thread)
    with each line torchrun prints (rank 0's output, teed), instead of passing it to the terminal;
    `on_tick`: called every 0.1 s while torchrun runs. `fork`: the agent is a fork of this process
    (`qwen3exp.run.forked_agent`, when `argv` is this interpreter's agent), not a new interpreter."""
    procs.become_subreaper()
    me = os.getpid()
    # Processes that were already ours before this run (e.g. of a test harness) are not touched.
    before = set(procs.descendants(me))
    if stop.signum is not None:  # a signal some library code swallowed during the preparation
        raise Interrupted(stop.signum)
    reader = None
    try:
        if fork and forked_agent.forkable(argv):
            stop.proc = forked_agent.start(argv, env, pipe=on_line is not None, parent=me)
        else:
            pipe = subprocess.PIPE if on_line is not None else None
            stop.proc = subprocess.Popen(
                argv,
                env=env,
                start_new_session=True,
                stdout=pipe,
                stderr=subprocess.STDOUT if pipe else None,
                preexec_fn=lambda: procs.die_with_parent(signal.SIGTERM, me),
            )
        if on_line is not None:
            reader = threading.Thread(
                target=_read_lines, args=(stop.proc.stdout, on_line), daemon=True, name="qwen3exp-torchrun-output"
            )
            reader.start()
        if stop.signum is not None:  # it came while torchrun was being started
            stop.stop_torchrun()
        return _wait(stop, stop_timeout_s, refusal, deadline, on_tick, spare=before)
    finally:
        # No orphans: ranks torchrun left behind (re-parented to us) and anything else it started.
        procs.kill_tree(me, exclude=before)
        if stop.proc is not None:
            _kill_group(stop.proc.pid)
        if reader is not None:  # the last lines torchrun printed come before the launcher's outcome
            reader.join(timeout=5)


def _wait(
    stop: StopSignals,
    stop_timeout_s: float,
    refusal: Path | None,
    deadline: float | None,
    on_tick: Callable[[], None] | None,
    *,
    spare: set[int],
) -> int:
    """Wait for the running torchrun (`stop.proc`) to end; returns its exit code. Meanwhile: the
    ranks are asked to checkpoint and stop at the time-limit `deadline`, torchrun and its ranks are
    killed at once when a rank's `refusal` appears, and `stop_timeout_s` after a stop signal.
    `spare`: the processes that were ours before torchrun started (never killed)."""
    me = os.getpid()
    proc = stop.proc
    assert proc is not None, "torchrun has started"
    while True:
        if on_tick is not None:
            on_tick()
        try:
            return proc.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.time() >= deadline and stop.logs is not None:
                timelimit.request(stop.logs, "launcher (the job's time limit is near)")
                deadline = None
            if refusal is not None and stop.signum is None and refusal.exists():
                _kill_group(proc.pid)
                procs.kill_tree(me, exclude=spare | {proc.pid})
            elif stop.at is not None and time.monotonic() - stop.at > stop_timeout_s:
                procs.kill_tree(me, exclude=spare | {proc.pid})
                _kill_group(proc.pid)


def _read_lines(stream, on_line: Callable[[str], None]) -> None:
    for raw in iter(stream.readline, b""):
        try:
            on_line(raw.decode("utf-8", errors="replace"))
        except Exception as e:  # the console must never stop the launch
            print(f"qwen3exp: could not show a rank's line: {type(e).__name__}: {e}", flush=True)
    stream.close()


def _kill_group(pgid: int) -> None:
    """No orphans: whatever is left of the process group is killed."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
