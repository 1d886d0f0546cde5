"""Hydra's compose API (`initialize_config_dir` + `compose`) over the packaged config groups plus the
user's, every mistake turned into a `Problem` that names the key, the value and what is allowed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException, MissingConfigException
from omegaconf.errors import OmegaConfBaseException

from qwen3exp.config import file_limits, sources
from qwen3exp.config.argv import CONF_DIR, CONFIG_NAME, GROUPS, is_group_override, parse_overrides
from qwen3exp.config.compose import experiment_data
from qwen3exp.config.jobs import COMPOSED
from qwen3exp.config.names import register_resolvers
from qwen3exp.config.problems_of_hydra import omegaconf_problem, problems_from_compose_error
from qwen3exp.config.schema import check_experiment, validate_experiment
from qwen3exp.config.sweeps import representative_values
from qwen3exp.errors import ConfigError, Problem, did_you_mean, one_of


class Composer:
    """Hydra's compose API over the packaged config groups plus the user's (`hydra.searchpath`,
    which `--config-dir` becomes). Use as a context manager: it owns Hydra's global state while
    open. Compositions are cached by their overrides."""

    def __init__(self, config_dir: Path = CONF_DIR, config_name: str = CONFIG_NAME) -> None:
        self.config_dir = Path(config_dir)
        self.config_name = config_name
        self._cache: dict[tuple[str, ...], Any] = {}
        self._options: dict[tuple[str, tuple[str, ...]], list[str]] = {}
        self._init: Any = None
        self._checked: set[Path] = {CONF_DIR}
        """Config folders already looked at (`file_limits.folder_problems`; the packaged one needs none)."""
        self.broken: list[Problem] = []
        """The files of the config folders that break a limit: each refuses a composition that reads
        it (`file_limits.ReadGuard`); the others are named in a warning (`warnings`)."""
        self._searches: dict[tuple[str, ...], sources.SearchPath] = {}

    def __enter__(self) -> Composer:
        register_resolvers()
        GlobalHydra.instance().clear()
        self._init = initialize_config_dir(config_dir=str(self.config_dir), version_base="1.3", job_name="qwen3exp")
        self._init.__enter__()
        file_limits.guard(self.loader, CONF_DIR)  # every file Hydra reads is checked first
        return self

    def __exit__(self, *exc) -> None:
        self._init.__exit__(*exc)
        GlobalHydra.instance().clear()

    @property
    def loader(self):
        return GlobalHydra.instance().config_loader()

    def options(self, group: str, overrides: tuple[str, ...] = ()) -> list[str]:
        """The options of a config group in every config source (packaged and the user's)."""
        searchpath = tuple(o for o in overrides if o.split("=", 1)[0] == "hydra.searchpath")
        key = (group, searchpath)
        if key not in self._options:
            self._options[key] = sorted(
                self.loader.get_group_options(group, config_name=self.config_name, overrides=list(searchpath))
            )
        return self._options[key]

    def search_path(self, parsed: list) -> sources.SearchPath:
        """The config sources of a composition with these overrides, their folders looked at
        (`file_limits.folder_problems`: raises ConfigError for a folder that holds no config groups;
        a broken file is kept in `broken`, and refuses only a composition that reads it)."""
        key = tuple(o.input_line for o in parsed if o.key_or_group == sources.SEARCHPATH_KEY)
        if key not in self._searches:
            # The primary folder first: finding the search path reads the primary config (checked).
            errors, broken = file_limits.folder_problems([self.config_dir], self._checked)
            self.broken += broken
            if errors:
                raise ConfigError(errors)
            search = sources.SearchPath(self.loader, self.config_name, parsed)
            errors, broken = file_limits.folder_problems(search.folders(), self._checked)
            self.broken += broken
            if errors:
                raise ConfigError(errors)
            self._searches[key] = search
        return self._searches[key]

    def warnings(self) -> list[str]:
        """One line for each broken file of the config folders (after a composition that did not
        read them: one that reads a broken file is refused)."""
        return [file_limits.warning_line(p) for p in self.broken]

    def compose(self, overrides: list[str], *, context: str | None = None):
        """The composed config (the hydra node included); raises ConfigError naming every mistake."""
        key = tuple(overrides)
        if key not in self._cache:
            self._cache[key] = self._compose(list(overrides), context)
        return self._cache[key]

    def _compose(self, overrides: list[str], context: str | None):
        parsed = parse_overrides(overrides)
        try:
            search = self.search_path(parsed)
        except ConfigError as e:
            raise ConfigError(e.problems, context=context) from None
        problems = self.group_problems(parsed, tuple(overrides))
        if problems:
            raise ConfigError([*problems, *self._other_problems(parsed, problems)], context=context)
        try:  # reads the experiment files (each checked first: file_limits.ReadGuard)
            problems = sources.headless_problems(search, _experiment_choices(search, parsed))
        except ConfigError as e:
            problems = e.problems
        if problems:
            raise ConfigError(problems, context=context)
        try:
            COMPOSED["command line"] += 1
            return compose(config_name=self.config_name, overrides=overrides, return_hydra_config=True)
        except ConfigError as e:  # a file that breaks a limit (file_limits.ReadGuard)
            raise ConfigError(e.problems, context=context) from None
        except yaml.YAMLError as e:
            raise ConfigError([file_limits.yaml_problem(e)], context=context) from None
        except OmegaConfBaseException as e:
            raise ConfigError([omegaconf_problem(e)], context=context) from None
        except (HydraException, ValueError, TypeError) as e:
            raise ConfigError(self._diagnose(e, parsed), context=context) from None
        except Exception as e:  # e.g. MissingConfigException for a file a defaults list names
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(
                [Problem("(composition)", " ".join(overrides) or "(defaults)", first)], context=context
            ) from None

    def group_problems(self, parsed: list, overrides: tuple[str, ...]) -> list[Problem]:
        """Unknown options of config groups (model=natve), named with the options that exist."""
        problems = []
        for ov in parsed:
            group = ov.key_or_group.split("@")[0]
            if group not in GROUPS or ov.is_delete():
                continue
            options = self.options(group, overrides)
            values = representative_values(ov) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
            for v in values or []:
                if v not in options and v != "null":
                    problems.append(
                        self._unreadable(group, v)
                        or Problem(
                            group,
                            v,
                            f"no option {v!r} in config group {group!r}",
                            one_of(options),
                            did_you_mean(v, options),
                            source=f"command line {ov.input_line}",
                        )
                    )
        return problems

    def _unreadable(self, group: str, option: str) -> Problem | None:
        """The broken file of an option Hydra does not list (a link that loops, a FIFO)."""
        name = f"{group}/{option}"
        found = next((p for p in self.broken if str(p.value).endswith((f"/{name}.yaml", f"/{name}.yml"))), None)
        return replace(found, key=group, value=option, message=f"{found.value} {found.message}") if found else None

    def _other_problems(self, parsed: list, group_problems: list[Problem]) -> list[Problem]:
        """The mistakes besides an unknown group option: compose without that group's overrides and
        validate, so that one mistake does not hide another."""
        bad = {p.key for p in group_problems}
        rest = [o.input_line for o in parsed if o.key_or_group.split("@")[0].split(".")[0] not in bad]
        try:
            data, problems = experiment_data(self.compose(rest))
        except ConfigError as e:
            return e.problems
        return [*problems, *(p for p in check_experiment(data).problems if p.key.split(".")[0] not in bad)]

    def _diagnose(self, e: Exception, parsed: list) -> list[Problem]:
        """Name the overrides that failed: compose without the value overrides and look them up (a
        primary config that does not exist: --config-name)."""
        if isinstance(e, MissingConfigException) and e.missing_cfg_file == self.config_name:
            names = sorted(p.stem for p in self.config_dir.glob("*.yaml"))
            where = f"no {self.config_name}.yaml in the primary config folder {self.config_dir}"
            allowed = f"a config of that folder: {one_of(names)}" if names else "a .yaml file in that folder"
            return [Problem("--config-name", self.config_name, where, allowed, did_you_mean(self.config_name, names))]
        groups = [o for o in parsed if is_group_override(o) or o.is_hydra_override()]
        values = [o for o in parsed if o not in groups]
        try:
            base = compose(config_name=self.config_name, overrides=[o.input_line for o in groups])
        except Exception:
            base = None
        return problems_from_compose_error(e, values, base)


def _experiment_choices(search: sources.SearchPath, parsed: list) -> list[str]:
    """The experiment files a composition reads: the command line's `experiment=NAME` (each value
    of a sweep), else the one the primary config's defaults list names."""
    named = [ov for ov in parsed if ov.key_or_group == "experiment"]
    if not named:
        default = sources.default_experiment(search)
        return [default] if default else []
    values = [
        v
        for ov in named
        if not ov.is_delete()
        for v in (representative_values(ov) if ov.is_sweep_override() else [ov.get_value_element_as_str()])
    ]
    return [v for v in values if v and v != "null"]


def composition_problems(e: Exception, overrides: list[str], base) -> list[Problem]:
    """A composition error of Hydra's (a job of a sweep) as Problems naming the override."""
    cause = e.__cause__ if isinstance(e.__cause__, (yaml.YAMLError, OmegaConfBaseException)) else e
    if isinstance(cause, yaml.YAMLError):
        return [file_limits.yaml_problem(cause)]
    if isinstance(cause, OmegaConfBaseException) and not str(cause).startswith("Could not override"):
        return [omegaconf_problem(cause)]
    try:
        parsed = parse_overrides(overrides)
    except ConfigError as parse_error:
        return parse_error.problems
    values = [o for o in parsed if not (is_group_override(o) or o.is_hydra_override())]
    return problems_from_compose_error(e, values, base)


def compose_experiment(overrides: list[str], *, config_dir: Path = CONF_DIR, config_name: str = CONFIG_NAME):
    """The validated Experiment of these overrides (raises ConfigError on any mistake)."""
    with Composer(config_dir, config_name) as c:
        data, problems = experiment_data(c.compose(overrides))
    if problems:
        raise ConfigError(problems)
    return validate_experiment(data)
