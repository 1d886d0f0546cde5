"""The configs of a sweep's jobs, each composed once.

Hydra composes every job twice: its sweepers check that a batch composes
(`Sweeper.validate_batch_is_legal`), then the launcher composes each job again to run it; and a
grid's jobs differ only in a few values, yet each composition reads and merges every config file
again (about 0.15 s a job on a 2-core machine: 30 s for a 100-point grid's dry run).

`JobConfigs` is a Hydra `ConfigLoader` (Hydra's public interface) around Hydra's own. qwen3exp's
launcher puts it in the Hydra context it shares with the sweeper, so that:
- each job's config is composed once, and the sweeper's check and the launcher get the same one;
- a job whose overrides differ from an already composed job only in the values of the same plain
  keys (`training.lr=0.001` where the other has `training.lr=0.002`) gets that job's config with its
  own values set the way Hydra sets an override (`OmegaConf.update(cfg, key, value, merge=True)`),
  and its own `hydra.overrides.task` and `hydra.job.override_dirname`. Anything else (a config group,
  `+key`, `~key`, a hydra.* key, a list, a dict or an interpolation as the value) is composed by
  Hydra. `tests/test_one_pass.py` compares every derived config of a sweep with Hydra's own.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import OverrideType
from omegaconf import DictConfig, OmegaConf, open_dict

COMPOSED: Counter[str] = Counter()
"""How many configs this process composed through Hydra ("job", "derived"): the one-pass test reads it."""


@dataclass(frozen=True)
class _Split:
    shape: tuple
    """What Hydra must compose: the structural overrides and the keys (not values) of the plain ones."""
    values: list
    """The plain value overrides (parsed), in order."""


class JobConfigs(ConfigLoader):
    """Hydra's config loader, composing each sweep job once (see the module docstring)."""

    def __init__(self, inner: ConfigLoader) -> None:
        self.inner = inner
        self._jobs: dict[tuple[int, tuple[str, ...]], DictConfig] = {}
        self._templates: dict[tuple[int, tuple], DictConfig] = {}
        self._groups: dict[str, bool] = {}
        self._parser = OverridesParser.create()

    # Hydra's ConfigLoader interface: everything but sweep configs is Hydra's own.
    def load_configuration(self, config_name, overrides, run_mode, from_shell=True, validate_sweep_overrides=True):
        return self.inner.load_configuration(config_name, overrides, run_mode, from_shell, validate_sweep_overrides)

    def get_search_path(self):
        return self.inner.get_search_path()

    def get_sources(self):
        return self.inner.get_sources()

    def list_groups(self, parent_name):
        return self.inner.list_groups(parent_name)

    def get_group_options(self, group_name, results_filter=None, config_name=None, overrides=None):
        return self.inner.get_group_options(group_name, results_filter, config_name, overrides)

    def compute_defaults_list(self, config_name, overrides, run_mode):
        return self.inner.compute_defaults_list(config_name, overrides, run_mode)

    def seed(self, master_config: DictConfig, sweep_overrides: list[str], cfg: DictConfig) -> None:
        """A job whose config is already composed (a single run: the command line's composition)."""
        self._jobs[(id(master_config), tuple(sweep_overrides))] = cfg

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> DictConfig:
        """The job's config: Hydra's, or derived from a job of the same shape. The same job gets the
        same object again (the sweeper's check reads it; the launcher then sets the job's number)."""
        key = (id(master_config), tuple(sweep_overrides))
        if key not in self._jobs:
            self._jobs[key] = self._compose(master_config, list(sweep_overrides))
        return self._jobs[key]

    def _compose(self, master: DictConfig, overrides: list[str]) -> DictConfig:
        split = self._split(master, overrides)
        template = self._templates.get((id(master), split.shape)) if split is not None else None
        if template is None or split is None:
            COMPOSED["job"] += 1
            cfg = self.inner.load_sweep_config(master, overrides)
            if split is not None:  # a copy: the launcher changes the job's own config
                self._templates[(id(master), split.shape)] = copy.deepcopy(cfg)
            return cfg
        COMPOSED["derived"] += 1
        return _derived(template, master, split.values)

    def _split(self, master: DictConfig, overrides: list[str]) -> _Split | None:
        """The job's overrides as shape and plain values; None: Hydra composes it (a parse error
        included: Hydra reports it in its own words)."""
        try:
            parsed = self._parser.parse_overrides(overrides)
        except Exception:
            return None
        shape: list = []
        values = []
        for o in parsed:
            if self._plain(o, master):
                values.append(o)
                shape.append(("=", o.key_or_group))
            else:
                shape.append(o.input_line)
        keys = [o.key_or_group for o in values]
        if len(set(keys)) != len(keys):  # a key set twice: Hydra's order rules decide
            return None
        return _Split(tuple(shape), values)

    def _plain(self, o, master: DictConfig) -> bool:
        """A `key=value` of a key the config has, with a scalar value Hydra sets as it is."""
        key = o.key_or_group
        if o.type != OverrideType.CHANGE or o.package is not None or o.is_sweep_override():
            return False
        if key == "hydra" or key.startswith("hydra.") or "/" in key or self._is_group(key):
            return False
        value = o.value()
        if isinstance(value, str):
            return "${" not in value and "\\" not in value
        return value is None or isinstance(value, (bool, int, float))

    def _is_group(self, key: str) -> bool:
        """A config group of the top level (`model`, `platform`): `model=hf` picks a file."""
        if not self._groups:
            self._groups = {group: True for group in self.inner.list_groups("")}
        return key.split("@")[0] in self._groups


def _derived(template: DictConfig, master: DictConfig, values: list) -> DictConfig:
    """The template's config with these values, as Hydra would have composed it."""
    cfg = copy.deepcopy(template)
    for o in values:
        OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
    hydra_overrides = list(cfg.hydra.overrides.task)
    by_key = {o.key_or_group: o.input_line for o in values}
    task = []
    for line in hydra_overrides:  # the template's task overrides, the plain ones with this job's values
        key = line.split("=", 1)[0]
        task.append(by_key.get(key, line))
    with open_dict(cfg.hydra):
        cfg.hydra.overrides.task = task
        cfg.hydra.job.override_dirname = _override_dirname(task, cfg.hydra.job.config.override_dirname)
    OmegaConf.copy_cache(from_config=master, to_config=cfg)
    return cfg


def _override_dirname(task: list[str], conf: Any) -> str:
    """`hydra.job.override_dirname` as Hydra names it: the task overrides but the excluded keys,
    sorted, joined by item_sep, with `=` written as kv_sep."""
    exclude = set(conf.exclude_keys)
    parser = OverridesParser.create()
    lines = sorted(str(o.input_line) for o in parser.parse_overrides(task) if o.key_or_group not in exclude)
    return re.sub("[=]", str(conf.kv_sep), str(conf.item_sep).join(lines))
