"""A sweep folder that holds a run of a different experiment (`qwen3exp.launchers.sweep.plan`): the
whole sweep is refused before anything starts, with what changed since that run and how to start
a new sweep directory instead.
"""

from __future__ import annotations

from pathlib import Path

from qwen3exp.analysis.diff import show
from qwen3exp.errors import Problem
from qwen3exp.run import rundir
from qwen3exp.run.identity import differences


def conflict_problem(conflicts: list, n: int, sweep_dir: Path) -> Problem:
    """One problem for every folder that holds a different experiment, with what changed (as seen
    in the first such folder). `conflicts`: (point index, its overrides' label, its run directory,
    its resolved experiment) of each such point; `n`: the number of points."""
    i, label, run_dir, data = conflicts[0]
    old = rundir.read_experiment(run_dir)
    changes = [c for c in differences(old or {}, data) if c[0] not in rundir.IDENTITY_IGNORES]
    shown = "; ".join(f"{k}: {show(a)} -> {show(b)}" for k, a, b in changes[:4])
    more = f" (+{len(changes) - 4} more)" if len(changes) > 4 else ""
    which = (
        f"sweep point {i + 1}/{n} [{label}]"
        if len(conflicts) == 1
        else f"{len(conflicts)} of {n} sweep points (first: {i + 1} [{label}])"
    )
    return Problem(
        "hydra.sweep.dir",
        str(sweep_dir),
        f"{which}: the job folder holds a run of a different experiment "
        f"(changed since: {shown or 'no key differs, the content hash does (recorded by another qwen3exp?)'}{more}); "
        "a sweep directory never mixes two configurations",
        "a new sweep directory",
        "drop hydra.sweep.dir=... (a new timestamped directory) or pass a new one; "
        f"qwen3exp diff '{run_dir}' <new run> shows every difference",
    )
