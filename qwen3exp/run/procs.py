"""Process supervision (Linux): no rank outlives its launcher, whatever kills whom.

torchrun starts every rank in a session of its own, so signals sent to torchrun's process group do
not reach the ranks, and ranks whose torchrun died are re-parented away from the launcher. Three
kernel features close these gaps:
- `become_subreaper()` (PR_SET_CHILD_SUBREAPER): orphaned descendants are re-parented to the
  launcher instead of init, so `descendants()` still finds them and the launcher can kill them.
- `die_with_parent(sig)` (PR_SET_PDEATHSIG): the kernel signals this process when its parent dies,
  even when the parent was SIGKILLed and had no chance to clean up. torchrun gets SIGTERM when the
  launcher dies (it then stops its ranks), each rank gets SIGKILL when torchrun dies.
- /proc: `descendants(pid)` walks the parent links; `workers_of(run_dir)` finds the
  ranks of one run directory.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Set as AbstractSet
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_NAME = 15
FORKED_AGENT_NAME = "qwen3exp-agent"
"""The name (/proc/PID/comm) of an agent forked from its launcher (`qwen3exp.run.forked_agent`)."""
FORKED_RANK_PREFIX = "rank"
"""The name of a rank forked from its agent: this and its global rank, `rank0`, `rank1`, ...
(`qwen3exp.worker.main.forked`)."""


def _prctl(option: int, arg: int | bytes) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, arg, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False  # not Linux: best effort only


def become_subreaper() -> bool:
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def name_this_process(name: str) -> None:
    """This process's name (/proc/PID/comm, at most 15 bytes): how a rank forked from its agent,
    whose command line is the agent's, is told apart (`qwen3exp.run.agent_records`)."""
    _prctl(_PR_SET_NAME, name.encode()[:15])


def process_name(pid: int) -> str | None:
    """/proc/PID/comm (`name_this_process`); None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return None


def die_with_parent(sig: int, parent: int | None = None) -> None:
    """Ask the kernel for `sig` when the parent dies. `parent`: the expected parent pid; if it is
    already gone (the race between fork and prctl), signal ourselves now."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), sig)


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1]) if fields[0] != "Z" else None


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def descendants(pid: int) -> list[int]:
    """Every live (non-zombie) process below `pid`."""
    children: dict[int, list[int]] = {}
    for p in _pids():
        parent = _ppid(p)
        if parent is not None:
            children.setdefault(parent, []).append(p)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def workers_of(
    run_dir: Path, module: str = "qwen3exp.worker.main", exclude: AbstractSet[int] = frozenset()
) -> list[int]:
    """Live `python -m qwen3exp.worker.main RUN_DIR` processes of exactly this run directory: the argument
    after the module, resolved against the process's own working directory, must be `run_dir`
    (a run in runs/exp10 is not a run in runs/exp1). A forked agent and its forked ranks, whose
    command line is their launcher's, are those that hold `run_dir` itself open."""
    target = Path(run_dir).resolve()
    found = []
    for p in _pids():
        if p in exclude or _ppid(p) is None:
            continue
        if _forked_holder(p, target):
            found.append(p)
            continue
        argv = _argv(p)
        if module not in argv or argv.index(module) + 1 >= len(argv):
            continue
        arg = Path(argv[argv.index(module) + 1])
        try:
            where = arg if arg.is_absolute() else Path(os.readlink(f"/proc/{p}/cwd")) / arg
            if where.resolve() == target:
                found.append(p)
        except OSError:
            continue
    return found


def _forked_holder(pid: int, target: Path) -> bool:
    """A forked agent (`FORKED_AGENT_NAME`) or rank (`FORKED_RANK_PREFIX`) that holds `target` open."""
    name = process_name(pid)
    if name is None or (name != FORKED_AGENT_NAME and not name.startswith(FORKED_RANK_PREFIX)):
        return False
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}") == str(target) for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def _argv(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def signal_all(pids: list[int], sig: int) -> None:
    for p in pids:
        try:
            os.kill(p, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pid: int, *, exclude: AbstractSet[int] = frozenset()) -> list[int]:
    """SIGKILL every descendant of `pid` (not `pid` itself, not `exclude`); returns the pids
    killed. Those that had become our children (orphans re-parented to a subreaper) are reaped."""
    killed: list[int] = []
    for _ in range(3):  # a dying process may still fork; a few rounds catch stragglers
        left = [p for p in descendants(pid) if p not in killed and p not in exclude]
        if not left:
            break
        signal_all(left, signal.SIGKILL)
        killed += left
    for p in killed:
        try:
            os.waitpid(p, 0)
        except ChildProcessError:
            pass  # not our child: its own parent reaps it
    return killed
