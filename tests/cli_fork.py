"""`run_cli`'s fast path: each `python -m qwen3exp ARGS` as a fork of a process that has already
imported what that command imports first (`tests/cli_fork_server.py`), instead of a new interpreter
importing Hydra, pydantic and the schema again (about 1 s of the 1.7 s a dry run takes here), and,
for a CPU training, torchtitan (its agent is the launcher's fork: about 10 s of CPU per training).

The child is the same command: the same `__main__` run by runpy as `-m` runs it, the given cwd
(first on sys.path), exactly the given environment, this process's umask, stdin from /dev/null,
stdout and stderr captured and decoded as `subprocess.run(..., text=True)` decodes them, the same
exit code. What a fork cannot give is a different interpreter start: a command whose environment
differs from the server's in what is read before it runs (`_start_keys`) runs as a real subprocess, and
so does every command when QWEN3EXP_TESTS_FORK=0 (tests/test_cli_fork.py runs both ways and
compares). One server per test process, started at its first command.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SERVER = Path(__file__).with_name("cli_fork_server.py")
_lock = threading.Lock()
_server: tuple[subprocess.Popen, dict[str, str]] | None = None


START_PREFIXES = ("PYTHON", "LC_")
"""What the interpreter reads as it starts (`PYTHON*`, the locale)."""
IMPORT_KEYS = (
    "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "HF_DATASETS_CACHE", "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
)  # fmt: skip
"""What the libraries the server imports read as they are imported and a test may set: where
huggingface_hub, datasets and transformers find their caches and whether they go online, and OpenMP's
threads. (Not what a library sets itself when it is imported in the test process: torch's
TORCHINDUCTOR_CACHE_DIR, lm_eval's HF_XET_HIGH_PERFORMANCE.)"""


def _start_keys(env: dict[str, str]) -> dict[str, str]:
    """What is read before any command runs: a command whose values differ runs anew."""
    return {k: v for k, v in env.items() if k.startswith(START_PREFIXES) or k in IMPORT_KEYS or k == "LANG"}


def enabled() -> bool:
    return os.environ.get("QWEN3EXP_TESTS_FORK", "1") != "0"


def _server_for(env: dict[str, str], base: dict[str, str]) -> subprocess.Popen | None:
    """The server (started with the `base` environment, the tests' usual one), if `env` matches it."""
    global _server
    if _server is None or _server[0].poll() is not None:
        proc = subprocess.Popen(
            [sys.executable, str(SERVER)],
            env=base,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        _server = (proc, _start_keys(base))
        atexit.register(_stop, proc)
    proc, keys = _server
    return proc if keys == _start_keys(env) else None


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _request(
    args: list[str], cwd: Path, env: dict[str, str], base: dict[str, str], stdout: Path, stderr: Path, result: Path
) -> int | None:
    """Ask the server to fork `python -m qwen3exp ARGS`; its pid, or None where it must be a real
    subprocess. `stdout` may be `stderr` (one file for both, as `stderr=subprocess.STDOUT`)."""
    if not enabled():
        return None
    with _lock:  # one request at a time; also keeps the umask read below from racing another thread's
        server = _server_for(env, base)
        if server is None:
            return None
        umask = os.umask(0o022)
        os.umask(umask)  # (read it back: os.umask only reads by setting)
        request = {
            "args": list(args),
            "umask": umask,
            "cwd": str(cwd),
            "env": env,
            "stdout": str(stdout),
            "stderr": str(stderr),
            "result": str(result),
        }
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        return int(server.stdout.readline())


class Started:
    """A command forked from the server, running in the background: as much of `subprocess.Popen` as
    the tests use (pid, poll, wait, send_signal, terminate, kill, returncode). It is the server's
    child, which reaps it and writes its exit code to `result`."""

    def __init__(self, pid: int, result: Path, args: list[str], own_folder: bool = False) -> None:
        self.pid, self.args, self.returncode, self._result = pid, args, None, result
        self._own_folder = own_folder  # `result`'s folder is this object's: removed once read

    def poll(self) -> int | None:
        if self.returncode is None and self._result.is_file():
            self.returncode = int(self._result.read_text())
            if self._own_folder:
                shutil.rmtree(self._result.parent, ignore_errors=True)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            time.sleep(0.005)
        return code

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start(
    args: list[str], cwd: Path, env: dict[str, str], base: dict[str, str], log: Path, err: Path | None = None
) -> Started | None:
    """`python -m qwen3exp ARGS` forked from the server in the background, its stdout in `log` and
    its stderr in `err` (or `log` too); None where it must be a real subprocess."""
    result = Path(tempfile.mkdtemp(prefix="qwen3exp_cli_")) / "result"
    pid = _request(args, cwd, env, base, log, err or log, result)
    if pid is None:
        shutil.rmtree(result.parent)
        return None
    return Started(pid, result, [sys.executable, "-m", "qwen3exp", *args], own_folder=True)


def run(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float, base: dict[str, str]
) -> subprocess.CompletedProcess | None:
    """`python -m qwen3exp ARGS` forked from the server, as `subprocess.run(capture_output=True,
    text=True, timeout=timeout)` would return it; None where it must be a real subprocess."""
    where = Path(tempfile.mkdtemp(prefix="qwen3exp_cli_"))
    pid = _request(args, cwd, env, base, where / "stdout", where / "stderr", where / "result")
    if pid is None:
        shutil.rmtree(where)
        return None
    command = [sys.executable, "-m", "qwen3exp", *args]
    try:
        code = Started(pid, where / "result", command).wait(timeout)
    except subprocess.TimeoutExpired:
        os.kill(pid, signal.SIGKILL)
        while not (where / "result").is_file():
            time.sleep(0.01)
        out, err = _read(where / "stdout"), _read(where / "stderr")
        shutil.rmtree(where)
        raise subprocess.TimeoutExpired(command, timeout, out, err) from None
    done = subprocess.CompletedProcess(command, code, _read(where / "stdout"), _read(where / "stderr"))
    shutil.rmtree(where)
    return done


def _read(path: Path) -> str:
    """As `subprocess.run(text=True)` decodes a captured stream (the locale's encoding, universal
    newlines)."""
    with io.TextIOWrapper(io.BytesIO(path.read_bytes())) as text:
        return text.read()
