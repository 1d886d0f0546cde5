"""Hydra composition outside of `@hydra.main`: parse the command line, expand sweeps, compose each
point, and turn mistakes into `Problem`s that name the key, the value and what is allowed.

The launcher validates every point of a run or sweep with these functions before Hydra starts any
job; Hydra itself (run or multirun) then composes the same overrides again for the real jobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from qwen3exp.errors import ConfigError, MISSING, Problem, did_you_mean, nearby_path, one_of
from qwen3exp.launchers.sweep import register_resolver

# conf/config.yaml names sweep job folders with ${qwen3exp.safe_dirname:...}; every process that
# composes (this one, and a launcher plugin's job process, which imports qwen3exp.cli) needs it.
register_resolver()

CONF_DIR = (Path(__file__).parent.parent / "conf").resolve()
"""The packaged config groups: in a wheel, qwen3exp/conf; in the source tree a link to conf/."""
CONFIG_NAME = "config"
GROUPS = ("model", "parallelism", "kernels", "checkpoint", "platform", "data", "launcher", "experiment")

# Hydra's flags, by what qwen3exp does with them. Everything else that starts with '-' is refused
# (exit 2): a flag passed through to Hydra unchecked could start a run that no check has seen.
_INFO_FLAGS = {"--help", "-h", "--hydra-help", "--version", "--info", "-i", "--cfg", "-c",
               "--shell-completion", "-sc", "--resolve", "--package", "-p"}
"""Flags that make Hydra print something instead of running the task (nothing starts)."""
_INFO_VALUE = {"--cfg": ("job", "hydra", "all"), "-c": ("job", "hydra", "all"),
               "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
               "-i": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath")}
_REFUSED = {"--experimental-rerun": "rerun a recorded run with python -m qwen3exp.analysis.relaunch RUN_DIR (it checks the "
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
    output_dir: str | None = None
    """The run directory (multirun: the sweep directory) as composed by the preflight; Hydra is
    then pinned to it, so `${qwen3exp.stamp:}` in the default names resolves once for every point."""
    search_dirs: list[Path] = field(default_factory=list)
    """Config directories added with --config-dir / -cd / hydra.searchpath=[file://...] (their
    group options count as options for the checks)."""

    @property
    def user_overrides(self) -> list[str]:
        return [o for o in self.overrides if not o.lstrip("+~").startswith("hydra.")]

    def hydra_argv(self, extra: list[str]) -> list[str]:
        argv = ["--config-path", str(self.config_dir), "--config-name", self.config_name]
        if self.multirun:
            argv.append("--multirun")
        return [*argv, *self.info_flags, *self.overrides, *extra]


_FLAG_ALLOWED = ("-m/--multirun, --config-dir/-cd DIR, --config-path/-cp DIR, --config-name/-cn NAME, "
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
            inv.overrides.append(_global_experiment(arg))
        i += 1
    if inv.info_flags and any(f in ("--package", "-p") for f in inv.info_flags) and \
            not any(f.split("=")[0] in ("--cfg", "-c") for f in inv.info_flags):
        problems.append(Problem("(command line)", "--package", "only prints a config package together with --cfg",
                                "--cfg job|hydra|all --package PKG"))
    for d in config_dirs:
        path = Path(d).expanduser().resolve()
        if not path.is_dir():
            problems.append(Problem("--config-dir", d, "folder does not exist" if not path.exists() else "is not a folder",
                                    "a folder of config groups (model/, data/, experiment/, ...)", nearby_path(path)))
        else:
            inv.search_dirs.append(path)
    if problems:
        raise ConfigError(problems)
    if inv.search_dirs:
        inv.overrides = _with_search_path(inv.overrides, inv.search_dirs)
    inv.search_dirs = [*inv.search_dirs, *_file_search_dirs(inv.overrides, skip=inv.search_dirs)]
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


def _file_search_dirs(overrides: list[str], skip: list[Path]) -> list[Path]:
    """The local folders of a `hydra.searchpath=[file://...]` override (for the group options)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    found = []
    for o in overrides:
        if o.split("=", 1)[0] != "hydra.searchpath":
            continue
        try:
            value = OverridesParser.create().parse_override(o).value()
        except OverrideParseException:
            continue
        for entry in value if isinstance(value, list) else [value]:
            entry = str(entry)
            if entry.startswith("file://"):
                path = Path(entry[len("file://"):]).resolve()
                if path not in skip and path not in found:
                    found.append(path)
    return found


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


def group_options(config_dir: Path = CONF_DIR, extra: list[Path] | tuple[Path, ...] = ()) -> dict[str, list[str]]:
    """The options of every config group: the packaged files plus those of added config dirs
    (--config-dir, hydra.searchpath); an added dir may also bring groups of its own."""
    out: dict[str, set[str]] = {}
    for d in (config_dir, *extra):
        for g in GROUPS:
            if (d / g).is_dir():
                out.setdefault(g, set()).update(p.stem for p in (d / g).glob("*.yaml"))
    return {g: sorted(v) for g, v in out.items()}


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
        parsed = OverridesParser.create().parse_overrides(overrides)
    except OverrideParseException as e:
        first = str(e).strip().splitlines()
        raise ConfigError([Problem("(command line)", " ".join(overrides),
                                   "cannot parse: " + "; ".join(first[:2]),
                                   "key=value, group=option, +key=value, ~key")]) from None
    empty = [o.input_line for o in parsed if not o.key_or_group]
    if empty:
        raise ConfigError([Problem("(command line)", " ".join(empty), "an override needs a key before '='",
                                   "key=value, group=option, +key=value, ~key")])
    return parsed


def check_group_choices(overrides: list[str], config_dir: Path,
                        options: dict[str, list[str]] | None = None, parsed: list | None = None) -> list[Problem]:
    """Unknown options of config groups (model=natve), named with the options that exist."""
    options = group_options(config_dir) if options is None else options
    problems = []
    for ov in _parse(overrides) if parsed is None else parsed:
        key = ov.key_or_group
        if key in options and not ov.is_delete():
            values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
            for v in values:
                if v not in options[key] and v != "null":
                    problems.append(Problem(key, v, f"no option {v!r} in config group {key!r}",
                                            one_of(options[key]), did_you_mean(v, options[key]),
                                            source=f"command line {_shown(ov)}"))
    return problems


@dataclass
class Composed:
    data: dict
    """The resolved experiment as plain data (hydra node dropped)."""
    run_dir: str
    sweep_dir: str
    overrides: list[str]
    problems: list[Problem] = field(default_factory=list)
    """Mistakes found while composing that did not stop composition (an unknown key on the command
    line, a ??? value): reported together with the validation errors of the rest."""
    group_key: tuple[str, ...] = ()
    """The group choices (model=..., experiment=...) this point was composed with."""
    value_overrides: tuple[str, ...] = ()
    """The key=value, +key=value, ~key overrides applied on top."""
    sweep_subdir: str | None = None
    """This point's folder under sweep_dir (composed with job_num; None otherwise)."""


class Composer:
    """Composes many points with one Hydra initialisation.

    Hydra composes the defaults list (root config, group files, experiment file) once per distinct
    set of group choices; the value overrides of each point (key=value, +key=value, ~key) are then
    applied to a copy with Hydra's own override code (`_apply_overrides_to_config`, the function
    `hydra.compose` uses), so the result is the same as composing each point from scratch. A sweep
    over values therefore composes once instead of once per point.

    Use as a context manager (it owns the global Hydra state while open).
    """

    def __init__(self, config_dir: Path = CONF_DIR, config_name: str = CONFIG_NAME,
                 search_dirs: list[Path] | tuple[Path, ...] = ()) -> None:
        self.config_dir = Path(config_dir)
        self.config_name = config_name
        self._options = group_options(self.config_dir, search_dirs)
        self._base: dict[tuple[str, ...], object] = {}
        self._base_error: dict[tuple[str, ...], Exception] = {}
        self._defaults: dict[tuple[str, ...], list] = {}
        self._file_sources: dict[tuple[str, ...], dict] = {}
        self._parsed: dict[str, object] = {}
        self._init = None
        self._loader = None

    def __enter__(self) -> Composer:
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra

        GlobalHydra.instance().clear()
        self._init = initialize_config_dir(config_dir=str(self.config_dir), version_base="1.3",
                                           job_name="qwen3exp")
        self._init.__enter__()
        self._loader = GlobalHydra.instance().config_loader()
        return self

    def __exit__(self, *exc) -> None:
        from hydra.core.global_hydra import GlobalHydra

        self._init.__exit__(*exc)
        GlobalHydra.instance().clear()

    # ------------------------------------------------------------------------------ compose
    def compose(self, overrides: list[str], *, context: str | None = None, job_num: int | None = None,
                collect: bool = False) -> Composed:
        """Compose one point. Fatal mistakes (an unknown group option, a file that does not compose)
        raise ConfigError; with `collect`, the others are returned in `Composed.problems`."""
        import copy

        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        parsed = self.parse(overrides)
        group_problems = check_group_choices(overrides, self.config_dir, self._options, parsed)
        if group_problems and not collect:
            raise ConfigError(group_problems, context=context)
        if group_problems:
            # Compose the rest with the default option, leaving out the keys of the bad group, so
            # that the other mistakes are reported too.
            bad = {p.key.split("@")[0] for p in group_problems}
            parsed = [o for o in parsed if o.key_or_group.split("@")[0].split(".")[0] not in bad]
        groups, values = self._split(parsed)
        # Group choices and hydra.* settings (the same for every point of a sweep) are composed by
        # Hydra itself, once; the experiment's value overrides are applied to a copy per point.
        hydra_values = [o for o in values if o.is_hydra_override()]
        values = [o for o in values if not o.is_hydra_override()]
        key = tuple(o.input_line for o in [*groups, *hydra_values])
        base, job_base, hydra_plain = self._base_for(key, context)
        job = copy.deepcopy(job_base)  # the experiment part only (copying Hydra's node costs ~80 ms)
        problems = group_problems + self._apply(values, job, base)
        hydra_plain = _hydra_dirs(hydra_plain, parsed, job_num)
        try:
            missing = sorted(OmegaConf.missing_keys(job))
        except OmegaConfBaseException as e:  # missing_keys resolves: a broken interpolation
            raise ConfigError(problems + [omegaconf_problem(e)], context=context) from None
        for k in missing:
            problems.append(Problem(k, MISSING, "required value is not set (??? in the config)",
                                    _describe(k), hint=f"set it on the command line: {k}=..."))
            parent, _, leaf = k.rpartition(".")
            node = OmegaConf.select(job, parent) if parent else job
            with _open(node):
                del node[leaf]  # so validation reports it once, as missing, and checks the rest
        try:
            data = OmegaConf.to_container(job, resolve=True)
            with _open(job):
                job.hydra = hydra_plain  # only run, sweep and job: what directory names refer to
            sweep_dir = str(job.hydra.sweep.dir)
            sweep_subdir = str(job.hydra.sweep.subdir) if job_num is not None else None
            run_dir = f"{sweep_dir}/{sweep_subdir}" if job_num is not None else str(job.hydra.run.dir)
        except OmegaConfBaseException as e:
            raise ConfigError(problems + [omegaconf_problem(e)], context=context) from None
        if problems and not collect:
            raise ConfigError(problems, context=context)
        return Composed(data, run_dir, sweep_dir, overrides, problems, tuple(o.input_line for o in groups),
                        tuple(o.input_line for o in values), sweep_subdir)

    @staticmethod
    def _apply(values: list, cfg, base) -> list[Problem]:
        from hydra.errors import HydraException
        from omegaconf.errors import OmegaConfBaseException

        problems = []
        for ov in values:  # one at a time, so that every bad override is reported, not just the first
            try:
                _apply_overrides([ov], cfg)
            except (HydraException, OmegaConfBaseException) as e:
                problems += _problems_from_compose_error(e, [ov], base)
        return problems

    def parse(self, overrides: list[str]) -> list:
        """Hydra's parse of each override, cached by its text (sweep points repeat the same ones)."""
        missing = [o for o in overrides if o not in self._parsed]
        if missing:
            self._parsed.update(zip(missing, _parse(missing)))
        return [self._parsed[o] for o in overrides]

    def _split(self, parsed) -> tuple[list, list]:
        """Group overrides (they change the defaults list) and value overrides, as Hydra splits them."""
        repo = self._loader.repository
        groups, values = [], []
        for ov in parsed:
            is_group = not isinstance(ov.value(), dict) and repo.group_exists(ov.key_or_group)
            (groups if is_group or ov.key_or_group.startswith("hydra.searchpath") else values).append(ov)
        return groups, values

    def _base_for(self, key: tuple[str, ...], context: str | None):
        """The config composed from the root config and the chosen group files (cached)."""
        from hydra import compose
        from hydra.errors import HydraException
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        if key not in self._base:
            import yaml

            try:
                cfg = compose(config_name=self.config_name, overrides=list(key), return_hydra_config=True)
            except yaml.YAMLError as e:
                raise ConfigError([yaml_problem(e)], context=context) from None
            except OmegaConfBaseException as e:
                raise ConfigError([omegaconf_problem(e)], context=context) from None
            except (HydraException, ValueError, TypeError) as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise ConfigError([Problem("(composition)", " ".join(key) or "(defaults)", first)],
                                  context=context) from None
            plugin_problems = hydra_plugin_problems(cfg)
            if plugin_problems:
                raise ConfigError(plugin_problems, context=context)
            job = OmegaConf.masked_copy(cfg, [k for k in cfg.keys() if k != "hydra"])
            OmegaConf.set_struct(job, True)
            hydra = OmegaConf.to_container(cfg.hydra, resolve=False)
            self._base[key] = (cfg, job, {k: hydra[k] for k in ("run", "sweep", "job")})
        return self._base[key]

    # ---------------------------------------------------------------------------- provenance
    def defaults_list(self, group_key: tuple[str, ...]) -> list:
        """Hydra's defaults list for these group choices: the files composed, in order."""
        from hydra.types import RunMode

        if group_key not in self._defaults:
            self._defaults[group_key] = self._loader.compute_defaults_list(
                self.config_name, list(group_key), RunMode.RUN).defaults
        return self._defaults[group_key]

    def provenance(self, composed: Composed):
        """Where each key's value came from (see `qwen3exp.config.origins`); the files' part is computed
        once per set of group choices."""
        from qwen3exp.config.origins import Provenance, file_sources

        if composed.group_key not in self._file_sources:
            self._file_sources[composed.group_key] = file_sources(self, composed.group_key)
        return Provenance.with_overrides(self._file_sources[composed.group_key],
                                         self.parse(list(composed.value_overrides)))

    def load_file(self, config_path: str):
        return self._loader.repository.load_config(config_path=config_path)


def compose_point(overrides: list[str], *, config_dir: Path = CONF_DIR, config_name: str = CONFIG_NAME,
                  context: str | None = None, job_num: int | None = None) -> Composed:
    """Compose a single point (raises ConfigError on any mistake). `job_num`: the point's index in a
    sweep (Hydra's hydra.job.num), so that the sweep subdir resolves as it will in the real job."""
    with Composer(config_dir, config_name) as c:
        return c.compose(overrides, context=context, job_num=job_num)


_DEFAULT_PLUGINS = {"launcher": "hydra._internal.core_plugins.basic_launcher.BasicLauncher",
                    "sweeper": "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"}


def hydra_plugin_problems(cfg) -> list[Problem]:
    """`hydra.launcher._target_` / `hydra.sweeper._target_` must name an installed Hydra launcher /
    sweeper plugin (found through Hydra's public plugin discovery), so that a typo is exit 2 here,
    not a traceback once the sweep starts. The usual choice is a config group: hydra/launcher=...,
    hydra/sweeper=..."""
    from omegaconf import OmegaConf

    problems = []
    for kind, default in _DEFAULT_PLUGINS.items():
        target = OmegaConf.select(cfg, f"hydra.{kind}._target_", throw_on_resolution_failure=False)
        if target is None or target == default:
            continue
        available = _plugin_names(kind)
        if target not in available:
            problems.append(Problem(f"hydra.{kind}._target_", target, f"is not an installed Hydra {kind} plugin",
                                    one_of(sorted(available)), did_you_mean(str(target), sorted(available)) or
                                    f"choose one with hydra/{kind}=<name>; plugins are pip packages "
                                    f"(e.g. hydra-submitit-launcher, hydra-optuna-sweeper)"))
    return problems


def _plugin_names(kind: str) -> set[str]:
    from hydra.core.plugins import Plugins
    from hydra.plugins.launcher import Launcher
    from hydra.plugins.sweeper import Sweeper

    base = Launcher if kind == "launcher" else Sweeper
    return {f"{c.__module__}.{c.__name__}" for c in Plugins.instance().discover(base)}


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


def yaml_problem(e: Exception) -> Problem:
    """A YAML syntax error in a config file: the file, line and column."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{mark.name}" if mark is not None else "(a config file)"
    line = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(e, "problem", None) or str(e).strip().splitlines()[0]
    context, cm = getattr(e, "context", None), getattr(e, "context_mark", None)
    if context and cm is not None and mark is not None and cm.line != mark.line:
        what += f" ({context} at line {cm.line + 1}, column {cm.column + 1})"
    return Problem("(config file)", where, f"YAML syntax error{line}: {what}",
                   "valid YAML (key: value, indented with spaces; [ ] and { } closed)",
                   source=f"{where}{line}")


def _shown(ov) -> str:
    """An override as the user typed it (experiment=X, not Hydra's experiment@_global_=X)."""
    return ov.input_line.replace("experiment@_global_", "experiment")


def _apply_overrides(overrides: list, cfg) -> None:
    # Hydra's own code for key=value, +key=value, ++key=value and ~key (hydra-core 1.3).
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigLoaderImpl._apply_overrides_to_config(overrides, cfg)


def _describe(key: str) -> str | None:
    from qwen3exp.config.schema import describe

    return describe(key)


def _hydra_dirs(hydra_plain: dict, parsed, job_num: int | None) -> dict:
    """The part of the hydra node the run and sweep directories are computed from, for this point."""
    from hydra._internal.config_loader_impl import get_overrides_dirname

    task = [o for o in parsed if not o.is_hydra_override()]
    job = dict(hydra_plain["job"])
    od = job["config"]["override_dirname"]
    job["override_dirname"] = get_overrides_dirname(overrides=task, kv_sep=od["kv_sep"], item_sep=od["item_sep"],
                                                    exclude_keys=od["exclude_keys"])
    if job_num is not None:
        job["num"], job["id"] = job_num, str(job_num)
    return {"run": hydra_plain["run"], "sweep": hydra_plain["sweep"], "job": job}


def _open(node):
    from omegaconf import open_dict

    return open_dict(node)


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
                                    source=f"command line {_shown(ov)}"))
        elif leaf not in parent:
            siblings = [str(k) for k in parent.keys()]
            full = [f"{parent_key}.{s}" if parent_key else s for s in siblings]
            problems.append(Problem(key, ov.get_value_element_as_str(), "unknown key", one_of(siblings),
                                    did_you_mean(key, full), source=f"command line {_shown(ov)}"))
    if not problems:
        msg = str(e)
        first = msg.strip().splitlines()[0] if msg.strip() else type(e).__name__
        problems.append(Problem(parsed[0].key_or_group if parsed else "(composition)",
                                " ".join(o.input_line for o in parsed), first, source="command line"))
    return problems
