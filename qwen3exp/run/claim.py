"""Claiming a run (or sweep) directory before anything is written into it.

A launch owns its directory from the moment `claim()` returns until `Claim.release()`:

- The claim is an exclusive `flock` on a lock file inside the directory (`.qwen3exp.lock`, one per
  node for multi-node runs whose node launchers share one folder). A second launcher into the same
  directory fails at once (exit 2, naming the directory and the holder) instead of training into the
  first one's files. The kernel drops the lock when the holder dies, however it dies, so a SIGKILLed
  launcher never leaves a stale claim; the lock file itself stays (deleting a lock file while another
  process opens it lets two holders in).
- Multi-node runs: every node's launcher claims the one shared folder with its own lock file, which
  records the run's identity (`run`: `qwen3exp.run.identity.of`, the same on every node). The nodes
  start in any order, seconds apart, so a node may find the folder holding what another node's
  launch has written so far (Hydra's `multirun.yaml` and `.hydra/`, `plan.json`, ... before any
  `experiment.yaml`): those belong to the same run when a lock file there records the same identity,
  and to a different experiment (refused) when the locks there record only other identities.
- What existed before is recorded. `release(discard=True)` (a launch refused before any worker
  started) removes only what this launch created: the directory and the parents it made, or, in a
  directory that existed before, the entries that were not there. Nothing that was there before the
  launch is ever removed or touched. When another launch claimed the folder meanwhile (another node
  of the run), what is new cannot be told apart from what that launch wrote: only this launch's
  lock file is removed.
- A directory that is not a qwen3exp run and not empty (a user's folder, a checkout: `hydra.run.dir=.`)
  is refused: a run is written only into a new directory, an empty one, or a run of its own
  (resume, or another node's launcher of the same multi-node run).
- The problems a directory can have before the launch are reported as `Problem`s (exit 2): it is a
  file, it cannot be created or written (read-only, permission, a missing parent that cannot be
  made), or its file system has less free space than the run will write (`disk_problem`).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from qwen3exp.errors import ConfigError, Problem
from qwen3exp.run import lockfile, makedirs, rundir

LOCK = ".qwen3exp.lock"
BOOKKEEPING = frozenset({rundir.HYDRA, "qwen3exp.log", "multirun.yaml"})
"""Entries a launch that never started may leave behind (Hydra's job files, job log and sweep
record; a launch SIGKILLed while it planned): a folder holding only these and a qwen3exp lock file
counts as empty. Without a lock file they are somebody else's (a Hydra app's `.hydra/`)."""
OURS = BOOKKEEPING | {
    ".qwen3exp-sweep.jsonl",
    rundir.EXPERIMENT,
    rundir.PLATFORM,
    rundir.TORCHTITAN_CONFIG,
    rundir.COMMAND,
    rundir.SUMMARY,
    rundir.METRICS,
    rundir.PLAN,
    rundir.OVERRIDES_APPLIED,
    rundir.LOGS,
    rundir.PROVENANCE,
    rundir.GIT_DIFF,
    "tb",
    "comm_traces",
}
"""What a launch writes before its ranks train (a refusal by torchtitan's own checks in the ranks
comes after the run files are written): all that a discarded launch removes, with its lock file.
Anything else that appeared meanwhile was written by another program and stays."""
KEPT_BYTES = 1 << 20
"""Bookkeeping files that existed before a launch and are at most this big are kept byte for byte
and put back by a discard (Hydra's sweeper rewrites multirun.yaml before the launcher refuses)."""


def lock_name(node_rank: int | None = None) -> str:
    """The lock file of this node's launcher (multi-node runs: one lock per node in one folder)."""
    return LOCK if not node_rank else f".qwen3exp.node{node_rank}.lock"


@dataclass
class Claim:
    path: Path
    key: str
    """The key that names this directory in messages (hydra.run.dir, hydra.sweep.dir)."""
    created: list[Path] = field(default_factory=list)
    """Directories this launch created, outermost first (the run directory is the last one)."""
    before: frozenset[str] = frozenset()
    """Top-level entries the directory held when it was claimed (empty when it was created)."""
    lock: str = LOCK
    """This launch's lock file (in `path`)."""
    kept: dict[str, bytes] = field(default_factory=dict)
    """The small bookkeeping files the directory held before (`KEPT_BYTES`), put back by a discard."""
    run: str | None = None
    """The multi-node run this launch belongs to (its identity), recorded in the lock file."""
    _fd: int | None = None

    @property
    def made_dir(self) -> bool:
        return bool(self.created) and self.created[-1] == self.path.absolute()

    def release(self, *, discard: bool = False) -> None:
        """Drop the lock. `discard`: also remove what this launch created (never anything else)."""
        try:
            if discard:
                self._discard()
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _discard(self) -> None:
        if self._shared():
            (self.path / self.lock).unlink(missing_ok=True)
            return
        if self.path.is_dir():
            for entry in self.path.iterdir():
                if entry.name in self.before or not (entry.name in OURS or lockfile.is_lock(entry.name)):
                    continue  # there before the launch, or another program's: never touched
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
            for name, content in self.kept.items():
                try:
                    if (self.path / name).read_bytes() != content:
                        (self.path / name).write_bytes(content)
                except OSError:
                    pass
        for parent in reversed(self.created):
            try:
                parent.rmdir()  # only if still empty: something else may have been put there since
            except OSError:
                break

    def _shared(self) -> bool:
        """Another launch has claimed this folder since this one did, or holds it now (a multi-node
        run's other node): the new entries may be its own."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return False
        return any(
            lockfile.is_lock(n) and n != self.lock and (n not in self.before or lockfile.held(self.path / n))
            for n in names
        )

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.release(discard=exc_type is not None and issubclass(exc_type, ConfigError))


def claim(path: Path | str, *, key: str = "hydra.run.dir", lock: str = LOCK, run: str | None = None) -> Claim:
    """Create (or take) `path` and lock it for this launch; raise ConfigError when it cannot be
    created or written, or another live launcher holds it. `run`: the identity of the multi-node
    run this node's launcher belongs to (recorded in its lock file for the other nodes)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            [
                Problem(
                    key,
                    str(path),
                    "is a file, not a directory",
                    "a new or empty directory",
                    "choose another name=... or hydra.run.dir=...",
                )
            ]
        )
    created = makedirs.makedirs(path, key)
    c = Claim(path, key, created, lock=lock, run=run)
    try:
        c.before = frozenset() if c.made_dir else frozenset(os.listdir(path))
        c.kept = _kept(path, c.before)
        c._fd = _lock(path / lock, key, run)
    except BaseException:
        c.release(discard=True)
        raise
    return c


def _lock(lock_path: Path, key: str, run: str | None) -> int:
    run_dir = lock_path.parent
    try:
        return lockfile.acquire(lock_path, run)
    except lockfile.Held as e:
        raise ConfigError(
            [
                Problem(
                    key,
                    str(run_dir),
                    f"is in use by another qwen3exp launch ({e})",
                    "a directory no other launch is using",
                    "wait for that launch to end, or choose another name=... / hydra.run.dir=...",
                )
            ]
        ) from None
    except lockfile.Unwritable as e:
        raise ConfigError([makedirs.os_problem(key, run_dir, e.error)]) from None


def _kept(path: Path, names: frozenset[str]) -> dict[str, bytes]:
    out = {}
    for name in names & OURS:
        p = path / name
        try:
            if p.is_file() and not p.is_symlink() and p.stat().st_size <= KEPT_BYTES:
                out[name] = p.read_bytes()
        except OSError:
            continue
    return out


def foreign_entries(c: Claim) -> list[str]:
    """The entries of a claimed directory that make it 'not empty' for a new run. Lock files do not
    count, nor the bookkeeping of a launch that never started, when a qwen3exp lock file says a
    launch of ours left it (without one, a `.hydra/` is a Hydra app's)."""
    ours = any(lockfile.is_lock(n) for n in c.before)
    return sorted(n for n in c.before if not lockfile.is_lock(n) and not (ours and n in BOOKKEEPING))


def _listed(names: list[str]) -> str:
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")


def other_runs(c: Claim) -> set[str]:
    """The multi-node run identities the other lock files in a claimed directory record."""
    return {
        run
        for n in c.before
        if lockfile.is_lock(n) and n != c.lock
        if (run := lockfile.recorded_run(c.path / n)) is not None
    }


def not_a_run_problem(c: Claim) -> Problem | None:
    """A directory that existed, holds files and is not a qwen3exp run (nor the start of one by
    another node's launcher of this multi-node run): never written into."""
    names = foreign_entries(c)
    if not names or rundir.looks_like_run(c.path):
        return None
    shown = _listed(names)
    fix = "choose another name=... or hydra.run.dir=... (the default is a new timestamped directory)"
    # A checkpoint/ comes after experiment.yaml in every run, so no node of a run ever sees one alone.
    runs = other_runs(c) if c.run is not None and rundir.CHECKPOINT not in names else set()
    if c.run in runs:
        return None  # another node's launcher of this run has started writing it
    if rundir.CHECKPOINT in names:
        message = (
            f"holds a {rundir.CHECKPOINT}/ but no {rundir.EXPERIMENT} of the run that wrote it "
            f"({shown}); a checkpoint is resumed only next to its own run's {rundir.EXPERIMENT} "
            "(DCP checkpoints are pickles: qwen3exp loads none it did not record)"
        )
    elif runs:
        message = (
            f"is being written by another node's launcher of a different experiment (run identity "
            f"{', '.join(sorted(r[:12] for r in runs))}, this node's {c.run[:12] if c.run else '?'}; "
            f"it holds {shown})"
        )
        fix = (
            "start every node with the same settings (only launcher.node_rank differs), "
            "or choose another hydra.run.dir=..."
        )
    else:
        message = f"already holds files that are not a qwen3exp run ({shown}); they are never overwritten"
    return Problem(c.key, str(c.path), message, "a new or empty directory, or a qwen3exp run of this experiment", fix)


SWEEP_FILE = "multirun.yaml"
"""Hydra's basic sweeper's record of a sweep, in the sweep directory: a directory holding it is a sweep's."""
SWEEP_MANIFEST = ".qwen3exp-sweep.jsonl"
"""qwen3exp's launcher's record of a sweep's jobs (every sweeper: Optuna's writes no multirun.yaml)."""


def not_a_sweep_problem(c: Claim) -> Problem | None:
    """A sweep directory that existed, holds files and is not an earlier sweep's: never written into."""
    names = foreign_entries(c)
    if not names or SWEEP_FILE in names or SWEEP_MANIFEST in names or rundir.looks_like_run(c.path):
        return None
    return Problem(
        c.key,
        str(c.path),
        f"already holds files that are not a qwen3exp sweep ({_listed(names)}); they are never overwritten",
        "a new or empty directory, or an earlier sweep's directory (resume)",
        "drop hydra.sweep.dir=... (a new timestamped directory) or pass a new one",
    )
