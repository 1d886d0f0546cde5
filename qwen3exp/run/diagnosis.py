"""Why a run failed, from the agents' records and the ranks' own error files (`root_cause`): the
node or rank that failed first for a reason of its own, not the ranks that failed because of it."""

from __future__ import annotations

import re
from pathlib import Path

from qwen3exp.run import rundir
from qwen3exp.run.agent_records import AGENTS_GLOB, ERRORS_GLOB, FAILURES_GLOB

# Errors a rank gets because a peer vanished or stopped answering: a consequence, never the root
# cause while another rank died on its own (gloo: "Connection reset by peer", "Connection closed by
# peer"; NCCL: remote process exited, watchdog timeouts; the TCPStore: broken pipe, refused).
CONSEQUENCE = re.compile(
    r"connection (reset|closed|refused|lost)|broken pipe|gloo/transport|remote process|watchdog"
    r"|nccl\w* (error|abort|communicator)|tcpstore|socket|timed out|timeout|got 0 bytes"
    r"|\bDist(Network|Store|Backend)Error\b",
    re.IGNORECASE,
)


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
    with_ranks = f", and with it rank {', '.join(f'{r} (pid {pid})' for r, pid in ranks)}" if ranks else ""
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
    return (
        f"node {a['node']} ({a.get('host')}): the c10d rendezvous at {a.get('rdzv_endpoint')} did not complete"
        f"{within} (endpoint unreachable, or not every node joined): {a.get('error')}"
    )


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
    errors = [
        e
        for e in (rundir.read_json(p) for p in log_dir.glob(ERRORS_GLOB))
        if isinstance(e, dict) and "rank" in e and e.get("time", 0) >= started - 1
    ]
    by_rank = {e["rank"]: e for e in errors}
    failures = [f for r in records for f in r.get("failures", []) if isinstance(f, dict) and "rank" in f]
    silent = sorted(
        (f for f in failures if not f.get("stopped_by_agent") and (f.get("signal") or f["rank"] not in by_rank)),
        key=lambda f: (f.get("time", 0), f["rank"]),
    )
    ordered = sorted(errors, key=lambda e: (is_consequence(e), e.get("time", 0), e["rank"]))
    if (killed := _killed_agent(agents, errors)) is not None:
        return killed
    if (
        not silent
        and not [e for e in errors if not is_consequence(e)]
        and (rendezvous := _rendezvous_failure(agents, rdzv_timeout_s)) is not None
    ):
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
