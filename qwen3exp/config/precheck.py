"""Before Hydra runs: the config of a run (for a sweep: the common part, and once per option of a
swept config group) is composed here (`precheck`), so that a typo is exit 2 with a clear message
instead of Hydra's traceback. It also yields the run or sweep directory to claim, and a single run's
experiment, validated once (the launcher runs that composition: `launchers.single`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from qwen3exp.config import choices, credentials, sweeps
from qwen3exp.config.argv import BASIC_SWEEPER, GROUPS, Invocation, parse_overrides, quote_value
from qwen3exp.config.compose import experiment_data
from qwen3exp.config.composer import Composer
from qwen3exp.config.names import placement_problems
from qwen3exp.config.problems_of_hydra import omegaconf_problem
from qwen3exp.config.schema import Checked, check_experiment
from qwen3exp.config.sweeps import representative_values
from qwen3exp.errors import ConfigError, Problem


@dataclass(frozen=True)
class Prechecked:
    """A composed config's experiment, validated once."""

    problems: list[Problem]
    """The config's own problems (`???` values, URL credentials)."""
    checked: Checked


def validated(cfg, context: str | None = None) -> Prechecked:
    """The experiment of a composed config, validated (raises ConfigError for a config whose
    experiment part cannot even be read: an interpolation that does not resolve)."""
    try:
        data, problems = experiment_data(cfg)
    except ConfigError as e:
        raise ConfigError(e.problems, context=context) from None
    return Prechecked(problems, check_experiment(data))


@dataclass
class Master:
    """What the command line composes to before Hydra runs."""

    cfg: Any
    """The composed config (sweep overrides at their first value)."""
    multirun: bool
    output_dir: str
    """The run directory (multirun: the sweep directory), resolved once."""
    sweeps: list[str] = field(default_factory=list)
    """The sweep overrides: hydra.sweeper.params (from the config) first, then the command line's."""
    sweeper: str = BASIC_SWEEPER
    """hydra.sweeper._target_ of the composed config."""
    extra: list[str] = field(default_factory=list)
    """Overrides the command line adds when it runs Hydra (a single run: the basic sweeper, no params)."""
    prechecked: Prechecked | None = None
    """A single run's experiment, validated once (the launcher reuses it); None for a sweep."""

    @property
    def adaptive(self) -> bool:
        """A sweeper that chooses its points as it goes (Optuna): nobody knows them before it runs."""
        return self.multirun and self.sweeper != BASIC_SWEEPER


SEARCH_ONLY = "interval() and tag() describe a search space for an adaptive sweeper"


def sweeper_params(cfg) -> list[str]:
    """`hydra.sweeper.params` of a composed config as overrides (`key=value`), the way Hydra's
    sweepers read them (the command line's own sweep overrides come after these and win)."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None, throw_on_resolution_failure=False)
    if not OmegaConf.is_dict(params):
        return []
    return [f"{k}={v}" for k, v in params.items()]


SHOWS_COMPOSITION = ("--cfg", "-c", "--info", "-i")
"""Hydra's flags that compose the command line's overrides to show them."""


def check_files(inv: Invocation) -> None:
    """For a command that runs Hydra without `precheck` (--cfg, --info, --hydra-help): the
    composition it shows (a sweep: at its first values), composed first, so that each file it reads
    is within the limits (`file_limits`) and each option it names exists; raises ConfigError. Other
    flags (--hydra-help, --shell-completion, whose words are no overrides) compose nothing."""
    with Composer(inv.config_dir, inv.config_name) as c:
        c.search_path(parse_overrides(inv.overrides))
        if not any(f.split("=", 1)[0] in SHOWS_COMPOSITION for f in inv.info_flags):
            return
        parsed = parse_overrides(inv.overrides, config_loader=c.loader)
        if problems := c.group_problems(parsed, tuple(inv.overrides)):
            raise ConfigError(problems)
        fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        c.compose(fixed + [_with_value(o, v) for o in parsed if o.is_sweep_override() and (v := sweeps.first_value(o))])
        _warn(c)


def _warn(c: Composer) -> None:
    """A broken file of the config folders that this composition did not read: one line each."""
    for line in c.warnings():
        print(line, file=sys.stderr)


def precheck(inv: Invocation) -> Master:
    """Compose the run (a sweep: its common part, and each option of a swept config group) through
    Hydra's compose API and report every mistake as Problems (raises ConfigError). A sweep's points
    come from the command line and from `hydra.sweeper.params` in the config files, as for Hydra's
    sweepers. A single run's experiment is validated here, once."""
    if problems := _credential_overrides(inv.overrides):
        raise ConfigError(problems)
    with Composer(inv.config_dir, inv.config_name) as c:
        c.search_path(parse_overrides(inv.overrides))  # the config files' limits, before Hydra reads any
        # glob() lists a config group's options: the parser needs Hydra's config loader for it.
        parsed = parse_overrides(inv.overrides, config_loader=c.loader)
        cli_sweeps = [o for o in parsed if o.is_sweep_override()]
        if problems := sweeps.single_problems(cli_sweeps):
            raise ConfigError(problems)
        fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
        base = fixed + [_with_value(o, v) for o in cli_sweeps if (v := sweeps.first_value(o)) is not None]
        try:
            cfg0 = c.compose(base)
        except ConfigError as e:
            raise ConfigError.several([e, *_group_variant_errors(c, fixed, cli_sweeps)]) from None
        sweeper = str(OmegaConf.select(cfg0, "hydra.sweeper._target_", default=BASIC_SWEEPER))
        multirun = inv.multirun or str(OmegaConf.select(cfg0, "hydra.mode")) == "RunMode.MULTIRUN"
        file_sweeps, extra = _file_sweeps(c, cfg0, parsed, cli_sweeps, multirun, sweeper)
        swept = [o for o in [*file_sweeps, *cli_sweeps] if o.is_sweep_override()]
        _sweep_problems(swept, file_sweeps, sweeper)
        all_fixed = fixed + [o.input_line for o in file_sweeps if not o.is_sweep_override()]
        cfg = c.compose(all_fixed + [_with_value(o, v) for o in swept if (v := sweeps.first_value(o)) is not None])
        if errors := _group_variant_errors(c, all_fixed, swept):
            raise ConfigError.several(errors)
        if problems := choices.shadowed(cfg) + choices.hydra_plugin_problems(cfg):
            raise ConfigError(problems)
        checked = _experiment_problems(cfg, multirun)
        output_dir = _output_dir(cfg, multirun)
        _warn(c)
    return Master(cfg, multirun, output_dir, [o.input_line for o in swept], sweeper, extra, checked)


def _file_sweeps(c: Composer, cfg0, parsed: list, cli_sweeps: list, multirun: bool, sweeper: str):
    """The sweep overrides of `hydra.sweeper.params` (those of keys the command line does not set),
    and the overrides a single run adds (as with Hydra, a single run is one job, whatever sweeper and
    params the config names)."""
    extra: list[str] = []
    params = sweeper_params(cfg0)
    if not multirun:
        if cli_sweeps:
            raise ConfigError(
                [
                    Problem(
                        "(command line)",
                        " ".join(o.input_line for o in cli_sweeps),
                        "is a sweep, but the command is a single run",
                        "add -m (--multirun) to run the sweep, or give one value per key",
                    )
                ]
            )
        if sweeper != BASIC_SWEEPER:
            extra.append("hydra/sweeper=basic")
        if params:
            extra.append("hydra.sweeper.params=null")
            print(
                f"note: hydra.sweeper.params ({', '.join(p.split('=', 1)[0] for p in params)}) is a sweep; "
                "this single run ignores it (add -m to sweep)",
                file=sys.stderr,
            )
        params = []
    cli_keys = {o.key_or_group for o in parsed}  # the command line's value for a key wins
    return [o for o in parse_overrides(params, config_loader=c.loader) if o.key_or_group not in cli_keys], extra


def _sweep_problems(swept: list, file_sweeps: list, sweeper: str) -> None:
    """Sweeps Hydra would refuse only once the sweep directory exists (exit 1), or cannot expand."""
    if hydra_swept := [o for o in swept if o.key_or_group.split("@")[0].lstrip("+~").startswith("hydra.")]:
        raise ConfigError(
            [
                Problem(
                    o.key_or_group,
                    o.input_line.split("=", 1)[1],
                    "is a sweep over Hydra's own settings, which Hydra does not support",
                    "one value for every hydra.* key of a sweep",
                    "run one sweep per value",
                )
                for o in hydra_swept
            ]
        )
    if sweeper != BASIC_SWEEPER:
        return
    if search := [o for o in swept if sweeps.sweep_size(o) is None]:
        raise ConfigError(
            [
                Problem(
                    o.key_or_group,
                    o.input_line.split("=", 1)[1],
                    f"{SEARCH_ONLY}; Hydra's basic sweeper (the default) cannot expand it",
                    "a list (a,b,c), range(), choice() or glob(); or an adaptive sweeper: "
                    "hydra/sweeper=optuna (pip install 'qwen3exp[optuna]')",
                    source="hydra.sweeper.params" if o in file_sweeps else "command line",
                )
                for o in search
            ]
        )
    if problems := sweeps.size_problems(swept, file_sweeps=tuple(file_sweeps)):
        raise ConfigError(problems)


def _experiment_problems(cfg, multirun: bool) -> Prechecked | None:
    """The experiment's own problems that must stop the launch here (URL credentials, before Hydra
    records any value; a bad name, before the run directory is named from it). A single run's
    experiment is validated here once and the launcher reuses it; a sweep's jobs are validated by
    the launcher, each once."""
    data, problems = experiment_data(cfg)  # an interpolation that does not resolve, named by its key
    if bad := credentials.url_credential_problems(data):
        raise ConfigError(bad)
    if multirun:
        return None
    checked = Prechecked(problems, check_experiment(data))
    if bad := [p for p in checked.checked.problems if p.key == "name"]:
        raise ConfigError(bad)
    return checked


def _output_dir(cfg, multirun: bool) -> str:
    try:
        HydraConfig.instance().set_config(cfg)
        output_dir = str(OmegaConf.select(cfg, "hydra.sweep.dir" if multirun else "hydra.run.dir"))
    except OmegaConfBaseException as e:
        raise ConfigError([omegaconf_problem(e)]) from None
    if problems := placement_problems(cfg, multirun=multirun):
        raise ConfigError(problems)
    return output_dir


def _credential_overrides(overrides: list[str]) -> list[Problem]:
    """A value override that holds URL credentials (each value of a sweep, an unknown key too),
    refused before anything could print or record it; hydra.* overrides (hydra.job.env_set) may:
    their records are redacted."""
    problems = []
    for o in overrides:
        key, _, value = o.partition("=")
        if not key.lstrip("+~").startswith(("hydra.", "hydra/")) and credentials.URL_USERINFO.search(value):
            problems += [
                replace(p, key=key.lstrip("+~"), source="command line " + credentials.mask_urls(o))
                for p in credentials.url_credential_problems(value)
            ]
    return problems


def _group_variant_errors(c: Composer, fixed: list[str], swept: list) -> list[ConfigError]:
    """Compose once per further option of each swept config group (the others at their first
    value): a group option brings its own files and keys, so each is checked here."""
    firsts = {o.input_line.split("=", 1)[0]: _with_value(o, vs[0]) for o in swept if (vs := representative_values(o))}
    errors = []
    for o in swept:
        if o.key_or_group.split("@")[0] not in GROUPS:
            continue
        key = o.input_line.split("=", 1)[0]
        for v in representative_values(o)[1:]:
            variant = fixed + [f if k != key else _with_value(o, v) for k, f in firsts.items()]
            try:
                c.compose(variant)
            except ConfigError as e:
                errors.append(e)
    return errors


def _with_value(ov, value: str) -> str:
    key = ov.input_line.split("=", 1)[0]
    return f"{key}={quote_value(value)}"
