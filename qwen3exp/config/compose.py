"""From the command line to Hydra's composed config, through Hydra's public API only.

- `parse_argv`: Hydra's flags as qwen3exp runs them. A flag that would make Hydra run something no
  check has seen is refused (exit 2); `--config-dir DIR` becomes Hydra's own `hydra.searchpath`.
- `Composer`: Hydra's compose API (`initialize_config_dir` + `compose`), every mistake turned into a
  `Problem` that names the key, the value and what is allowed.
- `precheck`: before Hydra runs, the config of a run (for a sweep: the common part, and once per
  option of a swept config group) is composed here, so that a typo is exit 2 with a clear message
  instead of Hydra's traceback. It also yields the run or sweep directory to claim.
- `experiment_data`: the experiment part of a composed config as plain data (`???` values as
  Problems).

Hydra composes the jobs themselves (its sweeper hands them to qwen3exp's launcher, which checks each
batch before any job of it starts: `qwen3exp.launchers.batch`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from qwen3exp.config import credentials, sources, sweeps
from qwen3exp.config.names import placement_problems, register_resolvers
from qwen3exp.config.sweeps import representative_values
from qwen3exp.errors import MISSING, ConfigError, Problem, did_you_mean, nearby_path, one_of

CONF_DIR = (Path(__file__).parent.parent / "conf").resolve()
"""The packaged config groups: in a wheel, qwen3exp/conf; in the source tree a link to conf/."""
CONFIG_NAME = "config"
GROUPS = ("model", "parallelism", "kernels", "checkpoint", "platform", "data", "launcher", "experiment")
LAUNCHER_TARGET = "hydra_plugins.qwen3exp_launcher.launcher.Qwen3expLauncher"
"""qwen3exp's Hydra launcher (conf: hydra/launcher=qwen3exp): it checks every batch of jobs."""
LAUNCHER_OVERRIDE = "hydra/launcher=qwen3exp"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""Hydra's default sweeper, by the name its config gives (a string: nothing of Hydra's internals is imported)."""

# Hydra's flags, by what qwen3exp does with them. Everything else that starts with '-' is refused
# (exit 2): a flag passed through to Hydra unchecked could start a run that no check has seen.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--info", "-i", "--cfg", "-c",
               "--shell-completion", "-sc", "--resolve", "--package", "-p"}
"""Flags that make Hydra print something instead of running the task (nothing starts)."""
_INFO_VALUE = {"--cfg": ("job", "hydra", "all"), "-c": ("job", "hydra", "all"),
               "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
               "-i": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")}
_REFUSED = {"--experimental-rerun": "rerun a recorded run with qwen3exp relaunch RUN_DIR (it checks the "
                                    "recorded config before running anything)"}


@dataclass
class Invocation:
    multirun: bool = False
    overrides: list[str] = field(default_factory=list)
    """User overrides (key=value, group=option, +key=value, ~key), hydra.* included; --config-dir
    becomes a `hydra.searchpath` override here, so that the checks and the run see the same files."""
    config_dir: Path = CONF_DIR
    config_name: str = CONFIG_NAME
    info_flags: list[str] = field(default_factory=list)
    """Flags Hydra answers by itself (--help, --cfg job, --info ...): passed straight through."""
    def hydra_argv(self, extra: list[str], *, multirun: bool) -> list[str]:
        argv = ["--config-path", str(self.config_dir), "--config-name", self.config_name]
        if multirun:
            argv.append("--multirun")
        return [*argv, *self.info_flags, *self.overrides, *extra]


_FLAG_ALLOWED = ("-m/--multirun, -v/--verbose, --config-dir/-cd DIR, --config-path/-cp DIR, --config-name/-cn NAME, "
                 "--help, --hydra-help, --version, --info [all|config|defaults|...], --cfg job|hydra|all "
                 "[--package PKG] [--resolve], --shell-completion; everything else is key=value")


def parse_argv(argv: list[str]) -> Invocation:
    """Hydra's command line, as qwen3exp runs it; raises ConfigError for a flag it does not run
    through the checks (exit 2 before anything starts)."""
    inv = Invocation()
    problems: list[Problem] = []
    config_dirs: list[str] = []
    args = list(argv)
    i = 0

    def value(flag: str) -> str | None:
        nonlocal i
        if "=" in args[i] and args[i].startswith("-"):
            return args[i].split("=", 1)[1]
        if i + 1 < len(args):
            i += 1
            return args[i]
        problems.append(Problem("(command line)", flag, "needs a value", _FLAG_ALLOWED))
        return None

    while i < len(args):
        arg = args[i]
        flag = arg.split("=", 1)[0] if arg.startswith("-") else arg
        if arg in ("-m", "--multirun"):
            inv.multirun = True
        elif arg in ("-r", "--run"):
            pass  # run mode is the default
        elif arg in ("-v", "--verbose"):
            inv.overrides.append("verbose=true")  # the experiment key: every line the ranks print
        elif flag in ("--config-path", "-cp"):
            if (v := value(flag)) is not None:
                inv.config_dir = Path(v).resolve()
        elif flag in ("--config-name", "-cn"):
            if (v := value(flag)) is not None:
                inv.config_name = v
        elif flag in ("--config-dir", "-cd"):
            if (v := value(flag)) is not None:
                config_dirs.append(v)
        elif flag in _REFUSED:
            problems.append(Problem("(command line)", arg, "is not run by qwen3exp", _REFUSED[flag]))
            value(flag)
        elif flag in _INFO_FLAGS:
            inv.info_flags.append(arg)
            options = _INFO_VALUE.get(flag)
            if options and "=" not in arg and i + 1 < len(args) and args[i + 1] in options:
                i += 1
                inv.info_flags.append(args[i])
            elif flag in ("--package", "-p") and "=" not in arg:
                if (v := value(flag)) is not None:
                    inv.info_flags.append(v)
        elif arg.startswith("-"):
            problems.append(Problem("(command line)", arg, "unknown flag", _FLAG_ALLOWED))
        else:
            inv.overrides.append(arg)
        i += 1
    if inv.info_flags and any(f in ("--package", "-p") for f in inv.info_flags) and \
            not any(f.split("=")[0] in ("--cfg", "-c") for f in inv.info_flags):
        problems.append(Problem("(command line)", "--package", "only prints a config package together with --cfg",
                                "--cfg job|hydra|all --package PKG"))
    dirs = []
    for d in config_dirs:
        path = Path(d).expanduser().resolve()
        if not path.is_dir():
            why = "folder does not exist" if not path.exists() else "is not a folder"
            problems.append(Problem("--config-dir", d, why,
                                    "a folder of config groups (model/, data/, experiment/, ...)", nearby_path(path)))
        else:
            dirs.append(path)
    if problems:
        raise ConfigError(problems)
    if config_dirs:
        inv.overrides = _with_search_path(inv.overrides, dirs)
    if not any(o.lstrip("+~").split("=", 1)[0] == "hydra/launcher" for o in inv.overrides):
        # Jobs always run through qwen3exp's launcher, whatever the primary config (yours with
        # --config-path, a recorded run's .hydra/config.yaml); another choice is refused later.
        inv.overrides.append(LAUNCHER_OVERRIDE)
    return inv


def _with_search_path(overrides: list[str], dirs: list[Path]) -> list[str]:
    """--config-dir DIR as Hydra's own `hydra.searchpath` (after the packaged conf/, before a
    hydra.searchpath given on the command line, as Hydra orders them)."""
    extra = [f"file://{d}" for d in dirs]
    out, merged = [], False
    for o in overrides:
        if o.split("=", 1)[0] == "hydra.searchpath":
            from hydra.core.override_parser.overrides_parser import OverridesParser

            value = OverridesParser.create().parse_override(o).value()
            listed = value if isinstance(value, list) else [value]
            o = "hydra.searchpath=[" + ",".join(_quoted(p) for p in [*extra, *map(str, listed)]) + "]"
            merged = True
        out.append(o)
    if not merged:
        out.append("hydra.searchpath=[" + ",".join(_quoted(p) for p in extra) + "]")
    return out


def _quoted(path: str) -> str:
    return "'" + path.replace("\\", "\\\\").replace("'", "\\'") + "'"


def quote_value(value: str) -> str:
    """An override value Hydra reads back as this exact string (paths with , = spaces, quotes...)."""
    if value and all(c.isalnum() or c in "/._-+@%" for c in value):
        return value
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse_overrides(overrides: list[str], config_loader=None) -> list:
    """Hydra's parse of the overrides; a mistake is a Problem (exit 2)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        parsed = OverridesParser.create(config_loader=config_loader).parse_overrides(overrides)
    except (OverrideParseException, ValueError) as e:  # ValueError: an integer of over 4300 digits
        first = str(e).strip().splitlines()
        raise ConfigError([Problem("(command line)", credentials.mask_urls(" ".join(overrides)),
                                   "cannot parse: " + credentials.mask_urls("; ".join(first[:2])),
                                   "key=value, group=option, +key=value, ~key")]) from None
    empty = [str(o.input_line) for o in parsed if not o.key_or_group]
    if empty:
        raise ConfigError([Problem("(command line)", " ".join(empty), "an override needs a key before '='",
                                   "key=value, group=option, +key=value, ~key")])
    return parsed


def is_group_override(ov) -> bool:
    """Whether an override picks a config file (model=hf, hydra/launcher=x) rather than sets a value."""
    key = ov.key_or_group.split("@")[0]
    return key in GROUPS or "/" in key


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
        """Config folders whose files passed `sources.file_problems` (the packaged one needs no check)."""
        self._searches: dict[tuple[str, ...], sources.SearchPath] = {}

    def __enter__(self) -> Composer:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        register_resolvers()
        GlobalHydra.instance().clear()
        self._init = initialize_config_dir(config_dir=str(self.config_dir), version_base="1.3", job_name="qwen3exp")
        self._init.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        from hydra.core.global_hydra import GlobalHydra

        self._init.__exit__(*exc)
        GlobalHydra.instance().clear()

    @property
    def loader(self):
        from hydra.core.global_hydra import GlobalHydra

        return GlobalHydra.instance().config_loader()

    def options(self, group: str, overrides: tuple[str, ...] = ()) -> list[str]:
        """The options of a config group in every config source (packaged and the user's)."""
        searchpath = tuple(o for o in overrides if o.split("=", 1)[0] == "hydra.searchpath")
        key = (group, searchpath)
        if key not in self._options:
            self._options[key] = sorted(self.loader.get_group_options(group, config_name=self.config_name,
                                                                      overrides=list(searchpath)))
        return self._options[key]

    def search_path(self, parsed: list) -> sources.SearchPath:
        """The config sources of a composition with these overrides, every YAML file of their
        folders checked against `sources` limits before Hydra parses any (raises ConfigError)."""
        key = tuple(o.input_line for o in parsed if o.key_or_group == sources.SEARCHPATH_KEY)
        if key not in self._searches:
            # The primary folder first: finding the search path may read the primary config.
            problems = sources.file_problems([self.config_dir], self._checked)
            search = sources.SearchPath(self.loader, self.config_name, parsed) if not problems else None
            problems += sources.file_problems(search.folders(), self._checked) if search is not None else []
            if problems or search is None:
                raise ConfigError(problems)
            self._searches[key] = search
        return self._searches[key]

    def compose(self, overrides: list[str], *, context: str | None = None):
        """The composed config (the hydra node included); raises ConfigError naming every mistake."""
        key = tuple(overrides)
        if key not in self._cache:
            self._cache[key] = self._compose(list(overrides), context)
        return self._cache[key]

    def _compose(self, overrides: list[str], context: str | None):
        import yaml
        from hydra import compose
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        parsed = parse_overrides(overrides)
        try:
            search = self.search_path(parsed)
        except ConfigError as e:
            raise ConfigError(e.problems, context=context) from None
        problems = self.group_problems(parsed, tuple(overrides))
        if problems:
            raise ConfigError([*problems, *self._other_problems(parsed, problems)], context=context)
        if problems := sources.headless_problems(search, _experiment_choices(search, parsed)):
            raise ConfigError(problems, context=context)
        try:
            return compose(config_name=self.config_name, overrides=overrides, return_hydra_config=True)
        except yaml.YAMLError as e:
            raise ConfigError([sources.yaml_problem(e)], context=context) from None
        except OmegaConfBaseException as e:
            raise ConfigError([omegaconf_problem(e)], context=context) from None
        except (HydraException, ValueError, TypeError) as e:
            raise ConfigError(self._diagnose(e, parsed), context=context) from None
        except Exception as e:  # e.g. MissingConfigException for a file a defaults list names
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError([Problem("(composition)", " ".join(overrides) or "(defaults)", first)],
                              context=context) from None

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
                    problems.append(Problem(group, v, f"no option {v!r} in config group {group!r}",
                                            one_of(options), did_you_mean(v, options),
                                            source=f"command line {ov.input_line}"))
        return problems

    def _other_problems(self, parsed: list, group_problems: list[Problem]) -> list[Problem]:
        """The mistakes besides an unknown group option: compose without that group's overrides and
        validate, so that one mistake does not hide another."""
        from qwen3exp.config.schema import check_experiment

        bad = {p.key for p in group_problems}
        rest = [o.input_line for o in parsed if o.key_or_group.split("@")[0].split(".")[0] not in bad]
        try:
            data, problems = experiment_data(self.compose(rest))
        except ConfigError as e:
            return e.problems
        return [*problems, *(p for p in check_experiment(data).problems if p.key.split(".")[0] not in bad)]

    def _diagnose(self, e: Exception, parsed: list) -> list[Problem]:
        """Name the overrides that failed: compose without the value overrides and look them up."""
        from hydra import compose

        groups = [o for o in parsed if is_group_override(o) or o.is_hydra_override()]
        values = [o for o in parsed if o not in groups]
        try:
            base = compose(config_name=self.config_name, overrides=[o.input_line for o in groups])
        except Exception:
            base = None
        return _problems_from_compose_error(e, values, base)


def _experiment_choices(search: sources.SearchPath, parsed: list) -> list[str]:
    """The experiment files a composition reads: the command line's `experiment=NAME` (each value
    of a sweep), else the one the primary config's defaults list names."""
    named = [ov for ov in parsed if ov.key_or_group == "experiment"]
    if not named:
        default = sources.default_experiment(search)
        return [default] if default else []
    values = [v for ov in named if not ov.is_delete()
              for v in (representative_values(ov) if ov.is_sweep_override() else [ov.get_value_element_as_str()])]
    return [v for v in values if v and v != "null"]


def _config_sources(cfg) -> list[dict]:
    """The config sources a composition used (provider, path, schema), from its hydra node."""
    from omegaconf import OmegaConf

    sources = OmegaConf.to_container(cfg.hydra.runtime.config_sources)
    return [s for s in sources if isinstance(s, dict)] if isinstance(sources, list) else []


def shadowed(cfg) -> list[Problem]:
    """A file of the user's that has the name of an option of an earlier config directory (the
    packaged one): Hydra takes the first in its search path, so the user's would be ignored without
    a word. Looked up in the config sources the composition used (`hydra.runtime.config_sources`)."""

    dirs = [Path(s["path"]) for s in _config_sources(cfg)
            if s["schema"] == "file" and s["provider"] not in ("hydra", "schema")]
    problems = []
    for group in GROUPS:
        seen: dict[str, Path] = {}
        for d in dirs:
            for f in sorted((d / group).glob("*.yaml")) if (d / group).is_dir() else []:
                if f.stem in seen and seen[f.stem] != d:
                    problems.append(Problem(group, f.stem,
                                            f"{f} has the name of an option in {seen[f.stem]}, which comes first "
                                            "in Hydra's search path, so it would be ignored",
                                            "a file name that no earlier config directory uses",
                                            f"rename it (e.g. {group}/my_{f.stem}.yaml) and select it with "
                                            f"{group}=my_{f.stem}"))
                seen.setdefault(f.stem, d)
    return problems


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

    @property
    def adaptive(self) -> bool:
        """A sweeper that chooses its points as it goes (Optuna): nobody knows them before it runs."""
        return self.multirun and self.sweeper != BASIC_SWEEPER


SEARCH_ONLY = "interval() and tag() describe a search space for an adaptive sweeper"


def sweeper_params(cfg) -> list[str]:
    """`hydra.sweeper.params` of a composed config as overrides (`key=value`), the way Hydra's
    sweepers read them (the command line's own sweep overrides come after these and win)."""
    from omegaconf import OmegaConf

    params = OmegaConf.select(cfg, "hydra.sweeper.params", default=None, throw_on_resolution_failure=False)
    if not OmegaConf.is_dict(params):
        return []
    return [f"{k}={v}" for k, v in params.items()]


def check_files(inv: Invocation) -> None:
    """The config files' limits (`sources.file_problems`) for a command that runs Hydra without
    `precheck` (--cfg, --info, --hydra-help); raises ConfigError."""
    with Composer(inv.config_dir, inv.config_name) as c:
        c.search_path(parse_overrides(inv.overrides))


def precheck(inv: Invocation) -> Master:
    """Compose the run (a sweep: its common part, and each option of a swept config group) through
    Hydra's compose API and report every mistake as Problems (raises ConfigError). A sweep's points
    come from the command line and from `hydra.sweeper.params` in the config files, as for Hydra's
    sweepers."""
    from omegaconf import OmegaConf

    multirun_asked = inv.multirun
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
        multirun = multirun_asked or str(OmegaConf.select(cfg0, "hydra.mode")) == "RunMode.MULTIRUN"
        extra: list[str] = []
        params = sweeper_params(cfg0)
        if not multirun:
            if cli_sweeps:
                raise ConfigError([Problem("(command line)", " ".join(o.input_line for o in cli_sweeps),
                                           "is a sweep, but the command is a single run",
                                           "add -m (--multirun) to run the sweep, or give one value per key")])
            # As with Hydra: a single run is one job, whatever sweeper and params the config names.
            if sweeper != BASIC_SWEEPER:
                extra.append("hydra/sweeper=basic")
            if params:
                extra.append("hydra.sweeper.params=null")
                print(f"note: hydra.sweeper.params ({', '.join(p.split('=', 1)[0] for p in params)}) is a sweep; "
                      "this single run ignores it (add -m to sweep)", file=sys.stderr)
            params = []
        cli_keys = {o.key_or_group for o in parsed}  # the command line's value for a key wins
        file_sweeps = [o for o in parse_overrides(params, config_loader=c.loader) if o.key_or_group not in cli_keys]
        swept = [o for o in [*file_sweeps, *cli_sweeps] if o.is_sweep_override()]
        if hydra_swept := [o for o in swept if o.key_or_group.split("@")[0].lstrip("+~").startswith("hydra.")]:
            # Hydra's sweepers refuse it too, but only after the sweep directory exists (exit 1).
            raise ConfigError([Problem(o.key_or_group, o.input_line.split("=", 1)[1],
                                       "is a sweep over Hydra's own settings, which Hydra does not support",
                                       "one value for every hydra.* key of a sweep",
                                       "run one sweep per value") for o in hydra_swept])
        if sweeper == BASIC_SWEEPER and (search := [o for o in swept if sweeps.sweep_size(o) is None]):
            raise ConfigError([Problem(o.key_or_group, o.input_line.split("=", 1)[1],
                                       f"{SEARCH_ONLY}; Hydra's basic sweeper (the default) cannot expand it",
                                       "a list (a,b,c), range(), choice() or glob(); or an adaptive sweeper: "
                                       "hydra/sweeper=optuna (pip install 'qwen3exp[optuna]')",
                                       source="hydra.sweeper.params" if o in file_sweeps else "command line")
                                for o in search])
        if sweeper == BASIC_SWEEPER and (problems := sweeps.size_problems(swept, file_sweeps=tuple(file_sweeps))):
            raise ConfigError(problems)
        all_fixed = fixed + [o.input_line for o in file_sweeps if not o.is_sweep_override()]
        cfg = c.compose(all_fixed + [_with_value(o, v) for o in swept if (v := sweeps.first_value(o)) is not None])
        errors = _group_variant_errors(c, all_fixed, swept)
        if errors:
            raise ConfigError.several(errors)
        problems = shadowed(cfg) + hydra_plugin_problems(cfg)
        if problems:
            raise ConfigError(problems)
        from hydra.core.hydra_config import HydraConfig
        from omegaconf.errors import OmegaConfBaseException

        data, _ = experiment_data(cfg)  # an interpolation that does not resolve, named by its key
        if problems := credentials.url_credential_problems(data):  # before Hydra records any value
            raise ConfigError(problems)
        if not multirun:  # the run directory is named from these values: check them before claiming it
            from qwen3exp.config.schema import check_experiment

            if bad := [p for p in check_experiment(data).problems if p.key == "name"]:
                raise ConfigError(bad)
        try:
            HydraConfig.instance().set_config(cfg)
            output_dir = str(OmegaConf.select(cfg, "hydra.sweep.dir" if multirun else "hydra.run.dir"))
        except OmegaConfBaseException as e:
            raise ConfigError([omegaconf_problem(e)]) from None
        if problems := placement_problems(cfg, multirun=multirun):
            raise ConfigError(problems)
    return Master(cfg, multirun, output_dir, [o.input_line for o in swept], sweeper, extra)


def _credential_overrides(overrides: list[str]) -> list[Problem]:
    """A value override that holds URL credentials (each value of a sweep, an unknown key too),
    refused before anything could print or record it; hydra.* overrides (hydra.job.env_set) may:
    their records are redacted."""
    problems = []
    for o in overrides:
        key, _, value = o.partition("=")
        if not key.lstrip("+~").startswith(("hydra.", "hydra/")) and credentials.URL_USERINFO.search(value):
            problems += [replace(p, key=key.lstrip("+~"), source="command line " + credentials.mask_urls(o))
                         for p in credentials.url_credential_problems(value)]
    return problems


def _group_variant_errors(c: Composer, fixed: list[str], swept: list) -> list[ConfigError]:
    """Compose once per further option of each swept config group (the others at their first
    value): a group option brings its own files and keys, so each is checked here."""
    firsts = {o.input_line.split("=", 1)[0]: _with_value(o, vs[0])
              for o in swept if (vs := representative_values(o))}
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


def composition_problems(e: Exception, overrides: list[str], base) -> list[Problem]:
    """A composition error of Hydra's (a job of a sweep) as Problems naming the override."""
    import yaml
    from omegaconf.errors import OmegaConfBaseException

    cause = e.__cause__ if isinstance(e.__cause__, (yaml.YAMLError, OmegaConfBaseException)) else e
    if isinstance(cause, yaml.YAMLError):
        return [sources.yaml_problem(cause)]
    if isinstance(cause, OmegaConfBaseException) and not str(cause).startswith("Could not override"):
        return [omegaconf_problem(cause)]
    try:
        parsed = parse_overrides(overrides)
    except ConfigError as parse_error:
        return parse_error.problems
    values = [o for o in parsed if not (is_group_override(o) or o.is_hydra_override())]
    return _problems_from_compose_error(e, values, base)


def _with_value(ov, value: str) -> str:
    key = ov.input_line.split("=", 1)[0]
    return f"{key}={quote_value(value)}"


def experiment_data(cfg) -> tuple[dict, list[Problem]]:
    """The experiment part of a composed config (the hydra node dropped) as plain data, resolved;
    each `???` value is a Problem and is left out, so that validation reports it once and checks
    the rest."""
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
    problems = []
    try:
        missing = sorted(OmegaConf.missing_keys(job))
    except OmegaConfBaseException as e:  # missing_keys resolves: a broken interpolation
        raise ConfigError([omegaconf_problem(e)]) from None
    for k in missing:
        problems.append(Problem(k, MISSING, "required value is not set (??? in the config)",
                                _describe(k), hint=f"set it on the command line: {k}=..."))
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
    from omegaconf import OmegaConf

    choice = OmegaConf.select(cfg, "hydra.runtime.choices.experiment", default="?")
    where = f"experiment/{choice}.yaml"
    for s in _config_sources(cfg):
        if s["schema"] == "file" and (Path(s["path"]) / where).is_file():
            packaged = Path(s["path"]).resolve() == CONF_DIR
            where = f"{Path(s['path']).name}/{where}" if packaged else str(Path(s["path"]) / where)
            break
    return sources.headless_problem(str(choice), where, None, [str(k) for k in nested])


def compose_experiment(overrides: list[str], *, config_dir: Path = CONF_DIR, config_name: str = CONFIG_NAME):
    """The validated Experiment of these overrides (raises ConfigError on any mistake)."""
    from qwen3exp.config.schema import validate_experiment

    with Composer(config_dir, config_name) as c:
        data, problems = experiment_data(c.compose(overrides))
    if problems:
        raise ConfigError(problems)
    return validate_experiment(data)


def hydra_plugin_problems(cfg) -> list[Problem]:
    """`hydra.launcher._target_` must be qwen3exp's launcher (it checks every batch of jobs; Hydra's
    basic or another launcher would start jobs no check has seen), and `hydra.sweeper._target_` an
    installed Hydra sweeper plugin (found through Hydra's public plugin discovery), so that a typo is
    exit 2 here, not a traceback once the sweep starts."""
    from omegaconf import OmegaConf

    problems = []
    launcher = OmegaConf.select(cfg, "hydra.launcher._target_", throw_on_resolution_failure=False)
    if launcher != LAUNCHER_TARGET:
        problems.append(Problem("hydra.launcher._target_", launcher,
                                "qwen3exp runs every job through its own Hydra launcher, which checks each batch "
                                "of jobs before any of them starts", f"hydra/launcher=qwen3exp ({LAUNCHER_TARGET})",
                                "drop hydra/launcher=...; SLURM is launcher=slurm (it runs through "
                                "hydra-submitit-launcher inside qwen3exp's launcher)"))
    target = OmegaConf.select(cfg, "hydra.sweeper._target_", throw_on_resolution_failure=False)
    if target is not None and target != BASIC_SWEEPER:
        available = _sweeper_names()
        if target not in available:
            problems.append(Problem("hydra.sweeper._target_", target, "is not an installed Hydra sweeper plugin",
                                    one_of(sorted(available)), did_you_mean(str(target), sorted(available)) or
                                    "choose one with hydra/sweeper=<name>; plugins are pip packages "
                                    "(e.g. hydra-optuna-sweeper)"))
    return problems


def _sweeper_names() -> set[str]:
    from hydra.core.plugins import Plugins
    from hydra.plugins.sweeper import Sweeper

    return {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(Sweeper)}


def omegaconf_problem(e: Exception) -> Problem:
    """An interpolation that does not resolve (`${nope}`, a cycle, an unset `${oc.env:X}`) or another
    OmegaConf error, as a Problem naming the key."""
    key = getattr(e, "full_key", None) or "(interpolation)"
    msg = str(getattr(e, "msg", None) or e).strip().splitlines()
    text = msg[0] if msg else type(e).__name__
    if "Recursive interpolation" in text:
        text = "the interpolation refers back to itself (a cycle)"
    return Problem(str(key), _raw_value(e), f"cannot resolve: {text}",
                   "a value, or ${other.key} / ${oc.env:VAR} / ${oc.env:VAR,default} that resolves",
                   "set the missing key or environment variable, or give oc.env a default")


def _raw_value(e: Exception):
    node = getattr(e, "child_node", None)
    try:
        return node._value() if node is not None else MISSING
    except Exception:
        return MISSING


def _describe(key: str) -> str | None:
    from qwen3exp.config.schema import describe

    return describe(key)


def _problems_from_compose_error(e: Exception, parsed: list, base) -> list[Problem]:
    """Name the offending override: an unknown key gets the keys that exist and a 'did you mean'."""
    from omegaconf import OmegaConf

    problems = []
    for ov in parsed:
        key = ov.key_or_group
        if key.startswith("hydra.") or ov.is_add() or base is None:
            continue
        parent_key, _, leaf = key.rpartition(".")
        sections = [str(k) for k in base.keys() if k != "hydra"]
        parent = OmegaConf.select(base, parent_key) if parent_key else base
        if parent is None or not OmegaConf.is_dict(parent):
            top = key.split(".")[0]
            problems.append(Problem(key, ov.get_value_element_as_str(), f"unknown section {parent_key or top!r}",
                                    one_of(sections), did_you_mean(parent_key or top, sections),
                                    source=f"command line {ov.input_line}"))
        elif leaf not in parent:
            siblings = [str(k) for k in parent.keys()]
            full = [f"{parent_key}.{s}" if parent_key else s for s in siblings]
            problems.append(Problem(key, ov.get_value_element_as_str(), "unknown key", one_of(siblings),
                                    did_you_mean(key, full), source=f"command line {ov.input_line}"))
    if not problems:
        msg = str(e)
        first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
        problems.append(Problem(parsed[0].key_or_group if parsed else "(composition)",
                                " ".join(o.input_line for o in parsed), first, source="command line"))
    return problems
