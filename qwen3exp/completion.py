"""What a TAB offers on the `qwen3exp` command line, found without composing anything.

The shell's completion function runs `qwen3exp -sc query=bash` at every TAB (`qwen3exp.entry`).
Hydra answers that by importing the whole application and composing the config (2-4 s of CPU, 6.5-16 s
per TAB on a loaded 2-core machine), and it never sees the `-cd DIR` on the line being completed (the
query's own command line has none). The same facts are read here directly, in about 0.15 s of CPU
(tests/bench/bench_completion.py measures both):
- the config groups and their options: the *.yaml files of the packaged conf/ and of the folders
  the line adds (`-cd/--config-dir DIR`, `hydra.searchpath=[file://DIR]`; `-cp/--config-path DIR`
  replaces the packaged one), so `qwen3exp -cd conf experiment=<TAB>` offers your experiments;
- the keys (`training.lr=`, `model.`) and the values a key allows (a Literal's choices, true/false,
  null) from the schema, through a cached table (`qwen3exp.completion_keys`: building the schema's
  pydantic models is most of a TAB's time); a value that starts like a path (`./`, `/`, `~/`)
  completes as a path;
- the commands: the keys of `qwen3exp.cli.COMMANDS`, read from cli.py's text (importing it loads the
  launchers and Hydra, seconds), and `relaunch`.
Nothing is composed: a key an experiment file adds outside the schema is not offered, and a mistake
on the line is not reported here (the launch reports it). After a command that takes a path, or a
flag's value (`-cd <TAB>`), nothing is offered, so the shell completes file names.
"""

from __future__ import annotations

import ast
import os
import re
from pathlib import Path

from qwen3exp import completion_keys
from qwen3exp.config.packaged import CONF_DIR

CLI_FILE = Path(__file__).with_name("cli.py")
"""Where the commands are declared (`COMMANDS`)."""
RELAUNCH = "relaunch"
"""The command cli.main runs outside COMMANDS (it launches again through main)."""
SUBCOMMANDS = {"data": ("show",)}
"""Commands whose first argument is a word of their own (`qwen3exp data show`)."""
OVERRIDE_ARGS = {("data", "show"): 0, (RELAUNCH,): 1}
"""Command forms followed by overrides, and how many path arguments come first (relaunch RUN)."""
DIR_FLAGS = ("-cd", "--config-dir", "-cp", "--config-path")
VALUE_FLAGS = (*DIR_FLAGS, "-cn", "--config-name")
"""Flags whose value is the next word or follows `=` (`qwen3exp.config.argv` reads them the same way)."""
_SEARCHPATH = re.compile(r"file://([^,\]'\"]+)")


def candidates(line: str, cwd: Path | None = None) -> list[str]:
    """Every completion of the word at the end of `line` (the command line up to the cursor, with the
    program: `qwen3exp -cd conf experiment=t`), sorted; [] leaves the word to the shell."""
    words = line.split()
    word = "" if not line or line[-1].isspace() else words.pop()
    args = _after_program(words)
    if args is None:
        return []
    return sorted(set(_offers(args, word, cwd or Path.cwd())))


def _after_program(words: list[str]) -> list[str] | None:
    """The arguments after `qwen3exp` (or `python -m qwen3exp`); None while the program is typed."""
    if len(words) >= 2 and Path(words[0]).name.startswith("python") and words[1] == "-m":
        return words[3:] if len(words) >= 3 else None
    return words[1:] if words else None


def _offers(args: list[str], word: str, cwd: Path) -> list[str]:
    flag, eq, value = word.partition("=")
    if flag in DIR_FLAGS and eq:
        return [f"{flag}={p}" for p in _paths(value, cwd)]  # --config-dir=DIR: the shell sees one word
    if (args and args[-1] in VALUE_FLAGS) or word.startswith("-"):
        return []  # a flag's value (a folder, a name) or a flag: the shell's own completion
    commands = command_names()
    if not args:
        return [c for c in commands if c.startswith(word)] + overrides(args, word, cwd)
    if args[0] not in commands:
        return overrides(args, word, cwd)
    form = tuple(args[:2]) if args[0] in SUBCOMMANDS else tuple(args[:1])
    if len(args) == 1 and args[0] in SUBCOMMANDS:
        return [s for s in SUBCOMMANDS[args[0]] if s.startswith(word)]
    paths = OVERRIDE_ARGS.get(form)
    if paths is None or len(args) < len(form) + paths:
        return []  # a command's paths: file names
    return overrides(args[len(form) + paths :], word, cwd)


def command_names() -> list[str]:
    """The commands besides a launch: `COMMANDS`' keys as cli.py writes them, and relaunch."""
    try:
        tree = ast.parse(CLI_FILE.read_text())
    except (OSError, SyntaxError):
        return [RELAUNCH]
    names = [RELAUNCH]
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        if any(isinstance(t, ast.Name) and t.id == "COMMANDS" for t in targets) and isinstance(value, ast.Dict):
            names += [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return names


def overrides(args: list[str], word: str, cwd: Path) -> list[str]:
    """Group choices, keys and values that complete `word` (`args`: the words before it)."""
    prefix = word[: len(word) - len(word.lstrip("+~"))]  # +key=, ++key=, ~key
    body = word[len(prefix) :]
    dirs = conf_dirs(args, cwd)
    if "=" in body:
        key, value = body.split("=", 1)
        found = [f"{key}={o}" for o in group_options(dirs, key.split("@")[0])]
        if not found and value.startswith((".", "/", "~")):
            found = [f"{key}={p}" for p in _paths(value, cwd)]
        elif not found:
            found = [f"{key}={v}" for v in key_values(key)]
    else:
        found = groups(dirs, body) + keys(body)
    return [prefix + f for f in found if f.startswith(body) and " " not in f]


def conf_dirs(args: list[str], cwd: Path) -> list[Path]:
    """The config folders the line composes from: the primary one (the packaged conf/, or
    -cp/--config-path DIR) and those it adds (-cd/--config-dir DIR, hydra.searchpath=[file://DIR])."""
    primary, added = CONF_DIR, []
    for i, arg in enumerate(args):
        flag, eq, value = arg.partition("=")
        if flag in VALUE_FLAGS and not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
        if flag in ("-cp", "--config-path") and value:
            primary = _folder(value, cwd)
        elif flag in ("-cd", "--config-dir") and value:
            added.append(_folder(value, cwd))
        elif arg.strip("'\"").lstrip("+").startswith("hydra.searchpath="):
            added += [_folder(p, cwd) for p in _SEARCHPATH.findall(arg)]
    return [d for d in (primary, *added) if d.is_dir()]


def _folder(value: str, cwd: Path) -> Path:
    return cwd / os.path.expanduser(value.strip("'\""))


def group_options(dirs: list[Path], group: str) -> list[str]:
    """The options of a config group (`experiment`, `hydra/job_logging`): its *.yaml files in any folder."""
    if not group or group.startswith("/") or ".." in group.split("/"):
        return []
    return [f.stem for d in dirs if (d / group).is_dir() for f in (d / group).iterdir() if f.suffix == ".yaml"]


def groups(dirs: list[Path], word: str) -> list[str]:
    """The groups under the word's parent group: `model=` (it has options), `hydra/` (it has groups)."""
    parent = word.rpartition("/")[0]
    found = []
    for d in dirs:
        folder = d / parent
        if ".." in parent.split("/") or not folder.is_dir():
            continue
        for sub in folder.iterdir():
            name = f"{parent}/{sub.name}" if parent else sub.name
            if not sub.is_dir() or sub.name.startswith((".", "_")) or not name.startswith(word):
                continue
            entries = list(sub.iterdir())
            if any(e.suffix == ".yaml" for e in entries):
                found.append(f"{name}=")
            if any(e.is_dir() for e in entries):
                found.append(f"{name}/")
    return found


def keys(word: str) -> list[str]:
    """The schema keys that complete `word`: `training.lr=` (a value), `training.` (a section), those
    under the same section as the word only (`tr` offers `training.`, not `training.lr=`)."""
    section = word.rpartition(".")[0]
    return [k for k in completion_keys.table() if k.startswith(word) and k[:-1].rpartition(".")[0] == section]


def key_values(key: str) -> list[str]:
    """The values a key allows when they are few: a Literal's choices, true/false, null."""
    return completion_keys.table().get(f"{key}=", [])


def _paths(value: str, cwd: Path) -> list[str]:
    """The files and folders (with a trailing /) whose path starts with `value`."""
    head, slash, tail = value.rpartition("/")
    folder = cwd / os.path.expanduser(head + slash if slash else ".")
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []
    return [
        f"{head}{slash}{e.name}{'/' if e.is_dir() else ''}"
        for e in entries
        if e.name.startswith(tail) and (tail.startswith(".") or not e.name.startswith("."))
    ]
