"""What every torchrun agent records in the run's log folder (`qwen3exp.run.agent` writes them,
`qwen3exp.run.diagnosis` reads them):
- `agent_node<N>.json` (`Record`): its host and pid, the global ranks it started, and how it ended;
- `agent_failures_node<N>.json` (`write_failures`): every rank failure torchrun saw, when the agent
  gave up on its ranks;
- the ranks' own error files (`error_rank<R>.json`, written by `qwen3exp.worker.main`).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from qwen3exp.run import procs, rundir

FAILURES_GLOB = "agent_failures_node*.json"
ERRORS_GLOB = "error_rank*.json"
AGENTS_GLOB = "agent_node*.json"


def failures_file(log_dir: Path, node: int) -> Path:
    return Path(log_dir) / f"agent_failures_node{node}.json"


def agent_file(log_dir: Path, node: int) -> Path:
    return Path(log_dir) / f"agent_node{node}.json"


class Record:
    """`agent_node<N>.json`: written when the agent starts, when its ranks are known, and when it ends."""

    def __init__(self, path: Path, node: int, endpoint: str | None) -> None:
        self.path = path
        self.data: dict = {
            "node": node,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "rdzv_endpoint": endpoint,
            "started": time.time(),
            "ranks": {},
            "ended": None,
            "how": None,
            "error": None,
        }
        self.lock = threading.Lock()
        self.write()

    def write(self, **changes) -> None:
        with self.lock:
            self.data.update(changes)
            try:
                rundir.atomic_write_json(self.path, self.data)
            except OSError as e:  # a diagnosis: never hide torchrun's own error
                print(f"qwen3exp.run.agent: could not write {self.path}: {e}", file=sys.stderr)

    def watch_ranks(self, stop: threading.Event) -> None:
        """Record the global rank and pid of every worker this agent starts (their RANK variable):
        the rank map of a node whose agent is killed with its ranks."""
        me = os.getpid()
        while not stop.wait(0.5):
            found = dict(self.data["ranks"])
            for pid in _children(me):
                rank = _env_of(pid).get("RANK") or _forked_rank(pid)
                if rank is not None and rank.isdigit():
                    found[rank] = pid
            if found != self.data["ranks"]:
                self.write(ranks=found)


def _children(pid: int) -> list[int]:
    out = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            out += [int(p) for p in children.read_text().split()]
        except OSError:
            continue
    return out


def _forked_rank(pid: int) -> str | None:
    """The global rank of a rank forked from this agent (its environment is the agent's; it names
    itself `rank<R>`, `qwen3exp.worker.main.forked`)."""
    name, prefix = procs.process_name(pid), procs.FORKED_RANK_PREFIX
    return name[len(prefix) :] if name is not None and name.startswith(prefix) else None


def _env_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


class ClosingSignals(logging.Handler):
    """The pids torchrun's agent stops itself ("Sending process P closing signal S") once a rank
    has failed: they are recorded as failures too (exit code -15), but as stopped, not as causes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.pids: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if (
            isinstance(record.msg, str)
            and record.msg.startswith("Sending process")
            and "closing signal" in record.msg
            and len(args) >= 2
            and isinstance(args[0], int | str)
        ):
            self.pids.setdefault(int(args[0]), str(args[1]))


def write_failures(path: Path, error, *, node: int, started: float, stopped: dict[int, str]) -> None:
    """`error`: torchrun's ChildFailedError."""
    failures = []
    for global_rank, f in sorted(error.failures.items()):
        failures.append(
            {
                "rank": global_rank,
                "local_rank": f.local_rank,
                "node": node,
                "pid": f.pid,
                "exitcode": f.exitcode,
                "signal": signal_name(f.exitcode),
                "time": f.timestamp,
                "error_file": None if f.error_file == "<N/A>" else f.error_file,
                "stopped_by_agent": f.pid in stopped,
            }
        )
    rundir.atomic_write_json(
        path,
        {
            "node": node,
            "agent_pid": os.getpid(),
            "agent_started": started,
            "written": time.time(),
            "failures": failures,
        },
    )
