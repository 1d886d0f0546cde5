"""The command line as qwen3exp runs Hydra with it.

- `parse_argv`: Hydra's flags as qwen3exp runs them. A flag that would make Hydra run something no
  check has seen is refused (exit 2); `--config-dir DIR` becomes Hydra's own `hydra.searchpath`.
- `parse_overrides`: Hydra's own override parser, its mistakes as Problems.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from qwen3exp.config.packaged import CONF_DIR
from qwen3exp.config.slips import flag_hint, word_problems
from qwen3exp.config.unparsable import parse_problem, unparsable
from qwen3exp.errors import ConfigError, Problem, nearby_path

CONFIG_NAME = "config"
GROUPS = (
    "model",
    "parallelism",
    "kernels",
    "checkpoint",
    "platform",
    "data",
    "peft",
    "objective",
    "eval",
    "launcher",
    "experiment",
)
LAUNCHER_TARGET = "hydra_plugins.qwen3exp_launcher.launcher.Qwen3expLauncher"
"""qwen3exp's Hydra launcher (conf: hydra/launcher=qwen3exp): it checks every batch of jobs."""
LAUNCHER_OVERRIDE = "hydra/launcher=qwen3exp"
BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
"""Hydra's default sweeper, by the name its config gives (a string: nothing of Hydra's internals is imported)."""

# Hydra's flags, by what qwen3exp does with them. Everything else that starts with '-' is refused
# (exit 2): a flag passed through to Hydra unchecked could start a run that no check has seen.
_INFO_FLAGS = {
    "--help",
    "-h",
    "--hydra-help",
    "--version",
    "--info",
    "-i",
    "--cfg",
    "-c",
    "--shell-completion",
    "-sc",
    "--resolve",
    "--package",
    "-p",
}
"""Flags that make Hydra print something instead of running the task (nothing starts)."""
_INFO_VALUE = {
    "--cfg": ("job", "hydra", "all"),
    "-c": ("job", "hydra", "all"),
    "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
    "-i": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
}
_REFUSED = {
    "--experimental-rerun": "rerun a recorded run with qwen3exp relaunch RUN_DIR (it checks the "
    "recorded config before running anything)"
}


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


_FLAG_ALLOWED = (
    "-m/--multirun, -v/--verbose, --config-dir/-cd DIR, --config-path/-cp DIR, --config-name/-cn NAME, "
    "--help, --hydra-help, --version, --info [all|config|defaults|...], --cfg job|hydra|all "
    "[--package PKG] [--resolve], --shell-completion; everything else is key=value"
)


class _Args:
    """The command line's words, read one at a time; a flag's value is the rest of `--flag=value`
    or the next word."""

    def __init__(self, argv: list[str], problems: list[Problem]) -> None:
        self.args, self.i, self.problems = list(argv), -1, problems

    def next(self) -> str | None:
        self.i += 1
        return self.args[self.i] if self.i < len(self.args) else None

    def peek(self) -> str | None:
        return self.args[self.i + 1] if self.i + 1 < len(self.args) else None

    def value(self, flag: str) -> str | None:
        arg = self.args[self.i]
        if "=" in arg and arg.startswith("-"):
            return arg.split("=", 1)[1]
        if self.peek() is not None:
            return self.next()
        self.problems.append(Problem("(command line)", flag, "needs a value", _FLAG_ALLOWED))
        return None


_VALUE_FLAGS = {
    "--config-path": "config_dir",
    "-cp": "config_dir",
    "--config-name": "config_name",
    "-cn": "config_name",
    "--config-dir": "search_dir",
    "-cd": "search_dir",
}


def parse_argv(argv: list[str], commands: Sequence[str] = ()) -> Invocation:
    """Hydra's command line, as qwen3exp runs it; raises ConfigError for a flag it does not run
    through the checks, and for a slip (`config.slips`: a mistyped command of `commands`, `key value`,
    `--dry-run`, ...) with the command that was meant (exit 2 before anything starts)."""
    inv = Invocation()
    problems: list[Problem] = []
    config_dirs: list[tuple[str, str]] = []
    args = _Args(argv, problems)
    while (arg := args.next()) is not None:
        flag = arg.split("=", 1)[0] if arg.startswith("-") else arg
        if arg in ("-m", "--multirun"):
            inv.multirun = True
        elif arg in ("-v", "--verbose"):
            inv.overrides.append("verbose=true")  # the experiment key: every line the ranks print
        elif flag in _VALUE_FLAGS:
            if (v := args.value(flag)) is not None:
                _set(inv, config_dirs, flag, v)
        elif flag in _REFUSED:
            problems.append(Problem("(command line)", arg, "is not run by qwen3exp", _REFUSED[flag]))
            args.value(flag)
        elif flag in _INFO_FLAGS:
            inv.info_flags += _info_flag(args, arg, flag)
        elif arg.startswith("-") and arg not in ("-r", "--run"):  # run mode is the default
            hint, took_value = flag_hint(arg, args.peek(), [*_INFO_FLAGS, *_VALUE_FLAGS, "--multirun", "--verbose"])
            problems.append(Problem("(command line)", arg, "unknown flag", _FLAG_ALLOWED, hint))
            if took_value:  # `--name x`: x is the flag's value, not a word of its own
                args.next()
        elif not arg.startswith("-"):
            inv.overrides.append(arg)
    if any(f in ("--package", "-p") for f in inv.info_flags) and not any(
        f.split("=")[0] in ("--cfg", "-c") for f in inv.info_flags
    ):
        problems.append(
            Problem(
                "(command line)",
                "--package",
                "only prints a config package together with --cfg",
                "--cfg job|hydra|all --package PKG",
            )
        )
    own = (
        bool(config_dirs) or inv.config_dir != CONF_DIR or any(o.startswith("hydra.searchpath=") for o in inv.overrides)
    )
    problems += word_problems(inv.overrides, argv, commands, GROUPS, CONF_DIR, own_dirs=own)
    dirs = _config_dirs(config_dirs, problems)
    if problems:
        raise ConfigError(problems)
    if dirs:
        inv.overrides = _with_search_path(inv.overrides, dirs)
    if not any(o.lstrip("+~").split("=", 1)[0] == "hydra/launcher" for o in inv.overrides):
        # Jobs always run through qwen3exp's launcher, whatever the primary config (yours with
        # --config-path, a recorded run's .hydra/config.yaml); another choice is refused later.
        inv.overrides.append(LAUNCHER_OVERRIDE)
    return inv


def _set(inv: Invocation, config_dirs: list[tuple[str, str]], flag: str, value: str) -> None:
    what = _VALUE_FLAGS[flag]
    if what == "config_dir":
        inv.config_dir = Path(value).expanduser().resolve()
        config_dirs.append((flag, value))  # checked as a folder with the --config-dir ones
    elif what == "config_name":
        inv.config_name = value
    else:
        config_dirs.append((flag, value))


def _info_flag(args: _Args, arg: str, flag: str) -> list[str]:
    """A flag Hydra answers by itself, with its value when it takes one (--cfg job, --package PKG)."""
    options = _INFO_VALUE.get(flag)
    if options and "=" not in arg and args.peek() in options:
        return [arg, str(args.next())]
    if flag in ("--package", "-p") and "=" not in arg and (v := args.value(flag)) is not None:
        return [arg, v]
    return [arg]


def _config_dirs(config_dirs: list[tuple[str, str]], problems: list[Problem]) -> list[Path]:
    """The `--config-dir` folders (for the search path), each folder of a flag (`--config-path`
    too) that is not a folder a Problem naming the flag as typed."""
    dirs = []
    for flag, d in config_dirs:
        path = Path(d).expanduser().resolve()
        primary = _VALUE_FLAGS[flag] == "config_dir"
        if path.is_dir():
            dirs += [] if primary else [path]
            continue
        why = "folder does not exist" if not path.exists() else "is not a folder"
        allowed = "a folder of config groups (model/, data/, experiment/, ...)"
        allowed += f" holding the primary config ({CONFIG_NAME}.yaml, or --config-name)" if primary else ""
        problems.append(Problem(flag, d, why, allowed, None if path.exists() else nearby_path(path)))
    return dirs


def _with_search_path(overrides: list[str], dirs: list[Path]) -> list[str]:
    """--config-dir DIR as Hydra's own `hydra.searchpath` (after the packaged conf/, before a
    hydra.searchpath given on the command line, as Hydra orders them)."""
    extra = [f"file://{d}" for d in dirs]
    out, merged = [], False
    for o in overrides:
        if o.split("=", 1)[0] == "hydra.searchpath":
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
    parser = OverridesParser.create(config_loader=config_loader)
    try:
        parsed = parser.parse_overrides(overrides)
    except (OverrideParseException, ValueError) as e:  # ValueError: an integer of over 4300 digits
        raise ConfigError(unparsable(parser, overrides) or [parse_problem(" ".join(overrides), e)]) from None
    empty = [str(o.input_line) for o in parsed if not o.key_or_group]
    if empty:
        raise ConfigError(
            [
                Problem(
                    "(command line)",
                    " ".join(empty),
                    "an override needs a key before '='",
                    "key=value, group=option, +key=value, ~key",
                )
            ]
        )
    return parsed


def is_group_override(ov) -> bool:
    """Whether an override picks a config file (model=hf, hydra/launcher=x) rather than sets a value."""
    key = ov.key_or_group.split("@")[0]
    return key in GROUPS or "/" in key
