"""`python -m qwen3exp.run.agent <torchrun arguments>`: torchrun's agent, plus a record of how ranks died.

The launcher starts this instead of `python -m torch.distributed.run`; it runs torchrun's public
`main(args)` unchanged. When the agent gives up on its ranks (`ChildFailedError`), every failure it
saw (global and local rank, pid, exit code, the signal that killed it, when, torchrun's error file,
and whether the agent itself stopped that rank after an earlier failure) is written atomically to
`<log dir>/agent_failures_node<N>.json` before the exception goes on, so the exit code and
torchrun's own report are unchanged. Why: a rank killed by a signal (`kill -9`, the OOM killer, a
segfault) writes nothing itself; without the agent's record the summary could only blame the ranks
that failed after it ("Connection reset by peer").

Every agent also keeps `<log dir>/agent_node<N>.json`: its host and pid, the global ranks it
started (read from its workers' environment), and, once it ends in any way Python sees (done, its
ranks failed, stopped by a signal, the rendezvous failed), how. An agent that has a record and no
end was killed itself (SIGKILL, its node lost): on several nodes that is how "node 1's agent was
killed" is told apart from the SIGTERM srun's --kill-on-bad-exit then sends to the other nodes.

Stopped by a signal (SIGTERM from the launcher on Ctrl-C, or from SLURM), the agent stops its
ranks as torchrun does and exits with code 128 + the signal's number, without torchrun's traceback.

SLURM's pre-timeout signal (SIGUSR2, `launcher.signal_delay_s` before the time limit) reaches every
process of the job step, the agents too: the agent would die of it, so it records the request for
the ranks instead (`qwen3exp.run.timelimit`).

`root_cause(log_dir)` reads these records and the ranks' own error files (`error_rank<R>.json`,
written by `qwen3exp.worker.main`) and names the rank that failed first for a reason of its own.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from qwen3exp.run import rundir, timelimit

FAILURES_GLOB = "agent_failures_node*.json"
ERRORS_GLOB = "error_rank*.json"
AGENTS_GLOB = "agent_node*.json"
NODE_ENV = "QWEN3EXP_NODE"
"""This agent's node (as the launcher numbers them), passed on to its ranks."""

# Errors a rank gets because a peer vanished or stopped answering: a consequence, never the root
# cause while another rank died on its own (gloo: "Connection reset by peer", "Connection closed by
# peer"; NCCL: remote process exited, watchdog timeouts; the TCPStore: broken pipe, refused).
CONSEQUENCE = re.compile(
    r"connection (reset|closed|refused|lost)|broken pipe|gloo/transport|remote process|watchdog"
    r"|nccl\w* (error|abort|communicator)|tcpstore|socket|timed out|timeout|got 0 bytes"
    r"|\bDist(Network|Store|Backend)Error\b", re.IGNORECASE)


def failures_file(log_dir: Path, node: int) -> Path:
    return Path(log_dir) / f"agent_failures_node{node}.json"


def agent_file(log_dir: Path, node: int) -> Path:
    return Path(log_dir) / f"agent_node{node}.json"


class _Record:
    """`agent_node<N>.json`: written when the agent starts, when its ranks are known, and when it ends."""

    def __init__(self, path: Path, node: int, endpoint: str | None) -> None:
        self.path = path
        self.data: dict = {"node": node, "host": socket.gethostname(), "pid": os.getpid(),
                           "rdzv_endpoint": endpoint, "started": time.time(), "ranks": {}, "ended": None,
                           "how": None, "error": None}
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
                rank = _env_of(pid).get("RANK")
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


def for_this_node(argv: list[str], node: int) -> list[str]:
    """srun starts one command on every node, node 0's (qwen3exp.plan.placement: it hosts the c10d
    store, `is_host=true`, and names the ranks' store by its address, `--local-addr`); on another
    node neither is its own: is_host=false and no --local-addr, like a launcher per node's."""
    if node == 0 or "--local-addr" not in argv:
        return argv
    i = argv.index("--local-addr")
    argv = argv[:i] + argv[i + 2:]
    return [a.replace("is_host=true", "is_host=false") if k and argv[k - 1] == "--rdzv-conf" else a
            for k, a in enumerate(argv)]


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


def _record_time_limit(log_dir: Path, node: int) -> None:
    """The one thread that takes SIGUSR2 (blocked everywhere else): record it for the ranks."""
    while True:
        signal.sigwait({signal.SIGUSR2})
        timelimit.request(log_dir, f"agent of node {node}")


def main(argv: list[str] | None = None) -> None:
    # SLURM's pre-timeout signal must kill neither this agent nor a rank that has not set up its
    # handler yet: it is blocked here, before any thread exists, and the ranks inherit the blocked
    # mask (a signal sent to them meanwhile stays pending until qwen3exp.run.timelimit takes it).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main, parse_args

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    node, started = _node(argv, args), time.time()
    argv = for_this_node(argv, node)
    os.environ[NODE_ENV] = str(node)
    log_dir = Path(args.log_dir) if args.log_dir else None
    path = failures_file(log_dir, node) if log_dir is not None else None
    if path is not None:
        path.unlink(missing_ok=True)  # a record of an earlier launch into this run directory
    record = _Record(agent_file(log_dir, node), node, args.rdzv_endpoint) if log_dir is not None else None
    if log_dir is not None:
        threading.Thread(target=_record_time_limit, args=(log_dir, node), daemon=True).start()
    watching = threading.Event()
    if record is not None:
        threading.Thread(target=record.watch_ranks, args=(watching,), daemon=True).start()
    closing = _ClosingSignals()
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addHandler(closing)
    how, error = "done", None
    try:
        torchrun_main(argv)
    except ChildFailedError as e:
        how = "its ranks failed"
        if path is not None:
            try:
                write_failures(path, e, node=node, started=started, stopped=closing.pids)
            except OSError as write_error:  # the record is a diagnosis: never hide torchrun's own error
                print(f"qwen3exp.run.agent: could not write {path}: {write_error}", file=sys.stderr)
        raise
    except SignalException as e:
        how = f"stopped by {signal.Signals(e.sigval).name}"
        # torchrun has stopped its ranks because it was asked to (the launcher's Ctrl-C or SIGTERM,
        # SLURM's scancel): an expected end, which the launcher reports in one line. torchrun's
        # 30-line traceback of where its monitor loop slept says nothing more; the exit code is the
        # shell's for a signal (128 + its number).
        raise SystemExit(128 + int(e.sigval)) from None
    except RendezvousError as e:
        how, error = "rendezvous failed", f"{type(e).__name__}: {e}" + (f" ({e.__cause__})" if e.__cause__ else "")
        raise
    except BaseException as e:
        how, error = "agent error", f"{type(e).__name__}: {e}"
        raise
    finally:
        watching.set()
        if record is not None:
            record.write(ended=time.time(), how=how, error=error)


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


def _agents(log_dir: Path, since: float) -> list[dict]:
    """The agents' own records of this launch (started after `since`)."""
    records = (rundir.read_json(p) for p in sorted(log_dir.glob(AGENTS_GLOB)))
    return [r for r in records if isinstance(r, dict) and "node" in r and r.get("started", 0) >= since]


def _killed_agent(agents: list[dict], errors: list[dict]) -> str | None:
    """An agent with a record and no end was killed (its node lost): the root cause, named by node,
    host and the ranks that died with it; then what failed next (a rank's error, or another node's
    agent that srun --kill-on-bad-exit stopped)."""
    dead = [a for a in agents if not a.get("ended")]
    if not dead:
        return None
    a = dead[0]
    ranks = sorted(a.get("ranks", {}).items(), key=lambda kv: int(kv[0]))
    with_ranks = (f", and with it rank {', '.join(f'{r} (pid {pid})' for r, pid in ranks)}" if ranks else "")
    text = f"node {a['node']} ({a.get('host')}): its torchrun agent (pid {a.get('pid')}) was killed{with_ranks}"
    theirs = {int(r) for r, _ in ranks}
    after = [e for e in sorted(errors, key=lambda e: e.get("time", 0)) if e["rank"] not in theirs]
    stopped = [o for o in agents if o is not a and o.get("how", "").startswith("stopped by")]
    if after:
        text += f"; rank {after[0]['rank']} then failed: {_error_text(after[0], first_line=True)}"
    elif stopped:
        text += f"; node {stopped[0]['node']}'s agent was then {stopped[0]['how']}"
    return text


def _rendezvous_failure(agents: list[dict], rdzv_timeout_s: float | None) -> str | None:
    failed = [a for a in agents if a.get("how") == "rendezvous failed"]
    if not failed:
        return None
    a = failed[0]
    within = f" within launcher.rdzv_timeout_s={rdzv_timeout_s:g} s" if rdzv_timeout_s else ""
    return (f"node {a['node']} ({a.get('host')}): the c10d rendezvous at {a.get('rdzv_endpoint')} did not complete"
            f"{within} (endpoint unreachable, or not every node joined): {a.get('error')}")


def root_cause(log_dir: Path, *, since: float = 0.0, rdzv_timeout_s: float | None = None) -> str | None:
    """What made the run fail, from the agents' records and the ranks' error files in `log_dir`;
    None when there is neither. Order: a node whose agent was killed (with its ranks); a rank that
    died without a word (killed by a signal, or exited non-zero without an error file), earliest
    first; an agent whose rendezvous failed; else the earliest error that is not a communication
    error; else the earliest error. The text names the node or rank and how it died, then what
    failed after it. `since`: agent records older than this (an earlier launch's) are ignored."""
    log_dir = Path(log_dir)
    records = [r for r in (rundir.read_json(p) for p in sorted(log_dir.glob(FAILURES_GLOB))) if isinstance(r, dict)]
    agents = _agents(log_dir, since)
    started = min((r.get("agent_started", r.get("started", 0)) for r in [*records, *agents]), default=0)
    errors = [e for e in (rundir.read_json(p) for p in log_dir.glob(ERRORS_GLOB))
              if isinstance(e, dict) and "rank" in e and e.get("time", 0) >= started - 1]
    by_rank = {e["rank"]: e for e in errors}
    failures = [f for r in records for f in r.get("failures", []) if isinstance(f, dict) and "rank" in f]
    silent = sorted((f for f in failures if not f.get("stopped_by_agent")
                     and (f.get("signal") or f["rank"] not in by_rank)),
                    key=lambda f: (f.get("time", 0), f["rank"]))
    ordered = sorted(errors, key=lambda e: (is_consequence(e), e.get("time", 0), e["rank"]))
    if (killed := _killed_agent(agents, errors)) is not None:
        return killed
    if not silent and not [e for e in errors if not is_consequence(e)] \
            and (rendezvous := _rendezvous_failure(agents, rdzv_timeout_s)) is not None:
        return rendezvous
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
