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

import json
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from qwen3exp.analysis import report
from qwen3exp.config.argv import quote_value
from qwen3exp.errors import ConfigError, Problem
from qwen3exp.launchers.sweep_conflict import conflict_problem
from qwen3exp.run import claim as claim_module, identity, rundir

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
    if identity.of_run(run_dir) != exp_hash:
        return CONFLICT, None
    summary = rundir.read_json(run_dir / rundir.SUMMARY)
    status = summary.get("status") if isinstance(summary, dict) else None
    if status == "completed":
        return DONE, status
    return RETRY, status or "no summary (killed)"


def plan(points, sweep_dir: Path, *, first_index: int = 0) -> list[Job]:
    """Decide for every point of a sweep what happens to it; raises ConfigError (before any job
    starts) when two points share a folder or a folder holds a different experiment."""
    jobs: list[Job] = []
    problems: list[Problem] = []
    seen: dict[Path, int] = {}
    conflicts: list = []
    for i, (overrides, exp, run_dir) in enumerate(((p.overrides, p.exp, p.run_dir) for p in points), first_index):
        run_dir = Path(run_dir)
        data = identity.recorded_data(exp)
        label = " ".join(o for o in overrides if not o.startswith("hydra."))
        if run_dir in seen:
            problems.append(
                Problem(
                    "hydra.sweep.subdir",
                    str(run_dir),
                    f"sweep points {seen[run_dir] + 1} and {i + 1} [{label}] share one run directory",
                    "a subdir that differs between points (the default names it by the overrides)",
                )
            )
            continue
        seen[run_dir] = i
        state, previous = _state(run_dir, identity.of(exp))
        if state == CONFLICT:
            conflicts.append((i, label, run_dir, data))
            continue
        jobs.append(Job(i, list(overrides), run_dir, data, state, previous))
    if conflicts:
        problems.append(conflict_problem(conflicts, len(points), sweep_dir))
    if problems:
        raise ConfigError(problems, context=f"sweep directory {sweep_dir}")
    return jobs


MANIFEST = claim_module.SWEEP_MANIFEST
"""The sweep directory's record of its jobs, one line per job as the launcher planned it (an
adaptive sweeper adds a batch at a time); the command line reads it back for the end table."""


def record(sweep_dir: Path, jobs: list[Job]) -> None:
    lines = "".join(
        json.dumps(
            {
                "index": j.index,
                "overrides": j.overrides,
                "run_dir": str(j.run_dir),
                "experiment": j.experiment,
                "state": j.state,
                "previous": j.previous,
            }
        )
        + "\n"
        for j in jobs
    )
    with open(sweep_dir / MANIFEST, "a", encoding="utf-8") as f:
        f.write(lines)
        f.flush()
        os.fsync(f.fileno())


def recorded(sweep_dir: Path, since: int = 0) -> list[Job]:
    """The jobs recorded from byte offset `since` (this launch's part of the manifest)."""
    try:
        with open(sweep_dir / MANIFEST, "rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return []
    jobs = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
            jobs.append(
                Job(
                    int(d["index"]),
                    list(d["overrides"]),
                    Path(d["run_dir"]),
                    dict(d["experiment"]),
                    str(d["state"]),
                    d.get("previous"),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return jobs


def manifest_size(sweep_dir: Path) -> int:
    try:
        return (sweep_dir / MANIFEST).stat().st_size
    except OSError:
        return 0


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
def claim(run_dir: Path, exp) -> bool:
    """Called by each sweep job before it launches. True: skip (completed earlier, same experiment).
    An unfinished attempt of the same experiment is moved to attempts/<n>/. A different experiment
    raises ConfigError (the plan refused that before the sweep; this guards a folder changed since)."""
    state, previous = _state(run_dir, identity.of(exp))
    if state == NEW:
        return False
    if state == DONE:
        print(f"qwen3exp: skipped (completed earlier, same experiment): {run_dir}", flush=True)
        return True
    if state == RETRY:
        kept = set_aside(run_dir)
        print(f"qwen3exp: {run_dir} held an unfinished attempt ({previous}); kept in {kept}, running again", flush=True)
        return False
    raise ConfigError(
        [
            Problem(
                "hydra.sweep.dir",
                str(run_dir.parent),
                f"{run_dir} holds a run of a different experiment; it is never overwritten",
                "a new sweep directory",
            )
        ]
    )


# Left in place: Hydra's own files for this job (just rewritten, the job log is open), earlier
# attempts, the checkpoint folder (torchtitan continues from its latest step), the exports so far,
# and submitit's folder (launcher=slurm, one run: the running job writes its log and result there).
_KEEP = {rundir.HYDRA, rundir.ATTEMPTS, rundir.CHECKPOINT, rundir.EXPORT, rundir.REFERENCE_LOGPS, ".submitit"}


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
def finish(jobs: list[Job], sweep_dir: Path, command: list[str], *, stopped: int | None, adaptive: bool = False) -> int:
    """Print the one-screen summary, write the report files next to the runs; return the exit code
    (`stopped`: the exit code of the signal that stopped the sweep, 130 or 143). `adaptive`: the
    sweeper chose the points and decided what a failed trial means (Optuna's max_failure_rate), so
    the search succeeded when it ran to its end with at least one completed trial; an unfinished
    trial is not run again (the sweeper asks for new points instead)."""
    jobs = list({j.run_dir: j for j in jobs}.values())  # a folder recorded twice: its latest record
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
    print(
        f"qwen3exp sweep {'interrupted' if stopped else 'finished'}: {sweep_dir}  "
        + ", ".join(f"{n} {s}" for s, n in counts.items())
    )
    t = report.table(runs, root=sweep_dir, status=status)
    print(report.render_terminal(t, max_rows=20))
    if (best := report.best_line(t)) is not None:
        print(best)
    for i, r in enumerate(t.runs, 1):  # numbered as in the (ranked) table
        if r.summary and r.summary.get("error"):
            first = (str(r.summary["error"]).strip().splitlines() or ["?"])[0][:150]
            print(f"  #{i} {r.path}: {first}")
    if any(r.metrics for r in runs):
        try:
            written = report.write_files(runs, sweep_dir, root=sweep_dir, status=status)
            print(f"report: {', '.join(str(p) for p in written)}   (qwen3exp report {sweep_dir})")
        except Exception as e:  # a plotting problem never changes what the sweep did
            print(f"report: not written ({type(e).__name__}: {e})")
    unfinished = [r for r in runs if status.get(r.path, r.status) not in ("completed", "skipped (done)")]
    if adaptive:
        if stopped:
            print(f"continue the search: {resume_command(command, sweep_dir)}")
            return stopped
        return 0 if len(unfinished) < len(runs) else 1
    if unfinished:
        print(f"resume (runs only the {len(unfinished)} unfinished job(s)): {resume_command(command, sweep_dir)}")
    if stopped:
        return stopped
    return 1 if unfinished else 0


def resume_command(command: list[str], sweep_dir: Path) -> str:
    args = [a for a in command if not a.startswith("hydra.sweep.dir=")]
    return shlex.join([*args, f"hydra.sweep.dir={quote_value(str(sweep_dir))}"])
