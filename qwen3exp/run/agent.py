"""`python -m qwen3exp.run.agent <torchrun arguments>`: torchrun's agent, plus a record of how ranks died.

The launcher starts this instead of `python -m torch.distributed.run`; it runs torchrun's public
`main(args)` unchanged, or, asked for `--start-method fork` (CPU), torchrun's public `elastic_launch`
with the worker's function as the entrypoint (`_launch`): the ranks are forked from this agent.

When the agent gives up on its ranks (`ChildFailedError`), every failure it saw (global and local
rank, pid, exit code, the signal that killed it, when, torchrun's error file, and whether the agent
itself stopped that rank after an earlier failure) is written atomically to `<log
dir>/agent_failures_node<N>.json` before the exception goes on, so the exit code and torchrun's own
report are unchanged. Why: a rank killed by a signal (`kill -9`, the OOM killer, a segfault) writes
nothing itself; without the agent's record the summary could only blame the ranks that failed after
it ("Connection reset by peer").

Every agent also keeps `<log dir>/agent_node<N>.json`: its host and pid, the global ranks it started
(read from its workers' environment, or a forked rank's process name), and, once it ends in any way
Python sees (done, its ranks failed, stopped by a signal, the rendezvous failed), how. An agent that
has a record and no end was killed itself (SIGKILL, its node lost): on several nodes that is how
"node 1's agent was killed" is told apart from the SIGTERM srun's --kill-on-bad-exit then sends to
the other nodes.

Stopped by a signal (SIGTERM from the launcher on Ctrl-C, or from SLURM), the agent stops its
ranks as torchrun does and exits with code 128 + the signal's number, without torchrun's traceback.

SLURM's pre-timeout signal (SIGUSR2, `launcher.signal_delay_s` before the time limit) reaches every
process of the job step, the agents too: the agent would die of it, so it records the request for
the ranks instead (`qwen3exp.run.timelimit`).

The records are `qwen3exp.run.agent_records`; `root_cause(log_dir)` (`qwen3exp.run.diagnosis`) reads
them and the ranks' own error files (`error_rank<R>.json`, written by `qwen3exp.worker.main`) and
names the rank that failed first for a reason of its own.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from qwen3exp.run import timelimit
from qwen3exp.run.agent_records import (
    ClosingSignals,
    Record,
    agent_file,
    failures_file,
    signal_name as signal_name,  # re-exported: the agent's record of a death
    write_failures,
)
from qwen3exp.run.diagnosis import root_cause as root_cause  # re-exported: what the agent's records tell

NODE_ENV = "QWEN3EXP_NODE"
"""This agent's node (as the launcher numbers them), passed on to its ranks."""


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
    argv = argv[:i] + argv[i + 2 :]
    return [
        a.replace("is_host=true", "is_host=false") if k and argv[k - 1] == "--rdzv-conf" else a
        for k, a in enumerate(argv)
    ]


def _record_time_limit(log_dir: Path, node: int) -> None:
    """The one thread that takes SIGUSR2 (blocked everywhere else): record it for the ranks."""
    while True:
        signal.sigwait({signal.SIGUSR2})
        timelimit.request(log_dir, f"agent of node {node}")


def _start_records(
    log_dir: Path | None, node: int, endpoint: str | None, watching: threading.Event
) -> tuple[Path | None, Record | None]:
    """This agent's record and the threads that keep it (its ranks; the pre-timeout signal).
    Returns (the failures file, the record); both None without a log folder."""
    if log_dir is None:
        return None, None
    path = failures_file(log_dir, node)
    path.unlink(missing_ok=True)  # a record of an earlier launch into this run directory
    record = Record(agent_file(log_dir, node), node, endpoint)
    threading.Thread(target=_record_time_limit, args=(log_dir, node), daemon=True).start()
    threading.Thread(target=record.watch_ranks, args=(watching,), daemon=True).start()
    return path, record


def _warmed(module, argv: list[str]) -> bool:
    """Whether `module.warm(argv)` succeeded. When it fails (e.g. the run's experiment file does not
    match its digest), the ranks start as new interpreters instead, and each meets the same error
    where it is recorded and reported as that rank's own (`logs/error_rank<R>.json`)."""
    try:
        module.warm(argv)
    except Exception as e:
        print(f"qwen3exp.run.agent: the ranks start anew ({type(e).__name__}: {e})", file=sys.stderr, flush=True)
        return False
    return True


def _launch(argv: list[str], torchrun_main: Callable[[list[str]], None]) -> None:
    """torchrun's main; or, for a module started with `--start-method fork` that offers `warm` and
    `forked` (the worker, on a platform with `forked_ranks`: CPU), the same launch through torchrun's
    public `elastic_launch` with the module's `forked` function as the entrypoint: this agent runs
    `warm` (the imports every rank would do) once and torchrun forks the ranks from it, instead of a
    new interpreter per rank importing it all again (for `-m`, torchrun ignores --start-method)."""
    from torch.distributed.launcher.api import elastic_launch  # lazy: torch only in the agent
    from torch.distributed.run import config_from_args, parse_args  # lazy: torch only in the agent

    args = parse_args(argv)
    module = importlib.import_module(args.training_script) if args.start_method == "fork" and args.module else None
    if module is None or not hasattr(module, "forked") or not _warmed(module, list(args.training_script_args)):
        torchrun_main(argv)
        return
    config, _python, _argv = config_from_args(args)
    elastic_launch(config, entrypoint=module.forked)(list(args.training_script_args))


def main(argv: list[str] | None = None) -> None:
    # SLURM's pre-timeout signal must kill neither this agent nor a rank that has not set up its
    # handler yet: it is blocked here, before any thread exists, and the ranks inherit the blocked
    # mask (a signal sent to them meanwhile stays pending until qwen3exp.run.timelimit takes it).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    from torch.distributed.elastic.multiprocessing.api import SignalException  # lazy: torch only in the agent
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # lazy: torch only in the agent
    from torch.distributed.elastic.rendezvous.api import RendezvousError  # lazy: torch only in the agent
    from torch.distributed.run import main as torchrun_main, parse_args  # lazy: torch only in the agent

    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    node, started = _node(argv, args), time.time()
    argv = for_this_node(argv, node)
    os.environ[NODE_ENV] = str(node)
    watching = threading.Event()
    path, record = _start_records(Path(args.log_dir) if args.log_dir else None, node, args.rdzv_endpoint, watching)
    closing = ClosingSignals()
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addHandler(closing)
    how, error = "done", None
    try:
        _launch(argv, torchrun_main)
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


if __name__ == "__main__":
    main()
