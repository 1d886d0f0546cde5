"""The slips a newcomer's command line makes, each named with the command that was meant.

Hydra's override parser answers all of these with "missing EQUAL at '<EOF>'" (or "no option"), which
says what is wrong with the words but not what to type instead:
- a command that does not exist (`qwen3exp reprot`, `qwen3exp train`, `qwen3exp lst`),
- a key and its value as two words (`training.lr 1e-3`: did you mean training.lr=1e-3?),
- a key spelled as a flag (`--dry-run`: did you mean dry_run=true?),
- an experiment file given by its path (`qwen3exp train x.yaml`: experiments are chosen by name),
- an option of your own folder chosen without that folder (`experiment=my_experiment` when
  ./conf/experiment/my_experiment.yaml exists but no `-cd conf` was given).
`config.argv.parse_argv` asks this module before Hydra runs; each slip is a Problem (exit 2, no
traceback). Every word this module does not recognise as a slip is left to Hydra's parser, whose
messages stay as they are.
"""

from __future__ import annotations

import difflib
import re
import shlex
from collections.abc import Sequence
from pathlib import Path

from qwen3exp.config.schema import Experiment
from qwen3exp.errors import Problem, did_you_mean

PROGRAM = "qwen3exp"
"""How a corrected command is spelled (`python -m qwen3exp` is the same command)."""
LAUNCH_WORDS = ("train", "run", "launch", "start", "fit", "sweep", "plan", "eval", "evaluate", "exec")
"""Words other tools use to start or check a run; qwen3exp launches with no command word (`eval`
only while no `eval` command exists: the commands are looked up at call time)."""
OWN_CONF_DIRS = ("conf", ".")
"""Where a user's config folder is looked for when an option is not packaged (`qwen3exp init`
writes ./conf; from inside it, `.`)."""
_COMMAND_LIKE = re.compile(r"^[a-z][a-z0-9_-]*$")
_KEY_LIKE = re.compile(r"^\+?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_]+)+$")


def _scalars() -> dict[str, bool]:
    """The experiment's top-level keys that take one value (name, dry_run, ...), each with whether
    it is a true/false switch; the others are sections (training, sweep, ...)."""
    fields = Experiment.model_fields.items()
    return {name: f.annotation is bool for name, f in fields if f.annotation in (bool, str, int, float)}


def _is_key(word: str) -> bool:
    """`training.lr`, `dry_run`, `+model.x`: a key that takes a value (a dotted key of a section, or
    a top-level key that is not a section)."""
    bare = word.lstrip("+")
    if "." in bare:
        return bool(_KEY_LIKE.match(word)) and bare.split(".")[0] in Experiment.model_fields
    return bare in _scalars()


def _is_value(word: str | None) -> bool:
    return word is not None and "=" not in word and not word.startswith(("-", "~", "+"))


def command(*words: str) -> str:
    return shlex.join([PROGRAM, *words])


def flag_hint(arg: str, following: str | None, flags: Sequence[str]) -> tuple[str | None, bool]:
    """A hint for an unknown flag, and whether it took the next word as its value: `--dry-run` is
    dry_run=true, `--training.lr=1e-3` and `--name x` are key=value; else the nearest flag qwen3exp
    reads (`--config_dir`: --config-dir), or no hint."""
    spelled, _, value = arg.lstrip("-").partition("=")
    key = spelled.replace("-", "_")
    if not _is_key(key) or key.startswith("+"):
        return did_you_mean(arg.split("=", 1)[0], list(flags)), False
    said = "a key is set without dashes: "
    if "=" in arg:
        return f"{said}did you mean {key}={value}?", False
    if _scalars().get(key):
        return f"{said}did you mean {key}=true?", False
    if _is_value(following):
        return f"{said}did you mean {key}={following}?", True
    return f"{said}{key}=VALUE", False


def word_problems(
    words: list[str], argv: list[str], commands: Sequence[str], groups: Sequence[str], packaged: Path, own_dirs: bool
) -> list[Problem]:
    """The slips among the overrides `words` (the command line `argv` without its flags).
    `commands`: the CLI's commands (none: not the command line, no command is suggested); `own_dirs`:
    whether a folder of the user's is searched (-cd, --config-path, hydra.searchpath)."""
    problems: list[Problem] = []
    i = 0
    while i < len(words):
        word, following = words[i], words[i + 1] if i + 1 < len(words) else None
        i += 1
        if "=" in word:
            problems += _option_slips(word, argv, groups, packaged, own_dirs)
        elif word.startswith("~"):
            continue
        elif word.endswith((".yaml", ".yml")):
            problems.append(_yaml_path(word, argv, packaged))
        elif word in commands:
            problems.append(_not_first(word, argv, commands, groups, following))
        elif (_is_key(word) or word in groups) and _is_value(following):
            problems.append(_split(word, f"did you mean {word}={following}?"))
            i += 1
        elif _is_key(word):
            problems.append(
                _split(word, f"did you mean {word}=true?" if _scalars().get(word) else f"write it as {word}=VALUE")
            )
        elif p := _command(word, argv, commands, groups):
            problems.append(p)
    return problems


def _split(word: str, hint: str) -> Problem:
    return Problem("(command line)", word, "a key and its value are one word", "key=value, group=option", hint)


def _allowed(commands: Sequence[str]) -> str:
    return f"the commands {', '.join(commands)}; or a launch: {PROGRAM} [group=option ...] [key=value ...]"


def _not_first(word: str, argv: list[str], commands: Sequence[str], groups: Sequence[str], following) -> Problem:
    """A command after other words (`qwen3exp -v report RUN`): a command is the first word."""
    hint = f"put it first: {command(word, *(a for a in argv if a != word))}"
    if word in groups and _is_value(following):
        hint = f"did you mean {word}={following}? (the command {word!r}: {hint})"
    return Problem("(command line)", word, "a command is the first word", _allowed(commands), hint)


def _command(word: str, argv: list[str], commands: Sequence[str], groups: Sequence[str]) -> Problem | None:
    """An unknown command (`reprot`: did you mean report?), a word of other tools that start a run
    (`train`, `run`), a group named without its option, or the first word looking like a command."""
    if not commands or not _COMMAND_LIKE.match(word):
        return None
    close = difflib.get_close_matches(word, list(commands), n=1, cutoff=0.6)
    rest = [a for a in argv if a != word]
    if close:
        hint = f"did you mean {close[0]!r}? {command(*(close[0] if a == word else a for a in argv))}"
    elif word in groups:
        hint = f"{word!r} is a config group: {word}=OPTION ({PROGRAM} --help lists its options)"
    elif any(a.endswith((".yaml", ".yml")) for a in rest):
        return None  # `qwen3exp train x.yaml`: the file's problem names the command
    elif word == "sweep":
        hint = f"a sweep is a launch with -m: {command('-m', *rest, 'KEY=A,B')}"
    elif word in LAUNCH_WORDS:
        hint = f"a launch has no command word: {command(*rest)} trains, {command(*rest, 'dry_run=true')} plans"
    elif argv[:1] == [word]:
        hint = f"an override is key=value or group=option; {PROGRAM} --help lists every group and key"
    else:
        return None
    return Problem("(command line)", word, f"unknown command {word!r}", _allowed(commands), hint)


def _yaml_path(word: str, argv: list[str], packaged: Path) -> Problem:
    """`x.yaml` on the command line: experiments are chosen by name, from a folder's experiment/; the
    command for that file keeps the other overrides."""
    path = Path(word)
    others = [a for a in argv if a != word and a not in LAUNCH_WORDS]
    allowed = "experiment=NAME, with -cd DIR for the folder that holds experiment/NAME.yaml"
    if path.parent.name == "experiment":
        folder = path.parent.parent
        where = [] if folder.resolve() == packaged.resolve() else ["-cd", str(folder)]
        missing = "" if path.is_file() else f" (there is no {word})"
        hint = f"run this file with: {command(*where, f'experiment={path.stem}', *others)}{missing}"
    else:
        hint = (
            f"put it in a config folder's experiment/ folder (e.g. conf/experiment/{path.stem}.yaml, first "
            f"line `# @package _global_`) and run {command('-cd', 'conf', f'experiment={path.stem}', *others)}"
        )
    return Problem("(command line)", word, "an experiment is chosen by name, not by its file", allowed, hint)


def _option_slips(word: str, argv: list[str], groups: Sequence[str], packaged: Path, own_dirs: bool) -> list[Problem]:
    """`experiment=x.yaml` (options are named without .yaml), and `experiment=my_experiment` without
    `-cd conf` when ./conf/experiment/my_experiment.yaml exists and qwen3exp ships no option of that
    name: the folder to add, and the whole command with it."""
    key, _, value = word.partition("=")
    group = key.lstrip("+").split("@")[0]
    if group not in groups:
        return []
    problems = []
    for option in value.split(","):
        if option.endswith((".yaml", ".yml")):
            fixed = command(*(a.replace(option, Path(option).stem) if a == word else a for a in argv))
            why = "an option is named without .yaml"
            problems.append(Problem(group, option, why, f"{group}=NAME for {group}/NAME.yaml", fixed))
            continue
        if own_dirs or not option or (packaged / group / f"{option}.yaml").is_file():
            continue
        for d in OWN_CONF_DIRS:
            if (Path(d) / group / f"{option}.yaml").is_file():
                why = f"no option {option!r} in config group {group!r}: {d}/{group}/{option}.yaml is read with -cd {d}"
                hint = f"add `-cd {d}`: {command('-cd', d, *argv)}"
                problems.append(Problem(group, option, why, f"-cd DIR for the folder that holds {group}/", hint))
                break
    return problems
