"""Hydra composition outside of `@hydra.main`: parse the command line, expand sweeps, compose each
point, and turn mistakes into `Problem`s that name the key, the value and what is allowed.

The launcher validates every point of a run or sweep with these functions before Hydra starts any
job; Hydra itself (run or multirun) then composes the same overrides again for the real jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qwen3exp.errors import ConfigError, MISSING, Problem, did_you_mean, one_of
from qwen3exp.sweep import register_resolver

# conf/config.yaml names sweep job folders with ${qwen3exp.safe_dirname:...}; every process that
# composes (this one, and a launcher plugin's job process, which imports qwen3exp.cli) needs it.
register_resolver()

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CONFIG_NAME = "config"
GROUPS = ("model", "parallelism", "kernels", "checkpoint", "platform", "data", "launcher", "experiment")

# Flags that take a value and belong to Hydra itself.
_HYDRA_VALUE_FLAGS = {"--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
                      "--experimental-rerun"}
_HYDRA_BARE_FLAGS = {"--resolve"}


@dataclass
class Invocation:
    multirun: bool = False
    overrides: list[str] = field(default_factory=list)
    """User overrides (key=value, group=option, +key=value, ~key), hydra.* included."""
    config_dir: Path = CONF_DIR
    config_name: str = CONFIG_NAME
    info_flags: list[str] = field(default_factory=list)
    """Flags Hydra answers by itself (--help, --cfg job, --info ...): passed straight through."""
    output_dir: str | None = None
    """The run directory (multirun: the sweep directory) as composed by the preflight; Hydra is
    then pinned to it, so `${now:...}` in the default names resolves once for every point."""

    @property
    def user_overrides(self) -> list[str]:
        return [o for o in self.overrides if not o.lstrip("+~").startswith("hydra.")]

    def hydra_argv(self, extra: list[str]) -> list[str]:
        argv = ["--config-path", str(self.config_dir), "--config-name", self.config_name]
        if self.multirun:
            argv.append("--multirun")
        return [*argv, *self.info_flags, *self.overrides, *extra]


def parse_argv(argv: list[str]) -> Invocation:
    inv = Invocation()
    it = iter(argv)
    for arg in it:
        if arg in ("-m", "--multirun"):
            inv.multirun = True
        elif arg in ("--config-path", "-cp"):
            inv.config_dir = Path(next(it, ".")).resolve()
        elif arg.startswith("--config-path="):
            inv.config_dir = Path(arg.split("=", 1)[1]).resolve()
        elif arg in ("--config-name", "-cn"):
            inv.config_name = next(it, CONFIG_NAME)
        elif arg.startswith("--config-name="):
            inv.config_name = arg.split("=", 1)[1]
        elif arg in _HYDRA_VALUE_FLAGS:
            inv.info_flags += [arg, next(it, "")]
        elif arg.startswith("-") and arg not in _HYDRA_BARE_FLAGS and "=" not in arg:
            inv.info_flags.append(arg)
            if arg in ("--cfg", "-c", "--package", "-p", "--info", "-i") :
                nxt = next(it, None)
                if nxt is not None:
                    inv.info_flags.append(nxt)
        else:
            inv.overrides.append(_global_experiment(arg))
    return inv


def _global_experiment(arg: str) -> str:
    """`experiment=X` -> `experiment@_global_=X`.

    conf/config.yaml lists the group as `experiment@_global_` so that experiment files need no
    `# @package _global_` header and can start with the command that runs them; Hydra then only
    accepts the override under that full name, which nobody should have to type."""
    for prefix in ("experiment=", "+experiment=", "~experiment="):
        if arg.startswith(prefix):
            return arg.replace("experiment=", "experiment@_global_=", 1)
    return arg


def shown(override: str) -> str:
    """An override as the user typed it (`experiment@_global_=x` -> `experiment=x`)."""
    return override.replace("experiment@_global_=", "experiment=", 1)


def group_options(config_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    return {g: sorted(p.stem for p in (config_dir / g).glob("*.yaml")) for g in GROUPS if (config_dir / g).is_dir()}


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """Expand Hydra sweep syntax (a=1,2 b=x,y, range(), choice()) into the list of points."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = _parse(overrides)
    (batch,) = BasicSweeper.split_arguments(parsed, None)
    return batch


def _parse(overrides: list[str]):
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        return OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:
        raise ConfigError([Problem("(command line)", " ".join(overrides), f"cannot parse: {e}",
                                   "key=value, group=option, +key=value, ~key")]) from None


def check_group_choices(overrides: list[str], config_dir: Path) -> list[Problem]:
    """Unknown options of config groups (model=natve), named with the options that exist."""
    options = group_options(config_dir)
    problems = []
    for ov in _parse(overrides):
        key = ov.key_or_group
        if key in options and not ov.is_delete():
            values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
            for v in values:
                if v not in options[key] and v != "null":
                    problems.append(Problem(key, v, f"no option {v!r} in config group {key!r}",
                                            one_of(options[key]), did_you_mean(v, options[key]),
                                            source="command line"))
    return problems


@dataclass
class Composed:
    data: dict
    """The resolved experiment as plain data (hydra node dropped)."""
    run_dir: str
    sweep_dir: str
    overrides: list[str]
    sweep_subdir: str | None = None
    """This point's folder under sweep_dir (composed with job_num; None otherwise)."""


def compose_point(overrides: list[str], *, config_dir: Path = CONF_DIR, config_name: str = CONFIG_NAME,
                  context: str | None = None, job_num: int | None = None) -> Composed:
    """Compose one point. `job_num`: the point's index in a sweep (Hydra's hydra.job.num), so that
    the sweep subdir resolves as it will in the real job."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict, read_write
    from omegaconf.errors import OmegaConfBaseException

    problems = check_group_choices(overrides, config_dir)
    if problems:
        raise ConfigError(problems, context=context)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="qwen3exp"):
            try:
                cfg = compose(config_name=config_name, overrides=overrides, return_hydra_config=True)
            except (HydraException, OmegaConfBaseException) as e:
                raise ConfigError(_problems_from_compose_error(e, overrides, config_dir, config_name),
                                  context=context) from None
    finally:
        GlobalHydra.instance().clear()
    job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    missing = sorted(OmegaConf.missing_keys(job))
    if missing:
        raise ConfigError([Problem(k, MISSING, "required value is not set (??? in the config)",
                                   hint=f"set it on the command line: {k}=...") for k in missing],
                          context=context)
    try:
        data = OmegaConf.to_container(job, resolve=True)
        run_dir = str(cfg.hydra.run.dir)
        sweep_dir = str(cfg.hydra.sweep.dir)
        sweep_subdir = None
        if job_num is not None:
            with read_write(cfg.hydra), open_dict(cfg.hydra):
                cfg.hydra.job.num = job_num
                cfg.hydra.job.id = str(job_num)
            sweep_subdir = str(cfg.hydra.sweep.subdir)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "(interpolation)"
        raise ConfigError([Problem(str(key), getattr(e, "msg", str(e)), "cannot resolve interpolation")],
                          context=context) from None
    return Composed(data, run_dir, sweep_dir, overrides, sweep_subdir)


def _problems_from_compose_error(e: Exception, overrides: list[str], config_dir: Path,
                                 config_name: str) -> list[Problem]:
    """Name the offending override: an unknown key gets the keys that exist and a 'did you mean'."""
    from omegaconf import OmegaConf

    msg = str(e)
    problems = []
    try:
        parsed = _parse(overrides)
    except ConfigError:
        parsed = []
    base = _base_config(overrides, config_dir, config_name)
    for ov in parsed:
        key = ov.key_or_group
        if key.startswith("hydra.") or ov.key_or_group in GROUPS or ov.is_add() or base is None:
            continue
        parent_key, _, leaf = key.rpartition(".")
        parent = OmegaConf.select(base, parent_key) if parent_key else base
        if parent is None or not OmegaConf.is_dict(parent):
            problems.append(Problem(key, ov.get_value_element_as_str(), f"unknown section {parent_key!r}",
                                    one_of(k for k in base.keys() if k != "hydra"),
                                    did_you_mean(parent_key, [k for k in base.keys() if k != "hydra"]),
                                    source="command line"))
        elif leaf not in parent:
            siblings = [str(k) for k in parent.keys()]
            full = [f"{parent_key}.{s}" if parent_key else s for s in siblings]
            problems.append(Problem(key, ov.get_value_element_as_str(), "unknown key", one_of(siblings),
                                    did_you_mean(key, full), source="command line"))
    if not problems:
        first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
        problems.append(Problem("(composition)", " ".join(overrides), first))
    return problems


def _base_config(overrides: list[str], config_dir: Path, config_name: str):
    """The composed config with only the group choices applied (to look keys up in)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    try:
        groups = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in GROUPS]
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3", job_name="qwen3exp"):
            return compose(config_name=config_name, overrides=groups)
    except Exception:
        return None
    finally:
        GlobalHydra.instance().clear()
