"""What the command line and qwen3exp's Hydra launcher ask of a launcher (`launcher=local`,
`launcher=slurm`, ...): the `Launcher` protocol.

Each launcher is one module of this package with one object that implements it (`local.LAUNCHER`,
`slurm.LAUNCHER`), found by the class of the validated launcher section
(`qwen3exp.launchers.registry.launcher_of`). What the plan and the launch know of a launcher's
runs from the inside (where the ranks go, the time limit) is its `Nodes` in `qwen3exp.plan`
(`qwen3exp.plan.placement.nodes_of`): the plan cannot import this package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import Problem
from qwen3exp.run import identity, rundir


@dataclass(frozen=True)
class Submission:
    """A checked batch, as a Hydra launcher plugin (submitit, joblib) is set up to run it."""

    config: Any
    """The sweep's Hydra config (`hydra.sweep.dir`, ...)."""
    hydra_context: Any
    """The HydraContext the plugin runs its jobs with."""
    task_function: Callable[..., Any]
    """What each job process runs."""
    exp: Experiment
    """The batch's first job: its launcher and sweep sections hold for every job (checked)."""
    single: bool
    """One run in its own directory (`hydra.sweep.subdir=.`), not a sweep."""
    jobs_at_once: int = 1
    """Local jobs run at once (`sweep.parallel_jobs`, fewer where this host takes fewer: `plan.host_share`)."""

    @property
    def sweep_dir(self) -> Path:
        return Path(str(self.config.hydra.sweep.dir))


class Launcher(Protocol):
    """One launcher. Every method gets (or is about) runs whose launcher section is this launcher's."""

    hands_over: bool
    """True: the jobs run in processes of their own elsewhere (a scheduler's jobs): every batch is
    handed over with `submit`, a stopped command cancels them (`cancel`), the command line reports
    each run's outcome, and an interrupted job returns normally (its result is what the submitter
    reads). False: the jobs run here, one after the other, or in a pool (`submit`) when
    `sweep.parallel_jobs` is above 1; an interrupted job stops the sweep."""

    def batch_problem(self, sections: Sequence[object]) -> Problem | None:
        """What is wrong with the launcher sections of one batch (this launcher's is among them)."""
        ...

    def submit_problem(self) -> Problem | None:
        """What stops a real launch before anything is written (a scheduler that does not answer)."""
        ...

    def submit(self, submission: Submission, overrides: list, first: int) -> list:
        """Hand the jobs (`overrides`, numbered from `first`) to the launcher's Hydra launcher plugin
        and wait for them; returns its JobReturns, in order."""
        ...

    def may_join(self, exp: Experiment, run_dir: Path) -> bool:
        """True when `run_dir` holds this same run, unfinished, started by another node's launcher."""
        ...

    def after_job(self, run_dir: Path, summary: dict) -> dict:
        """In the job's process, after its launch: what the job ends with (a requeue, for one)."""
        ...

    def cancel(self, sweep_dir: Path) -> None:
        """The command was stopped while jobs ran elsewhere: cancel them, wait until they have ended."""
        ...

    def job_logs(self, run_dir: Path) -> Path | None:
        """Where the jobs' own logs are, beside the run directory's (None: the run directory's)."""
        ...


def may_join(exp: Experiment, run_dir: Path) -> bool:
    """True when `run_dir` holds the same multi-node run, not finished, started by another node's
    launcher (every node's launcher writes the run files; whichever comes first)."""
    if exp.launcher.nnodes == 1 or (run_dir / rundir.SUMMARY).exists():
        return False
    return rundir.read_experiment(run_dir) is not None and identity.same(exp, run_dir)
