"""The process `tests/cli_fork.py` forks each `python -m qwen3exp` of the tests from (a fork server).

It imports what `python -m qwen3exp` imports before it reads its arguments (`qwen3exp.entry`,
`qwen3exp.cli`: Hydra, pydantic, the schema; about 1 s on this machine) once, and what a CPU run's
agent does before it forks the ranks (prepare the CPU platform, import torchtitan's trainer: about
10 s): a CPU launch forks its agent from the launcher (`qwen3exp.run.forked_agent`), so no training
started from here imports torchtitan again. Then, for each request
(a JSON line on stdin: args, cwd, env, the child's stdout/stderr files and its result file), it
forks; the child becomes that fresh `python -m qwen3exp` (below the loop) and the server answers
the child's pid on stdout. A child that ended is reaped here and its exit code (negative: the
signal that killed it, as `subprocess` reports it) written to its result file. Stdin closed: the
server stops (children still running finish on their own).
"""

from __future__ import annotations

import json
import os
import runpy
import select
import sys

import qwen3exp.cli  # noqa: F401 (the children start with it imported)
import qwen3exp.entry  # noqa: F401
from qwen3exp.config.sections.platform import CpuPlatform
from qwen3exp.platforms import prepare_worker, resolve
from qwen3exp.titan import warm


def _reap(pending: dict[int, str]) -> None:
    while pending:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        result = pending.pop(pid, None)
        if result is not None:
            with open(result + ".tmp", "w") as f:
                f.write(str(os.waitstatus_to_exitcode(status)))
            os.replace(result + ".tmp", result)


def serve() -> dict:
    """Forks one child per request; returns (in the child only) the request it is to run."""
    pending: dict[int, str] = {}
    buf = b""
    while True:
        ready, _, _ = select.select([0], [], [], 0.01)
        _reap(pending)
        if not ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            os._exit(0)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                return request
            pending[pid] = request["result"]
            os.write(1, f"{pid}\n".encode())


def become(request: dict) -> None:
    """This child turns into `python -m qwen3exp ARGS` run in `cwd` with exactly `env` and the
    test process's umask."""
    os.umask(request["umask"])  # what a subprocess of the test would inherit
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        if fd == 2 and path == request["stdout"]:  # one file for both (stderr=subprocess.STDOUT)
            os.dup2(1, 2)
            continue
        opened = os.open(path, flags, 0o644)
        os.dup2(opened, fd)
        os.close(opened)
    sys.path[0] = os.getcwd()  # as `python -m` sets it
    sys.argv = ["-m", *request["args"]]  # run_module makes argv[0] the module's file, as `-m` does
    runpy.run_module("qwen3exp", run_name="__main__", alter_sys=True)


# What a CPU run's agent does before it forks the ranks (qwen3exp.worker.main.warm): the launcher
# forks that agent (qwen3exp.run.forked_agent), so a CPU training started from here imports none of
# it again. A launcher a user starts has not imported it: its agent does (tests/test_installed.py).
# Not for the quick tier (nothing trains: tests/conftest.py sets QWEN3EXP_TESTS_PRELOAD=0).
if os.environ.get("QWEN3EXP_TESTS_PRELOAD", "1") != "0":
    prepare_worker(resolve(CpuPlatform(), nproc_per_node=1, dry_run=True))
    warm.import_trainer()
become(serve())
