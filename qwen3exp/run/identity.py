"""When two runs are "the same experiment": the one definition that rerun refusal, dcp resume,
sweep resume, a multi-node run's other launchers, relaunch and diff all use.

A run's identity is its resolved experiment as recorded in `experiment.yaml` (`recorded`: the
per-node `launcher.node_rank` dropped, since every node's launcher records the same run), hashed
canonically (`rundir.experiment_hash`: key order ignored, keys that change nothing a run computes,
such as `dry_run`, left out). Two experiments are the same when their identities are equal;
`differences` names the keys where they are not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import LocalLauncher
from qwen3exp.run import rundir


def recorded(exp: Experiment) -> Experiment:
    """The experiment as written to the run directory (experiment.yaml) and hashed."""
    la = exp.launcher
    if la.nnodes > 1 and isinstance(la, LocalLauncher) and la.node_rank is not None:
        return exp.model_copy(update={"launcher": la.model_copy(update={"node_rank": None})})
    return exp


def recorded_data(exp: Experiment) -> dict:
    return recorded(exp).model_dump(mode="json")


def of(exp: Experiment) -> str:
    """The identity (content hash) of an experiment."""
    return rundir.experiment_hash(recorded_data(exp))


def of_run(run_dir: Path) -> str | None:
    """The identity recorded for a run (summary.json's, else experiment.yaml's); None: no run."""
    return rundir.run_hash(run_dir)


def same(exp: Experiment, run_dir: Path) -> bool:
    """Whether `run_dir` holds a run of exactly this experiment."""
    return of_run(run_dir) == of(exp)


def differing_keys(exp: Experiment, run_dir: Path) -> list[str]:
    """The keys where `run_dir`'s recorded experiment differs from `exp`."""
    there = rundir.identity_view(rundir.read_experiment(run_dir) or {})
    return [key for key, _, _ in differences(there, rundir.identity_view(recorded_data(exp)))]


class _Absent:
    def __repr__(self) -> str:
        return "(absent)"


ABSENT = _Absent()


def differences(a: dict, b: dict) -> list[tuple[str, Any, Any]]:
    """(dotted key, value in a, value in b) for every key whose value differs; ABSENT where a key
    exists on one side only. Sorted by key."""
    fa, fb = rundir.flatten(a), rundir.flatten(b)
    out = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key, ABSENT), fb.get(key, ABSENT)
        if va != vb or (type(va) is not type(vb) and not _same_number(va, vb)):
            out.append((key, va, vb))
    return out


def _same_number(a, b) -> bool:
    return (
        isinstance(a, (int, float))
        and isinstance(b, (int, float))
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )
