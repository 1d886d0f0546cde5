"""The lock file a launch holds in its run directory: an exclusive `flock`, and who holds it.

The kernel drops the lock when the holder dies, however it dies, so a SIGKILLed launcher never
leaves a stale claim; the lock file itself stays (deleting a lock file while another process opens
it lets two holders in). The file records the holder (pid, host, since) and, for a multi-node run,
the run's identity, which the other nodes' launchers read (`qwen3exp.run.claim`).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import time
from pathlib import Path


class Held(Exception):
    """Another live launch holds the lock file (the message: who, from its record)."""


class Unwritable(Exception):
    """The lock file cannot be created or written; `error` is why."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


def is_lock(name: str) -> bool:
    """A qwen3exp lock file's name (one per node of a multi-node run)."""
    return name.startswith(".qwen3exp.") and name.endswith(".lock")


def acquire(lock_path: Path, run: str | None) -> int:
    """Create (or open) the lock file, take its exclusive flock and record this launch in it (pid,
    host, since; `run`: the multi-node run's identity); returns the open descriptor, which holds the
    lock until it is closed. Raises `Held` when another live launch holds it, `Unwritable` when the
    file cannot be created or written."""
    while True:
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise Unwritable(e) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = holder(fd)
            os.close(fd)
            raise Held(who) from None
        # The lock file we locked must still be the one at that path (it is never deleted by us,
        # but a user may have removed it while we opened it).
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_path, follow_symlinks=False).st_ino
        except OSError:
            same = False
        if not same:
            os.close(fd)
            continue
        try:
            os.ftruncate(fd, 0)
            record = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S"),
                **({"run": run} if run else {}),
            }
            os.write(fd, (json.dumps(record) + "\n").encode())
        except OSError as e:
            os.close(fd)
            raise Unwritable(e) from None
        return fd


def open_lock(lock_path: Path) -> int | None:
    """Another launch's lock file, opened for reading (None: gone, a link, not a plain file)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def held(lock_path: Path) -> bool:
    """Whether a live launcher holds this lock file now."""
    if (fd := open_lock(lock_path)) is None:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError as e:
        return isinstance(e, BlockingIOError)
    finally:
        os.close(fd)  # also drops the shared lock taken to test it


def recorded_run(lock_path: Path) -> str | None:
    """The multi-node run identity a lock file records (None: none, or not a lock file of ours)."""
    if (fd := open_lock(lock_path)) is None:
        return None
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    run = info.get("run") if isinstance(info, dict) else None
    return run if isinstance(run, str) else None


def holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"pid {info['pid']} on {info['host']}, since {info['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "its launcher holds the lock"
