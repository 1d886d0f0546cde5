"""What a composed config chose besides the experiment: the Hydra plugins it runs with and the
config files it reads. A launcher other than qwen3exp's, a sweeper that is not installed, or a user's
file hidden behind a packaged one of the same name is refused before anything runs."""

from __future__ import annotations

from pathlib import Path

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from qwen3exp.config.argv import BASIC_SWEEPER, GROUPS, LAUNCHER_TARGET
from qwen3exp.config.compose import config_sources
from qwen3exp.errors import Problem, did_you_mean, one_of


def shadowed(cfg) -> list[Problem]:
    """A file of the user's that has the name of an option of an earlier config directory (the
    packaged one): Hydra takes the first in its search path, so the user's would be ignored without
    a word. Looked up in the config sources the composition used (`hydra.runtime.config_sources`)."""

    dirs = [
        Path(s["path"])
        for s in config_sources(cfg)
        if s["schema"] == "file" and s["provider"] not in ("hydra", "schema")
    ]
    problems = []
    for group in GROUPS:
        seen: dict[str, Path] = {}
        for d in dirs:
            for f in sorted((d / group).glob("*.yaml")) if (d / group).is_dir() else []:
                if f.stem in seen and seen[f.stem] != d:
                    problems.append(
                        Problem(
                            group,
                            f.stem,
                            f"{f} has the name of an option in {seen[f.stem]}, which comes first "
                            "in Hydra's search path, so it would be ignored",
                            "a file name that no earlier config directory uses",
                            f"rename it (e.g. {group}/my_{f.stem}.yaml) and select it with {group}=my_{f.stem}",
                        )
                    )
                seen.setdefault(f.stem, d)
    return problems


def hydra_plugin_problems(cfg) -> list[Problem]:
    """`hydra.launcher._target_` must be qwen3exp's launcher (it checks every batch of jobs; Hydra's
    basic or another launcher would start jobs no check has seen), and `hydra.sweeper._target_` an
    installed Hydra sweeper plugin (found through Hydra's public plugin discovery), so that a typo is
    exit 2 here, not a traceback once the sweep starts."""
    problems = []
    launcher = OmegaConf.select(cfg, "hydra.launcher._target_", throw_on_resolution_failure=False)
    if launcher != LAUNCHER_TARGET:
        problems.append(
            Problem(
                "hydra.launcher._target_",
                launcher,
                "qwen3exp runs every job through its own Hydra launcher, which checks each batch "
                "of jobs before any of them starts",
                f"hydra/launcher=qwen3exp ({LAUNCHER_TARGET})",
                "drop hydra/launcher=...; SLURM is launcher=slurm (it runs through "
                "hydra-submitit-launcher inside qwen3exp's launcher)",
            )
        )
    target = OmegaConf.select(cfg, "hydra.sweeper._target_", throw_on_resolution_failure=False)
    if target is not None and target != BASIC_SWEEPER:
        available = _sweeper_names()
        if target not in available:
            problems.append(
                Problem(
                    "hydra.sweeper._target_",
                    target,
                    "is not an installed Hydra sweeper plugin",
                    one_of(sorted(available)),
                    did_you_mean(str(target), sorted(available))
                    or "choose one with hydra/sweeper=<name>; plugins are pip packages (e.g. hydra-optuna-sweeper)",
                )
            )
    return problems


def _sweeper_names() -> set[str]:
    return {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)}
