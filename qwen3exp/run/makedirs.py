"""Creating a launch's directory: `mkdir -p` that records which directories it made (so that a
discarded launch removes only those), and an OSError as the Problem of the directory's key."""

from __future__ import annotations

import errno
from pathlib import Path

from qwen3exp.errors import ConfigError, Problem


def makedirs(path: Path, key: str) -> list[Path]:
    """mkdir -p, returning the directories that did not exist (outermost first)."""
    missing = []
    p = path.absolute()
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    missing.reverse()
    made: list[Path] = []
    for d in missing:
        try:
            d.mkdir()
        except FileExistsError:  # a concurrent launch made it first: not ours
            if not d.is_dir():
                undo(made)
                raise ConfigError([os_problem(key, path, OSError(errno.ENOTDIR, f"{d} is a file"))]) from None
            continue
        except OSError as e:
            undo(made)
            raise ConfigError([os_problem(key, path, e)]) from None
        made.append(d)
    return made


def undo(made: list[Path]) -> None:
    """Remove the directories `makedirs` made (innermost first; those no longer empty stay)."""
    for d in reversed(made):
        try:
            d.rmdir()
        except OSError:
            pass


def os_problem(key: str, path: Path, e: OSError) -> Problem:
    """The directory `path` (named by `key`) cannot be created or written, and why."""
    why = {
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.EROFS: "the file system is read-only",
        errno.ENOSPC: "the disk is full",
        errno.EDQUOT: "the disk quota is exhausted",
        errno.ENOTDIR: "a part of the path is a file",
        errno.ENAMETOOLONG: "the name is too long",
    }.get(e.errno or 0, e.strerror or type(e).__name__)
    where = f" ({e.filename})" if getattr(e, "filename", None) and str(e.filename) != str(path) else ""
    return Problem(
        key,
        str(path),
        f"cannot be created or written: {why}{where}",
        "a directory this user can create and write",
        "choose another name=... or hydra.run.dir=... on a writable file system",
    )
