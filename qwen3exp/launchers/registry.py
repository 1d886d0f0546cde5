"""Every launcher, by the class of its validated launcher section (`LAUNCHERS`, one line per
launcher), and the lookups the command line and qwen3exp's Hydra launcher use: `launcher_of` (a
validated section), `of_batch` (the launcher that runs a checked batch)."""

from __future__ import annotations

from collections.abc import Sequence

from qwen3exp.config.schema import Experiment
from qwen3exp.config.sections.launcher import LocalLauncher, SlurmLauncher
from qwen3exp.errors import ConfigError
from qwen3exp.launchers import local, slurm
from qwen3exp.launchers.protocol import Launcher

LAUNCHERS: dict[type, Launcher] = {
    LocalLauncher: local.LAUNCHER,
    SlurmLauncher: slurm.LAUNCHER,
}
"""Each launcher section's `Launcher`, by the section's class (the schema's launcher union). A new
launcher adds its section there, a line here and one in `qwen3exp.plan.placement.NODES`."""


def launcher_of(section: object) -> Launcher:
    """The launcher of a validated launcher section (`exp.launcher`)."""
    return LAUNCHERS[type(section)]


def default() -> Launcher:
    """The launcher of the schema's default launcher section."""
    return launcher_of(Experiment.model_fields["launcher"].default)


def of_batch(sections: Sequence[object]) -> Launcher:
    """The launcher that runs a checked batch (its points' launcher sections): the first one that
    hands its jobs over, when its sections agree (else ConfigError), or the first point's."""
    launchers = [launcher_of(s) for s in sections]
    for launcher in launchers:
        if launcher.hands_over:
            if (problem := launcher.batch_problem(sections)) is not None:
                raise ConfigError([problem])
            return launcher
    return launchers[0] if launchers else default()
