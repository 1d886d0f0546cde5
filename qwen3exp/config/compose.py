"""The experiment part of a composed config, as plain data (`experiment_data`): the hydra node
dropped, interpolations resolved, each `???` value a Problem."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from qwen3exp.config import credentials, sources
from qwen3exp.config.argv import CONF_DIR
from qwen3exp.config.problems_of_hydra import describe_key, omegaconf_problem
from qwen3exp.errors import MISSING, ConfigError, Problem


def config_sources(cfg) -> list[dict]:
    """The config sources a composition used (provider, path, schema), from its hydra node."""
    sources = OmegaConf.to_container(cfg.hydra.runtime.config_sources)
    return [s for s in sources if isinstance(s, dict)] if isinstance(sources, list) else []


def experiment_data(cfg) -> tuple[dict, list[Problem]]:
    """The experiment part of a composed config (the hydra node dropped) as plain data, resolved;
    each `???` value is a Problem and is left out, so that validation reports it once and checks
    the rest."""
    job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    problems = []
    try:
        missing = sorted(OmegaConf.missing_keys(job))
    except OmegaConfBaseException as e:  # missing_keys resolves: a broken interpolation
        raise ConfigError([omegaconf_problem(e)]) from None
    for k in missing:
        problems.append(
            Problem(
                k,
                MISSING,
                "required value is not set (??? in the config)",
                describe_key(k),
                hint=f"set it on the command line: {k}=...",
            )
        )
        parent, _, leaf = k.rpartition(".")
        node = OmegaConf.select(job, parent) if parent else job
        with open_dict(node):
            del node[leaf]
    try:
        data = OmegaConf.to_container(job, resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError([*problems, omegaconf_problem(e)]) from None
    assert isinstance(data, dict)
    if isinstance(data.get("experiment"), dict):
        raise ConfigError([_headless_experiment(cfg, data["experiment"])])
    return data, [*problems, *credentials.url_credential_problems(data)]


def _headless_experiment(cfg, nested: dict) -> Problem:
    """An experiment file without `# @package _global_` that got through (a nested defaults list
    chose it): Hydra nested its keys under `experiment.`."""
    choice = OmegaConf.select(cfg, "hydra.runtime.choices.experiment", default="?")
    where = f"experiment/{choice}.yaml"
    for s in config_sources(cfg):
        if s["schema"] == "file" and (Path(s["path"]) / where).is_file():
            packaged = Path(s["path"]).resolve() == CONF_DIR
            where = f"{Path(s['path']).name}/{where}" if packaged else str(Path(s["path"]) / where)
            break
    return sources.headless_problem(str(choice), where, None, [str(k) for k in nested])
