"""What a job's own folder may hold: a run in it is never overwritten, except to resume the same
experiment; and the room its disk has."""

from __future__ import annotations

from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import Problem
from qwen3exp.launchers.points import Point
from qwen3exp.launchers.registry import launcher_of
from qwen3exp.run import disk, identity, rundir


def rerun_problem(exp: Experiment, run_dir: Path) -> Problem | None:
    """A directory that holds a run is never overwritten. The one exception is resuming: a
    resumable checkpoint kind (dcp) and the same experiment (`qwen3exp.run.identity`) continue
    from the latest checkpoint. None: the rerun may go ahead. The message says in one sentence what
    the directory holds, and the hint gives the command that continues it (where one can) and the
    one that starts anew."""
    recorded = rundir.read_experiment(run_dir) is not None
    if exp.checkpoint.resumable and recorded and identity.same(exp, run_dir):
        return None
    summary = rundir.read_json(run_dir / rundir.SUMMARY)
    status = summary.get("status") if isinstance(summary, dict) else None
    held = f"a {status} run" if isinstance(status, str) and status.isidentifier() else "a run"
    anew = "start anew in a new directory: drop hydra.run.dir=... (the default adds a timestamp) or pick another"
    same = recorded and identity.same(exp, run_dir)
    if same:  # the same experiment, but it keeps no resumable checkpoint
        message = (
            f"holds {held} of this same experiment, which keeps no resumable checkpoint "
            f"(checkpoint.save=false), so there is nothing to continue; it is never overwritten"
        )
        hint = anew
    elif not recorded:
        message = (
            f"holds files of {held} but no {rundir.EXPERIMENT}, so it cannot be continued; it is never overwritten"
        )
        hint = anew
    else:
        changed = identity.differing_keys(exp, run_dir)
        message = (
            f"holds {held} of a different experiment (differing keys: {', '.join(changed) or '?'}); "
            "it is never overwritten"
        )
        hint = (
            f"to continue that run with its own settings: qwen3exp relaunch {run_dir} hydra.run.dir={run_dir}; "
            f"to {anew}"
            if rundir.latest_checkpoint_step(run_dir) is not None
            else anew
        )
    return Problem(
        "hydra.run.dir",
        str(run_dir),
        message,
        "a new directory, or a dcp run of this same experiment (which continues from its latest checkpoint)",
        hint,
    )


def run_dir_problems(point: Point) -> list[Problem]:
    """A run's own directory (claimed by the command line): a run in it is resumed only when it is
    the same dcp experiment (or another node's launcher of this multi-node run); room on its disk."""
    run_dir = Path(point.run_dir)
    problems = []
    if not launcher_of(point.exp.launcher).may_join(point.exp, run_dir) and rundir.looks_like_run(run_dir):
        if (problem := rerun_problem(point.exp, run_dir)) is not None:
            problems.append(problem)
    full = disk.disk_problem("hydra.run.dir", run_dir, disk.estimate_bytes(point.exp, point.plan.parameters.total))
    return [*problems, *([full] if full is not None else [])]
