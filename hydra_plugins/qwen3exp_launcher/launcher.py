"""qwen3exp's Hydra launcher plugin (`hydra/launcher=qwen3exp`, the default in qwen3exp's config).

Every Hydra sweeper hands its batches of jobs to the launcher's `launch(job_overrides, ...)`: the
basic sweeper one batch for a grid, an adaptive sweeper (Optuna) one batch per round of trials. So
this is where every job is checked before any job of its batch starts, whatever the sweeper. The
work is done by `qwen3exp.launchers.batch`; this class is the part Hydra's plugin discovery needs
(plugins live in the `hydra_plugins` namespace package).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from qwen3exp.config.jobs import JobConfigs
from qwen3exp.launchers import batch


class Qwen3expLauncher(Launcher):
    def __init__(self, **params: Any) -> None:
        self.params = params
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        # The sweeper shares this context: with JobConfigs in it, the sweeper's check of a batch and
        # this launcher get each job's config from one composition (qwen3exp.config.jobs).
        if not isinstance(hydra_context.config_loader, JobConfigs):
            hydra_context.config_loader = JobConfigs(hydra_context.config_loader)
        self.config = config
        self.hydra_context = hydra_context
        self.task_function = task_function

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        return batch.launch(self.config, self.hydra_context, job_overrides, initial_job_idx)


@dataclass
class Qwen3expLauncherConf:
    _target_: str = "hydra_plugins.qwen3exp_launcher.launcher.Qwen3expLauncher"


# `hydra/launcher=qwen3exp` (the default of qwen3exp's config, and what `qwen3exp relaunch` selects
# for a recorded config), registered when Hydra's plugin discovery imports this module.
ConfigStore.instance().store(group="hydra/launcher", name="qwen3exp", node=Qwen3expLauncherConf, provider="qwen3exp")
