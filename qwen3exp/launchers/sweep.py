"""Sweeps that can be resumed: job directory names, the resume plan, and the end-of-sweep summary.

Each job of `python -m qwen3exp -m ...` runs in `hydra.sweep.dir/hydra.sweep.subdir`, and the subdir
is named by the job's overrides (`${qwen3exp.safe_dirname:${hydra.job.override_dirname}}`), so the
same point of the same sweep always lands in the same folder. That makes a sweep resumable: rerun
the same command with the same `hydra.sweep.dir=...` and

- a job whose folder holds a `completed` run of the same resolved experiment (same content hash,
  `summary.json`'s `experiment_hash`) is skipped;
- a job whose folder holds an unfinished run (failed, interrupted, killed) of the same experiment
  runs again; the earlier attempt's files are kept under `attempts/<n>/` (never overwritten), and
  `checkpoint/` stays in place so a checkpointing run continues from its last step;
- a job whose folder holds a different experiment (the base config changed since) refuses the whole
  sweep before anything starts (exit code 2): results of two different configs are never mixed.

Skipping happens inside the job (`claim`), so it also works where a launcher plugin runs jobs in
other processes; by then Hydra has rewritten the job's `.hydra/` files (same composed config).
The end-of-sweep table is read back from the run directories for the same reason.
"""

from __future__ import annotations

import hashlib
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from qwen3exp.run import rundir
from qwen3exp.errors import ConfigError, Problem

RESOLVER = "qwen3exp.safe_dirname"
_MAX_NAME = 200  # file names are limited to 255 bytes; leave room for suffixes


def safe_dirname(override_dirname: str) -> str:
    """A folder name for a job from Hydra's override_dirname (`a=1,b=x`): `experiment@_global_=`
    reads `experiment=`, characters that are not safe in a file name are %-escaped (`/` -> `%2F`),
    an empty name (no overrides) is `base`, and a name too long for a file system is shortened with
    a hash of the full name."""
    name = str(override_dirname).replace("@_global_=", "=")
    name = quote(name, safe="=,+-._@~")
    if not name:
        return "base"
    if len(name) > _MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = f"{name[:_MAX_NAME - 11]}-{digest}"
    return name


def register_resolver() -> None:
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver(RESOLVER):
        OmegaConf.register_new_resolver(RESOLVER, safe_dirname)
    if not OmegaConf.has_resolver(rundir.STAMP_RESOLVER):
        # Cached: every reference in one composed config sees the same stamp.
        OmegaConf.register_new_resolver(rundir.STAMP_RESOLVER, rundir.stamp, use_cache=True)


# ------------------------------------------------------------------------------ the resume plan
NEW, DONE, RETRY, CONFLICT = "new", "done", "retry", "conflict"


@dataclass(frozen=True)
class Job:
    index: int
    overrides: list[str]
    run_dir: Path
    experiment: dict
    """The resolved experiment (plain data)."""
    state: str
    """new | done (completed earlier: skipped) | retry (an unfinished attempt is set aside)."""
    previous: str | None = None
    """The earlier attempt's status (retry only)."""


def _state(run_dir: Path, exp_hash: str) -> tuple[str, str | None]:
    """(NEW | DONE | RETRY | CONFLICT, the earlier attempt's status)."""
    if not rundir.looks_like_run(run_dir):
        return NEW, None
    if rundir.run_hash(run_dir) != exp_hash:
        return CONFLICT, None
    summary = rundir.read_json(run_dir / rundir.SUMMARY)
    status = summary.get("status") if isinstance(summary, dict) else None
    if status == "completed":
        return DONE, status
    return RETRY, status or "no summary (killed)"


def plan(points, sweep_dir: Path) -> list[Job]:
    """Decide for every point of a sweep what happens to it; raises ConfigError (before any job
    starts) when two points share a folder or a folder holds a different experiment."""
    jobs, problems, seen, conflicts = [], [], {}, []
    for i, (overrides, exp, run_dir) in enumerate((p.overrides, p.exp, p.run_dir) for p in points):
        run_dir = Path(run_dir)
        data = exp.model_dump(mode="json")
        label = " ".join(o.replace("experiment@_global_=", "experiment=") for o in overrides
                         if not o.startswith("hydra."))
        if run_dir in seen:
            problems.append(Problem("hydra.sweep.subdir", str(run_dir),
                                    f"sweep points {seen[run_dir] + 1} and {i + 1} [{label}] share one run directory",
                                    "a subdir that differs between points (the default names it by the overrides)"))
            continue
        seen[run_dir] = i
        state, previous = _state(run_dir, rundir.experiment_hash(data))
        if state == CONFLICT:
            conflicts.append((i, label, run_dir, data))
            continue
        jobs.append(Job(i, list(overrides), run_dir, data, state, previous))
    if conflicts:
        problems.append(_conflict(conflicts, len(points), sweep_dir))
    if problems:
        raise ConfigError(problems, context=f"sweep directory {sweep_dir}")
    return jobs


def _conflict(conflicts: list, n: int, sweep_dir: Path) -> Problem:
    """One problem for every folder that holds a different experiment, with what changed (as seen
    in the first such folder)."""
    from qwen3exp.analysis.diff import differences, show

    i, label, run_dir, data = conflicts[0]
    old = rundir.read_experiment(run_dir)
    changes = [c for c in differences(old or {}, data) if c[0] not in rundir.IDENTITY_IGNORES]
    shown = "; ".join(f"{k}: {show(a)} -> {show(b)}" for k, a, b in changes[:4])
    more = f" (+{len(changes) - 4} more)" if len(changes) > 4 else ""
    which = f"sweep point {i + 1}/{n} [{label}]" if len(conflicts) == 1 else \
        f"{len(conflicts)} of {n} sweep points (first: {i + 1} [{label}])"
    return Problem(
        "hydra.sweep.dir", str(sweep_dir),
        f"{which}: the job folder holds a run of a different experiment "
        f"(changed since: {shown or 'no key differs, the content hash does (recorded by another qwen3exp?)'}{more}); "
        "a sweep directory never mixes two configurations",
        "a new sweep directory",
        "drop hydra.sweep.dir=... (a new timestamped directory) or pass a new one; "
        f"python -m qwen3exp.analysis.diff '{run_dir}' <new run> shows every difference")


def describe(jobs: list[Job], sweep_dir: Path) -> str:
    done = sum(j.state == DONE for j in jobs)
    retry = [j for j in jobs if j.state == RETRY]
    head = f"qwen3exp sweep: {len(jobs)} job(s) in {sweep_dir}"
    if not done and not retry:
        return head
    parts = [f"{done} completed earlier (skipped)"] if done else []
    if retry:
        parts.append(f"{len(retry)} unfinished ({', '.join(sorted({str(j.previous) for j in retry}))}) run again")
    new = len(jobs) - done - len(retry)
    if new:
        parts.append(f"{new} new")
    return f"{head}: resuming: {'; '.join(parts)}"


# ------------------------------------------------------------------------------- in each job
def claim(run_dir: Path, exp_data: dict) -> bool:
    """Called by each sweep job before it launches. True: skip (completed earlier, same experiment).
    An unfinished attempt of the same experiment is moved to attempts/<n>/. A different experiment
    raises ConfigError (the plan refused that before the sweep; this guards a folder changed since)."""
    state, previous = _state(run_dir, rundir.experiment_hash(exp_data))
    if state == NEW:
        return False
    if state == DONE:
        print(f"qwen3exp: skipped (completed earlier, same experiment): {run_dir}", flush=True)
        return True
    if state == RETRY:
        kept = set_aside(run_dir)
        print(f"qwen3exp: {run_dir} held an unfinished attempt ({previous}); kept in {kept}, running again",
              flush=True)
        return False
    raise ConfigError([Problem("hydra.sweep.dir", str(run_dir.parent),
                               f"{run_dir} holds a run of a different experiment; it is never overwritten",
                               "a new sweep directory")])


# Left in place: Hydra's own files for this job (just rewritten, the job log is open), earlier
# attempts, the checkpoint folder (torchtitan continues from its latest step), and submitit's folder
# (launcher=slurm, one run: the running job writes its log and result there).
_KEEP = {rundir.HYDRA, rundir.ATTEMPTS, rundir.CHECKPOINT, ".submitit"}


def set_aside(run_dir: Path) -> Path:
    attempts = run_dir / rundir.ATTEMPTS
    n = 1
    while (attempts / str(n)).exists():
        n += 1
    dest = attempts / str(n)
    dest.mkdir(parents=True)
    # With a checkpoint the job resumes from it and keeps the metrics rows up to that step: copy them.
    resumes = rundir.latest_checkpoint_step(run_dir) is not None
    for entry in sorted(run_dir.iterdir()):
        if entry.name in _KEEP or entry.suffix == ".log":
            continue
        if resumes and entry.name == rundir.METRICS:
            shutil.copy2(entry, dest / entry.name)
            continue
        shutil.move(str(entry), str(dest / entry.name))
    return dest


# ---------------------------------------------------------------------- the end-of-sweep table
def finish(jobs: list[Job], sweep_dir: Path, command: list[str], *, stopped: int | None) -> int:
    """Print the one-screen summary, write the report files next to the runs; return the exit code
    (`stopped`: the exit code of the signal that stopped the sweep, 130 or 143)."""
    from qwen3exp.analysis import report
    runs, status = [], {}
    for j in jobs:
        run = report.load_run(j.run_dir, experiment=j.experiment)
        if j.state == DONE:
            status[j.run_dir] = "skipped (done)"
        elif run.summary is None:
            status[j.run_dir] = "not run" if not rundir.looks_like_run(j.run_dir) else "incomplete"
        runs.append(run)
    counts: dict[str, int] = {}
    for r in runs:
        s = status.get(r.path, r.status)
        counts[s] = counts.get(s, 0) + 1
    print()
    print(f"qwen3exp sweep {'interrupted' if stopped else 'finished'}: {sweep_dir}  "
          + ", ".join(f"{n} {s}" for s, n in counts.items()))
    print(report.render_terminal(report.table(runs, root=sweep_dir, status=status), max_rows=20))
    for i, r in enumerate(runs, 1):
        if r.summary and r.summary.get("error"):
            first = (str(r.summary["error"]).strip().splitlines() or ["?"])[0][:150]
            print(f"  #{i} {r.path}: {first}")
    if any(r.metrics for r in runs):
        try:
            written = report.write_files(runs, sweep_dir, root=sweep_dir, status=status)
            print(f"report: {', '.join(str(p) for p in written)}   (python -m qwen3exp.analysis.report {sweep_dir})")
        except Exception as e:  # a plotting problem never changes what the sweep did
            print(f"report: not written ({type(e).__name__}: {e})")
    unfinished = [r for r in runs if status.get(r.path, r.status) not in ("completed", "skipped (done)")]
    if unfinished:
        print(f"resume (runs only the {len(unfinished)} unfinished job(s)): {resume_command(command, sweep_dir)}")
    if stopped:
        return stopped
    return 1 if unfinished else 0


def resume_command(command: list[str], sweep_dir: Path) -> str:
    args = [a for a in command if not a.startswith("hydra.sweep.dir=")]
    return shlex.join([*args, f"hydra.sweep.dir={quote_value(str(sweep_dir))}"])


def quote_value(value: str) -> str:
    """An override value Hydra reads back as this exact string (paths with , = spaces, quotes...)."""
    if value and all(c.isalnum() or c in "/._-+@%" for c in value):
        return value
    return "'" + value.replace("'", "\\'") + "'"
