"""A single run: the config the command line composed and validated (`config.precheck`) is the job's.

Hydra's sweeper would compose it twice more (its own config, then the job's), and the launcher would
validate it again; here it becomes a one-job batch of qwen3exp's launcher (`batch.launch`) with that
config and that validation, in the run directory the command line claimed (`hydra.sweep.subdir=.`).
The job still runs through Hydra's public `run_job` (its folder, `.hydra/`, logging, callbacks).
"""

from __future__ import annotations

from hydra.types import HydraContext
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from qwen3exp.config.argv import Invocation, quote_value
from qwen3exp.config.composer import Composer
from qwen3exp.config.jobs import JobConfigs
from qwen3exp.config.precheck import Master
from qwen3exp.launchers import batch


class Callbacks:
    """The run's `hydra.callbacks` (Hydra's public `Callback` interface), called as Hydra calls them
    around a job: each callback's on_job_start in order, on_job_end in reverse order."""

    def __init__(self, cfg) -> None:
        configured = OmegaConf.select(cfg, "hydra.callbacks", default=None) or {}
        self.callbacks = [instantiate(c) for c in configured.values()]

    def on_job_start(self, config, **kwargs) -> None:
        for c in self.callbacks:
            c.on_job_start(config=config, **kwargs)

    def on_job_end(self, config, job_return, **kwargs) -> None:
        for c in reversed(self.callbacks):
            c.on_job_end(config=config, job_return=job_return, **kwargs)


def launch_run(inv: Invocation, master: Master) -> None:
    """Check, plan and run the single run `master` holds (composed once, validated once)."""
    cfg = master.cfg
    out = master.output_dir
    OmegaConf.set_readonly(cfg.hydra, False)  # as in a job's config from Hydra's loader
    with open_dict(cfg.hydra):
        cfg.hydra.sweep.dir = out
        cfg.hydra.sweep.subdir = "."
        # Another launcher's job process (SLURM) composes the job from these: the same folder.
        cfg.hydra.overrides.hydra.extend([f"hydra.sweep.dir={quote_value(out)}", "hydra.sweep.subdir=."])
    overrides = [str(o) for o in cfg.hydra.overrides.task]
    with Composer(inv.config_dir, inv.config_name) as composer:  # Hydra's loader: composes nothing here
        loader = JobConfigs(composer.loader)
        loader.seed(cfg, overrides, cfg)
        # Hydra's context takes any object with Hydra's callback methods (its own class is internal).
        context = HydraContext(config_loader=loader, callbacks=Callbacks(cfg))  # type: ignore[arg-type]
        [ret] = batch.launch(cfg, context, [overrides], 0, prechecked=master.prechecked)
    _ = ret.return_value  # Hydra's JobReturn raises what the job raised
