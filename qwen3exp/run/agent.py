"""`python -m qwen3exp.run.agent <torchrun arguments>`: torchrun's agent, plus a record of how ranks died.

The launcher starts this instead of `python -m torch.distributed.run`; it runs torchrun's public
`main(args)` unchanged. When the agent gives up on its ranks (`ChildFailedError`), every failure it
saw (global and local rank, pid, exit code, the signal that killed it, when, torchrun's error file,
and whether the agent itself stopped that rank after an earlier failure) is written atomically to
`<log dir>/agent_failures_node<N>.json` before the exception goes on, so the exit code and
torchrun's own report are unchanged. Why: a rank killed by a signal (`kill -9`, the OOM killer, a
segfault) writes nothing itself; without the agent's record the summary could only blame the ranks
that failed after it ("Connection reset by peer").

`root_cause(log_dir)` reads these records and the ranks' own error files (`error_rank<R>.json`,
written by `qwen3exp.worker.main`) and names the rank that failed first for a reason of its own.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import time
from pathlib import Path

from qwen3exp.run import rundir

FAILURES_GLOB = "agent_failures_node*.json"
ERRORS_GLOB = "error_rank*.json"

# Errors a rank gets because a peer vanished or stopped answering: a consequence, never the root
# cause while another rank died on its own (gloo: "Connection reset by peer", "Connection closed by
# peer"; NCCL: remote process exited, watchdog timeouts; the TCPStore: broken pipe, refused).
CONSEQUENCE = re.compile(
    r"connection (reset|closed|refused|lost)|broken pipe|gloo/transport|remote process|watchdog"
    r"|nccl\w* (error|abort|communicator)|tcpstore|socket|timed out|timeout|got 0 bytes"
    r"|\bDist(Network|Store|Backend)Error\b", re.IGNORECASE)


def failures_file(log_dir: Path, node: int) -> Path:
    return Path(log_dir) / f"agent_failures_node{node}.json"


def signal_name(exitcode: int) -> str | None:
    if exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return f"signal {-exitcode}"


class _ClosingSignals(logging.Handler):
    """The pids torchrun's agent stops itself ("Sending process P closing signal S") once a rank
    has failed: they are recorded as failures too (exit code -15), but as stopped, not as causes."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.pids: dict[int, str] = {}

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if isinstance(record.msg, str) and record.msg.startswith("Sending process") \
                and "closing signal" in record.msg and len(args) >= 2 and isinstance(args[0], int | str):
            self.pids.setdefault(int(args[0]), str(args[1]))


def _node(argv: list[str], args) -> int:
    """This agent's node, as the launcher numbers nodes: --node-rank when the launcher passed one
    (several agents started by launchers), SLURM_NODEID when srun started the agents, else 0."""
    explicit = any(a.split("=")[0] in ("--node-rank", "--node_rank") for a in argv) or "PET_NODE_RANK" in os.environ
    if not explicit and "SLURM_NODEID" in os.environ:
        return int(os.environ["SLURM_NODEID"])
    return int(args.node_rank or 0)


def write_failures(path: Path, error, *, node: int, started: float, stopped: dict[int, str]) -> None:
    """`error`: torchrun's ChildFailedError."""
    failures = []
    for global_rank, f in sorted(error.failures.items()):
        failures.append({
            "rank": global_rank,
            "local_rank": f.local_rank,
            "node": node,
            "pid": f.pid,
            "exitcode": f.exitcode,
            "signal": signal_name(f.exitcode),
            "time": f.timestamp,
            "error_file": None if f.error_file == "<N/A>" else f.error_file,
            "stopped_by_agent": f.pid in stopped,
        })
    rundir.atomic_write_json(path, {"node": node, "agent_pid": os.getpid(), "agent_started": started,
                                    "written": time.time(), "failures": failures})


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main, parse_args

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    node, started = _node(argv, args), time.time()
    path = failures_file(Path(args.log_dir), node) if args.log_dir else None
    if path is not None:
        path.unlink(missing_ok=True)  # a record of an earlier launch into this run directory
    closing = _ClosingSignals()
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addHandler(closing)
    try:
        torchrun_main(argv)
    except ChildFailedError as e:
        if path is not None:
            try:
                write_failures(path, e, node=node, started=started, stopped=closing.pids)
            except OSError as write_error:  # the record is a diagnosis: never hide torchrun's own error
                print(f"qwen3exp.run.agent: could not write {path}: {write_error}", file=sys.stderr)
        raise


# ------------------------------------------------------------------ reading: the root cause
def _how(f: dict) -> str:
    if f.get("signal"):
        return f"was killed by {f['signal']}"
    return f"exited with code {f['exitcode']} and left no error report"


def _where(f: dict) -> str:
    return f"rank {f['rank']} (node {f['node']}, pid {f['pid']})"


def _error_text(e: dict, *, first_line: bool = False) -> str:
    message = str(e.get("message", ""))
    if first_line:
        lines = message.strip().splitlines()
        message = lines[0][:300] if lines else ""
    return f"{e.get('type', 'Error')}: {message}"


def is_consequence(error: dict) -> bool:
    """True for a rank's error that a vanished or silent peer explains (communication errors)."""
    return bool(CONSEQUENCE.search(f"{error.get('type', '')}: {error.get('message', '')}"))


def root_cause(log_dir: Path) -> str | None:
    """What made the run fail, from the agents' records and the ranks' error files in `log_dir`;
    None when there is neither. Order: a rank that died without a word (killed by a signal, or
    exited non-zero without an error file), earliest first, is the root cause; else the earliest
    error that is not a communication error; else the earliest error. The text names the rank and
    how it died, then the first rank that failed after it."""
    log_dir = Path(log_dir)
    records = [r for r in (rundir.read_json(p) for p in sorted(log_dir.glob(FAILURES_GLOB))) if isinstance(r, dict)]
    started = min((r.get("agent_started", 0) for r in records), default=0)
    errors = [e for e in (rundir.read_json(p) for p in log_dir.glob(ERRORS_GLOB))
              if isinstance(e, dict) and "rank" in e and e.get("time", 0) >= started - 1]
    by_rank = {e["rank"]: e for e in errors}
    failures = [f for r in records for f in r.get("failures", []) if isinstance(f, dict) and "rank" in f]
    silent = sorted((f for f in failures if not f.get("stopped_by_agent")
                     and (f.get("signal") or f["rank"] not in by_rank)),
                    key=lambda f: (f.get("time", 0), f["rank"]))
    ordered = sorted(errors, key=lambda e: (is_consequence(e), e.get("time", 0), e["rank"]))
    if silent:
        first = silent[0]
        text = f"{_where(first)} {_how(first)}"
        after = [e for e in sorted(errors, key=lambda e: e.get("time", 0)) if e["rank"] != first["rank"]]
        if after:
            text += f"; rank {after[0]['rank']} then failed: {_error_text(after[0], first_line=True)}"
        return text
    if ordered:
        first = ordered[0]
        return f"rank {first['rank']}: {_error_text(first)}"
    return None


if __name__ == "__main__":
    main()
