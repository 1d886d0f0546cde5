"""The torchrun agent as a fork of the launcher (a platform whose ranks fork from their agent: CPU).

The agent's command (`python -m qwen3exp.run.agent ARGS`, command.txt) is run by a fork of the
launcher instead of a new interpreter: the child starts as that command would, with the launcher's
own state undone (`_fresh`), then runs `qwen3exp.run.agent.main(ARGS)` and exits with its code. What
it saves is the interpreter's start; and where the launcher has already imported torch and
torchtitan (a process that forks launchers, as the test suite's does: tests/cli_fork.py), the agent
and the ranks it forks import nothing at all.

The agent is a child of the launcher as a started one is: a session of its own, SIGTERM when the
launcher dies, its stdout and stderr on the launcher's pipe. Its command line is the launcher's:
it names itself `procs.FORKED_AGENT_NAME` (/proc/PID/comm) and holds the run directory open, as its forked ranks
do, so that `procs.workers_of` finds them all (a relaunch waits for them).
"""

from __future__ import annotations

import io
import logging
import os
import select
import signal
import subprocess
import sys
import time
import traceback

from qwen3exp.run import agent, procs

AGENT_MODULE = "qwen3exp.run.agent"


def forkable(argv: list[str]) -> bool:
    """Whether `argv` is this interpreter running the agent (not srun, not another Python)."""
    return argv[:3] == [sys.executable, "-m", AGENT_MODULE]


class Forked:
    """The forked agent, as much of `subprocess.Popen` as the launcher uses: pid, stdout (the pipe's
    read end, binary), poll(), wait(timeout), returncode (negative: the signal that killed it)."""

    def __init__(self, pid: int, stdout: io.BufferedReader | None) -> None:
        self.pid, self.stdout = pid, stdout
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):
            self._pidfd = None  # an older kernel: wait() polls

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (procs.kill_tree): as subprocess says then
                pid, status = self.pid, 0
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
                if self._pidfd is not None:
                    os.close(self._pidfd)
                    self._pidfd = None
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired([AGENT_MODULE], timeout or 0)
            if self._pidfd is not None:
                select.select([self._pidfd], [], [], left)
            else:
                time.sleep(min(0.01, left) if left is not None else 0.01)
        return code


def start(argv: list[str], env: dict[str, str], *, pipe: bool, parent: int) -> Forked:
    """Fork the agent of `argv` (`forkable`) with exactly `env`; `pipe`: its stdout and stderr go
    to a pipe (`Forked.stdout`), else they are the launcher's."""
    read_fd, write_fd = os.pipe() if pipe else (None, None)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _run_agent(argv, env, write_fd, parent)  # never returns
    if write_fd is not None:
        os.close(write_fd)
    return Forked(pid, os.fdopen(read_fd, "rb") if read_fd is not None else None)


def _run_agent(argv: list[str], env: dict[str, str], write_fd: int | None, parent: int) -> None:
    code = 1
    try:
        os.setsid()
        procs.die_with_parent(signal.SIGTERM, parent)
        procs.name_this_process(procs.FORKED_AGENT_NAME)
        _fresh(env, write_fd)
        # Held open for as long as the agent and its forked ranks live (`procs.workers_of`).
        os.open(argv[-1], os.O_RDONLY | os.O_DIRECTORY)
        sys.argv = [agent.__file__, *argv[3:]]
        agent.main(argv[3:])
        code = 0
    except SystemExit as e:
        code = _exit_code(e.code)
    except KeyboardInterrupt:  # as an interpreter ends on an unhandled Ctrl-C: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _exit_code(code: object) -> int:
    """As the interpreter turns SystemExit's code into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _fresh(env: dict[str, str], write_fd: int | None) -> None:
    """Undo what the launcher set that a new interpreter would not have: its descriptors (all but
    stdin, stdout and stderr, as a started agent gets them) now point at /dev/null, so no lock or
    pipe of the launcher's is held and no stale object writes into a descriptor opened later; its
    signal handlers; buffered stdio (PYTHONUNBUFFERED=1 makes it unbuffered); its logging handlers
    and levels; its environment."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in _open_fds():
        if fd > 2 and fd not in (null, write_fd):
            os.dup2(null, fd, inheritable=False)
    if write_fd is not None:
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.dup2(null, write_fd, inheritable=False)
    for sig in signal.valid_signals():
        try:
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
        except (OSError, ValueError):
            continue
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(
        open(2, "wb", buffering=0, closefd=False), write_through=True, errors="backslashreplace"
    )
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.WARNING)
    for logger in logging.Logger.manager.loggerDict.values():
        if isinstance(logger, logging.Logger) and logger.name.split(".")[0] in ("qwen3exp", "hydra"):
            logger.handlers.clear()
            logger.setLevel(logging.NOTSET)
            logger.propagate = True
    os.environ.clear()
    os.environ.update(env)


def _open_fds() -> list[int]:
    """This process's open descriptors (not the one that listed them)."""
    listed = [int(fd) for fd in os.listdir("/proc/self/fd") if fd.isdigit()]
    return [fd for fd in listed if _is_open(fd)]


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
